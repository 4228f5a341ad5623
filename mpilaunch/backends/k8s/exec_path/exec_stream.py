"""The Kubernetes exec API over a stdlib-only websocket client: the connection, its frames, the session.

``ssl`` + an HTTP/1.1 Upgrade to ``/api/v1/namespaces/NS/pods/POD/exec`` with the
``v5.channel.k8s.io`` subprotocol (``v4`` as a fallback). Every websocket
message carries one channel byte: 0 stdin, 1 stdout, 2 stderr, 3 the final
``Status`` (exit code), 255 (v5) "close this channel" (our stdin's EOF).

Context keys (written once per job by the backend or the launcher pod):
``server``, ``ca_file`` | ``insecure``, ``token_file`` | ``cert_file`` +
``key_file``, ``namespace``, ``container``; ``in_cluster: true`` takes the
server from ``KUBERNETES_SERVICE_HOST/PORT``.

Used by the shim's direct path (:mod:`.transport`), the job's exec relay
(:mod:`.relay`) and the REST client (:mod:`..api`, for the address and the
credentials): stdlib only, it starts once per daemon.
"""

import os

from ....core import env_names

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255
DEFAULT_CONNECT_TIMEOUT = 30.0
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

_OP_CONT, _OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING, _OP_PONG = 0, 1, 2, 8, 9, 10


class ExecError(ConnectionError):
    pass


# ----------------------------------------------------------------- url + auth


def _quote(text: str) -> str:
    safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~"
    return "".join(chr(b) if b in safe else "%%%02X" % b for b in text.encode("utf-8"))


def server_address(context: dict):
    """``(host, port, host_header)`` of the API server."""
    if context.get("in_cluster"):
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ExecError("in-cluster context but KUBERNETES_SERVICE_HOST is not set")
        return host, int(port), (f"[{host}]" if ":" in host else host) + f":{port}"
    url = context["server"]
    if url.startswith("https://"):
        rest = url[8:]
    elif url.startswith("http://"):
        raise ExecError("plain-http API servers are not supported")
    else:
        rest = url
    hostport = rest.split("/", 1)[0]
    if hostport.startswith("["):
        host, _, port = hostport[1:].partition("]")
        port = port.lstrip(":") or "443"
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    else:
        host, port = hostport, "443"
    return host, int(port), hostport


def _read_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def _sa_dir(context: dict) -> str:
    return context.get("sa_dir") or os.environ.get(env_names.K8S_SA_DIR) or SA_DIR


def ssl_context(context: dict):
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if context.get("insecure"):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ca = context.get("ca_file") or (os.path.join(_sa_dir(context), "ca.crt") if context.get("in_cluster") else None)
        if ca:
            ctx.load_verify_locations(cafile=ca)
        else:
            ctx.load_default_certs()
    if context.get("cert_file"):
        ctx.load_cert_chain(context["cert_file"], context.get("key_file") or None)
    return ctx


def bearer_token(context: dict):
    """Read at every start: projected ServiceAccount tokens are rotated in place. ``token``: one held
    in memory (the user's own, resolved without a run directory: `mpilaunch stacks`); never in a
    context file."""
    if context.get("token"):
        return context["token"]
    path = context.get("token_file") or (os.path.join(_sa_dir(context), "token") if context.get("in_cluster") else None)
    return _read_file(path) if path else None


def exec_path(namespace: str, pod: str, container, argv, stdin: bool = True) -> str:
    query = [("command", a) for a in argv]
    query += [("stdin", "true" if stdin else "false"), ("stdout", "true"), ("stderr", "true")]
    if container:
        query.append(("container", container))
    qs = "&".join(f"{k}={_quote(v)}" for k, v in query)
    return f"/api/v1/namespaces/{_quote(namespace)}/pods/{_quote(pod)}/exec?{qs}"


# ----------------------------------------------------------------- websocket


class Channel:
    """One exec session over a client websocket (RFC 6455; client frames masked)."""

    def __init__(self, sock, protocol: str, leftover: bytes = b""):
        self.sock = sock
        self.protocol = protocol
        self.buf = bytearray(leftover)
        self.closed = False
        self.tls_session = None
        self._fragments = None

    # -- sending
    def send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytearray([0x80 | opcode])
        if n < 126:
            head.append(0x80 | n)
        elif n < 65536:
            head.append(0x80 | 126)
            head += n.to_bytes(2, "big")
        else:
            head.append(0x80 | 127)
            head += n.to_bytes(8, "big")
        mask = os.urandom(4)
        head += mask
        if n:
            # XOR the payload with the repeated mask as two big integers: a
            # per-byte Python loop would cost a millisecond per 10 kB.
            reps = (mask * (n // 4 + 1))[:n]
            payload = (int.from_bytes(payload, "big") ^ int.from_bytes(reps, "big")).to_bytes(n, "big")
        self.sock.sendall(bytes(head) + payload)

    def send(self, channel: int, data: bytes) -> None:
        self.send_frame(_OP_BINARY, bytes([channel]) + data)

    def close_stdin(self) -> bool:
        if self.protocol.startswith("v5."):
            self.send(CLOSE, bytes([STDIN]))
            return True
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.tls_session = self.sock.session  # for a relay's next connection
            except (AttributeError, ValueError, OSError):
                pass
            try:
                self.send_frame(_OP_CLOSE, (1000).to_bytes(2, "big"))
            except OSError:
                pass
        try:
            self.sock.close()
        except OSError:
            pass

    # -- receiving
    def _fill(self) -> bool:
        import ssl

        try:
            data = self.sock.recv(262144)
        except ssl.SSLWantReadError:
            return True
        if not data:
            return False
        self.buf += data
        return True

    def _parse(self):
        """One complete frame from the buffer: ``(fin, opcode, payload)`` or None."""
        b = self.buf
        if len(b) < 2:
            return None
        fin, opcode = b[0] & 0x80, b[0] & 0x0F
        masked, n = b[1] & 0x80, b[1] & 0x7F
        i = 2
        if n == 126:
            if len(b) < 4:
                return None
            n, i = int.from_bytes(b[2:4], "big"), 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, i = int.from_bytes(b[2:10], "big"), 10
        if masked:
            if len(b) < i + 4:
                return None
            mask, i = bytes(b[i : i + 4]), i + 4
        if len(b) < i + n:
            return None
        payload = bytes(b[i : i + n])
        del b[: i + n]
        if masked and n:
            reps = (mask * (n // 4 + 1))[:n]
            payload = (int.from_bytes(payload, "big") ^ int.from_bytes(reps, "big")).to_bytes(n, "big")
        return fin, opcode, payload

    def messages(self):
        """Complete data messages now readable; [] when none, None at end of stream."""
        if not self._fill():
            return None
        while self.sock.pending():
            if not self._fill():
                break
        out = []
        while True:
            frame = self._parse()
            if frame is None:
                return out
            fin, opcode, payload = frame
            if opcode == _OP_PING:
                self.send_frame(_OP_PONG, payload)
            elif opcode == _OP_CLOSE:
                out.append(None)
                return out
            elif opcode in (_OP_TEXT, _OP_BINARY):
                if fin:
                    out.append(payload)
                else:
                    self._fragments = bytearray(payload)
            elif opcode == _OP_CONT and self._fragments is not None:
                self._fragments += payload
                if fin:
                    out.append(bytes(self._fragments))
                    self._fragments = None


def connect(
    context: dict, pod: str, argv, stdin: bool = True, timeout: float = None, tls=None, token=None, tls_session=None
) -> Channel:
    """Open an exec websocket. ``tls``/``token``/``tls_session``: a relay's shared
    SSLContext, token and TLS session (resumption skips the certificate work
    on both sides)."""
    import socket

    host, port, host_header = server_address(context)
    timeout = float(context.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)) if timeout is None else timeout
    ctx = tls or ssl_context(context)
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = ctx.wrap_socket(raw, server_hostname=context.get("tls_server_name") or host, session=tls_session)
    except BaseException:
        raw.close()
        raise
    try:
        import base64

        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {exec_path(context.get('namespace') or 'default', pod, context.get('container'), argv, stdin)} HTTP/1.1",
            f"Host: {host_header}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            f"Sec-WebSocket-Protocol: {', '.join(PROTOCOLS)}",
            "User-Agent: mpilaunch-rsh",
        ]
        token = token or bearer_token(context)
        if token:
            lines.append(f"Authorization: Bearer {token}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = bytearray()
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            if not chunk:
                raise ExecError(f"API server closed the connection during the exec handshake for pod {pod}")
            head += chunk
            if len(head) > 1 << 20:
                raise ExecError("oversized handshake response")
        header, _, rest = bytes(head).partition(b"\r\n\r\n")
        status_line, *header_lines = header.decode("latin-1").split("\r\n")
        fields = {}
        for line in header_lines:
            k, _, v = line.partition(":")
            fields[k.strip().lower()] = v.strip()
        code = status_line.split(" ", 2)[1] if " " in status_line else "?"
        if code != "101":
            body = bytes(rest)
            length = int(fields.get("content-length", "0") or 0)
            while len(body) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
            raise ExecError(_status_message(body.decode("utf-8", "replace")) or status_line)
        protocol = fields.get("sec-websocket-protocol", "")
        if protocol not in PROTOCOLS:
            raise ExecError(f"API server chose no known exec protocol ({protocol or 'none'})")
        sock.settimeout(None)
        return Channel(sock, protocol, rest)
    except BaseException:
        sock.close()
        raise


def _status_message(text: str) -> str:
    """The ``message`` of a Kubernetes Status object, else the text."""
    text = text.strip()
    if text.startswith("{"):
        try:
            from mpilaunch.rsh_agent.shim import loads_json

            return str(loads_json(text).get("message") or text)
        except (ValueError, AttributeError):
            pass
    return text


def exit_code_from_status(text: str):
    """Channel 3 ``Status`` -> ``(exit code, message)``."""
    from mpilaunch.rsh_agent.shim import loads_json

    try:
        status = loads_json(text)
    except ValueError:
        return 255, text
    if status.get("status") == "Success":
        return 0, None
    details = status.get("details") or {}
    for cause in details.get("causes") or ():
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message")), None
            except (TypeError, ValueError):
                break
    return 255, status.get("message") or text


# ----------------------------------------------------------------- session


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BrokenPipeError:
            return
        view = view[n:]


def session(channel: Channel, stdin_fd=0, wakeup_fd=None, on_wakeup=None, out_fd=1, err_fd=2) -> int:
    """Pump stdin/stdout/stderr until the remote Status; return the exit code.

    Single-threaded (``poll``; a relay holds more than 1024 descriptors, so
    no ``select``): one TLS object must not be read and written from two
    threads at once. ``on_wakeup(timed_out)`` runs when ``wakeup_fd`` (a
    signal wakeup pipe or a relay's control socket) is readable or the
    timeout it returned last passed; it returns the next timeout in seconds
    (None: none), or False to hang up.
    """
    import select

    stdin_open = stdin_fd is not None
    if stdin_open:
        try:
            os.fstat(stdin_fd)
        except OSError:
            stdin_open = False
            channel.close_stdin()
    status = None
    timeout = None
    poller = select.poll()
    sock_fd = channel.sock.fileno()
    flags = select.POLLIN | select.POLLHUP | select.POLLERR
    poller.register(sock_fd, flags)
    if stdin_open:
        poller.register(stdin_fd, flags)
    if wakeup_fd is not None:
        poller.register(wakeup_fd, flags)
    while True:
        if channel.sock.pending():
            ready = {sock_fd}
        else:
            events = poller.poll(None if timeout is None else int(timeout * 1000))
            ready = {fd for fd, _ev in events}
        if wakeup_fd is not None and (wakeup_fd in ready or (timeout is not None and not ready)):
            timeout = on_wakeup(not ready)
            if timeout is False:
                channel.close()
                return 255
        if stdin_open and stdin_fd in ready:
            try:
                data = os.read(stdin_fd, 65536)
            except OSError:
                data = b""
            if data:
                channel.send(STDIN, data)
            else:
                stdin_open = False
                poller.unregister(stdin_fd)
                channel.close_stdin()
        if sock_fd in ready:
            messages = channel.messages()
            if messages is None:
                break
            for payload in messages:
                if payload is None:
                    channel.close()
                    return status if status is not None else _lost(err_fd)
                if not payload:
                    continue
                ch, data = payload[0], payload[1:]
                if not data:
                    continue  # the server's per-channel hello
                if ch == STDOUT:
                    write_all(out_fd, data)
                elif ch == STDERR:
                    write_all(err_fd, data)
                elif ch == ERROR:
                    code, message = exit_code_from_status(data.decode("utf-8", "replace"))
                    if message:
                        write_all(err_fd, f"mpilaunch-rsh: {message}\n".encode("utf-8", "replace"))
                    status = code
    channel.close()
    return status if status is not None else _lost(err_fd)


def _lost(err_fd: int = 2) -> int:
    write_all(err_fd, b"mpilaunch-rsh: exec stream ended without an exit status\n")
    return 255


def run_simple(context: dict, pod: str, argv, timeout: float = 30.0, tls=None, token=None, err_fd=2) -> int:
    """Run argv in the pod without stdin, output to our stdout/stderr (helper execs)."""
    channel = connect(context, pod, argv, stdin=False, timeout=timeout, tls=tls, token=token)
    channel.sock.settimeout(timeout)
    return session(channel, stdin_fd=None, out_fd=err_fd, err_fd=err_fd)
