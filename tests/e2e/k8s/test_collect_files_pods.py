"""--collect and --timeline on real pods: the files the ranks wrote in their pods come back
before the pods are deleted, through the job's exec channel (the Kubernetes exec API from the
submitting side, whichever launcher runs mpirun), each pod's under its worker's name.

4 ranks in 2 worker pods of the project image. The ranks are a shell line (no program of the
image is needed): each writes ``results/rank-<R>.txt`` in its working directory, rank 0 also
``$HOROVOD_TIMELINE`` (as Horovod's rank 0 does). With the cluster launcher rank 1 fails; with
``--launcher local`` the job runs past --timeout.
"""

from __future__ import annotations

import json

import pytest

from mpilaunch.core.exit_codes import EXIT_TIMEOUT
from support.helpers import finish

pytestmark = pytest.mark.real_pods

OMPI4 = "/usr/bin/mpirun.openmpi"  # --launcher local: this machine's Open MPI 4.1, like the image's
RANK = "${OMPI_COMM_WORLD_RANK:-$PMI_RANK}"


def write(where: str) -> str:
    """The ranks' shell line: each writes WHERE/rank-<R>.txt, rank 0 also $HOROVOD_TIMELINE."""
    return (
        f'mkdir -p {where} && echo "rank {RANK} on $MPILAUNCH_WORKER" > {where}/rank-{RANK}.txt && '
        f'if [ "{RANK}" = 0 ]; then echo "[{{\\"name\\": \\"sh\\"}}]" > "$HOROVOD_TIMELINE"; fi; '
    )


def tree(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


# With the cluster launcher the ranks run in the launcher's directory, which the worker pods have
# too (the image's WORKDIR) and their user may not write: the files go to /tmp, absolute globs.
# With --launcher local mpirun's directory (this checkout) is not in the pods: the ranks run in
# their pod's own, and relative globs start there.
@pytest.mark.parametrize("launcher", ["cluster", "local"])
def test_collect_files_pods_after_a_failed_rank_and_a_timeout(real, tmp_path, launcher):
    job = f"rp-collect-{launcher}"
    if launcher == "cluster":  # rank 1 fails once every rank wrote its file
        args, end, code = [], f'sleep 3; [ "{RANK}" = 1 ] && exit 7; sleep 5', 7
        where, timeline = "/tmp/rp-results", "/tmp/rp-timeline.json"
    else:
        args, end, code = ["--launcher", "local", "--mpirun", OMPI4, "--timeout", "25"], "sleep 600", EXIT_TIMEOUT
        where, timeline = "results", "timeline.json"
    proc = real.start(
        job,
        *args,
        "--np",
        "4",
        "--slots-per-worker",
        "2",
        "--output-dir",
        str(tmp_path),
        "--collect",
        f"{where}/*.txt",
        "--timeline",
        timeline,
        "--",
        "sh",
        "-c",
        write(where) + end,
    )
    out, err = finish(proc, 300)
    assert proc.returncode == code, out[-2000:] + err[-3000:]
    assert [line for line in err.splitlines() if line.startswith("mpilaunch: collect:")] == [], err[-3000:]
    files = tree(tmp_path / "files")
    kept = where.lstrip("/")  # an absolute glob's file keeps its whole path
    assert files == sorted(
        [f"{job}-worker-{r // 2}/{kept}/rank-{r}.txt" for r in range(4)] + [f"{job}-worker-0/{timeline.lstrip('/')}"]
    ), err[-3000:]
    for r in range(4):
        text = (tmp_path / "files" / f"{job}-worker-{r // 2}" / kept / f"rank-{r}.txt").read_text()
        assert text == f"rank {r} on {job}-worker-{r // 2}\n"
    assert json.loads((tmp_path / "files" / f"{job}-worker-0" / timeline.lstrip("/")).read_text()) == [{"name": "sh"}]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["collected"]["files"] == 5 and report["collected"]["dir"] == str(tmp_path / "files")
    assert real.leftovers(job) == []
