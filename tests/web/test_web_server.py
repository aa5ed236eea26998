"""The endpoint against real clients: HTTP/1.1 keep-alive, HEAD, requests
counted by code, real TLS with every client_auth_type, certificate rotation
(files rewritten, a kubelet-style Secret swap, a broken pair that keeps the
old one serving), the rate limit."""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agentproc import free_port, wait_for
from webcerts import Certs, make_certs, make_leaf

from agent.config import MetricsSection
from agent.findings import Sample
from agent.metrics import build_registry
from agent.registry import CATALOG
from agent.store import Store
from agent.web.server import MetricsServer, WebCounters
from agent.web.tls import load_file


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


class Served:
    def __init__(self, tmp: Path, web_yaml: str | None) -> None:
        self.port = free_port()
        self.published: list[Callable[[], list[Sample]]] = []
        web = None
        if web_yaml is not None:
            (tmp / "web.yml").write_text(web_yaml)
            web = load_file(str(tmp / "web.yml"))
        store = Store()
        store.tick()
        self.server = MetricsServer(MetricsSection(listen=f"127.0.0.1:{self.port}"), build_registry(store, CATALOG), store,
                                    web=web, counters=WebCounters(self.published.append))
        self.server.start()

    def value(self, name: str, **labels: str) -> float | None:
        for s in self.server.samples():
            if s.name == name and dict(s.labels) == labels:
                return s.value
        return None

    def connect(self, tls: bool, client: tuple[Path, Path] | None = None) -> http.client.HTTPConnection:
        if not tls:
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if client is not None:
            ctx.load_cert_chain(str(client[0]), str(client[1]))
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=5, context=ctx)

    def served_cert(self) -> bytes:
        conn = self.connect(tls=True)
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        der = conn.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
        conn.close()
        return der


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[[str | None], Served]]:
    made: list[Served] = []

    def make(web_yaml: str | None) -> Served:
        made.append(Served(tmp_path, web_yaml))
        return made[-1]

    yield make
    for s in made:
        s.server.stop()


def test_keep_alive_head_and_requests_counted_by_code(served: Callable[[str | None], Served]) -> None:
    s = served(None)
    conn = s.connect(tls=False)
    conn.request("GET", "/metrics")
    first = conn.getresponse()
    body = first.read()
    sock = conn.sock
    assert first.status == 200 and first.version == 11 and not first.will_close and b"node_health_build_info" in body
    conn.request("HEAD", "/metrics")
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b"" and int(head.headers["Content-Length"]) > 0
    conn.request("GET", "/nothing-here")
    assert conn.getresponse().status == 404
    assert conn.sock is sock, "the three requests went over one connection"
    conn.close()
    assert s.value("node_health_http_requests_total", handler="metrics", code="200") == 2
    assert s.value("node_health_http_requests_total", handler="other", code="404") == 1
    assert s.published, "the counters were handed to the daemon's loop"


def test_stop_closes_idle_keep_alive_connections(served: Callable[[str | None], Served]) -> None:
    s = served(None)
    conn = s.connect(tls=False)
    conn.request("GET", "/healthz")
    conn.getresponse().read()
    s.server.stop()
    assert conn.sock is not None and conn.sock.recv(1) == b"", "the server closed the idle connection"


def tls_yaml(certs: Certs, extra: str = "", cert: Path | None = None, key: Path | None = None) -> str:
    return (f"tls_server_config:\n  cert_file: {cert or certs.server[0]}\n  key_file: {key or certs.server[1]}\n"
            + extra)


def _outcome(s: Served, client: tuple[Path, Path] | None) -> str:
    try:
        conn = s.connect(tls=True, client=client)
        conn.request("GET", "/metrics")
        status = conn.getresponse().status
        conn.close()
        return "ok" if status == 200 else str(status)
    except (ssl.SSLError, OSError, http.client.HTTPException):
        return "refused"


# Go's crypto/tls semantics, as exporter-toolkit maps client_auth_type onto them.
CLIENT_AUTH = [
    pytest.param("NoClientCert", ("ok", "ok", "ok"), id="NoClientCert"),
    pytest.param("RequestClientCert", ("ok", "ok", "ok"), id="RequestClientCert"),
    pytest.param("RequireAnyClientCert", ("refused", "ok", "ok"), id="RequireAnyClientCert"),
    pytest.param("VerifyClientCertIfGiven", ("ok", "ok", "refused"), id="VerifyClientCertIfGiven"),
    pytest.param("RequireAndVerifyClientCert", ("refused", "ok", "refused"), id="RequireAndVerifyClientCert"),
]


@pytest.mark.parametrize(("mode", "expected"), CLIENT_AUTH)
def test_client_auth_types_over_real_tls(
    served: Callable[[str | None], Served], certs: Certs, mode: str, expected: tuple[str, str, str]
) -> None:
    ca = f"  client_ca_file: {certs.ca}\n" if mode != "NoClientCert" else ""
    s = served(tls_yaml(certs, f"  client_auth_type: {mode}\n{ca}"))
    got = tuple(_outcome(s, c) for c in (None, certs.client, certs.stranger))
    assert got == expected, f"no cert, our CA's, another CA's: {got}"


@pytest.mark.parametrize(("sans", "expected"), [("[scraper.example]", "ok"), ("[other.example]", "refused")])
def test_client_allowed_sans(served: Callable[[str | None], Served], certs: Certs, sans: str, expected: str) -> None:
    s = served(tls_yaml(certs, f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs.ca}\n"
                               f"  client_allowed_sans: {sans}\n"))
    assert _outcome(s, certs.client) == expected


def test_a_rotated_certificate_is_served_from_the_next_connection(
    served: Callable[[str | None], Served], certs: Certs, tmp_path: Path
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(certs.server[0], live / "tls.crt")
    shutil.copy(certs.server[1], live / "tls.key")
    s = served(tls_yaml(certs, cert=live / "tls.crt", key=live / "tls.key"))
    assert s.served_cert() == certs.fingerprint(certs.server[0])
    new = make_leaf(tmp_path, "rotated", (certs.ca, certs.dir / "ca.key"))
    shutil.copy(new[1], live / "tls.key")
    shutil.copy(new[0], live / "tls.crt")
    assert s.served_cert() == certs.fingerprint(new[0])
    assert s.value("node_health_web_config_last_reload_successful") == 1


def test_a_broken_new_pair_keeps_the_old_one_serving(
    served: Callable[[str | None], Served], certs: Certs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(certs.server[0], live / "tls.crt")
    shutil.copy(certs.server[1], live / "tls.key")
    s = served(tls_yaml(certs, cert=live / "tls.crt", key=live / "tls.key"))
    old = certs.fingerprint(certs.server[0])
    shutil.copy(certs.client[1], live / "tls.key")  # a key that is not the certificate's
    with caplog.at_level(logging.ERROR, logger="agent.web.tls"):
        assert [s.served_cert() for _ in range(3)] == [old] * 3
    lines = [r.getMessage() for r in caplog.records if r.name == "agent.web.tls"]
    assert len(lines) == 1 and "do not load as a pair" in lines[0] and "still serving the previous" in lines[0], lines
    assert s.value("node_health_web_config_reloads_total", result="failure") == 1
    assert s.value("node_health_web_config_last_reload_successful") == 0
    shutil.copy(certs.server[1], live / "tls.key")  # mended
    assert s.served_cert() == old
    assert s.value("node_health_web_config_last_reload_successful") == 1


def _kubelet_secret(d: Path, version: str, files: dict[str, Path]) -> None:
    """What the kubelet's atomic writer does: a new timestamped dir, then the
    ``..data`` symlink replaced by rename(2); the user-visible names point into ``..data``."""
    ts = d / f"..{version}"
    ts.mkdir()
    for name, src in files.items():
        shutil.copy(src, ts / name)
        if not (d / name).is_symlink():
            os.symlink(f"..data/{name}", d / name)
    os.symlink(ts.name, d / "..data_tmp")
    os.rename(d / "..data_tmp", d / "..data")


def test_a_kubelet_secret_update_is_served_without_a_restart(
    served: Callable[[str | None], Served], certs: Certs, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    _kubelet_secret(secret, "2026_01", {"tls.crt": certs.server[0], "tls.key": certs.server[1]})
    (secret / "web.yml").write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    store = Store()
    store.tick()
    server = MetricsServer(MetricsSection(listen=f"127.0.0.1:{(port := free_port())}"), build_registry(store, CATALOG), store,
                           web=load_file(str(secret / "web.yml")))
    server.start()
    try:
        probe = Served.__new__(Served)
        probe.port = port
        assert probe.served_cert() == certs.fingerprint(certs.server[0])
        new = make_leaf(tmp_path, "renewed", (certs.ca, certs.dir / "ca.key"))
        _kubelet_secret(secret, "2026_02", {"tls.crt": new[0], "tls.key": new[1]})
        wait_for(lambda: probe.served_cert() == certs.fingerprint(new[0]), timeout=5, what="the renewed certificate")
    finally:
        server.stop()


def test_rate_limit_as_exporter_toolkit_spares_healthz(served: Callable[[str | None], Served]) -> None:
    s = served("rate_limit:\n  interval: 1h\n  burst: 2\n")
    conn = s.connect(tls=False)
    codes = []
    for path in ("/metrics", "/metrics", "/metrics", "/healthz"):
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        codes.append(r.status)
    assert codes == [200, 200, 429, 200]
