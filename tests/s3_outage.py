"""A storage outage for tests: a loopback TCP proxy in front of the test S3 server that refuses
every request for a window of time, then forwards again.

A refused request is answered ``503 SlowDown`` (S3's own "back off") or, every other time, the
connection is dropped after its request was read (a network error): the two faults an S3 client
meets in an outage. The proxy reads only each request's head; the client's bytes and the
server's answer otherwise pass through unchanged, one request per connection (it asks the server
to close after each) so that every request is seen, and can be refused, on its own.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>outage</RequestId></Error>"
)
HEAD_LIMIT = 64 * 1024
# A refused upload's body is read (and dropped) up to this size, so the client gets the answer
# rather than a reset while it still sends; a larger one is cut off, a dropped connection too.
DRAIN_LIMIT = 16 * 1024**2


class OutageProxy:
    """``endpoint`` forwards to ``upstream`` (host, port) but refuses every request for
    ``seconds`` from the first request for which ``starts_on(method, target)`` is true (from the
    start when it is None). ``refused`` counts the requests refused."""

    def __init__(
        self,
        upstream: tuple[str, int],
        seconds: float,
        starts_on: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.upstream, self.seconds, self.starts_on = upstream, seconds, starts_on
        self.refused = 0
        self.forwarded = 0
        #: (seconds since the proxy started, method, target, "forwarded" or "refused")
        self.requests: list[tuple[float, str, str, str]] = []
        self._t0 = time.monotonic()
        self.began: float | None = None if starts_on else time.monotonic()
        self._lock, self._stopped = threading.Lock(), threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def serve(self) -> None:
        # A timeout, as closing a socket does not wake another thread's accept() on Linux.
        self._listener.settimeout(0.2)
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()
        self._listener.close()

    def close(self) -> None:
        self._stopped.set()

    def _refuses(self, method: str, target: str) -> int:
        """0 to forward; else the refusal's number (1, 2, ...)."""
        now = time.monotonic()
        with self._lock:
            if self.began is None and self.starts_on(method, target):
                self.began = now
            refused = self.began is not None and now < self.began + self.seconds
            self.requests.append(
                (now - self._t0, method, target, "refused" if refused else "forwarded")
            )
            if not refused:
                self.forwarded += 1
                return 0
            self.refused += 1
            return self.refused

    def _handle(self, client: socket.socket) -> None:
        with client:
            client.settimeout(30)
            try:
                head, rest = _read_head(client)
            except OSError:
                return
            if not head:
                return
            method, target, headers = _parse(head)
            refusal = self._refuses(method, target)
            if refusal == 0:
                _forward(client, self.upstream, _closing(head), rest)
            elif refusal % 2 == 0:
                _drop(client)
            else:
                _slow_down(client, method, headers, len(rest))


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """(the request's head up to its blank line, the bytes read after it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk or len(data) > HEAD_LIMIT:
            return b"", b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _parse(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, *_ = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, target, headers


def _closing(head: bytes) -> bytes:
    """The head with ``Connection: close``: the server ends the connection after its answer."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    kept = [line for line in lines if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n"


def _forward(client: socket.socket, upstream: tuple[str, int], head: bytes, rest: bytes) -> None:
    try:
        server = socket.create_connection(upstream, timeout=30)
    except OSError:
        return
    with server:
        server.sendall(head + rest)
        _pipe(client, server)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until both sides have finished sending."""
    open_ends = {a: b, b: a}
    with selectors.DefaultSelector() as selector:
        for sock in open_ends:
            selector.register(sock, selectors.EVENT_READ)
        while open_ends:
            for key, _ in selector.select(timeout=30) or [(None, None)]:
                if key is None:
                    return  # idle for 30 s: give up on this connection
                sock = key.fileobj
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                if data:
                    open_ends[sock].sendall(data)
                    continue
                selector.unregister(sock)
                with contextlib.suppress(OSError):
                    open_ends.pop(sock).shutdown(socket.SHUT_WR)


def _drain(sock: socket.socket, headers: dict[str, str], have: int) -> None:
    """Read the body the client sends, unless it waits for ``100 Continue`` first."""
    if headers.get("expect", "").lower() == "100-continue":
        return
    left = min(int(headers.get("content-length", "0") or 0), DRAIN_LIMIT) - have
    while left > 0:
        chunk = sock.recv(min(left, 65536))
        if not chunk:
            return
        left -= len(chunk)


def _slow_down(client: socket.socket, method: str, headers: dict[str, str], have: int) -> None:
    with contextlib.suppress(OSError):
        _drain(client, headers, have)
        body = b"" if method == "HEAD" else SLOW_DOWN
        client.sendall(
            b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
            + f"Content-Length: {len(SLOW_DOWN)}\r\n".encode()
            + b"Connection: close\r\n\r\n"
            + body
        )


def _drop(client: socket.socket) -> None:
    """Close at once, unanswered (as a load balancer or a restarting server does)."""
    with contextlib.suppress(OSError):
        client.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def s3_outage(
    endpoint: str, seconds: float, starts_on: Callable[[str, str], bool] | None = None
) -> Iterator[OutageProxy]:
    """An ``OutageProxy`` in front of the S3 server at ``endpoint`` (http://127.0.0.1:PORT),
    serving until the block ends."""
    host, _, port = endpoint.removeprefix("http://").rstrip("/").partition(":")
    proxy = OutageProxy((host, int(port)), seconds, starts_on)
    thread = threading.Thread(target=proxy.serve, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.close()
        thread.join(timeout=10)
