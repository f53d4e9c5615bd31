"""A TCP proxy on loopback that puts network faults between a client and a server.

Tests of remote storage run a real server (moto's S3-compatible one) and point the
client at this proxy, so latency, dropped connections and outages happen on the network
path, where they happen to users, instead of inside the code under test.

- ``latency``: seconds added before each request is forwarded (a request starts with the
  first bytes a client sends after the server last answered on that connection).
- :meth:`outage`: refuse new connections (reset at once) and drop the open ones, until
  :meth:`restore`.
- :meth:`drop_connections`: reset every open connection once.
- :meth:`throttle`: answer the next requests with ``503 SlowDown`` (S3's throttling
  reply) instead of forwarding them.
- ``bytes_down`` / ``bytes_up``: bytes forwarded server -> client and client -> server;
  ``requests``: requests forwarded.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

__all__ = ["NetProxy"]

_BUFFER = 1 << 16
_SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
    + f"Content-Length: {len(_SLOW_DOWN_BODY)}\r\n\r\n".encode()
    + _SLOW_DOWN_BODY
)


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a crashed peer or a dropped route would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class NetProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (host, port), one thread pair per connection.

    Examples:
        >>> import socket, threading
        >>> server = socket.create_server(("127.0.0.1", 0))
        >>> def echo():
        ...     conn, _ = server.accept()
        ...     conn.sendall(conn.recv(5)); conn.close()
        >>> t = threading.Thread(target=echo); t.start()
        >>> with NetProxy(server.getsockname()) as proxy:
        ...     with socket.create_connection(("127.0.0.1", proxy.port)) as c:
        ...         c.sendall(b"hello"); reply = c.recv(5)
        >>> t.join(); server.close(); reply, proxy.bytes_down
        (b'hello', 5)
    """

    def __init__(self, target: tuple[str, int], *, latency: float = 0.0) -> None:
        self.target = (target[0], int(target[1]))
        self.latency = latency
        self.bytes_down = 0
        self.bytes_up = 0
        self.requests = 0
        self.in_flight = 0
        """Requests sent on and not answered yet."""
        self.max_in_flight = 0
        """The most requests in flight at once since the counters were reset."""
        self.throttled = 0
        self._throttle = 0
        self._throttle_only: bytes | None = None
        self._lock = threading.Lock()
        self._down = threading.Event()
        self._closed = threading.Event()
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, name="netproxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset_counters(self) -> None:
        with self._lock:
            self.bytes_down = self.bytes_up = self.requests = 0
            self.max_in_flight = self.in_flight

    def outage(self) -> None:
        """Refuse new connections and drop the open ones until :meth:`restore`."""
        self._down.set()
        self.drop_connections()

    def throttle(self, requests: int, only: bytes | None = None) -> None:
        """Answer the next ``requests`` requests with 503 SlowDown (those whose request
        holds the bytes ``only``, as a key's name, if given)."""
        with self._lock:
            self._throttle = requests
            self._throttle_only = only

    def restore(self) -> None:
        self._down.clear()

    def drop_connections(self) -> None:
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _reset(sock)

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self._listener.close()
        self.drop_connections()

    def __enter__(self) -> NetProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forwarding ---------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._down.is_set():
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
            state = {"answered": True}
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._pump, args=(src, dst, up, state), name="netproxy-pump", daemon=True
                ).start()

    def _answered(self, state: dict[str, bool]) -> None:
        with self._lock:
            if not state["answered"]:
                self.in_flight -= 1
            state["answered"] = True

    def _pump(
        self, src: socket.socket, dst: socket.socket, up: bool, state: dict[str, bool]
    ) -> None:
        try:
            while True:
                data = src.recv(_BUFFER)
                if not data:
                    break
                if up and state["answered"]:
                    state["answered"] = False
                    with self._lock:
                        self.requests += 1
                        self.in_flight += 1
                        self.max_in_flight = max(self.max_in_flight, self.in_flight)
                        only = self._throttle_only
                        slow_down = self._throttle > 0 and (only is None or only in data)
                        if slow_down:
                            self._throttle -= 1
                            self.throttled += 1
                    if self.latency:
                        time.sleep(self.latency)
                    if slow_down:  # a GET's request fits one read: answer it here
                        src.sendall(_SLOW_DOWN)
                        self._answered(state)
                        continue
                if self._down.is_set():
                    break
                dst.sendall(data)
                with self._lock:
                    if up:
                        self.bytes_up += len(data)
                    else:
                        self.bytes_down += len(data)
                if not up:
                    self._answered(state)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            _reset(src) if self._down.is_set() else src.close()
