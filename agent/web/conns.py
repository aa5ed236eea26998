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
  of addresses at their per-client limit cannot fill it; when it is full, a
  newcomer holding fewer connections than the biggest holder takes the
  place of that holder's oldest connection (`Gate`), so many addresses
  cannot keep a scraper out either;
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
import queue
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
    connection holds (release it with its id when the connection ends), or
    why it is refused.

    When the total is full, a newcomer that would still hold fewer
    connections than the client that holds the most takes the place of that
    client's oldest connection, which the caller cuts: many addresses can
    fill the total, but not keep a client with a fair share out (max-min
    fairness; the newest connections, a scrape in flight among them, are the
    last cut). Addresses holding nearly as many as the biggest are refused,
    not swapped, so attackers cannot make the endpoint churn among themselves."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._by_client: dict[str, dict[int, None]] = {}  # client -> its connection ids, oldest first
        self._remote = 0
        self._local: set[int] = set()

    def admit(self, client: str, local: bool, conn: int) -> tuple[str | None, str, int | None]:
        """(the key to release, "", the id of a connection to cut or None) or (None, the reason it is refused, None)."""
        with self._lock:
            if local:
                if len(self._local) >= self.limits.local:
                    return None, "local_limit", None
                self._local.add(conn)
                return LOCAL, "", None
            held = self._by_client.get(client, {})
            if len(held) >= self.limits.per_client:
                return None, "client_limit", None
            victim = None
            if self._remote >= self.limits.total:
                top = max(self._by_client, key=lambda c: len(self._by_client[c]), default=None)
                if top is None or len(held) + 1 >= len(self._by_client[top]):  # no fairer after: no churn
                    return None, "total_limit", None
                victim = next(iter(self._by_client[top]))
                self._drop(top, victim)
            self._by_client.setdefault(client, {})[conn] = None
            self._remote += 1
            return client, "", victim

    def release(self, key: str, conn: int) -> None:
        with self._lock:
            if key == LOCAL:
                self._local.discard(conn)
                return
            if conn in self._by_client.get(key, {}):
                self._drop(key, conn)

    def _drop(self, client: str, conn: int) -> None:
        held = self._by_client[client]
        del held[conn]
        self._remote -= 1
        if not held:
            del self._by_client[client]

    def held(self) -> tuple[int, int, int]:
        """(remote connections, distinct remote clients, local connections)."""
        with self._lock:
            return self._remote, len(self._by_client), len(self._local)


LOCAL = "\0local"


class Reaper:
    """Shuts down each registered connection once its deadline has passed.

    A connection is registered by its id and descriptor when accepted
    (`bind`) and must be forgotten before its descriptor is closed
    (`forget`, with its id, so a descriptor number closed and reused by a
    newer connection is never touched on the old one's behalf). Shutdowns
    happen under the same lock. `on_expire(reason)` is told of each
    connection shut down."""

    def __init__(self, on_expire: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._due: dict[int, tuple[float, str]] = {}  # descriptor -> (deadline, reason)
        self._conn_of: dict[int, int] = {}  # descriptor -> connection id
        self._fd_of: dict[int, int] = {}  # connection id -> descriptor
        self._cond = threading.Condition()
        self._on_expire = on_expire
        self._clock = clock
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="metrics-http-deadlines", daemon=True)
        self._thread.start()

    def bind(self, conn: int, fd: int, seconds: float, reason: str) -> None:
        with self._cond:
            self._conn_of[fd], self._fd_of[conn] = conn, fd
            self._due[fd] = (self._clock() + seconds, reason)
            self._cond.notify()

    def set(self, fd: int, seconds: float, reason: str) -> None:
        """A new deadline for a bound connection (its next phase)."""
        with self._cond:
            if fd not in self._conn_of:
                return
            self._due[fd] = (self._clock() + seconds, reason)
            self._cond.notify()

    def forget(self, fd: int, conn: int) -> bool:
        """Before `fd` is closed. False if its deadline had passed already (and was counted)."""
        with self._cond:
            if self._conn_of.get(fd) != conn:
                return False
            del self._conn_of[fd]
            self._fd_of.pop(conn, None)
            return self._due.pop(fd, None) is not None

    def cut(self, conn: int, reason: str) -> None:
        """Shut connection `conn` down now (if it is still open and has a deadline)."""
        with self._cond:
            fd = self._fd_of.get(conn)
            if fd is None or self._due.pop(fd, None) is None:
                return
            _shutdown_fd(fd)
        self._on_expire(reason)

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


class Workers:
    """Threads kept for the next connection: the accept loop hands a new
    connection to an idle thread instead of starting one and waiting for it
    to be scheduled, which under load is what keeps the next connection
    waiting in the listen queue. A thread idle for `linger` seconds ends."""

    def __init__(self, target: Callable[..., None], name: str, linger: float = 60.0) -> None:
        self._target = target
        self._name = name
        self._linger = linger
        self._queue: queue.SimpleQueue[tuple[object, ...]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, *args: object) -> None:
        """Raises RuntimeError when no thread can be started."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._queue.put(args)
                return
        threading.Thread(target=self._run, args=(args,), name=self._name, daemon=True).start()

    def _run(self, args: tuple[object, ...]) -> None:
        while True:
            self._target(*args)
            with self._lock:
                self._idle += 1
            while True:
                try:
                    args = self._queue.get(timeout=self._linger)
                    break
                except queue.Empty:
                    with self._lock:
                        if self._queue.empty():  # nothing handed over meanwhile: end
                            self._idle -= 1
                            return


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
