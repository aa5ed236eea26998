"""What keeps hostile clients from starving the endpoint: connection budgets
counted when a connection is accepted (before any TLS handshake), and one
deadline per phase of a connection's life, enforced by a single reaper.

The model is Go's net/http server (a TLS handshake deadline,
``ReadHeaderTimeout`` counted from a request's first byte, ``WriteTimeout``,
``IdleTimeout`` for a kept-alive connection) and nginx's ``limit_conn`` keyed
on ``$binary_remote_addr`` under a total (``worker_connections``):

- **per client**: at most `Limits.per_client` connections from one address;
  over it, a new connection is closed at once (nothing is read from it);
- **total**: at most `Limits.total` from other hosts, enough that a handful
  of addresses at their per-client limit cannot fill it;
- **this host**: a connection from one of the host's own addresses to itself
  (the kubelet's probe of a hostNetwork pod connects from the node's address
  to the node's address; a process on the host to 127.0.0.1) has its own
  budget, `Limits.local`, which no other host can take. Whether a connection
  is one is read from the socket: its peer address is its own local address.
  A remote peer cannot forge that over TCP (the SYN-ACK would go to the host
  itself), and a pod's connections carry the pod's address.

Every accepted connection always has a deadline: the handshake and its first
request must arrive within `Limits.request` of the accept (each half its own
`Limits.request`), a response is written within `Limits.write`, a kept-alive
connection waits at most `Limits.idle` for the next request's first byte,
which must then be followed by the whole request within `Limits.request`.
Past its deadline a connection is shut down by the reaper, whatever it is
blocked in (a handshake, a read, a write).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    per_client: int = 16  # connections from one address (nginx limit_conn)
    total: int = 256  # from other hosts, all addresses together
    local: int = 16  # from this host to itself: the kubelet's probes, host processes
    request: float = 5.0  # a TLS handshake; a request from its first byte to its last
    write: float = 10.0  # a response, from the end of the request to its last byte
    idle: float = 5.0  # a kept-alive connection waiting for its next request
    header_bytes: int = 32 * 1024  # request line and headers (nginx: 4 x 8k large_client_header_buffers)


def client_key(peer: str) -> str:
    """The address a connection is counted under (an IPv4-mapped IPv6 address as IPv4)."""
    try:
        ip = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return peer
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def is_local(sock: socket.socket) -> bool:
    """A connection from this host to itself: its peer address is its own local address."""
    try:
        peer, own = sock.getpeername(), sock.getsockname()
    except OSError:
        return False
    if not isinstance(peer, tuple) or not isinstance(own, tuple):
        return False
    return client_key(str(peer[0])) == client_key(str(own[0]))


class Gate:
    """The connection budgets, counted at accept. `admit` answers the key the
    connection holds (release it when the connection ends) or why it is refused."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._by_client: dict[str, int] = {}
        self._remote = 0
        self._local = 0

    def admit(self, client: str, local: bool) -> tuple[str | None, str]:
        """(the key to release, "") or (None, the reason it is refused)."""
        with self._lock:
            if local:
                if self._local >= self.limits.local:
                    return None, "local_limit"
                self._local += 1
                return "\0local", ""
            held = self._by_client.get(client, 0)
            if held >= self.limits.per_client:
                return None, "client_limit"
            if self._remote >= self.limits.total:
                return None, "total_limit"
            self._by_client[client] = held + 1
            self._remote += 1
            return client, ""

    def release(self, key: str) -> None:
        with self._lock:
            if key == "\0local":
                self._local -= 1
                return
            self._remote -= 1
            left = self._by_client.get(key, 0) - 1
            if left > 0:
                self._by_client[key] = left
            else:
                self._by_client.pop(key, None)

    def held(self) -> tuple[int, int, int]:
        """(remote connections, distinct remote clients, local connections)."""
        with self._lock:
            return self._remote, len(self._by_client), self._local


class Reaper:
    """Shuts down each registered connection once its deadline has passed.

    Connections are registered by file descriptor; `forget` must be called
    before the descriptor is closed. The shutdown happens under the same lock,
    so a descriptor number that was closed and reused is never touched.
    `on_expire(reason)` is told of each connection shut down."""

    def __init__(self, on_expire: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._due: dict[int, tuple[float, str]] = {}
        self._cond = threading.Condition()
        self._on_expire = on_expire
        self._clock = clock
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="metrics-http-deadlines", daemon=True)
        self._thread.start()

    def set(self, fd: int, seconds: float, reason: str) -> None:
        with self._cond:
            self._due[fd] = (self._clock() + seconds, reason)
            self._cond.notify()

    def forget(self, fd: int) -> bool:
        """False if the deadline had passed already (and was counted)."""
        with self._cond:
            return self._due.pop(fd, None) is not None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def pending(self) -> int:
        with self._cond:
            return len(self._due)

    def _run(self) -> None:
        while True:
            expired: list[str] = []
            with self._cond:
                if self._stopped:
                    return
                now = self._clock()
                for fd, (due, reason) in list(self._due.items()):
                    if due <= now:
                        del self._due[fd]
                        _shutdown_fd(fd)
                        expired.append(reason)
                wait = min((due for due, _ in self._due.values()), default=now + 3600.0) - now
                if not expired:
                    self._cond.wait(timeout=max(wait, 0.001))
            for reason in expired:
                try:
                    self._on_expire(reason)
                except Exception:  # noqa: BLE001 - a counter must not stop the deadlines
                    log.exception("counting an expired connection failed")


def _shutdown_fd(fd: int) -> None:
    """shutdown(2) on a descriptor someone else owns: the wrapper is detached, never closes it."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        s.detach()


class Throttled:
    """At most one log line per `every` seconds for a kind of event, with the
    number of events it stands for: a flood of bad requests writes a line a
    minute, not one per request."""

    def __init__(self, logger: logging.Logger, every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def __call__(self, kind: str, level: int, msg: str, *args: object) -> bool:
        with self._lock:
            now = self._clock()
            self._since[kind] = self._since.get(kind, 0) + 1
            last = self._last.get(kind)
            if last is not None and now - last < self._every:
                return False
            self._last[kind] = now
            n = self._since.pop(kind)
        suffix = f" ({n} since the last such line)" if last is not None and n > 1 else ""
        self._log.log(level, msg + suffix, *args)
        return True
