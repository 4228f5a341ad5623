"""mpilaunch run by a regular user, not root.

Every other test runs as root. Here an unprivileged user (``mpilaunch-user``,
made by scripts/nonroot-user.sh together with that user's own venv: Debian's
python3 with Debian's psutil, the k8s and yarn extras from PyPI, mpilaunch
from this checkout) runs the ``mpilaunch`` command of its own venv, with a
clean environment (its HOME, PATH with its venv first, nothing of root's:
no OMPI_ALLOW_RUN_AS_ROOT, no root venv or pyenv, which /root's mode 700 hides
from it anyway) in a directory it owns, and Debian's system-wide Open MPI 4.1
(``/usr/bin/mpirun.openmpi``). Only what needs root stays root: making the
user, starting the testbeds, copying the cluster's client configuration where
the user can read it, and looking at what is left afterwards.

* local backend: a job, a failing rank, Ctrl-C and SIGKILL of mpilaunch; after
  each, no process of the user's uid may be left, nor a run directory.
* Kubernetes (kwok testbed) and YARN: the client side of one job (mpilaunch,
  mpirun, the shims, the exec relay, skein's driver) as the user; the
  cluster's side (kwok's exec, the NodeManagers' containers) runs as the
  testbeds run it, as root.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from mpilaunch.core.exit_codes import EXIT_TIMEOUT
from support.helpers import REPO, login_user_alone, wait_for, wait_started
from support.k8s import forget_pod_env, give_pods_their_env, leftover_objects
from support.mpi_installs import installs, require
from support.yarn import app_by_name, assert_released

USER = os.environ.get("MPILAUNCH_NONROOT_USER", "mpilaunch-user")
MPIRUN = "/usr/bin/mpirun.openmpi"  # Debian's Open MPI 4.1: system-wide, readable by every user
SETUP = REPO / "scripts" / "nonroot-user.sh"

# Each rank says who it is, where it ran and as whom.
RANK_INFO = (
    "import json, os; print('RANKINFO ' + json.dumps({'rank': int(os.environ['OMPI_COMM_WORLD_RANK']), "
    "'worker': os.environ.get('MPILAUNCH_WORKER'), 'uid': os.getuid(), 'euid': os.geteuid()}), flush=True)"
)
FAIL_RANK = str(REPO / "tests" / "programs" / "fail_rank.py")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path
    venv: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def env(self, workdir: Path, **extra: str) -> dict:
        """A login-like environment of the user's own: nothing inherited from root's."""
        env = {
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "SHELL": "/bin/bash",
            "PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "TMPDIR": str(workdir / "tmp"),  # where the run directories go: looked at after each job
        }
        env.update(extra)
        return env

    def popen(self, argv, workdir: Path, env: dict, **kw) -> subprocess.Popen:
        """Start ``argv`` as the user (its uid, its group, no supplementary group of root's)."""
        return subprocess.Popen(
            argv,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            umask=0o022,
            cwd=workdir,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **kw,
        )

    def processes(self) -> list[str]:
        """Every process of this uid still alive. A zombie counts when its parent is a live process
        that failed to reap it, not when init adopted it (mpirun leaves its rsh agents' exits to
        init; this machine's init reaps them up to ~1.5 s late): nothing of it runs any more."""
        found = []
        for p in psutil.process_iter(["pid", "ppid", "uids", "cmdline", "status"]):
            uids = p.info["uids"]
            if p.info["status"] == psutil.STATUS_ZOMBIE and p.info["ppid"] == 1:
                continue
            if uids and self.uid in (uids.real, uids.effective):
                found.append(f"{p.info['pid']} [{p.info['status']}]: {' '.join(p.info['cmdline'] or [])[:150]}")
        return found


@pytest.fixture(scope="session")
def nonroot():
    """The user and its venv (scripts/nonroot-user.sh: ~1 s when cached, ~20-40 s from nothing)."""
    if os.geteuid() != 0:
        require("the non-root tests create a user: run them as root")
    if not os.access(MPIRUN, os.X_OK):
        require(f"{MPIRUN} not installed (apt-get install openmpi-bin; ./scripts/test does)")
    with login_user_alone():  # the script may (re)create the user: not under another session's test
        return _user()


def _user() -> User:
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        require(f"{SETUP.name} failed ({done.returncode}): {done.stderr[-3000:]}")
    print(f"{done.stderr}nonroot: user and venv ready in {time.monotonic() - t0:.1f}s")
    pw = pwd.getpwnam(USER)
    return User(USER, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir), Path(done.stdout.strip().splitlines()[-1]))


@pytest.fixture
def workdir(nonroot):
    """A directory the user owns (pytest's tmp_path is root's, mode 700), with a TMPDIR inside it."""
    d = Path(tempfile.mkdtemp(prefix="mpilaunch-nonroot-"))
    (d / "tmp").mkdir()
    for p in (d, d / "tmp"):
        os.chown(p, nonroot.uid, nonroot.gid)
        p.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def nothing_left(nonroot):
    """No process of the user may be alive before a test, and none after it (within a few seconds);
    the user is this test's alone meanwhile."""
    with login_user_alone():
        assert nonroot.processes() == [], "processes of the user left by someone else"
        yield
        wait_for(lambda: not nonroot.processes(), 15, f"every process of {nonroot.name} to end: {nonroot.processes()}")


def run_dirs(workdir: Path) -> list[str]:
    return sorted(p.name for p in (workdir / "tmp").iterdir())


def only_the_summary(stderr: str, job: str) -> bool:
    """-q: nothing on stderr but the closing summary's one line (no warning of a mixed venv, no
    traceback); the ranks' own output is on stdout."""
    lines = stderr.splitlines()
    return len(lines) == 1 and lines[0].startswith(f"mpilaunch: job {job} succeeded in ")


def rank_infos(stdout: str) -> list[dict]:
    return sorted(
        (json.loads(line.split("RANKINFO ", 1)[1]) for line in stdout.splitlines() if "RANKINFO " in line),
        key=lambda r: r["rank"],
    )


def wait_started_or_kill(proc, count: int) -> None:
    """helpers.wait_started, killing the job when its ranks never came (nothing of the user may stay)."""
    try:
        wait_started(proc, count, timeout=120)
    except AssertionError:
        proc.kill()
        proc.communicate()
        raise


def communicate_or_stop(proc, timeout: float) -> tuple[str, str]:
    """The job's output once it ended; a job still running when that fails (a timeout) gets
    SIGTERM, as a user's Ctrl-C would, so its cleanup runs before the test's checks."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)


def local_job(nonroot, workdir, name: str, *args: str, env=None, **popen):
    """``mpilaunch --mpirun MPIRUN --name NAME --np 4 --slots-per-worker 2 -q ARGS...`` as the user."""
    return nonroot.popen(
        ["mpilaunch", "--mpirun", MPIRUN, "--name", name, "--np", "4", "--slots-per-worker", "2", "-q", *args],
        workdir,
        env or nonroot.env(workdir),
        **popen,
    )


# ------------------------------------------------------------------ local backend


@pytest.mark.mpi
def test_nonroot_local_job_runs_every_rank_as_the_user(nonroot, workdir, nothing_left):
    """4 ranks on 2 local workers: every rank ran as the user on its planned worker (mpilaunch's
    own placement check passed too), the rank logs and report.json are the user's, the run
    directory is gone."""
    name = "nonroot-ok"
    out_dir = workdir / "out"
    proc = local_job(
        nonroot, workdir, name, "--output-dir", str(out_dir), "--", "python3", "-c", RANK_INFO, env=nonroot.env(workdir)
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert only_the_summary(err, name), err
    ranks = rank_infos(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], out
    assert [r["worker"] for r in ranks] == [f"{name}-worker-0"] * 2 + [f"{name}-worker-1"] * 2
    assert {(r["uid"], r["euid"]) for r in ranks} == {(nonroot.uid, nonroot.uid)}
    report = json.loads((out_dir / "report.json").read_text())
    assert report["exit_code"] == 0
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    for path in [out_dir, *out_dir.iterdir()]:
        assert path.stat().st_uid == nonroot.uid, path
    assert '"rank": 3' in (out_dir / "rank-3.log").read_text()
    assert run_dirs(workdir) == []


@pytest.mark.mpi
def test_nonroot_local_rank_failure_exit_code_names_the_rank(nonroot, workdir, nothing_left):
    name = "nonroot-fail"
    proc = local_job(
        nonroot, workdir, name, "--", "python3", FAIL_RANK, env=nonroot.env(workdir, FAIL_RANK="3", FAIL_CODE="7")
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, out + err
    assert f"rank 3 on worker {name}-worker-1 exited with code 7" in err, err
    assert "rank 3 about to fail" in err  # its last lines
    assert run_dirs(workdir) == []


@pytest.mark.mpi
def test_nonroot_local_ctrl_c_exits_130_and_leaves_nothing(nonroot, workdir, nothing_left):
    name = "nonroot-int"
    proc = local_job(
        nonroot,
        workdir,
        name,
        "--",
        "python3",
        FAIL_RANK,
        env=nonroot.env(workdir, FAIL_RANK="-1", SLEEP="300"),
        start_new_session=True,
    )
    wait_started_or_kill(proc, 4)
    assert len(nonroot.processes()) >= 8  # mpilaunch, 2 agents, mpirun, shims/daemons, 4 ranks
    # Ctrl-C: the terminal sends SIGINT to its foreground process group, mpilaunch's (started
    # here as a shell starts a job, in a group of its own) with whatever of the job stayed in it.
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err, err
    wait_for(lambda: not nonroot.processes(), 10, "every process of the job to end")
    assert run_dirs(workdir) == []


@pytest.mark.mpi
def test_nonroot_local_sigkill_of_mpilaunch_leaves_nothing_behind(nonroot, workdir, nothing_left):
    """SIGKILL runs no cleanup: the agents (--exit-with-pid) end with their sessions, mpirun and
    the ranks follow; no process of the user is left a few seconds later."""
    name = "nonroot-kill"
    proc = local_job(
        nonroot, workdir, name, "--", "python3", FAIL_RANK, env=nonroot.env(workdir, FAIL_RANK="-1", SLEEP="300")
    )
    wait_started_or_kill(proc, 4)
    before = nonroot.processes()
    assert len(before) >= 8, before
    proc.kill()
    proc.communicate(timeout=10)
    t0 = time.monotonic()
    wait_for(lambda: not nonroot.processes(), 10, "every process of the user to end")
    print(f"nonroot sigkill: {len(before)} processes gone {time.monotonic() - t0:.1f}s after SIGKILL")
    # The workers' private TMPDIRs (their Open MPI session dirs inside), mpirun's session dir and
    # mpilaunch's own run directory (its secret inside) are gone: SIGKILL gave mpilaunch no
    # cleanup, its agents (--orphan-cleanup) removed it on their way out.
    wait_for(lambda: run_dirs(workdir) == [], 5, "the run directory to be removed")


HANG = REPO / "tests" / "programs" / "hang.py"
# the lines hang.py marks "# STUCK: <mode>" (as tests/e2e/local/test_hang.py finds them)
HANG_LINES = {
    line.split("STUCK: ", 1)[1].split()[0]: i
    for i, line in enumerate(HANG.read_text().splitlines(), 1)
    if "STUCK: " in line
}


@pytest.mark.mpi
@pytest.mark.parametrize("mode,odd,mine", [("sleep", 1, "time.sleep"), ("busy", 2, "spin"), ("recv", 3, "comm.Recv")])
def test_nonroot_local_hang_without_py_spy_names_the_rank(nonroot, workdir, nothing_left, mode, odd, mine):
    """The user's venv has no py-spy: at --timeout the stacks come from the faulthandler mpilaunch's
    sitecustomize armed in each rank, read back through /proc by the user's own probe; the verdict
    names the injected rank. (mpi4py: the suite's Open MPI 4 build, copied where the user reads it.)"""
    site = workdir / "py"
    shutil.copytree(installs()["openmpi4"].pythonpath, site, symlinks=True)
    name = f"nonroot-hang-{mode}"
    out_dir = workdir / "out"
    proc = local_job(
        nonroot,
        workdir,
        name,
        "--timeout",
        "8",
        "--output-dir",
        str(out_dir),
        "--",
        "python3",
        str(HANG),
        mode,
        str(odd),
        env=nonroot.env(workdir, PYTHONPATH=str(site)),
    )
    out, err = communicate_or_stop(proc, 120)
    assert proc.returncode == EXIT_TIMEOUT, out + err
    verdict = [line for line in err.splitlines() if line.startswith("mpilaunch: hang:")]
    others = HANG_LINES["others-recv" if mode == "recv" else "others"]
    assert verdict == [
        f"mpilaunch: hang: rank {odd} ({name}-worker-{odd // 2}) is in {mine} at hang.py:"
        f"{HANG_LINES[mode]}; the 3 other ranks are in comm.{'Barrier' if mode == 'recv' else 'Allreduce'}"
        f" at hang.py:{others}"
    ], err
    report = json.loads((out_dir / "report.json").read_text())
    assert {s["tool"] for s in report["stacks"]} == {"faulthandler"}, report["stacks"]
    assert run_dirs(workdir) == []


def test_nonroot_unwritable_output_dir_is_a_usage_error(nonroot, workdir, nothing_left):
    """A directory only root may write (root's home): exit 2 with the OS's reason, before any
    worker exists."""
    proc = nonroot.popen(
        ["mpilaunch", "--mpirun", MPIRUN, "--np", "2", "-q", "--output-dir", "/root/mpilaunch-out", "--", "true"],
        workdir,
        nonroot.env(workdir),
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, out + err
    assert "mpilaunch: error: cannot create --output-dir /root/mpilaunch-out: Permission denied" in err, err
    assert "Traceback" not in err
    assert not Path("/root/mpilaunch-out").exists()
    assert run_dirs(workdir) == []


# ------------------------------------------------------------------ Kubernetes (client side)


@pytest.mark.k8s
def test_nonroot_k8s_job_client_side(kube, nonroot, workdir, nothing_left, tmp_path):
    """mpilaunch --backend k8s --launcher local as the user, with a kubeconfig of its own: 4 ranks
    in 2 pods through the exec API. The pods' side is kwok's (root); the user's side ends clean."""

    job = "nonroot-k8s"
    kubeconfig = workdir / "kubeconfig"
    shutil.copyfile(kube.kubeconfig, kubeconfig)
    os.chown(kubeconfig, nonroot.uid, nonroot.gid)
    kubeconfig.chmod(0o600)
    give_pods_their_env(kube, job, 2, tmp_path)
    out_dir = workdir / "out"
    try:
        proc = nonroot.popen(
            [
                "mpilaunch",
                "--backend",
                "k8s",
                "--image",
                "mpilaunch:test",
                "--mpirun",
                MPIRUN,
                "--name",
                job,
                "--np",
                "4",
                "--slots-per-worker",
                "2",
                "--launcher",
                "local",
                "-q",
                "--output-dir",
                str(out_dir),
                "--",
                nonroot.python,
                "-c",
                RANK_INFO,
            ],
            workdir,
            nonroot.env(
                workdir, KUBECONFIG=str(kubeconfig), MPILAUNCH_K8S_PYTHON=nonroot.python, MPILAUNCH_K8S_TOOLS="image"
            ),
        )
        out, err = communicate_or_stop(proc, 180)
    finally:
        forget_pod_env(kube, job, 2)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert only_the_summary(err, job), err
    ranks = rank_infos(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], out
    # each rank came through its own pod's exec (kwok runs it as root)
    assert [r["worker"] for r in ranks] == [f"{job}-worker-0"] * 2 + [f"{job}-worker-1"] * 2
    report = json.loads((out_dir / "report.json").read_text())
    assert report["exit_code"] == 0
    assert leftover_objects(kube, job) == []
    assert run_dirs(workdir) == []


# ------------------------------------------------------------------ YARN (client side)


def yarn_client_for(nonroot: User, yarn, workdir: Path) -> dict:
    """What a user of a YARN cluster has on its machine, readable by it: the Hadoop client jars
    and a `yarn classpath` (all skein asks of `yarn`), the cluster's configuration, a home on
    the cluster's file system for skein's staging, and skein's own config directory. The
    testbed's copies are in root's cache (mode 700) or its workdir (700): copied here."""
    from testbeds.yarn.hadoop import CLIENT_DIR

    client = workdir / "hadoop-client"
    shutil.copytree(CLIENT_DIR, client / "jars")
    (client / "bin").mkdir()
    (client / "bin" / "yarn").write_text(
        "#!/bin/sh\n# `yarn classpath [--glob]`, the one command skein's driver runs\n"
        '[ "$1" = classpath ] || { echo "yarn: only classpath here" >&2; exit 1; }\n'
        f'printf "%s:" "$HADOOP_CONF_DIR" {client}/jars/*.jar | sed "s/:$//"; echo\n'
    )
    (client / "bin" / "yarn").chmod(0o755)
    conf = workdir / "hadoop-conf"
    shutil.copytree(yarn.env["HADOOP_CONF_DIR"], conf)
    # The staging home (viewfs home dir + /<user>) was under the testbed's workdir: the user's
    # own one instead, on the same viewfs (its fallback is the local file system).
    home = workdir / "dfs-home"
    (home / nonroot.name).mkdir(parents=True)
    core = conf / "core-site.xml"
    tree = ET.parse(core)
    homes = [p for p in tree.getroot().iter("property") if p.findtext("name", "").endswith(".homedir")]
    assert homes, "the testbed's core-site.xml names no viewfs home dir"
    for p in homes:
        p.find("value").text = str(home)
    tree.write(core)
    (workdir / "skein").mkdir()
    for dirpath, dirnames, filenames in os.walk(workdir):
        for n in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
            os.chown(n, nonroot.uid, nonroot.gid)
    java_home = yarn.env["JAVA_HOME"]
    return {
        "PATH": f"{nonroot.venv / 'bin'}:{client / 'bin'}:{java_home}/bin:/usr/local/bin:/usr/bin:/bin",
        "JAVA_HOME": java_home,
        "HADOOP_CONF_DIR": str(conf),
        "YARN_CONF_DIR": str(conf),
        "SKEIN_CONFIG": str(workdir / "skein"),
        "SKEIN_DRIVER_JAVA_OPTIONS": yarn.env["SKEIN_DRIVER_JAVA_OPTIONS"],
    }


@pytest.mark.yarn
def test_nonroot_yarn_job_client_side(yarn, nonroot, workdir, nothing_left):
    """mpilaunch --backend yarn --launcher local as the user: skein's driver, mpirun and the
    shims are the user's; 4 ranks in 2 containers (the NodeManagers run them as the testbed's
    user, root). The application is the user's, SUCCEEDED, and every container released."""

    name = "nonroot-yarn"
    env = nonroot.env(workdir, **yarn_client_for(nonroot, yarn, workdir))
    proc = nonroot.popen(
        [
            "mpilaunch",
            "--backend",
            "yarn",
            "--mpirun",
            MPIRUN,
            "--name",
            name,
            "--launcher",
            "local",
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--memory",
            "512 MiB",
            "--vcores",
            "1",
            "-q",
            "--",
            nonroot.python,
            "-c",
            RANK_INFO,
        ],
        workdir,
        env,
    )
    out, err = communicate_or_stop(proc, 240)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert only_the_summary(err, name), err
    ranks = rank_infos(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], out
    assert [r["worker"] for r in ranks] == [f"{name}-worker-0"] * 2 + [f"{name}-worker-1"] * 2
    app = app_by_name(yarn, name)
    assert app["user"] == nonroot.name, app
    assert_released(yarn, name, "SUCCEEDED")
    assert run_dirs(workdir) == []
