"""One in-cluster runner (``mpilaunch/job/in_cluster.py``) for every cluster backend's launcher.

The k8s launcher pod and the YARN launcher container ran one sequence each (spec and plan, the
mpirun workload, its token, the attempt, the lifecycle), and the attempt number travelled by
environment in one and by field in the other. Each launcher now supplies only how to reach the
workers and where the outcome goes; the attempt is the description's field in both.
"""

from __future__ import annotations

import ast

from support.helpers import REPO

LAUNCHERS = ("mpilaunch/backends/k8s/in_cluster/launcher.py", "mpilaunch/backends/yarn/in_cluster/launcher.py")
# what only the runner does: a launcher that names one of these runs its own copy of the sequence
RUNNER_ONLY = {"run_job", "MpirunWorkload", "RelayedOutput"}


def names_used(path) -> set[str]:
    tree = ast.parse((REPO / path).read_text())
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    used |= {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    return used


def test_in_cluster_launchers_run_through_the_one_runner():
    for path in LAUNCHERS:
        used = names_used(path)
        assert "run_launch" in used, path
        assert not used & RUNNER_ONLY, f"{path} runs its own sequence: {sorted(used & RUNNER_ONLY)}"


def test_in_cluster_attempt_is_the_descriptions_field_on_k8s_too():
    from mpilaunch.backends.k8s.in_cluster.launcher import this_attempt
    from mpilaunch.backends.launch_description import LaunchDescription

    launch = LaunchDescription(job="j", workers=(), rank_prefix=("python3", "-m", "mpilaunch.rank"), spec={})
    # a relaunched Job says its attempt in its environment; the runner reads the field alone
    assert this_attempt(launch, {"MPILAUNCH_ATTEMPT": "3"}).attempt == 3
    assert this_attempt(launch, {}).attempt == 1
    assert this_attempt(launch, {}) == launch


def test_a_launchers_own_verdict_lines_go_where_mpiruns_lines_go_and_the_rest_to_its_stderr():
    """--preflight's and --straggler-report's lines, printed by the lifecycle in a YARN launcher
    container, reached only that container's log (never followed): now they are relayed."""
    import io

    from mpilaunch.job.in_cluster import NotesToRelay

    relayed: list[tuple[str, str]] = []
    own = io.StringIO()
    stream = NotesToRelay(lambda s, line: relayed.append((s, line)), own)
    print("mpilaunch: preflight: worker w1 GPU 0 has 3 uncorrected ECC errors", file=stream, flush=True)
    print("mpilaunch-yarn-launcher: waiting for the spec", file=stream)
    stream.write("mpilaunch: straggler: rank 5 (w2) spent 41% of samples in data loading\npartial")
    assert relayed == [
        ("stderr", "mpilaunch: preflight: worker w1 GPU 0 has 3 uncorrected ECC errors\n"),
        ("stderr", "mpilaunch: straggler: rank 5 (w2) spent 41% of samples in data loading\n"),
    ]
    assert own.getvalue() == "mpilaunch-yarn-launcher: waiting for the spec\n"  # "partial": no line yet
