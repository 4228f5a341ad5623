"""Cluster credentials that expire: a kubeconfig whose exec plugin hands out 20-second tokens.

The testbed's kube-apiserver checks such tokens with a webhook
(``testbeds/k8s/token_auth.py``: HMAC-signed, valid until their
``expirationTimestamp``, answers cached 1 s), the way EKS accepts its
15-minute IAM tokens. Every request of a job made with the first token
alone would fail after 20 s: the Lease's renewals, the watch for lost
workers, following the launcher pod, the exec relay's new sessions and
the teardown. kwok runs pods' exec'd commands as local processes; the
cluster-launcher test plays the kubelet for the launcher pod's status.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from support.helpers import REPO, leftover_processes, wait_for, wait_started
from support.k8s import end_launcher_pod, forget_pod_env, give_pods_their_env, leftover_objects, start, stop

pytestmark = pytest.mark.k8s

LIFETIME = 20


@pytest.fixture
def token_env(kube, k8s_env, tmp_path):
    """k8s_env with a kubeconfig whose user is an exec plugin minting LIFETIME-second tokens."""
    user = f"token-user-{uuid.uuid4().hex[:8]}"
    state = tmp_path / "plugin"
    kubeconfig = kube.token_kubeconfig(tmp_path / "token.kubeconfig", user, LIFETIME, state)
    env = {**k8s_env, "KUBECONFIG": str(kubeconfig)}
    return env, state, user


def minted(state: Path) -> int:
    try:
        return len((state / "minted").read_text().splitlines())
    except OSError:
        return 0


def renewed_within(kube, job: str, seconds: float) -> bool:
    """The job's Lease was renewed in the last ``seconds`` (read with the admin's credentials)."""
    from datetime import datetime, timezone

    stamp = kube.get_json("lease", job)["spec"]["renewTime"]
    renewed = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
    return time.time() - renewed < seconds


def context_file_of(job: str) -> Path:
    """The running job's exec context (what mpirun's shims read), found by its job name."""
    for path in Path("/tmp").glob("mpilaunch-*/context.json"):
        try:
            if f"{job}-worker-0" in path.read_text():
                return path
        except OSError:
            continue
    raise AssertionError(f"no context.json of job {job} under /tmp")


def test_token_expiring_every_20s_a_90s_job_passes(kube, token_env, tmp_path):
    """--launcher local, a 90 s job: the Lease keeps being renewed, the lost-worker watch keeps
    reading, the relay opens a new exec session with a token fetched long after the first
    expired, and the teardown works; the plugin ran again before every expiry."""
    env, state, _user = token_env
    job = "k8s-token-90s"
    give_pods_their_env(kube, job, 2, tmp_path)
    proc = start(
        [
            "--name",
            job,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--launcher",
            "local",
            "-q",
            "--orphan-timeout",
            "10",
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=90",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        env,
    )
    try:
        wait_started(proc, 4)
        t0 = time.monotonic()
        context = context_file_of(job)
        time.sleep(2.5 * LIFETIME - (time.monotonic() - t0))  # the first two tokens have expired
        # a new exec session now (as a relaunch's daemons would open): the relay reads the refreshed token
        shim = subprocess.run(
            [sys.executable, "-m", "mpilaunch.rsh_agent.shim", f"{job}-worker-0", "echo", "exec-after-expiry"],
            env={**env, "MPILAUNCH_CONTEXT": str(context)},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shim.returncode == 0 and "exec-after-expiry" in shim.stdout, shim.stderr
        assert renewed_within(kube, job, 10), "the Lease was not renewed after the first token expired"
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert "credential" not in err and "cannot renew" not in err, err
    finally:
        stop(proc)
        forget_pod_env(kube, job, 2)
    # 90 s of 20 s tokens, fetched again at half their life: about 9
    assert minted(state) >= 6, f"the plugin ran {minted(state)} times"
    assert leftover_objects(kube, job) == []
    assert leftover_processes(job) == []


def test_token_expiring_every_20s_cluster_launcher_followed_to_its_end(kube, token_env, tmp_path):
    """--launcher cluster: mpilaunch follows the launcher pod for 32 s (its first token expired at
    20 s, and the Lease is renewed with a later one) and reports its exit status; kwok runs no
    container, so the test ends the launcher pod the way a kubelet would. (The 90 s job above
    covers several expiries.)"""
    env, state, _user = token_env
    job = "k8s-token-cl"
    give_pods_their_env(kube, job, 1, tmp_path)
    proc = start(
        ["--name", job, "--np", "2", "--slots-per-worker", "2", "-q", "--orphan-timeout", "10", "--", "true"], env
    )
    try:

        def launcher_pod():
            pods = kube.get_json("pods", "-l", f"mpilaunch/job={job},mpilaunch/role=launcher")["items"]
            return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None

        pod = wait_for(launcher_pod, 120, "the launcher pod")
        time.sleep(1.6 * LIFETIME)  # the first token, minted before the pod ran, expired > 10 s ago
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert renewed_within(kube, job, 10)
        end_launcher_pod(kube, pod, 0)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
        assert "credential" not in err, err
    finally:
        stop(proc)
        forget_pod_env(kube, job, 1)
    assert minted(state) >= 3  # the first token, and at least two fetched again at half their life
    assert leftover_objects(kube, job) == []


def test_token_plugin_failing_midway_fails_the_job_in_one_line_and_releases_it(kube, token_env, tmp_path):
    """The token service goes away mid-job: mpilaunch retries until shortly before the last token
    expires, then stops the job and deletes it with that token: exit 3, one error line naming
    the plugin and what it said, nothing left in the cluster or on this machine."""
    env, state, _user = token_env
    job = "k8s-token-fails"
    give_pods_their_env(kube, job, 2, tmp_path)
    proc = start(
        [
            "--name",
            job,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--launcher",
            "local",
            "-q",
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=300",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        env,
    )
    try:
        wait_started(proc, 4)
        (state / "fail").write_text("token service unavailable (test)")
        t_fail = time.monotonic()
        out, err = proc.communicate(timeout=90)
        ended_s = time.monotonic() - t_fail
    finally:
        stop(proc)
        forget_pod_env(kube, job, 2)
    assert proc.returncode == 3, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("mpilaunch: error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith("mpilaunch: error: cluster credentials failed"), errors[0]
    assert "exec plugin" in errors[0] and "token service unavailable (test)" in errors[0], errors[0]
    assert "hint:" in err
    # at most one token lifetime after the service went away, less the margin kept for the teardown
    assert ended_s < LIFETIME + 5, f"the job ended {ended_s:.1f}s after the plugin started failing"
    assert "cleanup of job" not in err, err  # deleted with the still-valid token
    assert leftover_objects(kube, job) == []
    assert leftover_processes(job) == []


def test_token_plugin_failing_before_the_launch_exits_3_and_creates_nothing(kube, token_env):
    env, state, _user = token_env
    job = "k8s-token-never"
    state.mkdir(parents=True, exist_ok=True)
    (state / "fail").write_text("no credentials for this account")
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--backend",
            "k8s",
            "--image",
            "mpilaunch:test",
            "--name",
            job,
            "--np",
            "2",
            "--",
            "true",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 3, ran.stderr
    first = ran.stderr.splitlines()[0]
    assert (
        first.startswith("mpilaunch: error: cluster credentials failed") and "no credentials for this account" in first
    )
    assert "Traceback" not in ran.stderr
    assert leftover_objects(kube, job, timeout=0) == []


def test_token_revoked_midway_fails_the_job_naming_the_401(kube, token_env, tmp_path):
    """The plugin still hands out tokens, but the cluster rejects them all (the credential was
    revoked): one fetch again, then exit 3 naming the 401. mpilaunch can delete nothing with
    such credentials; it says the cluster's reaper removes the job (tested with SIGKILL in
    test_k8s.py) and how to delete it."""
    env, state, user = token_env
    job = "k8s-token-revoked"
    give_pods_their_env(kube, job, 2, tmp_path)
    revoked = kube.workdir / "token-auth" / "revoked-users"
    proc = start(
        [
            "--name",
            job,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--launcher",
            "local",
            "-q",
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=300",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        env,
    )
    try:
        wait_started(proc, 4)
        with open(revoked, "a") as f:
            f.write(user + "\n")
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
        forget_pod_env(kube, job, 2)
        kube.kubectl("delete", "configmap", job, "--ignore-not-found", check=False)
    assert proc.returncode == 3, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("mpilaunch: error:")]
    assert len(errors) == 1 and "401 Unauthorized" in errors[0], err
    assert f"mpilaunch delete {job}" in err and "reaper" in err
    assert leftover_processes(job) == []
    assert leftover_objects(kube, job) == []
