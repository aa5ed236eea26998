"""/metrics, /healthz and / over HTTP/1.1, as Prometheus exporters serve them.

A scraper keeps its connection (and its TLS session) from one scrape to the
next: Prometheus holds idle connections for 5 minutes, so an idle one is kept
as long. Connections are capped so that idle ones cannot exhaust the threads;
a stopped server closes the ones it holds, so a reload with new settings does
not leave old connections serving the old ones. HEAD is answered as GET
without the body. Basic auth (bcrypt, as exporter-toolkit: a verified
password is cached, one bcrypt at a time, an unknown user costs as much as a
wrong password), the security headers and the rate limit come from the web
settings; /healthz needs neither auth nor a token, so probes keep working.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import ipaddress
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

from .. import __version__
from ..findings import Sample
from ..metrics import Registry, encode
from ..settings import MetricsSection
from ..store import Store
from .listen import bind_error, resolve_listen
from .settings import WebSettings
from .tls import Serving, resolve

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 300.0  # Prometheus' scrape client keeps an idle connection 5 minutes
REQUEST_TIMEOUT = 10.0  # a handshake, or a request once its first byte came
MAX_CONNECTIONS = 64
# exporter-toolkit's stand-in hash ("fakepassword") for an unknown user.
_FAKE_HASH = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
_HANDLERS = {"/metrics": "metrics", "/healthz": "healthz", "/": "root"}


class _Auth:
    def __init__(self) -> None:
        self._ok: dict[bytes, None] = {}  # verified (user, password, hash), oldest first
        self._lock = threading.Lock()
        self._bcrypt = threading.Lock()

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
        import bcrypt

        with self._bcrypt:  # bcrypt is slow on purpose: one at a time
            ok = bcrypt.checkpw(password.encode(), (hashed or _FAKE_HASH).encode())
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, family: int, addr: tuple[Any, ...], handler: type, serving: Serving) -> None:
        self.address_family = family
        self.serving = serving
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        self.active = 0
        super().__init__(addr, handler, bind_and_activate=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conns_lock:
            if self.active >= MAX_CONNECTIONS:
                log.debug("refusing a connection from %s: %d open", client_address, self.active)
                self.shutdown_request(request)
                return
            self.active += 1
        super().process_request(request, client_address)

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(REQUEST_TIMEOUT)
        try:
            settings, ctx = self.serving.current()
            if ctx is not None:
                try:
                    request = ctx.wrap_socket(request, server_side=True)  # the handshake, in this thread
                except (ssl.SSLError, OSError) as exc:
                    log.debug("TLS handshake with %s failed: %s", client_address, exc)
                    return
                if settings.tls.client_allowed_sans and not _san_allowed(request, settings.tls.client_allowed_sans):
                    log.debug("client certificate of %s has none of the allowed SANs", client_address)
                    request.close()
                    return
            with self.conns_lock:
                self.conns.add(request)
            try:
                super().finish_request(request, client_address)
            finally:
                with self.conns_lock:
                    self.conns.discard(request)
                if ctx is not None:
                    request.close()
        finally:
            with self.conns_lock:
                self.active -= 1

    def close_connections(self) -> None:
        with self.conns_lock:
            conns = list(self.conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


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
        self._lock = threading.Lock()
        self._pending = False

    def count(self, handler: str, code: int) -> None:
        with self._lock:
            k = (handler, str(code))
            self._counts[k] = self._counts.get(k, 0) + 1
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
    ) -> None:
        self._stall_after = stall_after
        self._store = store
        self._registry = registry
        self.counters = counters or WebCounters()
        self._auth = _Auth()
        self._rate = _RateLimit()
        self.serving = Serving(web or resolve(cfg, "config"), self.counters.reloaded)
        family, sockaddr = resolve_listen(cfg.listen, key)
        self._httpd = _Server(family, sockaddr, _handler(self), self.serving)
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
        server_version = f"node-health-agent/{__version__}"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http %s " + format, self.client_address[0], *args)

        served = 0

        def handle_one_request(self) -> None:
            # A new connection gets the request timeout for its first request; after
            # one, it may idle as long as a scraper keeps it. A request, once its
            # first byte came, is read within the request timeout.
            try:
                self.connection.settimeout(IDLE_TIMEOUT if self.served else REQUEST_TIMEOUT)
                if not self.rfile.peek(1):  # type: ignore[attr-defined] # a BufferedReader (rbufsize -1)
                    self.close_connection = True
                    return
                self.connection.settimeout(REQUEST_TIMEOUT)
            except (OSError, ValueError):
                self.close_connection = True
                return
            super().handle_one_request()
            self.served += 1

        def do_GET(self) -> None:
            self._serve(body=True)

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def _serve(self, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            handler = _HANDLERS.get(path, "other")
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
            if path == "/metrics":
                payload, ctype = outer.render(self.headers.get("Accept", ""))
                if "gzip" in self.headers.get("Accept-Encoding", ""):
                    payload = gzip.compress(payload, compresslevel=1)
                    headers["Content-Encoding"] = "gzip"
                return self._send(handler, 200, payload, ctype, headers, body)
            if path == "/":
                return self._send(handler, 200, b"node-health-agent: /metrics /healthz\n", "text/plain", headers, body)
            self._send(handler, 404, b"not found\n", "text/plain", headers, body)

        def _send(
            self, handler: str, code: int, payload: bytes, ctype: str, headers: Mapping[str, str], body: bool
        ) -> None:
            outer.count(handler, code)  # before the client can see the answer
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if body:
                self.wfile.write(payload)

    return Handler
