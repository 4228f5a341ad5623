"""Bad input: exit 2, one `mpilaunch: error:` line plus a hint, nothing started."""

import subprocess
import sys

import psutil
import pytest


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "mpilaunch", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def agents_of(job: str) -> list:
    """Agents of one job (other jobs may run on this machine at the same time)."""
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "mpilaunch.agent" in (p.info["cmdline"] or []) and any(job in a for a in p.info["cmdline"])]


CASES = {
    "gpus-zero": (["--gpus", "0", "--", "true"], "--gpus must be at least 1"),
    "gpus-not-multiple": (["--gpus", "12", "--gpus-per-node", "8", "--", "true"], "not a multiple"),
    "no-command": (["--np", "2"], "no command given"),
    "no-command-after-dashes": (["--np", "2", "--"], "no command given"),
    "unknown-backend": (["--backend", "slurm", "--np", "2", "--", "true"], "unknown backend 'slurm'"),
    "negative-timeout": (["--np", "2", "--timeout", "-5", "--", "true"], "--timeout must be positive"),
    "missing-mpirun": (["--np", "2", "--mpirun", "/nonexistent/mpirun", "--", "true"], "not found"),
    "unknown-mpirun": (["--np", "2", "--mpirun", "/bin/echo", "--", "true"],
                       "cannot tell which MPI /bin/echo is: its --version printed 'echo (GNU coreutils)"),
    "unreadable-hostfile": (["--hostfile", "/nonexistent/hosts", "--", "true"], "cannot read hostfile"),
    "bad-option": (["--np", "two", "--", "true"], "invalid int value"),
    "unknown-mpi": (["--np", "2", "--mpi", "lam", "--", "true"], "unknown MPI flavour"),
    "cluster-launcher-local": (["--np", "2", "--launcher", "cluster", "--", "true"], "--launcher cluster needs a cluster backend"),
    "bad-name": (["--np", "2", "--name", "Bad_Name", "--", "true"], "invalid job name"),
    "bad-orphan-timeout": (["--backend", "k8s", "--np", "2", "--orphan-timeout", "1", "--", "true"],
                           "--orphan-timeout must be a finite number of seconds, at least 3"),
    "pod-memory-not-a-quantity": (["--np", "2", "--backend", "k8s", "--image", "x", "--pod-memory", "8GB", "--", "true"],
                                  "--pod-memory '8GB' is not a Kubernetes quantity"),
    "negative-retries": (["--np", "2", "--retries", "-1", "--", "true"], "--retries must be 0 or more"),
    "retry-rank-failures-alone": (["--np", "2", "--retry-rank-failures", "--", "true"], "needs --retries N"),
    "retries-ps": (["--mode", "ps", "--workers", "2", "--retries", "1", "--", "true"], "not PS jobs"),
    "retries-detach": (["--np", "2", "--backend", "k8s", "--image", "x", "--retries", "1", "--detach", "--", "true"],
                       "--retries needs this mpilaunch to stay"),
    "detach-local": (["--np", "2", "--detach", "--", "true"], "--detach needs a cluster backend"),
    "detach-local-launcher": (["--np", "2", "--backend", "k8s", "--image", "x", "--launcher", "local", "--detach",
                               "--", "true"], "--detach needs the launcher in the cluster"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exits_2_with_one_clear_line(case):
    args, expected = CASES[case]
    job = f"bad-{case}"
    if "--name" not in args:
        args = ["--name", job, *args]
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("mpilaunch: error: "), proc.stderr
    assert expected in lines[0]
    assert "Traceback" not in proc.stderr
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("  hint: "))
    assert agents_of(job) == []


def test_mpirun_missing_from_path_is_exit_2(tmp_path):
    # An empty PATH plus a flavour PyPI does not provide: nothing to find.
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    proc = run_cli("--np", "2", "--mpi", "intel", "--", "true", env=env)
    assert proc.returncode == 2
    assert "no mpirun found" in proc.stderr and "hint:" in proc.stderr


def test_help_works():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "--gpus" in proc.stdout


def test_version_is_the_installed_packages():
    """`mpilaunch --version` says what pip installed (pyproject's version, not a second copy gone stale)."""
    from importlib.metadata import version

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"mpilaunch {version('mpilaunch')}", proc


@pytest.mark.parametrize("argv", [["--mpi-args", "-verbose"], ["--mpi-args=-verbose"], ["--mpi-args", "--mca btl tcp"]])
def test_mpi_args_may_start_with_a_dash(argv):
    """`--mpi-args -verbose` is a value, not an unknown option (argparse alone says "expected one argument")."""
    from mpilaunch.cli import parse_run

    spec, _ = parse_run(["--np", "2", *argv, "--", "true"])
    assert spec.mpi_args == tuple(argv[-1].split("=", 1)[-1].split()), spec.mpi_args
