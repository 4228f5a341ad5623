"""``mpilaunch-rsh`` against real agents, and under a real ``mpirun``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from mpilaunch.core import inherited
from mpilaunch.rsh_agent import shim
from support.agent import AgentProc, agent_env, session_processes, wait_for_file, wait_until
from support.helpers import REPO

SHIM = [sys.executable, "-m", "mpilaunch.rsh_agent.shim"]


def write_context(path: Path, agents: dict, secret_file: Path, **extra) -> Path:
    context = {
        "job": "testjob",
        "transport": "agent",
        "secret_file": str(secret_file),
        "forward_env": ["PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "SHIM_TEST_VAR"],
        "workers": {host: {"address": a.address} for host, a in agents.items()},
        **extra,
    }
    path.write_text(json.dumps(context))
    return path


@pytest.fixture
def cluster(tmp_path):
    """Two agents named like real workers, reached as hosts w0 and w1."""
    agents = {
        "w0": AgentProc(tmp_path / "a0", name="testjob-worker-0"),
        "w1": AgentProc(tmp_path / "a1", name="testjob-worker-1"),
    }
    ctx = write_context(tmp_path / "context.json", agents, agents["w0"].secret_file)
    env = agent_env()
    env["MPILAUNCH_CONTEXT"] = str(ctx)
    yield agents, env
    for a in agents.values():
        a.stop()


def rsh(args, env, **kwargs):
    kwargs.setdefault("timeout", 30)
    kwargs.setdefault("capture_output", True)
    return subprocess.run(SHIM + list(args), env=env, cwd=REPO, **kwargs)


# --- argument parsing (pure) --------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["w0", "orted", "-mca", '"env"', "--x"], ("w0", 'orted -mca "env" --x', False)),  # Open MPI
        (
            ["w1", '"/usr/bin/hydra_pmi_proxy" --control-port vm:1 --proxy-id 0'],
            ("w1", '"/usr/bin/hydra_pmi_proxy" --control-port vm:1 --proxy-id 0', False),
        ),  # MPICH
        (
            ["-x", "-q", "-o", "StrictHostKeyChecking=no", "-p", "2222", "-l", "me", "-T", "w0", "cmd"],
            ("w0", "cmd", False),
        ),  # Intel MPI
        (["-qxn", "-oBatchMode=yes", "-p22", "user@w1", "a", "b"], ("w1", "a b", True)),
        (["--", "w0", "-x"], ("w0", "-x", False)),
    ],
)
def test_parse_argv(argv, expected):
    assert shim.parse_argv(argv) == expected


@pytest.mark.parametrize("argv", [[], ["w0"], ["-p"], ["-x", "w0"]])
def test_parse_argv_usage_errors(argv):
    with pytest.raises(shim.ArgvError):
        shim.parse_argv(argv)


def test_json_reader_agrees_with_json():
    doc = {
        "job": 'j\u00e9"\\/\n\t',
        "n": [1, -2, 3.5, 1e3, True, False, None],
        "e": {},
        "a": [],
        "w": {"x-0": {"address": "[::1]:4000"}},
        "emoji": "\U0001f600",
    }
    for text in (json.dumps(doc), json.dumps(doc, indent=2), json.dumps(doc, ensure_ascii=False)):
        assert shim.loads_json(text) == json.loads(text)
    with pytest.raises(ValueError):
        shim.loads_json("{bad")


# --- against real agents --------------------------------------------------------------------


def test_openmpi_style_words_are_rejoined(cluster):
    _, env = cluster
    r = rsh(["w0", "printf", "'%s|'", '"a b"', "c", ";", "echo", "$MPILAUNCH_WORKER"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"a b|c|testjob-worker-0\n"


def test_mpich_style_single_command_string(cluster):
    _, env = cluster
    r = rsh(["w1", '"/bin/echo" hydra proxy on $MPILAUNCH_WORKER'], env)
    assert (r.returncode, r.stdout) == (0, b"hydra proxy on testjob-worker-1\n")


def test_intel_style_leading_options_and_no_stdin(cluster):
    _, env = cluster
    r = rsh(
        [
            "-x",
            "-q",
            "-o",
            "StrictHostKeyChecking=no",
            "-p",
            "22",
            "-l",
            "me",
            "-T",
            "w1",
            "echo",
            "intel",
            "$MPILAUNCH_WORKER",
        ],
        env,
    )
    assert (r.returncode, r.stdout) == (0, b"intel testjob-worker-1\n"), r.stderr
    r = rsh(["-n", "w0", "cat"], env, input=b"should not arrive")
    assert (r.returncode, r.stdout) == (0, b"")


def test_stdio_streams_and_exit_status(cluster):
    _, env = cluster
    env = dict(env, SHIM_TEST_VAR="forwarded", NOT_FORWARDED="x")
    r = rsh(
        ["w0", "cat; echo $SHIM_TEST_VAR ${NOT_FORWARDED:-unset}; echo oops >&2; exit 42"], env, input=b"piped in\n"
    )
    assert r.returncode == 42
    assert r.stdout == b"piped in\nforwarded unset\n"
    assert r.stderr == b"oops\n"


def test_forward_env_only_sends_listed_names(tmp_path):
    a = AgentProc(tmp_path / "a", name="solo")
    try:
        ctx = write_context(tmp_path / "ctx.json", {"h": a}, a.secret_file, cwd=str(tmp_path))
        # The agent was started without these, so what the command sees came from the shim.
        env = agent_env()
        env.update(MPILAUNCH_CONTEXT=str(ctx), SHIM_TEST_VAR="yes", NOT_FORWARDED="no")
        r = rsh(["h", "echo $SHIM_TEST_VAR ${NOT_FORWARDED:-unset}; pwd"], env)
        out = r.stdout.decode().splitlines()
        assert out[0] == "yes unset"
        assert os.path.realpath(out[1]) == os.path.realpath(tmp_path)
    finally:
        a.stop()


def test_unknown_host_and_missing_context(cluster):
    _, env = cluster
    r = rsh(["nosuch", "true"], env)
    assert r.returncode == 255
    assert r.stderr.decode().strip() == "mpilaunch-rsh: error: unknown worker 'nosuch' (known: w0, w1)"
    env2 = dict(env)
    del env2["MPILAUNCH_CONTEXT"]
    r = rsh(["w0", "true"], env2)
    assert r.returncode == 255 and b"MPILAUNCH_CONTEXT" in r.stderr


def test_sigterm_to_shim_kills_remote_process_group(cluster, tmp_path):
    agents, env = cluster
    sidfile = tmp_path / "sid"
    p = subprocess.Popen(
        SHIM + ["w0", f"echo $MPILAUNCH_SESSION > {sidfile}; sleep 300 & sleep 300; wait"], env=env, cwd=REPO
    )
    sid = wait_for_file(sidfile)
    assert wait_until(lambda: len(session_processes(sid)) >= 3)
    p.send_signal(signal.SIGTERM)
    assert p.wait(15) == 128 + signal.SIGTERM
    assert wait_until(lambda: not session_processes(sid), 10), session_processes(sid)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_sigint_and_sighup_are_forwarded(cluster, tmp_path, sig):
    _, env = cluster
    sidfile = tmp_path / "sid"
    p = subprocess.Popen(SHIM + ["w1", f"echo $MPILAUNCH_SESSION > {sidfile}; exec sleep 300"], env=env, cwd=REPO)
    sid = wait_for_file(sidfile)
    assert wait_until(lambda: session_processes(sid))
    p.send_signal(sig)
    assert p.wait(15) == 128 + sig
    assert wait_until(lambda: not session_processes(sid), 10), session_processes(sid)


def test_remote_side_that_survives_the_signal_is_killed_after_the_grace(tmp_path):
    """Background jobs of a non-interactive sh ignore SIGINT; the shim hangs up
    after the context's signal_grace and the agent kills the rest."""
    a = AgentProc(tmp_path / "a", name="solo")
    try:
        ctx = write_context(tmp_path / "ctx.json", {"h": a}, a.secret_file, signal_grace=0.5)
        env = dict(agent_env(), MPILAUNCH_CONTEXT=str(ctx))
        sidfile = tmp_path / "sid"
        p = subprocess.Popen(SHIM + ["h", f"echo $MPILAUNCH_SESSION > {sidfile}; sleep 300 & wait"], env=env, cwd=REPO)
        sid = wait_for_file(sidfile)
        assert wait_until(lambda: len(session_processes(sid)) >= 2)
        p.send_signal(signal.SIGINT)
        assert p.wait(15) == 128 + signal.SIGINT
        assert wait_until(lambda: not session_processes(sid), 10), session_processes(sid)
    finally:
        a.stop()


def test_sigkill_to_shim_kills_remote_side(cluster, tmp_path):
    agents, env = cluster
    sidfile = tmp_path / "sid"
    p = subprocess.Popen(SHIM + ["w1", f"echo $MPILAUNCH_SESSION > {sidfile}; sleep 300"], env=env, cwd=REPO)
    sid = wait_for_file(sidfile)
    p.kill()
    p.wait()
    assert wait_until(lambda: not session_processes(sid), 10), session_processes(sid)


def test_connection_loss_exits_255(cluster, tmp_path):
    agents, env = cluster
    sidfile = tmp_path / "sid"
    p = subprocess.Popen(
        SHIM + ["w0", f"echo $MPILAUNCH_SESSION > {sidfile}; sleep 300"], env=env, cwd=REPO, stderr=subprocess.PIPE
    )
    sid = wait_for_file(sidfile)
    agents["w0"].proc.kill()  # no chance to clean up: the connection just dies
    try:
        assert p.wait(15) == 255
        assert b"lost connection" in p.stderr.read()
    finally:
        for pid in session_processes(sid):
            psutil.Process(pid).kill()


def test_fast_launcher(cluster, tmp_path):
    _, env = cluster
    launcher = shim.write_launcher(str(tmp_path / "mpilaunch-rsh"))
    r = subprocess.run([launcher, "-x", "w1", "echo", "$MPILAUNCH_WORKER"], env=env, capture_output=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, b"testjob-worker-1\n"), r.stderr


# --- a real mpirun ------------------------------------------------------------------------------


def _mpiruns():
    found = []
    for path in (shutil.which("mpirun"), "/usr/bin/mpirun.openmpi", "/usr/bin/mpirun.mpich"):
        if path and os.access(path, os.X_OK):
            real = os.path.realpath(path)
            if real not in [os.path.realpath(p) for p in found]:
                found.append(path)
    return found or [None]


def _flavour(mpirun: str) -> tuple[str, str]:
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    if "Open MPI" in out or "OpenRTE" in out:
        major = re.search(r"(\d+)\.\d+", out).group(1)
        return "openmpi", major
    return "hydra", ""


def _where_it_stuck(agents) -> str:
    tree = subprocess.run(
        ["ps", "-eo", "pid,ppid,stat,wchan:20,etime,args", "--forest"], capture_output=True, text=True
    )
    logs = "\n".join(f"--- agent {name}:\n{a.log()}" for name, a in agents.items())
    return f"{logs}\n--- processes:\n{tree.stdout}"


@pytest.mark.mpi
@pytest.mark.parametrize("mpirun", _mpiruns())
def test_real_mpirun_places_ranks_on_the_assigned_agents(mpirun, cluster, tmp_path):
    if mpirun is None:
        pytest.skip("mpirun not found")
    agents, env = cluster
    agent_exe = shim.write_launcher(str(tmp_path / "mpilaunch-rsh"))
    flavour, major = _flavour(mpirun)
    # the shell's launch settings (an image's OMPI_MCA_plm=isolated) out, as mpilaunch leaves them out
    kept, _ = inherited.split(env, flavour)
    env.clear()
    env.update(kept)
    rank_cmd = ["sh", "-c", 'echo "rank=${OMPI_COMM_WORLD_RANK:-$PMI_RANK} worker=$MPILAUNCH_WORKER"']
    if flavour == "openmpi":
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("w0 slots=1\nw1 slots=1\n")
        env.update(
            OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
            PRTE_MCA_plm_ssh_agent=agent_exe,
            PRTE_MCA_plm_ssh_no_tree_spawn="1",
            OMPI_MCA_plm_rsh_agent=agent_exe,
            OMPI_MCA_plm_rsh_no_tree_spawn="1",
        )
        argv = [mpirun, "--mca", "plm_rsh_agent", agent_exe, "--hostfile", str(hostfile), "-np", "2", *rank_cmd]
    else:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("w0:1\nw1:1\n")
        env.update(HYDRA_LAUNCHER="rsh", HYDRA_LAUNCHER_EXEC=agent_exe)
        argv = [mpirun, "-f", str(hostfile), "-np", "2", *rank_cmd]
    try:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    except subprocess.TimeoutExpired as stuck:
        # Seen once in a full suite's load (Open MPI 5, both rank lines out, mpirun never exited;
        # 0 of 400 alone under load): what each agent's session and the process tree said.
        pytest.fail(f"mpirun did not exit: {stuck.output!r}\n{_where_it_stuck(agents)}")
    assert r.returncode == 0, f"{argv}\n{r.stdout}\n{r.stderr}"
    lines = sorted(line for line in r.stdout.splitlines() if line.startswith("rank="))
    assert lines == ["rank=0 worker=testjob-worker-0", "rank=1 worker=testjob-worker-1"], r.stdout + r.stderr
    # Both daemons really went through the agents (not forked next to mpirun).
    for a in agents.values():
        assert wait_until(lambda: "end status=" in a.log(), 10), a.log()
