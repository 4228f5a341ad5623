"""What the job's pods run as: PodSecurity ``restricted`` by default (pure).

A shared cluster's namespace commonly enforces the ``restricted`` Pod Security
Standard, which refuses any pod that does not say it runs as non-root, without
privilege escalation, with every capability dropped and the runtime's default
seccomp profile. Most MPI images (the project's own, Debian's, NVIDIA's) have
no ``USER`` line, so they would run as root and ``runAsNonRoot`` alone would
make the kubelet refuse them: mpilaunch therefore names a non-root UID itself
(``--run-as-user``, default 1000:1000). Every piece mpilaunch runs in a pod
works without a passwd entry for it (HOME and TMPDIR point at the pod's
writable ``/tmp``), which is also what OpenShift's ``restricted-v2`` (a random
UID, GID 0) needs: ``--run-as-user image`` leaves the UID to the image or the
platform.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import UsageError
from . import mesh

DEFAULT_RUN_AS = "1000:1000"
# the pod's writable scratch: the launcher's run directory, MPI's session directories, the exec
# transport's pid files; HOME too (a UID without a passwd entry has none)
SCRATCH_DIR = "/tmp"
RUN_AS_HINT = (
    "--run-as-user UID[:GID] (a non-root UID, e.g. 1000:1000), --run-as-user image (the image's or the "
    "platform's own user, e.g. on OpenShift), or --run-as-user root where the namespace allows it"
)


@dataclass(frozen=True)
class RunAs:
    """``uid``/``gid`` None: not set by mpilaunch (the image's, the platform's or the pod template's)."""

    uid: int | None
    gid: int | None
    root: bool = False


def parse_run_as(text: str) -> RunAs:
    """``UID[:GID]``, ``image`` or ``root`` (UID 0: no ``runAsNonRoot``; refused under ``restricted``)."""
    if text == "image":
        return RunAs(None, None)
    if text in ("root", "0", "0:0"):
        return RunAs(0, 0, root=True)
    uid_text, _, gid_text = text.partition(":")
    try:
        uid = int(uid_text)
        gid = int(gid_text) if gid_text else None
    except ValueError:
        raise UsageError(f"invalid --run-as-user {text!r}", RUN_AS_HINT) from None
    if uid < 0 or (gid is not None and gid < 0) or uid > 2**31 - 1 or (gid or 0) > 2**31 - 1:
        raise UsageError(f"invalid --run-as-user {text!r}: IDs are 0 .. 2147483647", RUN_AS_HINT)
    if uid == 0:
        return RunAs(0, gid, root=True)
    return RunAs(uid, gid)


def pod_security_context(run_as: RunAs) -> dict:
    """The pod-level securityContext: ``restricted`` asks for runAsNonRoot and a seccomp profile."""
    ctx: dict = {"seccompProfile": {"type": "RuntimeDefault"}}
    if not run_as.root:
        ctx["runAsNonRoot"] = True
    if run_as.uid is not None:
        ctx["runAsUser"] = run_as.uid
    if run_as.gid is not None:
        ctx["runAsGroup"] = run_as.gid
    return ctx


def container_security_context(read_only_root: bool) -> dict:
    """Each container's: no privilege escalation, no capabilities (neither is needed: MPI's
    daemons and ranks are ordinary processes, the agent listens on an unprivileged port)."""
    ctx: dict = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if read_only_root:
        ctx["readOnlyRootFilesystem"] = True
    return ctx


# The RuntimeDefault seccomp profile refuses process_vm_readv (cross-memory attach) to a process
# without CAP_SYS_PTRACE: MPICH's single-copy path between the ranks of one pod then fails in
# MPI_Init ("process_vm_readv failed (errno 1)"), and UCX's shared memory through /proc/PID/fd
# links with it. Both have a copy path of their own, which these select (seen on the testbed's
# real node; Open MPI 4.1 and 5 fall back by themselves, a 3.2 MB allreduce passed).
SECCOMP_MPI_SETTINGS = (("MPIR_CVAR_CH4_CMA_ENABLE", "0"), ("UCX_POSIX_USE_PROC_LINK", "n"))


def pod_env() -> list[dict]:
    """HOME and TMPDIR on the writable scratch volume, whatever the UID (no passwd entry needed),
    and the MPI settings the RuntimeDefault seccomp profile needs."""
    return [{"name": "HOME", "value": SCRATCH_DIR}, {"name": "TMPDIR", "value": SCRATCH_DIR}] + [
        {"name": k, "value": v} for k, v in SECCOMP_MPI_SETTINGS
    ]


def mesh_annotations(keep_injection: bool) -> dict:
    """Service-mesh sidecars (Istio, linkerd) opted out: a sidecar keeps a launcher Job from ever
    completing, and its proxy would sit between mpirun's daemons, which need raw TCP both ways.
    Kept (a mesh that is mandatory), linkerd's proxy is let take the quit the Job pods send it
    at their end (mesh.py)."""
    if keep_injection:
        return dict(mesh.LINKERD_SHUTDOWN)
    return {"sidecar.istio.io/inject": "false", "linkerd.io/inject": "disabled"}


def template_values(run_as: RunAs, read_only_root: bool, keep_mesh_injection: bool) -> dict:
    return {
        "pod_security": pod_security_context(run_as),
        "container_security": container_security_context(read_only_root),
        "scratch_dir": SCRATCH_DIR,
        "pod_env": pod_env(),
        "mesh_annotations": mesh_annotations(keep_mesh_injection),
        "job_pod_env": mesh.job_pod_env(keep_mesh_injection),
    }
