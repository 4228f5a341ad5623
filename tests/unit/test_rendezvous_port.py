"""The MASTER_PORT mpilaunch hands to rank 0 must not be one the kernel may give away before rank 0
binds it. An ephemeral port was: CI saw rank 0's Gloo rendezvous fail with "Address already in use"
after the local backend picked a port with bind(0)."""

import socket
import subprocess
import sys

from mpilaunch.backends import rendezvous


def ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        return int(ports.read().split()[0])


def test_the_port_is_below_the_ephemeral_range_and_bindable_on_all_addresses():
    for _ in range(20):
        port = rendezvous.free_port_below_ephemeral()
        assert 10000 <= port < ephemeral_low()
        with socket.socket() as sock:
            sock.bind(("", port))  # rank 0 binds every address, not only loopback


def test_a_port_already_taken_is_skipped():
    with socket.socket() as held:
        held.bind(("", 0))
        for _ in range(50):
            assert rendezvous.free_port_below_ephemeral() != held.getsockname()[1]


def test_the_source_shipped_to_a_worker_runs_in_a_bare_python():
    """Workers' own python may lack mpilaunch: the script is the function's source, self-contained."""
    out = subprocess.run(
        [sys.executable, "-I", "-c", rendezvous.free_port_script()], capture_output=True, text=True, check=True
    )
    assert 10000 <= int(out.stdout) < ephemeral_low()


def test_the_local_backend_hands_out_such_a_port(tmp_path):
    from mpilaunch.backends.local.backend import LocalBackend

    addr, port = LocalBackend.rendezvous(object.__new__(LocalBackend), "w-0")
    assert addr == "127.0.0.1" and 10000 <= port < ephemeral_low()
