"""/metrics and /healthz.

A prometheus-client custom collector renders the store's latest snapshot: a
scrape never runs or waits on a check. Every finding the checks know of is
exported at 0 from start, so "no problem" differs from "not reporting". The
HTTP server is the standard library's, with optional TLS and basic auth in the
style of Prometheus exporters' web config.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import logging
import platform
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector

from . import __version__, catalog, native
from .config import MetricsSection, split_host_port
from .store import Snapshot, Store

log = logging.getLogger(__name__)


class AgentCollector:
    def __init__(self, store: Store) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        return iter(render_families(self._store.snapshot()))


def _family(name: str) -> Any:
    spec = catalog.metric(name)
    cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    return cls(name, spec.help, labels=list(spec.labels))


def render_families(snap: Snapshot) -> list[Metric]:
    fams: dict[str, Any] = {}

    def add(name: str, labels: tuple[str, ...], value: float) -> None:
        fam = fams.get(name)
        if fam is None:
            fam = fams[name] = _family(name)
        fam.add_metric(labels, value)

    add("node_health_build_info", (__version__, str(native.IMPLEMENTATION == "native").lower(), platform.python_version()), 1)
    add("node_health_start_time_seconds", (), snap.started)
    add("node_health_scheduler_last_tick_timestamp_seconds", (), snap.last_tick)
    for name, st in snap.checks.items():
        lab = (name,)
        add("node_health_check_success", lab, 1 if st.ok else 0)
        add("node_health_check_duration_seconds", lab, st.duration)
        add("node_health_check_last_run_timestamp_seconds", lab, st.finished_at)
        add("node_health_check_runs_total", lab, st.runs)
        add("node_health_check_failures_total", lab, st.failures)
        add("node_health_check_timeouts_total", lab, st.timeouts)
        add("node_health_check_skipped_total", lab, st.skipped)
        add("node_health_check_stuck", lab, 1 if st.stuck else 0)
    _findings(snap, add)
    for s in snap.samples():
        fam = fams.get(s.name)
        if fam is None:
            fam = fams[s.name] = _family(s.name)
        fam.add_metric([v for _, v in s.labels], s.value)
    return list(fams.values())


def _findings(snap: Snapshot, add: Any) -> None:
    reasons = catalog.reasons()
    series: dict[tuple[str, str, str, str], int] = {}
    for name, st in snap.checks.items():
        for subject, reason in st.known:
            series[(name, subject, reason, reasons[reason].severity.value)] = 0
    for triples in snap.events_known.values():
        for check, subject, reason in triples:
            series[(check, subject, reason, reasons[reason].severity.value)] = 0
    for f in snap.findings():
        series[(f.check, f.subject, f.reason, f.severity.value)] = 1
    for labels, value in series.items():
        add("node_health_finding", labels, value)


def build_registry(store: Store) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(store))  # type: ignore[arg-type]
    registry.register(ProcessCollector(registry=None))
    return registry


# ---------------------------------------------------------------- HTTP


class _Auth:
    """Basic auth against bcrypt hashes; a verified (user, password) is cached
    by its SHA-256 so a scrape every 15 s does not pay bcrypt's cost each time."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = dict(users)
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if hashed is None:
            return False
        token = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        with self._lock:
            if token in self._ok:
                return True
        import bcrypt

        if not bcrypt.checkpw(password.encode(), hashed.encode()):
            return False
        with self._lock:
            self._ok.add(token)
        return True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, addr: tuple[str, int], handler: type, family: int, tls: ssl.SSLContext | None) -> None:
        self.address_family = family
        self.tls = tls
        super().__init__(addr, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(10)  # a slow or stuck client cannot hold a thread forever
        if self.tls is not None:
            try:
                request = self.tls.wrap_socket(request, server_side=True)  # handshake here, not in accept
            except (ssl.SSLError, OSError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address, exc)
                return
        super().finish_request(request, client_address)


def _tls_context(cfg: MetricsSection) -> ssl.SSLContext | None:
    tls = cfg.tls
    if not tls.cert_file:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if tls.min_version == "TLS13" else ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file or None)
    if tls.client_ca_file:
        ctx.load_verify_locations(tls.client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class MetricsServer:
    """Serves /metrics, /healthz and / in a daemon thread."""

    def __init__(
        self, cfg: MetricsSection, registry: CollectorRegistry, store: Store, *, stall_after: float = 30.0
    ) -> None:
        host, port = split_host_port(cfg.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        auth = _Auth(cfg.basic_auth_users)
        self._stall_after = stall_after
        outer = self

        class Handler(BaseHTTPRequestHandler):
            server_version = f"node-health-agent/{__version__}"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                log.debug("http %s " + format, self.client_address[0], *args)

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    code, body = outer.health(store)
                    return self._send(code, body.encode(), "text/plain; charset=utf-8")
                if path == "/metrics":
                    if auth.enabled and not auth.check(self.headers.get("Authorization")):
                        return self._send(401, b"Unauthorized\n", "text/plain", {"WWW-Authenticate": 'Basic realm="node-health-agent"'})
                    encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
                    body = encoder(registry)
                    headers = {}
                    if "gzip" in self.headers.get("Accept-Encoding", ""):
                        body = gzip.compress(body, compresslevel=1)
                        headers["Content-Encoding"] = "gzip"
                    return self._send(200, body, ctype, headers)
                if path == "/":
                    return self._send(200, b"node-health-agent: /metrics /healthz\n", "text/plain")
                self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str, headers: Mapping[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self._httpd = _Server((host, port), Handler, family, _tls_context(cfg))
        self.address = self._httpd.server_address
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True)

    def health(self, store: Store) -> tuple[int, str]:
        age = time.time() - store.snapshot().last_tick
        if age > self._stall_after:
            return 503, f"scheduler stalled for {age:.0f}s\n"
        return 200, "ok\n"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
