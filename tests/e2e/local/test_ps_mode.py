"""PS mode on the local backend with real processes: registry, life cycle, ports, TensorFlow.

Every task runs in its own exec agent ("container"), reached through
``mpilaunch-rsh`` exactly like a cluster container; the launcher is the
registry.  Tasks are plain Python programs here, except for the TensorFlow
test which trains a Keras model under ParameterServerStrategy.
"""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from support.helpers import REPO, agent_workers, leftover_processes, mpilaunch_env, run_mpilaunch
from support.mpi_installs import require

pytestmark = pytest.mark.ps

TASK_PROGRAM = textwrap.dedent('''
    """A PS-mode task: records what it was told, then behaves as its role does."""
    import argparse, json, os, socket, sys, time, traceback

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--fail-worker", type=int, default=-1)
    p.add_argument("--code", type=int, default=3)
    p.add_argument("--finish-after", type=float, default=0.5)
    p.add_argument("--fail-after", type=float, default=0.5)
    args = p.parse_args()
    role, index = os.environ["DTF_TASK_JOB_NAME"], int(os.environ["DTF_TASK_INDEX"])
    config = json.loads(os.environ["TF_CONFIG"])
    # Serve on the reserved port, as tf.distribute.Server would (SO_REUSEPORT).
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    server.bind(("0.0.0.0", int(os.environ["MPILAUNCH_TASK_PORT"])))
    server.listen()
    record = {k: v for k, v in os.environ.items()
              if k.startswith(("DTF_", "TF_", "MPILAUNCH_TASK", "MPILAUNCH_WORKER", "USER_"))}
    record.update(pid=os.getpid(), argv=sys.argv)
    if "DTF_TASK_SCRIPT" in os.environ:
        record["script"] = open(os.environ["DTF_TASK_SCRIPT"]).read()
    # whole or not at all: the tests poll for these files while the tasks write them
    path = os.path.join(args.out, f"env-{role}-{index}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    print(f"{role}:{index} listening at {os.environ['MPILAUNCH_TASK_ADDRESS']}", flush=True)
    if role == "worker" and index == args.fail_worker:
        time.sleep(args.fail_after)
        try:
            raise ValueError(f"worker {index} hit bad data")
        except ValueError:
            traceback.print_exc()
            sys.exit(args.code)
    finishes = role == "chief" or (role == "worker" and "chief" not in config["cluster"])
    if finishes:
        time.sleep(args.finish_after)
        print(f"{role}:{index} done", flush=True)
        sys.exit(0)
    while True:  # ps (and workers under a chief) serve until they are stopped
        time.sleep(60)
''')


@pytest.fixture
def task_program(tmp_path):
    path = tmp_path / "ps_task.py"
    path.write_text(TASK_PROGRAM)
    return path


def task_records(out):
    return {p.name[4:-5]: json.loads(p.read_text()) for p in out.glob("env-*.json")}


def assert_all_gone(name, records):
    alive = [
        r["pid"]
        for r in records.values()
        if psutil.pid_exists(r["pid"]) and psutil.Process(r["pid"]).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == [], f"task processes still alive: {alive}"
    assert leftover_processes(name) == []


# ------------------------------------------------------------------ bad input


BAD = {
    "not-a-number": (["-r", "ps:x"], "must be a whole number, got 'x'"),
    "zero-workers": (["-r", "worker:0"], "needs at least 1 task"),
    "duplicate-job": (["-r", "ps:1,worker:2,ps:2"], "appears twice"),
    "tensorboard-without-output": (
        ["--mode", "ps", "--workers", "2", "--tensorboard"],
        "--tensorboard needs an output directory",
    ),
    "both-forms": (["-r", "worker:2", "--ps", "1"], "both size the job"),
    "two-chiefs": (["-r", "chief:2,worker:1"], "one chief task"),
    "missing-script": (["--workers", "1", "-s", "/nonexistent/train.py"], "cannot read --script"),
    "allreduce-sizing": (["--workers", "1", "--np", "4"], "--np sizes allreduce jobs"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_cluster_requirements_exit_2_with_one_clear_line(case):
    args, expected = BAD[case]
    name = f"bad-{case}"  # what it would have allocated is named after it (other jobs run beside)
    proc = run_mpilaunch([*args, "--name", name, "--", "python", "train.py"], timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("mpilaunch: error: ") and lines[1].startswith("  hint: "), (
        proc.stderr
    )
    assert expected in lines[0]
    assert [w for w in agent_workers().values() if w.startswith(name + "-")] == []
    assert leftover_processes(name) == []


def test_render_prints_cluster_spec_and_environment_without_starting_anything(tmp_path):
    proc = run_mpilaunch(
        [
            "render",
            "--mode",
            "ps",
            "--name",
            "psrender",
            "--ps",
            "2",
            "--workers",
            "2",
            "--chief",
            "-i",
            "/data",
            "-o",
            str(tmp_path / "o"),
            "--output-dir",
            str(tmp_path / "d"),
            "--",
            "python",
            "train.py",
        ],
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert '"psrender-ps-1:PORT"' in out and '"psrender-chief-0:PORT"' in out
    assert "DTF_PS_HOSTS=psrender-ps-0:PORT,psrender-ps-1:PORT" in out
    assert "TF_ROLE=worker" in out and "DTF_INPUT_PATH=/data" in out
    assert out.count("TF_CONFIG=") == 5
    assert "mpilaunch.rank --task-starter --task ps:1" in out
    assert not (tmp_path / "d").exists() and leftover_processes("psrender") == []


# ------------------------------------------------------------------ life cycle


def test_chief_success_ends_the_job_and_terminates_ps_and_workers(tmp_path, task_program):
    name = "pslife"
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "helper_script.sh"
    script.write_text("echo shipped\n")
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--mode",
            "ps",
            "--ps",
            "2",
            "--workers",
            "2",
            "--chief",
            "-i",
            "/data/in",
            "-o",
            str(out),
            "-s",
            str(script),
            "--output-dir",
            str(tmp_path / "logs"),
            "--",
            sys.executable,
            str(task_program),
            "--out",
            "$DTF_OUTPUT_PATH",
        ]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = task_records(out)
    assert sorted(records) == ["chief-0", "ps-0", "ps-1", "worker-0", "worker-1"]
    report = json.loads((tmp_path / "logs" / "report.json").read_text())
    status = {t["task"]: t["status"] for t in report["tasks"]}
    assert status == {
        "chief:0": "succeeded",
        "worker:0": "terminated",
        "worker:1": "terminated",
        "ps:0": "terminated",
        "ps:1": "terminated",
    }
    # Every task got the same cluster, built from the ports the starters reserved.
    cluster = report["cluster"]
    addresses = [a for hosts in cluster.values() for a in hosts]
    assert len(set(addresses)) == 5 and all(a.startswith("127.0.0.1:") for a in addresses)
    for key, rec in records.items():
        role, index = key.split("-")
        config = json.loads(rec["TF_CONFIG"])
        assert config == {"cluster": cluster, "task": {"type": role, "index": int(index)}}
        assert rec["MPILAUNCH_TASK_ADDRESS"] == cluster[role][int(index)]
        assert rec["MPILAUNCH_WORKER"] == f"{name}-{role}-{index}"  # its own container
        assert rec["DTF_PS_HOSTS"] == ",".join(cluster["ps"])
        assert rec["DTF_WORKER_HOSTS"] == ",".join(cluster["worker"])
        assert (rec["TF_ROLE"], rec["TF_INDEX"]) == (role, index)
        assert json.loads(rec["TF_CLUSTER_DEF"]) == cluster
        assert rec["DTF_INPUT_PATH"] == "/data/in" and rec["DTF_OUTPUT_PATH"] == str(out)
        assert rec["script"] == "echo shipped\n" and rec["DTF_TASK_SCRIPT"].endswith("/helper_script.sh")
        assert not os.path.exists(rec["DTF_TASK_SCRIPT"])  # the starter cleaned up after the task
        assert rec["argv"][-1] == str(out)  # $DTF_OUTPUT_PATH expanded without a shell
    assert "[chief:0] chief:0 done" in proc.stdout
    assert "chief:0 done" in (tmp_path / "logs" / "chief-0.log").read_text()
    assert f"PS job {name} succeeded" in proc.stderr
    assert_all_gone(name, records)


def test_without_chief_all_workers_succeeding_ends_the_job(tmp_path, task_program):
    name = "psnochief"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "-q",
            "-r",
            "ps:1,worker:3",
            "--evaluator",
            "--output-dir",
            str(tmp_path),
            "-x",
            "USER_A=1",
            "-x",
            "USER_B",
            "--",
            sys.executable,
            str(task_program),
            "--out",
            str(tmp_path),
        ],
        env_extra={"USER_B": "from-launcher"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(t["task"], t["status"]) for t in report["tasks"]] == [
        ("worker:0", "succeeded"),
        ("worker:1", "succeeded"),
        ("worker:2", "succeeded"),
        ("ps:0", "terminated"),
        ("evaluator:0", "terminated"),
    ]
    assert all(t["duration_s"] is not None and t["address"] for t in report["tasks"])
    records = task_records(tmp_path)
    assert {(r["USER_A"], r["USER_B"]) for r in records.values()} == {("1", "from-launcher")}
    assert "chief" not in json.loads(records["evaluator-0"]["TF_CONFIG"])["cluster"]
    assert_all_gone(name, records)


def test_timeout_stops_the_job_with_124(tmp_path, task_program):
    name = "pstimeout"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "-q",
            "--chief",
            "--ps",
            "1",
            "--timeout",
            "3",
            "--output-dir",
            str(tmp_path),
            "--",
            sys.executable,
            str(task_program),
            "--out",
            str(tmp_path),
            "--finish-after",
            "120",
        ]
    )
    assert proc.returncode == 124, proc.stderr
    assert "ran past --timeout 3s" in proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert {t["status"] for t in report["tasks"]} == {"terminated"}
    assert_all_gone(name, task_records(tmp_path))


def test_failing_worker_fails_the_job_with_its_code_and_traceback(tmp_path, task_program):
    name = "psfail"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--mode",
            "ps",
            "--ps",
            "1",
            "--workers",
            "2",
            "--chief",
            "--output-dir",
            str(tmp_path),
            "--",
            sys.executable,
            str(task_program),
            "--out",
            str(tmp_path),
            "--fail-worker",
            "1",
            "--code",
            "3",
            "--finish-after",
            "30",
        ]
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    err = proc.stderr
    assert "mpilaunch: error: task worker:1 on psfail-worker-1 exited with code 3" in err
    assert "  | ValueError: worker 1 hit bad data" in err and "  | Traceback (most recent call last):" in err
    report = json.loads((tmp_path / "report.json").read_text())
    tasks = {t["task"]: t for t in report["tasks"]}
    assert tasks["worker:1"]["status"] == "failed" and tasks["worker:1"]["exit_code"] == 3
    assert any("ValueError: worker 1 hit bad data" in line for line in tasks["worker:1"]["tail"])
    # The chief was still running (it finishes after 30 s): it was stopped, as were the rest.
    assert {tasks[t]["status"] for t in ("chief:0", "worker:0", "ps:0")} == {"terminated"}
    assert report["exit_code"] == 3 and "ValueError" in report["failure"]
    assert report["timings"]["total_s"] < 25
    assert_all_gone(name, task_records(tmp_path))


def test_ctrl_c_stops_every_task_and_exits_130(tmp_path, task_program):
    name = "psint"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--name",
            name,
            "-q",
            "-r",
            "ps:1,worker:1",
            "--chief",
            "--",
            sys.executable,
            str(task_program),
            "--out",
            str(tmp_path),
            "--finish-after",
            "120",
        ],
        cwd=REPO,
        env=mpilaunch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while len(task_records(tmp_path)) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert len(task_records(tmp_path)) == 3
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT" in err
    assert_all_gone(name, task_records(tmp_path))


# ------------------------------------------------------------------ port reservation


PRESSURE = textwrap.dedent('''
    """Bind ephemeral ports as fast as allowed, holding up to HOLD at a time.

    On stdin EOF: read the task windows [[port, t0, t1], ...] from the file
    named in argv[1] and print how many of our bindings overlapped one.
    """
    import json, resource, select, socket, sys, time
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    HOLD = 3000
    held, history = [], {}
    print("ready", flush=True)
    while not select.select([0], [], [], 0)[0]:
        for _ in range(50):
            s = socket.socket()
            s.bind(("0.0.0.0", 0))  # like any program asking for a free port
            held.append((s, s.getsockname()[1], time.monotonic()))
            if len(held) > HOLD:
                old, port, t0 = held.pop(0)
                old.close()
                history.setdefault(port, []).append((t0, time.monotonic()))
        time.sleep(0.002)
    now = time.monotonic()
    for s, port, t0 in held:
        history.setdefault(port, []).append((t0, now))
    windows = json.load(open(sys.argv[1]))
    hits = [(p, a, b) for p, t0, t1 in windows for a, b in history.get(p, []) if a < t1 and b > t0]
    print(json.dumps({"bindings": sum(map(len, history.values())), "hits": hits}), flush=True)
''')

TASK_BINDS = (
    "import os, socket, sys, time\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
    "try:\n"
    "    s.bind(('0.0.0.0', int(os.environ['MPILAUNCH_TASK_PORT']))); s.listen()\n"
    "    print('BOUND', flush=True)\n"
    "except OSError as e:\n"
    "    print('BINDFAIL', e, flush=True); sys.exit(1)\n"
    "time.sleep(60)\n"
)


def _start_starters(n):
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-S",
                "-m",
                "mpilaunch.task_starter",
                "--task",
                f"worker:{i}",
                "--host",
                "127.0.0.1",
                "--",
                sys.executable,
                "-S",
                "-c",
                TASK_BINDS,
            ],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]


def _one_round(tmp_path, n):
    windows_file = tmp_path / "windows.json"
    pressure = subprocess.Popen(
        [sys.executable, "-c", PRESSURE, str(windows_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert pressure.stdout.readline().strip() == "ready"
    starters = _start_starters(n)
    ended_at = None
    try:
        ports, reported_at = [], []
        for s in starters:
            line = s.stdout.readline().strip()
            assert line.startswith("MPILAUNCH-TASK-ADDRESS 127.0.0.1:"), line
            ports.append(int(line.rpartition(":")[2]))
            reported_at.append(time.monotonic())
        assert len(set(ports)) == n, "two starters reported the same port"
        for i, s in enumerate(starters):
            s.stdin.write(json.dumps({"env": {"DTF_TASK_INDEX": str(i)}}) + "\n")
            s.stdin.flush()
        bound = [s.stdout.readline().strip() for s in starters]
        ended_at = time.monotonic()
        assert bound == ["BOUND"] * n, bound
    finally:
        for s in starters:
            s.stdin.close()  # the starter stops its task
        codes = [s.wait(timeout=30) for s in starters]
        ended_at = ended_at or time.monotonic()
        windows_file.write_text(json.dumps([[p, t0, ended_at] for p, t0 in zip(ports, reported_at)]))
        pressure.stdin.close()
        verdict = json.loads(pressure.stdout.readline())
        pressure.wait(timeout=30)
    assert codes == [128 + signal.SIGTERM] * n  # stopped by the starter, not crashed
    return verdict


@pytest.mark.slow
def test_reserved_ports_survive_ephemeral_port_pressure(tmp_path):
    """32 tasks on one host, 20 times, while another process keeps taking ephemeral ports."""
    total_bindings = 0
    for _ in range(20):
        verdict = _one_round(tmp_path, 32)
        assert verdict["hits"] == [], f"another process got a reserved port: {verdict['hits']}"
        total_bindings += verdict["bindings"]
    assert total_bindings > 20 * 3000  # the pressure was real


def test_reservation_blocks_ephemeral_binds_and_lets_reuseport_bind():
    from mpilaunch.task_starter import listening_ports, reserve_port

    holder = reserve_port()
    port = holder.getsockname()[1]
    try:
        taken = set()
        for _ in range(2000):
            s = socket.socket()
            s.bind(("0.0.0.0", 0))
            taken.add(s.getsockname()[1])
            s.close()
        assert port not in taken
        plain = socket.socket()
        with pytest.raises(OSError):
            plain.bind(("0.0.0.0", port))  # a program without SO_REUSEPORT/ADDR cannot take it
        plain.close()
        assert port not in listening_ports()  # the holder never listens: it gets no connections
        task = socket.socket()
        task.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        task.bind(("0.0.0.0", port))
        task.listen()
        assert port in listening_ports()
        task.close()
    finally:
        holder.close()


# ------------------------------------------------------------------ TensorFlow


def test_keras_parameter_server_training_with_tf_config_only(tmp_path):
    """1 chief, 2 workers, 1 ps: TF's documented ParameterServerStrategy pattern, TF_CONFIG from mpilaunch."""
    if importlib.util.find_spec("tensorflow") is None:
        require("tensorflow not installed (pip install 'mpilaunch[ps]')")
    name = "pskeras"
    board = importlib.util.find_spec("tensorboard") is not None
    out = tmp_path / "train"
    args = [
        "--name",
        name,
        "--mode",
        "ps",
        "--chief",
        "--workers",
        "2",
        "--ps",
        "1",
        "-o",
        str(out),
        "--output-dir",
        str(tmp_path / "logs"),
        "--timeout",
        "400",
    ]
    if board:
        args.append("--tensorboard")
    started = time.monotonic()
    proc = run_mpilaunch([*args, "--", sys.executable, "examples/ps_keras.py", "--steps", "12"], timeout=480)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "ps_keras.json").read_text())
    report = json.loads((tmp_path / "logs" / "report.json").read_text())
    assert summary["cluster"] == report["cluster"]
    assert summary["steps"] == 12 and summary["loss_after"] < summary["loss_before"]
    assert summary["variable_devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"]
    status = {t["task"]: t["status"] for t in report["tasks"]}
    # ps and worker servers never exit by themselves: mpilaunch's life cycle ended them.
    assert status["chief:0"] == "succeeded"
    assert {status["worker:0"], status["worker:1"], status["ps:0"]} == {"terminated"}
    for task in ("worker:0", "worker:1", "ps:0"):
        assert (
            f"[{task}] {task} serving at grpc://{report['cluster'][task.split(':')[0]][int(task[-1])]}" in proc.stdout
        )
    if board:
        assert status["tensorboard:0"] == "terminated"
        assert f"TensorBoard for {out}: http://127.0.0.1:" in proc.stderr
    assert leftover_processes(name) == []
    print(f"keras PS training took {elapsed:.1f}s")
