"""`mpilaunch stacks NAME` trusts only the caller's own run directories, and no credential in them (issue 49).

``$TMPDIR/mpilaunch-NAME-*`` is a name any local user may take in /tmp. A
context found there counts only in a directory of the caller's own (mode 700,
not a link, read without following one) whose owner process surely runs; of it
only the job, its workers and a transport of a fixed set are taken, never a
server, TLS setting, CA, token file or relay: the exec API's credentials are
the caller's own configuration's. The two-user test is
``tests/e2e/local/test_stacks_two_users_trust_tmp.py``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from argparse import Namespace

import pytest

from mpilaunch.hang import collect, local_job
from mpilaunch.job import manage
from mpilaunch.runtime import rundir

OTHER_UID = 1001  # scripts/nonroot-user.sh's mpilaunch-user on the test machines; any uid not ours will do
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="hands a directory to another uid (chown): needs root")

# what a job's mpilaunch writes (lifecycle.write_context), one per transport
AGENT_CONTEXT = {
    "job": "train",
    "backend": "local",
    "transport": "agent",
    "secret_file": "/elsewhere/secret",
    "forward_env": ["PATH", "LD_PRELOAD"],
    "cwd": "/somewhere",
    "workers": {"train-worker-0": {"address": "127.0.0.1:40001"}, "train-worker-1": {"address": "127.0.0.1:40002"}},
    "probe_python": "/usr/bin/python3",
}
EXEC_CONTEXT = {
    "job": "train",
    "backend": "k8s",
    "transport": "mpilaunch.backends.k8s.exec_path.transport",
    "server": "https://203.0.113.7:6443",
    "insecure": True,
    "tls_server_name": "evil",
    "ca_file": "/tmp/x/ca.pem",
    "cert_file": "/root/.kube/client.crt",
    "key_file": "/root/.kube/client.key",
    "token_file": "/root/.kube/config",
    "relay": "/tmp/x/relay.sock",
    "namespace": "team-a",
    "container": "worker",
    "workers": {"train-worker-0": {"pod": "train-worker-0"}},
    "probe_python": "python3",
}
CREDENTIAL_KEYS = {"server", "insecure", "tls_server_name", "ca_file", "cert_file", "key_file", "token_file", "relay"}


def live_owner() -> str:
    return rundir.owner_record(os.getpid())


def make_rundir(base, suffix, context, owner=None, mode=0o700):
    """A run directory ``mpilaunch-train-<suffix>`` as make_rundir leaves it once the job is ready."""
    path = base / f"mpilaunch-train-{suffix}"
    path.mkdir()
    (path / "context.json").write_text(json.dumps(context))
    (path / rundir.OWNER_FILE).write_text(live_owner() if owner is None else owner)
    (path / "secret").write_text("s" * 64)
    path.chmod(mode)
    return path


def found(base, backend=None):
    """The contexts `mpilaunch stacks train [--backend BACKEND]` would act on."""
    return [
        c
        for c in local_job.running_contexts("train", tmpdir=str(base))
        if backend is None or c.get("backend") == backend
    ]


# ----------------------------------------------------------------- the pure checks


def fake_stat(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, uid, 0, 0, 0, 0))


def test_trust_tmp_only_a_directory_of_ones_own_with_mode_700_is_a_run_directory():
    me = 1234
    assert rundir.is_own_rundir(fake_stat(stat.S_IFDIR | 0o700, me), me)
    assert not rundir.is_own_rundir(fake_stat(stat.S_IFDIR | 0o700, me + 1), me)  # another user's
    for mode in (0o755, 0o770, 0o707, 0o1700, 0o500):
        assert not rundir.is_own_rundir(fake_stat(stat.S_IFDIR | mode, me), me), oct(mode)
    assert not rundir.is_own_rundir(fake_stat(stat.S_IFLNK | 0o777, me), me)  # lstat of a link
    assert not rundir.is_own_rundir(fake_stat(stat.S_IFREG | 0o700, me), me)


def test_trust_tmp_only_a_regular_file_of_ones_own_is_read():
    me = 1234
    assert rundir.is_own_file(fake_stat(stat.S_IFREG | 0o644, me), me)
    assert not rundir.is_own_file(fake_stat(stat.S_IFREG | 0o644, me + 1), me)
    assert not rundir.is_own_file(fake_stat(stat.S_IFIFO | 0o600, me), me)
    assert not rundir.is_own_file(fake_stat(stat.S_IFLNK | 0o777, me), me)


def test_trust_tmp_an_empty_partial_or_unreadable_owner_file_is_not_alive():
    identity = ("boot-1", "pid:[4026531836]")
    record = f"mpilaunch-rundir-owner v1\npid=4242\nstart=777\nboot={identity[0]}\npidns={identity[1]}\n"
    running = {4242: "777"}.get
    assert rundir.owner_alive(record, identity, start_of=running)
    for bad in (None, "", "mpilaunch-rundir-owner v1\n", "not an owner file\npid=4242\nstart=777\n", record[:30]):
        assert not rundir.owner_alive(bad, identity, start_of=running), bad
    assert not rundir.owner_alive(record, identity, start_of={4242: "778"}.get)  # the pid was reused
    assert not rundir.owner_alive(record, identity, start_of={}.get)  # no such process
    assert not rundir.owner_alive(record.replace("start=777", "start=?"), identity, start_of={4242: "?"}.get)
    assert not rundir.owner_alive(record, ("boot-2", identity[1]), start_of=running)  # another machine's
    assert not rundir.owner_alive(record, (identity[0], "pid:[1]"), start_of=running)  # another container's
    # the sweep's question is another one: it removes only what is surely dead, never an empty record
    assert rundir.owner_gone("") is False
    assert rundir.owner_alive(live_owner())


def test_trust_tmp_stacks_context_keeps_workers_and_no_credential():
    exec_api = local_job.stacks_context(EXEC_CONTEXT, "/tmp/mpilaunch-train-abc")
    assert exec_api == {
        "job": "train",
        "backend": "k8s",
        "transport": "mpilaunch.backends.k8s.exec_path.transport",
        "workers": {"train-worker-0": {"pod": "train-worker-0"}},
        "container": "worker",
        "namespace": "team-a",
        "probe_python": "python3",
    }
    assert local_job.needs_credentials(exec_api)
    agent = local_job.stacks_context(AGENT_CONTEXT, "/tmp/mpilaunch-train-abc")
    assert agent == {
        "job": "train",
        "backend": "local",
        "transport": "agent",
        "secret_file": "/tmp/mpilaunch-train-abc/secret",  # the run directory's own, wherever it says
        "workers": AGENT_CONTEXT["workers"],
        "probe_python": "/usr/bin/python3",
    }
    assert not local_job.needs_credentials(agent)


@pytest.mark.parametrize(
    "change",
    [
        {"transport": "os"},  # any importable module would be imported by the shim's load_transport
        {"transport": "evil.module"},
        {"transport": "mpilaunch.rsh_agent.transports.agent"},  # right module, not the fixed name
        {"secret_file": "/elsewhere/.."},
        {"secret_file": ""},
        {"workers": {}},
        {"workers": {"w": {"pod": "w"}}},  # the agent's workers have addresses
        {"workers": {"w": {"address": 7}}},
        {"job": None},
        {"backend": None},
    ],
)
def test_trust_tmp_stacks_context_refuses_what_is_not_a_jobs(change):
    assert local_job.stacks_context({**AGENT_CONTEXT, **change}, "/tmp/mpilaunch-train-abc") is None


def test_trust_tmp_the_fixed_transports_are_the_backends_own():
    from mpilaunch.backends.k8s.launch import TRANSPORT
    from mpilaunch.rsh_agent.shim import load_transport

    assert set(local_job.STACKS_TRANSPORTS) == {"agent", TRANSPORT}
    for name in local_job.STACKS_TRANSPORTS:
        assert callable(load_transport(name).capture)


# ----------------------------------------------------------------- the run directories found by name


def test_trust_tmp_the_callers_own_running_job_is_found(tmp_path):
    make_rundir(tmp_path, "abc123", AGENT_CONTEXT)
    assert [c["workers"] for c in found(tmp_path)] == [AGENT_CONTEXT["workers"]]
    assert found(tmp_path, "local") == found(tmp_path)
    assert found(tmp_path, "k8s") == []


def test_trust_tmp_a_found_context_gives_no_credential(tmp_path):
    own = make_rundir(tmp_path, "abc123", AGENT_CONTEXT)
    make_rundir(tmp_path, "def456", EXEC_CONTEXT)
    contexts = found(tmp_path)
    assert [c["transport"] for c in contexts] == ["agent", "mpilaunch.backends.k8s.exec_path.transport"]
    assert contexts[0]["secret_file"] == str(own / "secret")
    assert not any(CREDENTIAL_KEYS & set(c) for c in contexts), contexts
    # only the job's backend's, where `stacks` names one
    assert local_job.running_contexts("train", "k8s", str(tmp_path)) == contexts[1:]


@as_root
def test_trust_tmp_a_directory_of_another_user_is_ignored(tmp_path):
    planted = make_rundir(tmp_path, "", EXEC_CONTEXT)
    for path in (planted, *planted.iterdir()):
        os.chown(path, OTHER_UID, OTHER_UID)
    assert found(tmp_path) == []
    assert found(tmp_path, "k8s") == []


def test_trust_tmp_a_directory_others_may_enter_is_ignored(tmp_path):
    make_rundir(tmp_path, "", AGENT_CONTEXT, mode=0o755)
    make_rundir(tmp_path, "x", AGENT_CONTEXT, mode=0o777)
    assert found(tmp_path) == []


def test_trust_tmp_a_link_to_a_run_directory_or_a_context_is_not_followed(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    real = make_rundir(tmp_path / "elsewhere", "real", AGENT_CONTEXT)
    (tmp_path / "mpilaunch-train-").symlink_to(real)
    linked = make_rundir(tmp_path, "linked", AGENT_CONTEXT)
    (linked / "context.json").unlink()
    (linked / "context.json").symlink_to(real / "context.json")
    assert found(tmp_path) == []


def test_trust_tmp_an_empty_owner_file_is_not_a_running_job(tmp_path):
    make_rundir(tmp_path, "", AGENT_CONTEXT, owner="")
    make_rundir(tmp_path, "dead", AGENT_CONTEXT, owner=rundir.owner_record(dead_pid()))
    assert found(tmp_path) == []


def test_trust_tmp_a_context_naming_another_transport_is_ignored(tmp_path):
    make_rundir(tmp_path, "", {**AGENT_CONTEXT, "transport": "antigravity"})
    assert found(tmp_path) == []


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


# ----------------------------------------------------------------- what `stacks` sends where


def test_trust_tmp_stacks_reaches_a_local_k8s_job_with_the_callers_own_credentials(tmp_path, monkeypatch):
    """The job's own context names another server, TLS off and a token file: none of it is used. The
    server, the CA and the token are the caller's kubeconfig's, the namespace and pods the job's."""
    base = tmp_path / "tmp"
    base.mkdir()
    make_rundir(base, "abc123", EXEC_CONTEXT)
    (tmp_path / "ca.pem").write_text("not read here")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "mine",
                "contexts": [{"name": "mine", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://127.0.0.1:16443", "certificate-authority": "ca.pem"}}
                ],
                "users": [{"name": "u", "user": {"token": "the-callers-own-token"}}],
            }
        )
    )
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    used = []

    def take(context, python, **kwargs):
        used.append((context, python))
        return collect.Collection([], {}, 0.0)

    monkeypatch.setattr(collect, "collect_from_context", take)
    args = Namespace(
        name="train", backend="k8s", kubeconfig=str(kubeconfig), context=None, namespace=None, json=True, deadline=1.0
    )
    assert manage.stacks(args) == 0
    [(context, python)] = used
    assert python == "python3"
    assert context["server"] == "https://127.0.0.1:16443"
    assert context["ca_file"] == str(tmp_path / "ca.pem")
    assert context["token"] == "the-callers-own-token"
    assert context["namespace"] == "team-a" and context["container"] == "worker"
    assert context["workers"] == {"train-worker-0": {"pod": "train-worker-0"}}
    assert not {"insecure", "tls_server_name", "cert_file", "key_file", "token_file", "relay"} & set(context)


def test_trust_tmp_the_exec_transport_sends_a_token_held_in_memory():
    from mpilaunch.backends.k8s.exec_path import exec_stream

    assert exec_stream.bearer_token({"token": "t", "token_file": "/nonexistent"}) == "t"
    assert exec_stream.bearer_token({}) is None
