"""The local backend at scale (issue 26): a wide launch completes, every rank where it was planned,
and nothing of it is left; the launch-tuning flags a user gives replace mpilaunch's own.

From ``backend.FORK_AGENTS_FROM`` workers on the agents are forked from mpilaunch rather than
started as interpreters of their own: these tests are where that path runs (a 128-worker
launch, tree spawn over 64 workers, a forked agent lost mid-run). Each stays under a minute on
a 2-core machine; ``benchmarks/bench_scale.py`` measures the same launches against the floor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from mpilaunch.backends.local.backend import FORK_AGENTS_FROM
from support.helpers import (
    REPO,
    assert_local_worker_lost,
    leftover_processes,
    mpilaunch_env,
    run_mpilaunch,
    wait_started,
)

pytestmark = pytest.mark.mpi

# one line per rank: its rank, its worker (set by the worker's agent only) and its daemon's pid
REPORT_RANK = ["sh", "-c", 'echo "scale-rank ${OMPI_COMM_WORLD_RANK} ${MPILAUNCH_WORKER} ${PPID}"']


def rank_lines(stdout: str) -> dict[int, tuple[str, int]]:
    """rank -> (worker, daemon pid) from REPORT_RANK's lines (mpirun's tag before them)."""
    out = {}
    for line in stdout.splitlines():
        _, found, rest = line.partition("scale-rank ")
        if found:
            rank, worker, daemon = rest.split()
            out[int(rank)] = (worker, int(daemon))
    return out


def launch(name, workers, install, tmp_path, *more, timeout=120):
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            str(workers),
            "--slots-per-worker",
            "1",
            "-q",
            "--output-dir",
            str(tmp_path),
            *more,
            "--",
            *REPORT_RANK,
        ],
        install,
        timeout=timeout,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc, json.loads((tmp_path / "report.json").read_text())


@pytest.mark.parametrize("mpi_install", ["openmpi4", "openmpi5"], indirect=True)
def test_scale_128_local_workers_every_rank_runs_on_its_worker_and_nothing_is_left(mpi_install, tmp_path):
    name = f"scale128-{mpi_install.id}"
    proc, report = launch(name, 128, mpi_install, tmp_path)
    ranks = rank_lines(proc.stdout)
    assert sorted(ranks) == list(range(128)), proc.stdout[-2000:]
    assert {r: w for r, (w, _) in ranks.items()} == {r: f"{name}-worker-{r}" for r in range(128)}
    assert len({daemon for _, daemon in ranks.values()}) == 128  # one daemon per worker
    assert report["exit_code"] == 0
    assert [(r["rank"], r["exit_code"]) for r in report["ranks"]] == [(r, 0) for r in range(128)]
    assert report["placement"]["mismatch"] is None
    assert len(report["workers"]) == 128
    # every agent (forked from mpilaunch here: its command line is mpilaunch's, --name included),
    # daemon and rank is gone once mpilaunch has returned
    assert leftover_processes(name) == []


@pytest.mark.parametrize("mpi_install", ["openmpi4", "openmpi5"], indirect=True)
def test_scale_tree_spawn_over_64_workers_places_ranks_as_direct_spawn(mpi_install, tmp_path):
    """Open MPI's tree spawn (daemons start daemons through mpilaunch-rsh on their worker, which
    the local agents make possible: the job's context in their environment) with a radix of 8,
    given as --mpi-args: mpilaunch drops its own values of those parameters (Open MPI 4 refuses
    a parameter named twice), and every rank runs on its planned worker as with direct spawn."""
    name = f"scaletree-{mpi_install.id}"
    mca, plm = ("--prtemca", "plm_ssh") if mpi_install.id == "openmpi5" else ("--mca", "plm_rsh")
    flags = f"{mca} {plm}_no_tree_spawn 0 {mca} routed_radix 8"
    (tmp_path / "direct").mkdir()
    (tmp_path / "tree").mkdir()
    direct, _ = launch(name, 64, mpi_install, tmp_path / "direct")
    tree, report = launch(name, 64, mpi_install, tmp_path / "tree", "--mpi-args", flags)
    assert (
        {r: w for r, (w, _) in rank_lines(tree.stdout).items()}
        == {r: w for r, (w, _) in rank_lines(direct.stdout).items()}
        == {r: f"{name}-worker-{r}" for r in range(64)}
    )
    assert [(r["rank"], r["exit_code"]) for r in report["ranks"]] == [(r, 0) for r in range(64)]
    assert leftover_processes(name) == []


def test_scale_flags_from_mpi_args_replace_mpilaunchs_own(openmpi5):
    """--dry-run: one value per tuning parameter, the user's; the pinned ones stay mpilaunch's."""
    proc = run_mpilaunch(
        [
            "--dry-run",
            "--np",
            "300",
            "--slots-per-worker",
            "1",
            "--mpi-args",
            "--prtemca routed_radix 16 --prtemca plm_ssh_num_concurrent 32",
            "--",
            "true",
        ],
        openmpi5,
    )
    assert proc.returncode == 0, proc.stderr
    argv = next(line for line in proc.stdout.splitlines() if line.startswith("  /")).split()
    values = [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--prtemca"]
    assert ("routed_radix", "16") in values and ("plm_ssh_num_concurrent", "32") in values
    assert [k for k, _ in values].count("routed_radix") == 1
    assert [k for k, _ in values].count("plm_ssh_num_concurrent") == 1
    assert ("plm_ssh_no_tree_spawn", "1") in values and ("plm", "ssh") in values
    assert "PRTE_MCA_routed_radix" not in proc.stdout


@pytest.mark.parametrize("mpi_install", ["openmpi4"], indirect=True)
def test_scale_a_lost_forked_agent_is_named_with_its_pid(mpi_install, tmp_path):
    """A forked agent (``FORK_AGENTS_FROM`` workers) SIGKILLed mid-run: mpilaunch reaps it as its
    own child, names the worker and its pid, fails with the lost-worker code and leaves nothing."""
    name = "scalelost"
    workers = max(FORK_AGENTS_FROM, 4)
    program = ["sh", "-c", 'echo "started ${MPILAUNCH_WORKER} $$"; sleep 60']
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--name",
            name,
            "--mpirun",
            mpi_install.mpirun,
            "--np",
            str(workers),
            "--slots-per-worker",
            "1",
            "--timeout",
            "100",
            "-q",
            "--output-dir",
            str(tmp_path),
            "--",
            *program,
        ],
        cwd=REPO,
        env=mpilaunch_env(mpi_install),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    victim = None
    try:
        lines = wait_started(proc, workers, timeout=90)
        rank_pid = next(int(line.split()[-1]) for line in lines if f" {name}-worker-1 " in line + " ")
        agent = next(p for p in psutil.Process(rank_pid).parents() if p.name() == "mpilaunch.agent")
        assert agent.ppid() == proc.pid  # forked by mpilaunch itself
        victim = agent.pid
        os.kill(victim, signal.SIGKILL)
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_local_worker_lost(proc, err, name, 1, victim)
    assert "SIGKILL" in err
    assert leftover_processes(name) == []
