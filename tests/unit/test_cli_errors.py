"""Bad input: exit 2, one `mpilaunch: error:` line plus a hint, nothing started."""

import os
import subprocess
import sys

import pytest

from support.helpers import agent_workers


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args], capture_output=True, text=True, timeout=60, env=env
    )


def agents_of(job: str) -> list:
    """Agents of one job (other jobs may run on this machine at the same time)."""
    return [pid for pid, worker in agent_workers().items() if worker.startswith(job + "-")]


CASES = {
    "gpus-zero": (["--gpus", "0", "--", "true"], "--gpus must be at least 1"),
    "gpus-not-multiple": (["--gpus", "12", "--gpus-per-node", "8", "--", "true"], "not a multiple"),
    "no-command": (["--np", "2"], "no command given"),
    "no-command-after-dashes": (["--np", "2", "--"], "no command given"),
    "unknown-backend": (["--backend", "slurm", "--np", "2", "--", "true"], "unknown backend 'slurm'"),
    "negative-timeout": (["--np", "2", "--timeout", "-5", "--", "true"], "--timeout must be positive"),
    "missing-mpirun": (["--np", "2", "--mpirun", "/nonexistent/mpirun", "--", "true"], "not found"),
    "unknown-mpirun": (
        ["--np", "2", "--mpirun", "/bin/echo", "--", "true"],
        "cannot tell which MPI /bin/echo is: its --version printed 'echo (GNU coreutils)",
    ),
    "unreadable-hostfile": (
        ["--backend", "local", "--hostfile", "/nonexistent/hosts", "--", "true"],
        "cannot read hostfile",
    ),
    "bad-option": (["--np", "two", "--", "true"], "invalid int value"),
    "unknown-mpi": (["--np", "2", "--mpi", "lam", "--", "true"], "unknown MPI flavour"),
    "cluster-launcher-local": (
        ["--np", "2", "--launcher", "cluster", "--", "true"],
        "--launcher cluster needs a cluster backend",
    ),
    "bad-name": (["--np", "2", "--name", "Bad_Name", "--", "true"], "invalid job name"),
    "bad-orphan-timeout": (
        ["--backend", "k8s", "--np", "2", "--orphan-timeout", "1", "--", "true"],
        "--orphan-timeout must be a finite number of seconds, at least 3",
    ),
    "pod-memory-not-a-quantity": (
        ["--np", "2", "--backend", "k8s", "--image", "x", "--pod-memory", "8GB", "--", "true"],
        "--pod-memory '8GB' is not a Kubernetes quantity",
    ),
    "negative-retries": (["--np", "2", "--retries", "-1", "--", "true"], "--retries must be 0 or more"),
    "retry-rank-failures-alone": (["--np", "2", "--retry-rank-failures", "--", "true"], "needs --retries N"),
    "retries-ps": (["--mode", "ps", "--workers", "2", "--retries", "1", "--", "true"], "not PS jobs"),
    "retries-detach": (
        ["--np", "2", "--backend", "k8s", "--image", "x", "--retries", "1", "--detach", "--", "true"],
        "--retries needs this mpilaunch to stay",
    ),
    "detach-local": (["--np", "2", "--detach", "--", "true"], "--detach needs a cluster backend"),
    "detach-local-launcher": (
        ["--np", "2", "--backend", "k8s", "--image", "x", "--launcher", "local", "--detach", "--", "true"],
        "--detach needs the launcher in the cluster",
    ),
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


def test_help_names_every_subcommand_and_each_has_its_own_help():
    # cli.SUBCOMMANDS is the one list: what --help names is what dispatch runs
    from mpilaunch import cli

    listed = run_cli("--help").stdout.split("other commands:")[1].split("(")[0].replace(",", " ").split()
    assert listed == [name for name in cli.SUBCOMMANDS if name != "run"]
    assert {"render", "status", "logs", "delete", "wait", "rbac", "agent"} <= set(listed)
    for name in listed:
        usage = "usage: mpilaunch [run]" if name == "render" else f"usage: mpilaunch {name}"  # render takes run's
        proc = run_cli(name, "--help")
        assert proc.returncode == 0 and proc.stdout.startswith(usage), (name, proc.stdout[:200], proc.stderr)


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


# Issue 24, items 8: inputs that got a traceback, a hang or a wrong meaning.
# "{kubeconfig}" stands for a kubeconfig whose API server is nowhere: these
# must fail on their own, before any cluster is contacted.
K8S = ["--backend", "k8s", "--image", "x", "--kubeconfig", "{kubeconfig}"]
STRICT_CASES = {
    "timeout-nan-does-not-run": (
        ["--np", "2", "--timeout", "nan", "--", "true"],
        "--timeout must be positive and finite (seconds), got nan",
    ),
    "timeout-inf": (
        ["--np", "2", "--timeout", "inf", "--", "true"],
        "--timeout must be positive and finite (seconds), got inf",
    ),
    "timeout-zero": (
        ["--np", "2", "--timeout", "0", "--", "true"],
        "--timeout must be positive and finite (seconds), got 0",
    ),
    "start-timeout-nan": (
        ["--np", "2", "--start-timeout", "nan", "--", "true"],
        "--start-timeout must be positive and finite (seconds), got nan",
    ),
    "k8s-timeout-inf": (
        [*K8S, "--np", "2", "--timeout", "inf", "--", "true"],
        "--timeout must be positive and finite (seconds), got inf",
    ),
    "k8s-start-timeout-inf": (
        [*K8S, "--np", "2", "--start-timeout", "inf", "--", "true"],
        "--start-timeout must be positive and finite (seconds), got inf",
    ),
    "k8s-start-timeout-nan-dry-run": (
        ["--backend", "k8s", "--image", "x", "--np", "2", "--start-timeout", "nan", "--dry-run", "--", "true"],
        "--start-timeout must be positive and finite (seconds), got nan",
    ),
    "k8s-orphan-timeout-nan": (
        [*K8S, "--np", "2", "--orphan-timeout", "nan", "--", "true"],
        "--orphan-timeout must be a finite number of seconds",
    ),
    "wait-timeout-nan": (
        ["wait", "--backend", "k8s", "--kubeconfig", "{kubeconfig}", "--timeout", "nan", "somejob"],
        "--timeout must be positive and finite (seconds), got nan",
    ),
    "mpi-args-unbalanced-quote": (
        ["--np", "2", "--mpi-args", '--mca "x', "--", "true"],
        "cannot split --mpi-args '--mca \"x': no closing quotation",
    ),
    "name-with-trailing-newline": (
        ["--np", "2", "--name", "ab\n", "--dry-run", "--", "true"],
        "invalid job name 'ab\\n'",
    ),
    "env-name-with-trailing-newline": (["--np", "2", "-x", "FOO\n", "--dry-run", "--", "true"], "invalid -x 'FOO\\n'"),
    "pod-memory-with-trailing-newline": (
        ["--backend", "k8s", "--image", "x", "--np", "2", "--pod-memory", "8Gi\n", "--dry-run", "--", "true"],
        "is not a Kubernetes quantity",
    ),
    "render-namespace-injects-yaml": (
        [
            "render",
            "--backend",
            "k8s",
            "--image",
            "x",
            "--np",
            "2",
            "--namespace",
            "ns\n---\nkind: Secret",
            "--",
            "true",
        ],
        "invalid --namespace 'ns\\n---\\nkind: Secret'",
    ),
    "namespace-not-a-dns-label": (
        [*K8S, "--np", "2", "--namespace", "Team_A", "--", "true"],
        "invalid --namespace 'Team_A'",
    ),
    "status-namespace-not-a-dns-label": (
        ["status", "--backend", "k8s", "--kubeconfig", "{kubeconfig}", "--namespace", "a/b", "somejob"],
        "invalid --namespace 'a/b'",
    ),
    "gpus-per-node-zero-is-not-8": (
        ["--gpus", "8", "--gpus-per-node", "0", "--dry-run", "--", "true"],
        "--gpus-per-node must be at least 1, got 0",
    ),
    "np-beyond-max-ranks-dry-run": (
        ["--np", "100000000", "--dry-run", "--", "true"],
        "--np 100000000 asks for 100000000 ranks; mpilaunch launches at most 65536",
    ),
    "np-beyond-max-workers": (
        ["--np", "10000", "--slots-per-worker", "1", "--dry-run", "--", "true"],
        "needs 10000 workers; mpilaunch launches at most 8192",
    ),
    "gpus-beyond-max-workers": (
        ["--gpus", "16384", "--gpus-per-node", "1", "--dry-run", "--", "true"],
        "needs 16384 workers; mpilaunch launches at most 8192",
    ),
    "ps-tasks-beyond-max": (
        ["--workers", "100000000", "--", "true"],
        "asks for 100000000 tasks, one worker each; mpilaunch launches at most 8192 workers",
    ),
    "cluster-requirement-non-ascii-digit": (["-r", "worker:²", "--", "true"], "must be a whole number, got '²'"),
}


@pytest.mark.parametrize("case", sorted(STRICT_CASES))
def test_bad_input_is_one_error_and_one_hint_with_nothing_left(case, tmp_path):
    """Exactly `mpilaunch: error: ...` + `  hint: ...`, exit 2, no traceback, no run directory, no agent."""
    args, expected = STRICT_CASES[case]
    kubeconfig = tmp_path / "kubeconfig"  # an API server nobody listens on
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n"
        "clusters: [{name: nowhere, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: nobody, user: {token: x}}]\n"
        "contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]\n"
    )
    args = [str(kubeconfig) if a == "{kubeconfig}" else a for a in args]
    job = f"bad-{case}"[:42]
    if "--name" not in args and args[0] not in ("wait", "status"):  # after the subcommand, if any
        at = 1 if args[0] == "render" else 0
        args = [*args[:at], "--name", job, *args[at:]]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = run_cli(*args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "", proc.stdout  # render prints nothing of a job it refused
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("mpilaunch: error: ") and expected in lines[0], proc.stderr
    assert lines[1].startswith("  hint: ") and len(lines[1]) > len("  hint: "), proc.stderr
    assert list(tmp.iterdir()) == []  # no /tmp/mpilaunch-<job>-* run directory
    assert agents_of(job) == []
