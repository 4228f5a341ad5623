"""Images no one here prepared for mpilaunch, on real pods (marker ``real_pods``).

Built from Debian packages only, never with mpilaunch inside
(``testbeds/k8s/build-foreign-images.sh``): bookworm + openmpi-bin +
python3-mpi4py; trixie + mpich + python3 (MPICH 4.2.1: bookworm's 4.0.2
deadlocks in MPI_Finalize in about 1 of 8 two-pod jobs, pmodels/mpich#6596;
Debian's mpi4py exists only for Open MPI, so ranks there reach MPICH's library
through ctypes); bookworm + openmpi-bin without python3. mpilaunch's pieces
come with the job, from its ConfigMap ``<job>-tools``; with the cluster
launcher mpirun runs in the user's image, so it is the workers' MPI. The
rank programs are passed as ``python3 -c TEXT``: the images do not have
this repository.
"""

from __future__ import annotations

import json
import time

import pytest

from support.helpers import REPO
from support.real_pods import assert_placement, pods_of, ranks_from, run_seeing_pods

pytestmark = pytest.mark.real_pods

PROGRAMS = {
    # image -> (rank program, how its MPI library names itself)
    "openmpi": ((REPO / "tests" / "programs" / "placement.py").read_text(), "Open MPI v4.1"),
    "mpich": ((REPO / "tests" / "programs" / "ctypes_allreduce.py").read_text(), "libmpich.so.12"),
}
# mpirun on this machine (Debian bookworm) for --launcher local: Open MPI 4.1 as the openmpi image
# has it; MPICH 4.0.2, a release before the mpich image's
LOCAL_MPIRUN = {"openmpi": "/usr/bin/mpirun.openmpi", "mpich": "/usr/bin/mpirun.mpich"}


def launch_args(name: str, launcher: str, ranks: int, per_worker: int) -> list[str]:
    args = ["--np", str(ranks), "--slots-per-worker", str(per_worker), "--launcher", launcher]
    return args + (["--mpirun", LOCAL_MPIRUN[name]] if launcher == "local" else [])


@pytest.mark.parametrize("name,launcher", [("openmpi", "local"), ("openmpi", "cluster"), ("mpich", "cluster")])
def test_foreign_image_allreduce_with_placement_verified(real, foreign, name, launcher, tmp_path):
    """A stock image with an MPI and python3 runs unchanged: every rank in its planned pod on the
    image's MPI library, placement verified; the pods run the user's image, mpilaunch's pieces
    mounted from the job's ConfigMap."""
    job = f"fi-{name}-{launcher}"
    program, library = PROGRAMS[name]
    image = foreign(name)
    proc = real.start(
        job,
        *launch_args(name, launcher, 4, 2),
        "--output-dir",
        str(tmp_path),
        "--",
        "python3",
        "-c",
        program,
        image=image,
    )
    code, out, err, seen = run_seeing_pods(proc, lambda: pods_of(real, job))
    assert code == 0, out[-2000:] + err[-3000:]
    ranks = ranks_from(out)
    assert_placement(real, job, ranks, 4, 2, seen)
    assert all(r["library"].startswith(library) for r in ranks), ranks[0]["library"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == 0 and [r["exit_code"] for r in report["ranks"]] == [0] * 4
    assert "placement not verified" not in err and "placement check failed" not in err, err
    for pod in (p for n, p in seen.items() if "-worker-" in n or "-launcher" in n):
        assert pod["spec"]["containers"][0]["image"] == image
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["mpilaunch-tools"]["configMap"]["name"] == f"{job}-tools"
    assert real.leftovers(job) == []


def test_foreign_mpich_image_with_this_machines_mpiexec_of_another_release_fails_naming_it(real, foreign, tmp_path):
    """--launcher local runs this machine's mpiexec (Debian bookworm's MPICH 4.0.2) against the
    image's hydra_pmi_proxy (trixie's 4.2.1): hydra cannot span two releases. One error, the
    hint that says so and what to do, nothing left."""
    job = "fi-mpich-local"
    ran = real.run(
        job,
        *launch_args("mpich", "local", 4, 2),
        "--output-dir",
        str(tmp_path),
        "--",
        "python3",
        "-c",
        PROGRAMS["mpich"][0],
        image=foreign("mpich"),
        timeout=300,
    )
    assert ran.returncode not in (0, 2, 3), ran.stderr[-3000:]
    errors = [line for line in ran.stderr.splitlines() if line.startswith("mpilaunch: error:")]
    assert len(errors) == 1 and "cannot find proxy" in errors[0], ran.stderr[-3000:]
    assert (
        "hint: hydra's mpiexec here and the hydra_pmi_proxy on the workers are different MPICH releases" in ran.stderr
    ), ran.stderr[-3000:]
    assert "--launcher cluster" in ran.stderr
    assert "placement not verified" not in ran.stderr  # the error says why no rank started
    assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == ran.returncode
    assert real.leftovers(job) == []


@pytest.mark.parametrize("launcher", ["cluster", "local"])
def test_foreign_image_without_python3_fails_at_once_naming_it(real, foreign, launcher):
    """exit 3 and one line naming the image and what it lacks, with the hint; nothing left."""
    image = foreign("nopython")
    job = f"fi-nopython-{launcher}"
    t0 = time.monotonic()
    ran = real.run(job, *launch_args("openmpi", launcher, 2, 1), "--", "true", image=image, timeout=300)
    took = time.monotonic() - t0
    assert ran.returncode == 3, ran.stderr[-3000:]
    errors = [line for line in ran.stderr.splitlines() if line.startswith("mpilaunch: error:")]
    assert errors == [f"mpilaunch: error: the image {image} lacks python3 (3.8 or newer) on PATH"], ran.stderr
    assert "hint:" in ran.stderr and "--mpirun" in ran.stderr
    assert took < 120, f"{took:.0f}s: not at once"  # not --start-timeout (300 s)
    assert real.leftovers(job) == []
