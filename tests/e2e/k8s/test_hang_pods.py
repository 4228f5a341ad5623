"""Hung jobs on real pods: the verdict names the injected rank, and `kubectl describe` shows it (issue 42).

tests/programs/hang.py (4 ranks, 2 worker pods of the project image) makes
one rank sleep before the allreduce while the others wait in it. The image
has no py-spy: the stacks come from the faulthandler mpilaunch's
sitecustomize arms in each rank, read back by the probe through the job's
exec channel: the pods' agents (``--transport agent``) or the Kubernetes
exec API (``--transport exec``). The verdict reaches the submitting user's
stderr and report.json, and is posted as a Warning Event (reason Hang) on
the launcher pod, or on worker 0's with ``--launcher local``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from mpilaunch.core.exit_codes import EXIT_HUNG, EXIT_TIMEOUT, EXIT_USAGE
from support.helpers import PROGRAMS, REPO, finish, wait_started

pytestmark = pytest.mark.real_pods

STUCK = {
    m[1]: i
    for i, line in enumerate((PROGRAMS / "hang.py").read_text().splitlines(), 1)
    if (m := re.search(r"STUCK: (\S+)", line))
}
HANG = "/opt/mpilaunch/tests/programs/hang.py"  # where the image has it
NP, SLOTS = 4, 2
SIZE = ["--np", str(NP), "--slots-per-worker", str(SLOTS)]  # every job here: 4 ranks in 2 pods
OMPI4 = "/usr/bin/mpirun.openmpi"  # --launcher local: this machine's Open MPI 4.1, like the image's


def hang_events(real, job: str, but=()) -> list[dict]:
    """The Hang events on the job's pods (they outlive the pods), but those with the uids ``but``."""
    items = json.loads(
        real.kubectl("get", "events", "-n", "default", "--field-selector", "reason=Hang", "-o", "json").stdout
    )["items"]
    return [e for e in items if e["involvedObject"]["name"].startswith(job + "-") and e["metadata"]["uid"] not in but]


def expected_verdict(job: str, odd: int) -> str:
    return (
        f"mpilaunch: hang: rank {odd} ({job}-worker-{odd // SLOTS}) is in time.sleep at hang.py:{STUCK['sleep']}; "
        f"the 3 other ranks are in comm.Allreduce at hang.py:{STUCK['others']}"
    )


# Both launchers and both transports, each once: each launcher with the transport it gets by
# default (--transport auto). The two other pairs reach the same probes from the same places and
# cost a minute of the pods' part.
@pytest.mark.parametrize("launcher,transport", [("local", "exec"), ("cluster", "agent")])
def test_hang_pods_at_timeout_the_verdict_names_the_rank_and_is_an_event(real, tmp_path, launcher, transport):
    job = f"rp-hang-{launcher}-{transport}"
    odd = 3 if launcher == "local" else 1
    args = ["--launcher", launcher, "--transport", transport]
    if launcher == "local":
        args += ["--mpirun", OMPI4]
    earlier = {e["metadata"]["uid"] for e in hang_events(real, job)}  # an earlier run's
    proc = real.start(
        job,
        *args,
        *SIZE,
        "--timeout",
        "20",
        "--output-dir",
        str(tmp_path),
        "--",
        "python3",
        str(HANG),
        "sleep",
        str(odd),
    )
    out, err = finish(proc, 300)
    assert proc.returncode == EXIT_TIMEOUT, out[-2000:] + err[-3000:]
    verdict = expected_verdict(job, odd)
    assert [line for line in err.splitlines() if line.startswith("mpilaunch: hang:")] == [verdict], err[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["hang"]["odd_ranks"] == [odd] and report["hang"]["collection_s"] < 15
    assert {s["tool"] for s in report["stacks"]} == {"faulthandler"}, report["stacks"]
    events = hang_events(real, job, but=earlier)
    assert [(e["type"], e["message"]) for e in events] == [("Warning", verdict)], events
    pod = events[0]["involvedObject"]["name"]
    assert pod == f"{job}-worker-0" if launcher == "local" else pod.startswith(f"{job}-launcher"), pod
    assert real.leftovers(job) == []


def test_hang_pods_stacks_command_on_a_running_job(real, tmp_path):
    job = "rp-hang-stacks"
    proc = real.start(
        job,
        *SIZE,
        "--timeout",
        "150",
        "--output-dir",
        str(tmp_path),
        "--",
        "python3",
        str(HANG),
        "sleep",
        "2",
    )
    try:
        wait_started(proc, NP, text="ready", timeout=180)
        shown = subprocess.run(
            [sys.executable, "-m", "mpilaunch", "stacks", job, "--backend", "k8s"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=real.env(),
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0] == f"ranks 0-1,3: comm.Allreduce <- <module> (hang.py:{STUCK['others']})", shown.stdout
        assert lines[1] == f"rank 2: time.sleep <- <module> (hang.py:{STUCK['sleep']})", shown.stdout
        assert lines[2] == expected_verdict(job, 2), shown.stdout
        assert proc.poll() is None  # the job runs on
    finally:
        proc.terminate()
        finish(proc, 120)
    assert real.leftovers(job) == []


def test_hang_pods_in_a_restricted_namespace_an_edit_only_user_gets_the_verdict(tenant, tmp_path):
    """PodSecurity restricted (seccomp RuntimeDefault, every capability dropped, no ptrace of
    another process): the faulthandler still names the rank, for a user with only 'edit'."""
    job = "rp-hang-tenant"
    proc = tenant.start(
        job,
        *SIZE,
        "--timeout",
        "20",
        "--output-dir",
        str(tmp_path),
        "--",
        "python3",
        HANG,
        "sleep",
        "2",
    )
    out, err = finish(proc, 300)
    assert proc.returncode == EXIT_TIMEOUT, out[-2000:] + err[-3000:]
    assert [line for line in err.splitlines() if line.startswith("mpilaunch: hang:")] == [expected_verdict(job, 2)], (
        err[-3000:]
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["hang"]["odd_ranks"] == [2] and {s["tool"] for s in report["stacks"]} == {"faulthandler"}
    events = json.loads(tenant.kubectl("get", "events", "--field-selector", "reason=Hang", "-o", "json").stdout)[
        "items"
    ]
    assert [e["message"] for e in events] == [expected_verdict(job, 2)], err[-2000:]
    assert tenant.leftovers(job) == []


def test_hang_pods_stacks_of_a_detached_job_for_an_edit_only_tenant(tenant):
    """``mpilaunch stacks`` on a detached job: no mpilaunch on this machine runs it any more, so the
    stacks come through the exec API into its worker pods, with the tenant's own credentials (the
    'edit' role may exec), in a restricted namespace behind default-deny policies."""
    job = "rp-hang-detached"
    handed = tenant.run(
        job, *SIZE, "--timeout", "300", "--detach", "--",
        "python3", HANG, "sleep", "1", timeout=300,
    )  # fmt: skip
    assert handed.returncode == 0, handed.stdout[-2000:] + handed.stderr[-3000:]
    try:
        # the ranks print "ready" into the launcher's log only: ask until they all stand where they hang
        deadline, shown = time.monotonic() + 180, None
        while time.monotonic() < deadline:
            shown = tenant.manage("stacks", job, timeout=120)
            assert shown.returncode == 0, shown.stderr
            if expected_verdict(job, 1) in shown.stdout.splitlines():
                break
            time.sleep(3)
        lines = shown.stdout.splitlines()
        assert lines[:3] == [
            f"ranks 0,2-3: comm.Allreduce <- <module> (hang.py:{STUCK['others']})",
            f"rank 1: time.sleep <- <module> (hang.py:{STUCK['sleep']})",
            expected_verdict(job, 1),
        ], shown.stdout
        as_json = json.loads(tenant.manage("stacks", job, "--json", timeout=120).stdout)
        assert as_json["hang"]["odd_ranks"] == [1] and len(as_json["stacks"]) == NP, as_json["hang"]
    finally:
        deleted = tenant.manage("delete", job)
    assert deleted.returncode == 0, deleted.stderr
    assert tenant.leftovers(job) == []
    gone = tenant.manage("stacks", job)
    assert gone.returncode == EXIT_USAGE and f"no job {job} in namespace" in gone.stderr, gone.stderr


def test_hang_pods_detached_at_timeout_the_launcher_posts_the_verdict_as_an_event(tenant):
    """Detached, the launcher pod diagnoses the hang at --timeout itself: the verdict is in its log
    (``mpilaunch logs``) and, with nobody on the submitting side, it posts the Event on its own pod."""
    job = "rp-hang-detached-timeout"
    handed = tenant.run(
        job, *SIZE, "--timeout", "30", "--detach", "--",
        "python3", HANG, "sleep", "3", timeout=300,
    )  # fmt: skip
    assert handed.returncode == 0, handed.stdout[-2000:] + handed.stderr[-3000:]
    try:
        waited = tenant.manage("wait", job, "--timeout", "240")
        assert waited.returncode == EXIT_TIMEOUT and "124" in waited.stdout + waited.stderr, waited
        logs = tenant.manage("logs", job)
        verdict = expected_verdict(job, 3)
        assert verdict in (logs.stdout + logs.stderr).splitlines(), logs.stdout[-3000:]
        events = json.loads(tenant.kubectl("get", "events", "--field-selector", "reason=Hang", "-o", "json").stdout)
        mine = [e for e in events["items"] if e["involvedObject"]["name"].startswith(f"{job}-launcher")]
        assert [(e["type"], e["message"]) for e in mine] == [("Warning", verdict)], events["items"]
    finally:
        deleted = tenant.manage("delete", job)
    assert deleted.returncode == 0, deleted.stderr
    assert tenant.leftovers(job) == []


def test_hang_pods_detached_default_identity_posts_the_hang_event_and_drops_its_secrets(real):
    """Issue 49, item 6 and a low: without --service-account, a detached job's launcher runs as its
    per-job identity, whose Role lacked events create and any read of the launcher's own pod: the
    Hang Event never came (the 403 went to the launcher's log). The verdict is now posted on the
    launcher pod, named from the downward API. And once the outcome is recorded, the job's Secrets
    (the forwarded values, the agents' private key) are gone; the root and its record stay."""
    job = "rp-hang-detached-own"
    earlier = {e["metadata"]["uid"] for e in hang_events(real, job)}
    started = time.monotonic()
    handed = real.run(
        job, *SIZE, "--timeout", "30", "--detach", "--",
        "python3", HANG, "sleep", "3", timeout=300,
    )  # fmt: skip
    assert handed.returncode == 0, handed.stdout[-2000:] + handed.stderr[-3000:]
    manage = ["--namespace", "default"]
    try:
        waited = subprocess.run(
            [sys.executable, "-m", "mpilaunch", "wait", job, "--backend", "k8s", *manage, "--timeout", "240"],
            cwd=REPO, env=real.env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert waited.returncode == EXIT_TIMEOUT, waited.stdout + waited.stderr[-3000:]
        events = hang_events(real, job, but=earlier)
        assert [(e["type"], e["message"]) for e in events] == [("Warning", expected_verdict(job, 3))], events
        pod = events[0]["involvedObject"]
        assert pod["name"].startswith(f"{job}-launcher-") and pod["uid"], pod
        # its uid is the launcher pod's (describe matches by uid)
        launcher = json.loads(real.kubectl("get", "pod", pod["name"], "-o", "json").stdout)
        assert launcher["metadata"]["uid"] == pod["uid"]
        secrets = real.kubectl(
            "get", "secrets", "-l", f"mpilaunch/job={job}", "-o", "name", "--ignore-not-found"
        ).stdout.split()
        assert secrets == [], secrets
        assert real.kubectl("get", "configmap", job, "-o", "name").stdout.strip() == f"configmap/{job}"
        print(
            f"{job}: detached, hung, Event posted and Secrets gone {time.monotonic() - started:.0f}s after submission"
        )
    finally:
        subprocess.run(
            [sys.executable, "-m", "mpilaunch", "delete", job, "--backend", "k8s", *manage],
            cwd=REPO, env=real.env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert real.leftovers(job) == []


def test_hang_pods_foreign_image_names_the_rank(real, foreign, tmp_path):
    """An image no one here prepared (Debian's Open MPI and mpi4py, no py-spy): the program comes as
    ``python3 -c`` text, so its frames are in <string>, and the verdict still names the rank."""
    job = "fi-hang"
    proc = real.start(
        job,
        *SIZE,
        "--timeout",
        "20",
        "--output-dir",
        str(tmp_path),
        "--",
        "python3",
        "-c",
        (PROGRAMS / "hang.py").read_text(),
        "sleep",
        "1",
        image=foreign("openmpi"),
    )
    out, err = finish(proc, 300)
    assert proc.returncode == EXIT_TIMEOUT, out[-2000:] + err[-3000:]
    assert [line for line in err.splitlines() if line.startswith("mpilaunch: hang:")] == [
        f"mpilaunch: hang: rank 1 ({job}-worker-0) is in <module> at <string>:{STUCK['sleep']}; "
        f"the 3 other ranks are in <module> at <string>:{STUCK['others']}"
    ], err[-3000:]
    assert real.leftovers(job) == []


def test_hang_pods_detached_stall_timeout_names_the_rank_and_wait_returns_hung(real):
    """--stall-timeout reaches a detached launcher (it was silently dropped: the job then ran to its
    --timeout). The launcher finds the hang after 15 s of silence with unchanged stacks, names the
    rank in its log, stops the job, and `mpilaunch wait` returns 86 well before --timeout."""
    job = "rp-hang-detached-stall"
    handed = real.run(
        job, *SIZE, "--stall-timeout", "15", "--timeout", "240", "--detach", "--",
        "python3", HANG, "sleep", "2", timeout=300,
    )  # fmt: skip
    assert handed.returncode == 0, handed.stdout[-2000:] + handed.stderr[-3000:]
    try:
        started = time.monotonic()
        waited = real.manage("wait", job, "--timeout", "200")
        took = time.monotonic() - started
        assert waited.returncode == EXIT_HUNG, waited.stdout[-2000:] + waited.stderr[-2000:]
        assert took < 150, f"wait took {took:.0f} s: the stall was not found before --timeout"
        logs = real.manage("logs", job)
        assert expected_verdict(job, 2) in (logs.stdout + logs.stderr).splitlines(), logs.stdout[-3000:]
    finally:
        deleted = real.manage("delete", job)
    assert deleted.returncode == 0, deleted.stderr
    assert real.leftovers(job) == []
