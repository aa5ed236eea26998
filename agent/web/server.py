"""/metrics, /healthz and / over HTTP/1.1, as Prometheus exporters serve them.

HEAD is answered as GET without the body. Basic auth (bcrypt, as
exporter-toolkit: a verified password is cached, one bcrypt at a time, an
unknown user costs as much as a wrong password, a password over bcrypt's 72
bytes is refused as Go's bcrypt refuses it), the security headers and the
rate limit come from the web settings; /healthz needs neither auth nor a
token, so probes keep working.

Hostile clients cannot starve it (`agent.web.conns`): connections are counted
per client address when accepted, before the TLS handshake, under a total a
handful of addresses cannot fill; the host's own connections to itself (the
kubelet's probes) have their own budget; every phase of a connection has a
deadline (handshake, request from first byte to last, response, keep-alive
idle). A stopped server closes the connections it holds, so a reload with new
settings does not leave old connections serving the old ones. Every answer,
error answers included, is counted; a handler that fails answers 500 and
writes one log line a minute, never a traceback per request.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.client
import ipaddress
import itertools
import logging
import os
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..findings import Sample
from ..metrics import Registry, encode
from ..settings import MetricsSection
from ..store import Store
from .conns import Gate, Limits, Reaper, Throttled, Workers, client_key, is_local
from .listen import bind_error, resolve_listen
from .settings import WebSettings
from .tls import Serving, resolve

log = logging.getLogger(__name__)

# What each blocking call waits at most, beneath the deadlines the reaper holds.
SOCKET_TIMEOUT = 30.0
BCRYPT_MAX = 72  # bytes of password bcrypt reads; Go's bcrypt refuses more (ErrPasswordTooLong)
SERVER = "node-health-agent"  # the Server header: the agent's name, no version of anything
# exporter-toolkit's stand-in hash ("fakepassword") for an unknown user.
_FAKE_HASH = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
_HANDLERS = {"/healthz": "healthz", "/": "root"}  # and the telemetry path (metrics.telemetry_path): "metrics"


class _Auth:
    def __init__(self, say: Throttled) -> None:
        self._ok: dict[bytes, None] = {}  # verified (user, password, hash), oldest first
        self._lock = threading.Lock()
        self._bcrypt = threading.Lock()
        self._say = say

    def check(self, users: Mapping[str, str], header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = users.get(user)
        token = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        with self._lock:
            if hashed is not None and token in self._ok:
                return True
        secret = password.encode()
        if len(secret) > BCRYPT_MAX:  # bcrypt 5 raises ValueError; Go's bcrypt answers ErrPasswordTooLong
            self._say("long-password", logging.WARNING,
                      "basic auth: refused a password of %d bytes (bcrypt reads at most %d)", len(secret), BCRYPT_MAX)
            return False
        import bcrypt

        try:
            with self._bcrypt:  # bcrypt is slow on purpose: one at a time
                ok = bcrypt.checkpw(secret, (hashed or _FAKE_HASH).encode())
        except ValueError as exc:  # anything else bcrypt refuses to read: not a match
            self._say("bcrypt-refused", logging.WARNING, "basic auth: bcrypt refused a password: %s", exc)
            return False
        if not ok or hashed is None:
            return False
        with self._lock:
            self._ok[token] = None
            if len(self._ok) > 64:
                del self._ok[next(iter(self._ok))]
        return True


class _RateLimit:
    """golang.org/x/time/rate's token bucket as exporter-toolkit uses it (burst 0 allows nothing)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens = 0.0
        self._at = time.monotonic()
        self._shape: tuple[float, int] | None = None

    def allow(self, interval: float, burst: int) -> bool:
        if interval <= 0:
            return True
        with self._lock:
            now = time.monotonic()
            if self._shape != (interval, burst):
                self._shape, self._tokens = (interval, burst), float(burst)
            self._tokens = min(float(burst), self._tokens + (now - self._at) / interval)
            self._at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True


_REFUSED = {
    "client_limit": "this address holds its limit of connections",
    "total_limit": "the endpoint holds its limit of connections from other hosts",
    "local_limit": "this host's own connections are at their limit",
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The accept queue absorbs a flood of reconnecting peers while the accept thread waits for a CPU: a full
    # queue drops the SYN of a legitimate scrape, which the client sends again only after 1 s (the kernel caps
    # the backlog at net.core.somaxconn, 4096 by default).
    request_queue_size = 1024

    def __init__(
        self, family: int, addr: tuple[Any, ...], handler: type, serving: Serving, limits: Limits, counters: WebCounters
    ) -> None:
        self.address_family = family
        self.serving = serving
        self.limits = limits
        self.counters = counters
        self.gate = Gate(limits)
        self.say = Throttled(log)
        self.reaper = Reaper(counters.closed)
        self._ids = itertools.count()
        self.workers = Workers(self._connection, "metrics-http-conn")
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        super().__init__(addr, handler, bind_and_activate=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        """In the accept loop: counted before anything is read, the handshake included."""
        client = client_key(str(client_address[0]))
        conn = next(self._ids)
        key, why, victim = self.gate.admit(client, is_local(request), conn)
        if key is None:
            self.counters.closed(why)
            self.say(why, logging.WARNING, "refusing connections from %s: %s", client, _REFUSED[why])
            self.shutdown_request(request)
            return
        if victim is not None:
            self.reaper.cut(victim, "evicted")
            self.say("evicted", logging.WARNING, "connections from other hosts at their limit of %d: "
                     "closing the oldest of the address that holds the most", self.limits.total)
        request.settimeout(SOCKET_TIMEOUT)
        try:  # as Go sets on every TCP connection: no Nagle delay between a TLS record and the next
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        fd = request.fileno()
        self.reaper.bind(conn, fd, self.limits.request, "handshake")
        try:
            self.workers.submit(request, client_address, key, conn, fd)
        except RuntimeError:  # no thread to be had: refuse this one
            self.reaper.forget(fd, conn)
            self.gate.release(key, conn)
            self.counters.closed("total_limit")
            self.shutdown_request(request)

    def _connection(self, request: socket.socket, client_address: Any, key: str, conn: int, fd: int) -> None:
        try:
            self._serve(request, client_address, conn, fd)
        except Exception:  # noqa: BLE001 - one connection's failure is logged, never raised
            self.handle_error(request, client_address)
        finally:
            self.reaper.forget(fd, conn)  # before the descriptor is closed
            self.gate.release(key, conn)
            self.shutdown_request(request)

    def _serve(self, request: socket.socket, client_address: Any, conn: int, fd: int) -> None:
        settings, ctx = self.serving.current()
        if ctx is not None:
            tls = ctx.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            try:
                tls.do_handshake()  # in this thread, under the handshake deadline
            except (ssl.SSLError, OSError, ValueError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
                if self.reaper.forget(fd, conn):  # else the handshake deadline cut it, and was counted
                    self.counters.closed("tls")
                tls.close()
                return
            if settings.tls.client_allowed_sans and not _san_allowed(tls, settings.tls.client_allowed_sans):
                log.debug("client certificate of %s has none of the allowed SANs", client_address[0])
                self.reaper.forget(fd, conn)
                self.counters.closed("tls")
                tls.close()
                return
            request = tls
        self.reaper.set(fd, self.limits.request, "request")  # the first request, from now to its last byte
        with self.conns_lock:
            self.conns.add(request)
        try:
            self.finish_request(request, client_address)
        finally:
            with self.conns_lock:
                self.conns.discard(request)
            if ctx is not None:
                self.reaper.forget(fd, conn)  # before the descriptor is closed
                request.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """socketserver prints a traceback per failure; here, one line a minute."""
        import sys

        exc = sys.exc_info()[1]
        self.say("connection-error", logging.ERROR, "a connection from %s failed: %s: %s",
                 client_key(str(client_address[0])), type(exc).__name__, exc)

    def close_connections(self) -> None:
        with self.conns_lock:
            conns = list(self.conns)
        for conn in conns:
            try:
                socket.socket.shutdown(conn, socket.SHUT_RDWR)
            except OSError:
                pass

    def server_close(self) -> None:
        super().server_close()
        self.reaper.stop()


class _Capped:
    """The request's reader, with the request line and headers held to
    `budget` bytes together: past it, http.client's LineTooLong, which
    BaseHTTPRequestHandler answers with 431."""

    def __init__(self, raw: Any, budget: int) -> None:
        self._raw = raw
        self.left = budget

    def readline(self, size: int = -1) -> bytes:
        if self.left <= 0:
            raise http.client.LineTooLong("request headers")
        limit = self.left if size < 0 else min(size, self.left)
        line: bytes = self._raw.readline(limit)
        self.left -= len(line)
        if self.left <= 0 and not line.endswith(b"\n"):
            raise http.client.LineTooLong("request headers")
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _san_allowed(conn: ssl.SSLSocket, allowed: tuple[str, ...]) -> bool:
    """exporter-toolkit's VerifyPeerCertificate: any DNS, e-mail, IP or URI SAN in the list."""
    sans: Any = (conn.getpeercert() or {}).get("subjectAltName", ())
    names = {_norm(str(kind), str(value)) for kind, value in sans}
    return any(_norm("IP Address", a) in names or a in names for a in allowed)


def _norm(kind: str, value: str) -> str:
    if kind == "IP Address":
        try:
            return str(ipaddress.ip_address(value.strip()))
        except ValueError:
            return value
    return value


class WebCounters:
    """What the endpoint counts. It outlives a server: a reload that makes a
    new one (new address or settings) does not reset the counters.
    `publish` hands them to the daemon's loop, at most one hand-over pending."""

    def __init__(self, publish: Callable[[Callable[[], list[Sample]]], None] | None = None) -> None:
        self._publish = publish
        self._counts: dict[tuple[str, str], int] = {}
        self._reloads = {"success": 0, "failure": 0}
        self._reload_ok = True
        self._closed: dict[str, int] = {}
        self._lock = threading.Lock()
        self._pending = False

    def count(self, handler: str, code: int) -> None:
        with self._lock:
            k = (handler, str(code))
            self._counts[k] = self._counts.get(k, 0) + 1
        self.flush()

    def closed(self, reason: str) -> None:
        with self._lock:
            self._closed[reason] = self._closed.get(reason, 0) + 1
        self.flush()

    def reloaded(self, ok: bool) -> None:
        with self._lock:
            self._reloads["success" if ok else "failure"] += 1
            self._reload_ok = ok
        self.flush()

    def samples(self) -> list[Sample]:
        with self._lock:
            self._pending = False
            out = [Sample("node_health_http_requests_total", n, (("handler", h), ("code", c)))
                   for (h, c), n in sorted(self._counts.items())]
            out += [Sample("node_health_http_connections_closed_total", n, (("reason", r),))
                    for r, n in sorted(self._closed.items())]
            out += [Sample("node_health_web_config_reloads_total", n, (("result", r),)) for r, n in self._reloads.items()]
            out.append(Sample("node_health_web_config_last_reload_successful", 1.0 if self._reload_ok else 0.0))
        return out

    def flush(self) -> None:
        if self._publish is None:
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
        self._publish(self.samples)


class MetricsServer:
    """Serves /metrics, /healthz and / in a daemon thread. Binds when made:
    a ListenError (one line, exit code) or a ConfigError comes from here."""

    def __init__(
        self,
        cfg: MetricsSection,
        registry: Registry,
        store: Store,
        *,
        web: WebSettings | None = None,
        stall_after: float = 30.0,
        counters: WebCounters | None = None,
        key: str = "metrics.listen",
        limits: Limits | None = None,
    ) -> None:
        self._stall_after = stall_after
        self.telemetry_path = cfg.telemetry_path
        self._store = store
        self._registry = registry
        self.counters = counters or WebCounters()
        self.limits = limits or Limits()
        self.serving = Serving(web or resolve(cfg, "config"), self.counters.reloaded)
        family, sockaddr = resolve_listen(cfg.listen, key)
        self._httpd = _Server(family, sockaddr, _handler(self), self.serving, self.limits, self.counters)
        self._auth = _Auth(self._httpd.say)
        self._rate = _RateLimit()
        try:
            self._httpd.server_bind()
            self._httpd.server_activate()
        except OSError as exc:
            self._httpd.server_close()
            raise bind_error(cfg.listen, key, exc) from None
        self.address = self._httpd.server_address
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="metrics-http", daemon=True)

    # ------------------------------------------------------------ state served

    def health(self) -> tuple[int, str]:
        age = time.time() - self._store.snapshot().last_tick
        if age > self._stall_after:
            return 503, f"scheduler stalled for {age:.0f}s\n"
        return 200, "ok\n"

    def render(self, accept: str) -> tuple[bytes, str]:
        return encode(self._registry, accept)

    def handler(self, path: str) -> str:
        """The `handler` label of a request's path: metrics (at the telemetry path), healthz, root or other."""
        return "metrics" if path == self.telemetry_path else _HANDLERS.get(path, "other")

    def allow(self, settings: WebSettings) -> bool:
        return self._rate.allow(settings.rate_interval, settings.rate_burst)

    def authorized(self, settings: WebSettings, header: str | None) -> bool:
        return not settings.users or self._auth.check(settings.users, header)

    def count(self, handler: str, code: int) -> None:
        self.counters.count(handler, code)

    def samples(self) -> list[Sample]:
        return self.counters.samples()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.counters.flush()
        self._thread.start()

    def _serve(self) -> None:
        """`serve_forever` without its wake-up every 0.5 s to look for shutdown(): the thread sleeps until a
        connection arrives or `stop` writes to the wake pipe (issue 29: no thread wakes more than its work needs)."""
        with selectors.DefaultSelector() as sel:
            sel.register(self._httpd, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = sel.select()
                if any(key.fileobj == self._wake_r for key, _ in ready):
                    return
                if ready:
                    self._httpd._handle_request_noblock()  # type: ignore[attr-defined]  # what serve_forever calls: accept, verify, process
                self._httpd.service_actions()

    def stop(self) -> None:
        if self._wake_w >= 0:  # a second stop() only closes again
            os.write(self._wake_w, b"x")
            if self._thread.ident is not None:
                self._thread.join()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
        self._httpd.server_close()
        self._httpd.close_connections()


def _handler(outer: MetricsServer) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = SERVER
        sys_version = ""
        server: _Server

        served = 0
        counted = False  # this request's answer was counted

        def version_string(self) -> str:
            return SERVER

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http %s " + format, self.client_address[0], *args)

        def handle_one_request(self) -> None:
            # The first request's deadline runs from the end of the handshake (set
            # by the server); a kept-alive connection waits `idle` for the next
            # request's first byte, and from it the whole request has `request`.
            srv, limits, fd = self.server, self.server.limits, self.connection.fileno()
            self.counted = False
            try:
                if self.served:
                    srv.reaper.set(fd, limits.idle, "idle")
                    if not self.rfile.peek(1):  # type: ignore[attr-defined] # a BufferedReader (rbufsize -1)
                        self.close_connection = True
                        return
                    srv.reaper.set(fd, limits.request, "request")
            except (OSError, ValueError):
                self.close_connection = True
                return
            raw = self.rfile
            self.rfile = _Capped(raw, limits.header_bytes)  # type: ignore[assignment]
            try:
                super().handle_one_request()
            except http.client.LineTooLong:  # the request line itself ran past the budget
                self.request_version, self.command, self.path, self.requestline = "HTTP/1.1", "", "", ""
                self.send_error(431, "Request Header Fields Too Large")
                self.close_connection = True
            except (OSError, ValueError):  # the peer went, or the reaper shut the connection
                self.close_connection = True
            finally:
                self.rfile = raw
            self.served += 1

        def do_GET(self) -> None:
            self._serve(body=True)

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def _serve(self, body: bool) -> None:
            self.server.reaper.set(self.connection.fileno(), self.server.limits.write, "write")
            if self.headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in self.headers:
                self.close_connection = True  # a body is never read: answer, then close
            path = self.path.split("?", 1)[0]
            handler = outer.handler(path)
            try:
                self._answer(path, handler, body)
            except OSError:  # the client went, or the write deadline passed
                self.close_connection = True
            except Exception as exc:  # noqa: BLE001 - answered and counted, one line a minute
                self.server.say("handler-error", logging.ERROR, "%s %s failed: %s: %s",
                                self.command, handler, type(exc).__name__, exc)
                log.debug("the failure", exc_info=True)
                self.close_connection = True
                if not self.counted:
                    try:
                        self._send(handler, 500, b"Internal Server Error\n", "text/plain; charset=utf-8", {}, body)
                    except OSError:
                        pass

        def _answer(self, path: str, handler: str, body: bool) -> None:
            settings, _ = outer.serving.current()
            headers = dict(settings.headers)
            if path == "/healthz":
                code, text = outer.health()
                return self._send(handler, code, text.encode(), "text/plain; charset=utf-8", headers, body)
            if not outer.allow(settings):
                return self._send(handler, 429, b"Too Many Requests\n", "text/plain; charset=utf-8", headers, body)
            if not outer.authorized(settings, self.headers.get("Authorization")):
                headers["WWW-Authenticate"] = "Basic"
                return self._send(handler, 401, b"Unauthorized\n", "text/plain; charset=utf-8", headers, body)
            if handler == "metrics":
                payload, ctype = outer.render(self.headers.get("Accept", ""))
                if "gzip" in self.headers.get("Accept-Encoding", ""):
                    payload = gzip.compress(payload, compresslevel=1)
                    headers["Content-Encoding"] = "gzip"
                return self._send(handler, 200, payload, ctype, headers, body)
            if path == "/":
                return self._send(handler, 200, f"node-health-agent: {outer.telemetry_path} /healthz\n".encode(), "text/plain",
                                  headers, body)
            self._send(handler, 404, b"not found\n", "text/plain", headers, body)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """http.server's own answers (400, 414, 431, 501, 505...): counted like the others."""
            path = (getattr(self, "path", "") or "").split("?", 1)[0]
            handler = outer.handler(path)
            if not self.counted:
                self.counted = True
                outer.count(handler, code)
            self.server.reaper.set(self.connection.fileno(), self.server.limits.write, "write")
            super().send_error(code, message, explain)

        def _send(
            self, handler: str, code: int, payload: bytes, ctype: str, headers: Mapping[str, str], body: bool
        ) -> None:
            self.counted = True
            outer.count(handler, code)  # before the client can see the answer
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            for k, v in headers.items():
                self.send_header(k, v)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if body:
                self.wfile.write(payload)

    return Handler
