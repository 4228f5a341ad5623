"""The ssh backend's pure parts: its options, the ssh command it builds, its checks of the hostfile.

Nothing here starts ssh; tests/e2e/ssh/ runs the backend against real sshd hosts.
"""

from __future__ import annotations

import argparse
import shlex

import pytest

from mpilaunch.backends.ssh.backend import READY, STAGE0, ZIP_ON_HOST, SshBackend, remote_command
from mpilaunch.backends.ssh.options import DEFAULT_SSH_OPTIONS, SshOptions
from mpilaunch.core.errors import UsageError
from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan


def parse(*argv: str) -> SshOptions:
    parser = argparse.ArgumentParser()
    SshOptions.add_arguments(parser.add_argument_group("--backend ssh"))
    return SshOptions.from_args(parser.parse_args(list(argv)))


def test_defaults_are_plain_ssh_and_python3():
    assert parse() == SshOptions() == SshOptions(ssh_command="ssh", ssh_options=(), remote_python="python3")


def test_the_users_options_come_first_so_they_win_over_ours():
    options = parse(
        "--ssh-command",
        "ssh -F '/etc/my cluster.conf'",
        "--ssh-option",
        "ConnectTimeout=3",
        "--ssh-option",
        "BatchMode no",
        "--remote-python",
        "/opt/py/bin/python3",
    )
    defaults = [word for option in DEFAULT_SSH_OPTIONS for word in ("-o", option)]
    assert options.ssh_argv("node-1", "CMD") == [
        "ssh",
        "-F",
        "/etc/my cluster.conf",
        "-o",
        "ConnectTimeout=3",
        "-o",
        "BatchMode no",
        *defaults,
        "-T",
        "--",
        "node-1",
        "CMD",
    ]


def test_the_host_runs_its_python_on_stage0_and_nothing_secret_is_in_the_command():
    command = remote_command(SshOptions(remote_python="/opt/my python/python3"), "node-1")
    assert shlex.split(command) == ["exec", "/opt/my python/python3", "-c", STAGE0, "node-1"]
    compile(STAGE0, "stage0", "exec")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ssh_command": "ssh -F 'open"}, '--ssh-command "ssh -F \'open" is not a command line'),
        ({"ssh_command": "  "}, "--ssh-command is empty"),
        ({"ssh_options": ("-oProxyCommand=x",)}, "--ssh-option '-oProxyCommand=x' is not an ssh_config option"),
        ({"remote_python": ""}, "--remote-python '' is no program"),
    ],
)
def test_bad_options_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError) as err:
        SshOptions(**kwargs)
    assert err.value.message.startswith(message) and err.value.hint


def spec(**kw) -> JobSpec:
    return JobSpec(command=("true",), backend="ssh", **kw)


def test_the_hosts_are_the_hostfiles_and_ssh_must_exist():
    with pytest.raises(UsageError) as err:
        SshBackend.check_spec(spec())
    assert err.value.message == "the ssh backend runs on the hosts of --hostfile, and none was given"
    SshBackend.check_spec(spec(hostfile="hosts"))
    with pytest.raises(UsageError, match=r"the ssh client 'no-such-ssh' \(--ssh-command\) is not an executable"):
        SshBackend.check_spec(spec(hostfile="hosts", backend_options=SshOptions(ssh_command="no-such-ssh -F x")))
    SshBackend.check_spec(spec(hostfile="hosts", retries=1))  # a lost host gets a new session
    with pytest.raises(UsageError, match="--detach needs a cluster backend"):
        SshBackend.check_spec(spec(hostfile="hosts", detach=True))


@pytest.mark.parametrize(
    "hosts, why",
    [
        (["node-1", "node-1"], "--hostfile names host 'node-1' twice"),
        (["-oProxyCommand=evil"], "--hostfile names host '-oProxyCommand=evil' in a form ssh would take"),
        (["bob@node-1"], "--hostfile names host 'bob@node-1' in a form ssh would take"),
    ],
)
def test_hosts_ssh_would_misread_are_refused(tmp_path, hosts, why):
    plan = Plan("j", tuple(WorkerPlan(host, 1, 0) for host in hosts))
    with pytest.raises(UsageError) as err:
        SshBackend(spec(hostfile="hosts"), plan, tmp_path)
    assert err.value.message.startswith(why)


def test_a_rank_starts_the_zips_wrapper_with_the_hosts_python(tmp_path):
    backend = SshBackend(
        spec(hostfile="h", backend_options=SshOptions(remote_python="/usr/bin/python3")),
        Plan("j", (WorkerPlan("node-1", 2, 0),)),
        tmp_path,
    )
    prefix = backend.rank_prefix()
    assert prefix[:3] == ["/usr/bin/python3", "-IS", "-c"]
    # one line (it travels in mpirun's argv): the zip the host unpacked on the path, then the module's main
    assert "\n" not in prefix[3] and f"sys.path.insert(0, {ZIP_ON_HOST})" in prefix[3]
    assert "from mpilaunch.rank import main" in prefix[3]
    compile(prefix[-1], "rank", "exec")
    # the shim reaches each host's agent at the address its line gave; no cwd: mpirun sets the ranks'
    backend.facts = {"node-1": {"address": "10.0.0.1:4000"}}
    context = backend.exec_context()
    assert context["transport"] == "agent" and context["workers"] == {"node-1": {"address": "10.0.0.1:4000"}}
    assert "cwd" not in context and "PATH" in context["forward_env"]


def test_a_login_scripts_chatter_before_the_hosts_line_is_skipped(tmp_path):
    import os
    import selectors

    backend = SshBackend(spec(hostfile="h"), Plan("j", (WorkerPlan("node-1", 1, 0),)), tmp_path)
    read, write = os.pipe()
    with selectors.DefaultSelector() as sel, os.fdopen(read, "rb") as pipe:
        sel.register(pipe, selectors.EVENT_READ)
        os.write(write, b"Welcome to node-1\n" + READY + b'{"address": "10.0.0.1:4000"')
        assert not backend._read_line(sel, pipe, "node-1", received := bytearray())
        os.write(write, b"}\n")
        assert backend._read_line(sel, pipe, "node-1", received)
        assert backend.facts == {"node-1": {"address": "10.0.0.1:4000"}} and not sel.get_map()
    os.close(write)
