"""A TCP service for reachability tests: it answers every connection with "ok" and hangs up.

Run in a pod (``python3 -c LISTENER``) or a process; the NetworkPolicy tests ask whether a peer
reaches it (test_network_policy_testbed.py: the enforcer; test_network_policy_job.py: the job's
own policies)."""

LISTENER_PORT = 8080
LISTENER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {LISTENER_PORT})); s.listen(64)
while True:
    c, _ = s.accept()
    try:
        c.sendall(b"ok")
    finally:
        c.close()
"""
