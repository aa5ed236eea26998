"""Hostile clients cannot starve the endpoint (issue 25 item 2): connection
budgets counted at accept (per client address, a total, this host's own),
one deadline per phase of a connection, and 100 hostile connections (idle
keep-alives, slowloris, never-handshaking TLS, mTLS without a certificate)
while every legitimate scrape and every /healthz still succeeds.

The attackers come from loopback addresses other than the server's
(127.0.0.2...), so the server counts them as other hosts; the legitimate
scraper from 127.0.0.250; the kubelet-like probe from 127.0.0.1 to
127.0.0.1, a connection of the host to itself."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agentproc import free_port, wait_for
from webcerts import Certs, make_certs

from agent.config import MetricsSection
from agent.metrics import build_registry
from agent.registry import CATALOG
from agent.store import Store
from agent.web.conns import Gate, Limits, Reaper, Workers, client_key, is_local
from agent.web.server import MetricsServer
from agent.web.tls import load_file

HOSTILE = Path(__file__).resolve().parents[1] / "support" / "hostile.py"
SCRAPER = "127.0.0.250"


# ---------------------------------------------------------------- the budgets, alone


def test_gate_counts_per_client_under_a_total_and_keeps_this_hosts_own_budget() -> None:
    gate = Gate(Limits(per_client=2, total=3, local=1))
    assert gate.admit("10.0.0.1", False, 1) == ("10.0.0.1", "", None)
    assert gate.admit("10.0.0.1", False, 2) == ("10.0.0.1", "", None)
    assert gate.admit("10.0.0.1", False, 3) == (None, "client_limit", None)
    assert gate.admit("10.0.0.2", False, 4) == ("10.0.0.2", "", None)
    assert gate.held() == (3, 2, 0)
    local = gate.admit("10.0.0.9", True, 5)[0]
    assert local is not None, "the host's own budget is not taken by the others"
    assert gate.admit("10.0.0.9", True, 6) == (None, "local_limit", None)
    gate.release(local, 5)
    assert gate.held() == (3, 2, 0)


def test_a_full_total_makes_room_for_a_newcomer_from_the_biggest_holders_oldest() -> None:
    gate = Gate(Limits(per_client=3, total=4))
    for conn, client in enumerate(["a", "a", "a", "b"]):
        gate.admit(client, False, conn)
    assert gate.admit("c", False, 10) == ("c", "", 0), "a's oldest makes room: a holds 3, c would hold 1"
    assert gate.admit("b", False, 11) == (None, "total_limit", None), "b would hold 2 as a does: no swap"
    assert gate.admit("d", False, 12) == ("d", "", 1), "a holds 2, d would hold 1: a's next oldest"
    assert gate.admit("e", False, 13) == (None, "total_limit", None), "everyone holds one"
    gate.release("a", 0)  # a cut connection ends later: already counted out
    assert gate.held() == (4, 4, 0)
    gate.release("a", 2)
    assert gate.admit("e", False, 14) == ("e", "", None)


def test_client_key_counts_an_ipv4_mapped_address_as_ipv4() -> None:
    assert client_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert client_key("fe80::1%eth0") == "fe80::1"
    assert client_key("not an address") == "not an address"


def test_is_local_is_the_host_connecting_to_itself() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        seen = []
        for source in ("127.0.0.1", "127.0.0.7"):
            with socket.create_connection(("127.0.0.1", port), source_address=(source, 0)):
                conn, _ = srv.accept()
                with conn:
                    seen.append(is_local(conn))
    assert seen == [True, False]


def test_the_reaper_shuts_a_connection_down_at_its_deadline_and_says_why() -> None:
    expired: list[str] = []
    reaper = Reaper(expired.append)
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        a.settimeout(10)
        reaper.bind(1, a.fileno(), 0.05, "request")
        assert a.recv(1) == b"", "a blocked read ends when the deadline passes"
        wait_for(lambda: expired == ["request"], timeout=5, what="the expiry counted")
        assert not reaper.forget(a.fileno(), 1), "already expired"
        reaper.bind(2, c.fileno(), 0.05, "idle")
        assert not reaper.forget(c.fileno(), 99), "another connection's id: left registered"
        assert reaper.forget(c.fileno(), 2)
        reaper.set(c.fileno(), 0.01, "idle")  # forgotten: no new deadline
        c.settimeout(0.3)
        with pytest.raises(TimeoutError):
            c.recv(1)  # left alone
        assert expired == ["request"] and reaper.pending() == 0
        reaper.bind(3, c.fileno(), 3600, "idle")
        reaper.cut(3, "evicted")
        c.settimeout(10)
        assert c.recv(1) == b"" and expired == ["request", "evicted"]
    finally:
        reaper.stop()
        for x in (a, b, c, d):
            x.close()


def test_workers_reuse_an_idle_thread_and_end_after_lingering() -> None:
    ran: list[tuple[int, int]] = []
    done = threading.Semaphore(0)

    def work(n: int) -> None:
        ran.append((n, threading.get_ident()))
        done.release()

    workers = Workers(work, "test-worker", linger=0.3)
    workers.submit(1)
    assert done.acquire(timeout=10)
    wait_for(lambda: workers._idle == 1, timeout=5, what="the thread idle")
    workers.submit(2)
    assert done.acquire(timeout=10)
    assert ran[0][1] == ran[1][1], "the idle thread took the second"
    wait_for(lambda: workers._idle == 0, timeout=10, what="the idle thread ending")
    assert not any(t.ident == ran[0][1] for t in threading.enumerate() if t.is_alive())
    workers.submit(3)
    assert done.acquire(timeout=10) and [n for n, _ in ran] == [1, 2, 3]


# ---------------------------------------------------------------- a real server


class Served:
    def __init__(self, tmp: Path, web_yaml: str | None, limits: Limits | None = None) -> None:
        self.port = free_port()
        web = None
        if web_yaml is not None:
            (tmp / "web.yml").write_text(web_yaml)
            web = load_file(str(tmp / "web.yml"))
        store = Store()
        store.tick()
        self.server = MetricsServer(MetricsSection(listen=f"127.0.0.1:{self.port}"), build_registry(store, CATALOG),
                                    store, web=web, limits=limits, stall_after=3600)
        self.server.start()

    def closed(self, reason: str) -> float:
        for s in self.server.samples():
            if s.name == "node_health_http_connections_closed_total" and dict(s.labels) == {"reason": reason}:
                return s.value
        return 0.0

    def requests(self, handler: str, code: int) -> float:
        for s in self.server.samples():
            if s.name == "node_health_http_requests_total" and dict(s.labels) == {"handler": handler, "code": str(code)}:
                return s.value
        return 0.0

    def get(self, path: str, *, source: str = SCRAPER, tls: bool = False, cert: Certs | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPResponse, bytes]:
        conn: http.client.HTTPConnection
        if tls:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            if cert is not None:
                ctx.load_cert_chain(str(cert.client[0]), str(cert.client[1]))
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=ctx,
                                               source_address=(source, 0))
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10, source_address=(source, 0))
        try:
            conn.request("GET", path, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp, resp.read()
        finally:
            conn.close()

    def raw(self, source: str = SCRAPER) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10, source_address=(source, 0))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def make(web_yaml: str | None = None, limits: Limits | None = None) -> Served:
        made.append(Served(tmp_path, web_yaml, limits))
        return made[-1]

    yield make
    for s in made:
        s.server.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


SHORT = Limits(request=0.5, idle=0.5, write=0.5)


def test_a_slowloris_request_is_cut_at_its_deadline_not_per_byte(served: Callable[..., Served]) -> None:
    s = served(limits=SHORT)
    with s.raw() as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-a: ")
        closed = False
        for _ in range(100):  # one byte every 0.1 s: each well inside any per-read timeout
            time.sleep(0.1)
            try:
                sock.sendall(b"a")
                if sock.recv(1, socket.MSG_DONTWAIT) == b"":
                    closed = True
                    break
            except BlockingIOError:
                continue
            except OSError:
                closed = True
                break
        assert closed, "the server closed the dripping request"
    wait_for(lambda: s.closed("request") == 1, timeout=5, what="the request deadline counted")


def test_an_idle_keep_alive_is_closed_and_a_silent_connection_at_the_handshake_deadline(
    served: Callable[..., Served], certs: Certs
) -> None:
    s = served(f"tls_server_config:\n  cert_file: {certs.server[0]}\n  key_file: {certs.server[1]}\n", SHORT)
    with s.raw() as silent:
        assert silent.recv(1) == b"", "a connection that never sends a ClientHello is dropped"
    wait_for(lambda: s.closed("handshake") == 1, timeout=5, what="the handshake deadline counted")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", s.port, timeout=10, context=ctx, source_address=(SCRAPER, 0))
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() == b"ok\n"
    assert conn.sock is not None and conn.sock.recv(1) == b"", "the idle keep-alive was closed"
    conn.close()
    wait_for(lambda: s.closed("idle") == 1, timeout=5, what="the idle close counted")


def test_one_address_over_its_limit_is_refused_before_anything_is_read_others_are_served(
    served: Callable[..., Served],
) -> None:
    s = served(limits=Limits(per_client=3))
    held = [s.raw("127.0.0.2") for _ in range(3)]
    try:
        wait_for(lambda: s.server._httpd.gate.held()[0] == 3, timeout=5, what="three held")
        with s.raw("127.0.0.2") as fourth:
            fourth.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                assert _read_all(fourth) == b""
            except ConnectionResetError:
                pass
        assert s.get("/healthz")[0] == 200, "another address is served"
        assert s.closed("client_limit") == 1
    finally:
        for h in held:
            h.close()


def test_a_full_total_leaves_the_hosts_own_probe_its_budget(served: Callable[..., Served]) -> None:
    s = served(limits=Limits(per_client=3, total=4))
    held = [s.raw(f"127.0.0.{2 + i // 2}") for i in range(4)]
    try:
        wait_for(lambda: s.server._httpd.gate.held()[0] == 4, timeout=5, what="the total held")
        with pytest.raises((ConnectionError, http.client.HTTPException)):  # holds as many as the biggest holder
            s.get("/healthz", source="127.0.0.2")
        assert s.closed("total_limit") == 1
        assert s.get("/healthz", source="127.0.0.1")[0] == 200, "the host's own connection is served"
        assert s.server._httpd.gate.held()[0] == 4 and s.closed("evicted") == 0, "and took no one's place"
    finally:
        for h in held:
            h.close()


def test_many_addresses_filling_the_total_cannot_keep_a_scraper_out(served: Callable[..., Served]) -> None:
    s = served(limits=Limits(per_client=4, total=8))
    held = [s.raw(f"127.0.0.{2 + i // 4}") for i in range(8)]
    try:
        wait_for(lambda: s.server._httpd.gate.held()[0] == 8, timeout=5, what="the total held")
        assert [s.get("/metrics")[0] for _ in range(3)] == [200] * 3
        evicted = s.closed("evicted")
        assert evicted >= 1  # a scrape admitted in a place the previous one left needs none
        cut = 0
        for h in held:
            h.settimeout(0)
            try:
                cut += h.recv(1) == b""
            except BlockingIOError:
                pass
            except ConnectionError:
                cut += 1
        assert cut == evicted, "each eviction cut one held connection"
    finally:
        for h in held:
            h.close()


def test_headers_are_held_to_a_budget_and_answered_431(served: Callable[..., Served]) -> None:
    s = served(limits=Limits(header_bytes=1024))
    status, _, _ = s.get("/metrics", headers={f"X-{i}": "a" * 100 for i in range(20)})
    assert status == 431
    assert s.requests("metrics", 431) == 1
    with s.raw() as sock:
        sock.sendall(b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 431 ")
    assert s.requests("other", 431) == 1


def test_a_request_body_is_not_read_the_connection_is_closed_after_the_answer(served: Callable[..., Served]) -> None:
    s = served()
    with s.raw() as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nGET /metrics HTTP/1.1\r\n")
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in answer and answer.count(b"HTTP/1.1") == 1


# ---------------------------------------------------------------- 100 hostile connections


def _attack(port: int, tls: bool, kinds: dict[str, int], certs: Certs | None) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(HOSTILE), "--port", str(port), "--drip", "1"]
    cmd += ["--tls"] if tls else []
    cmd += ["--cert", str(certs.client[0]), "--key", str(certs.client[1])] if certs else []
    for kind, n in kinds.items():
        cmd += ["--kind", f"{kind}:{n}"]
    for i in range(7):  # 100 / 7 stays within the per-client limit: all held at once
        cmd += ["--source", f"127.0.0.{2 + i}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.strip() == "ready", f"the attackers did not start: {line}{proc.stderr.read() if proc.poll() else ''}"


def _stop(proc: subprocess.Popen[str]) -> dict[str, int]:
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    counts: dict[str, int] = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    return counts


MODES = [
    pytest.param("", {"idle": 34, "slowloris": 33, "silent": 33}, id="http"),
    pytest.param("tls", {"idle": 34, "slowloris": 33, "silent": 33}, id="tls"),
    pytest.param("mtls", {"idle": 25, "slowloris": 25, "silent": 25, "nocert": 25}, id="mtls"),
]


@pytest.mark.parametrize(("mode", "kinds"), MODES)
def test_100_hostile_connections_every_scrape_and_every_healthz_succeeds(
    served: Callable[..., Served], certs: Certs, mode: str, kinds: dict[str, int]
) -> None:
    yaml = None
    if mode:
        yaml = f"tls_server_config:\n  cert_file: {certs.server[0]}\n  key_file: {certs.server[1]}\n"
        if mode == "mtls":
            yaml += f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs.ca}\n"
    s = served(yaml)
    tls, cert = bool(mode), certs if mode == "mtls" else None
    proc = _attack(s.port, tls, kinds, cert)
    try:
        _ready(proc)
        wait_for(lambda: s.server._httpd.gate.held()[0] >= 75, timeout=30, what="the attackers holding connections")
        deadline = time.monotonic() + 6  # past the 5 s deadlines, so that attackers were also dropped and came back
        results, held = [], []
        while time.monotonic() < deadline or len(results) < 20:
            held.append(s.server._httpd.gate.held()[0])
            results.append((s.get("/metrics", tls=tls, cert=cert)[0], s.get("/healthz", source="127.0.0.1", tls=tls,
                                                                             cert=cert)[0]))
            time.sleep(0.1)
    finally:
        counts = _stop(proc)
    assert all(r == (200, 200) for r in results), [r for r in results if r != (200, 200)]
    # more than the 64 connections that locked every client out before (issue 25 item 2)
    assert max(held) >= 75, f"the attack held {held} connections while the scrapes were answered"
    assert counts.get("slowloris_opened", 0) > kinds["slowloris"], f"slowloris were cut and re-opened: {counts}"
    if mode == "mtls":
        assert counts.get("nocert_dropped", 0) >= kinds["nocert"], counts
        assert s.closed("tls") >= kinds["nocert"]


def test_the_server_header_names_the_agent_only(served: Callable[..., Served]) -> None:
    s = served()
    _, resp, _ = s.get("/healthz")
    assert resp.headers["Server"] == "node-health-agent"
    with s.raw() as sock:
        sock.sendall(b"BREW /pot HTTP/1.1\r\n\r\n")
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 501 ") and b"Server: node-health-agent\r\n" in answer
    assert b"Python" not in answer
    assert s.requests("other", 501) == 1, "http.server's own error answers are counted"


def test_a_failing_handler_answers_500_counted_one_log_line(
    served: Callable[..., Served], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    s = served()

    def broken(accept: str) -> tuple[bytes, str]:
        raise RuntimeError("the registry broke")

    monkeypatch.setattr(s.server, "render", broken)
    with caplog.at_level("DEBUG", logger="agent.web"):
        codes = [s.get("/metrics")[0] for _ in range(20)]
    assert codes == [500] * 20
    assert s.requests("metrics", 500) == 20
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "the registry broke" in errors[0].getMessage(), errors
    assert "Traceback" not in capfd.readouterr().err
    assert s.get("/healthz")[0] == 200


if os.environ.get("NHA_SKIP_HOSTILE"):
    pytestmark = pytest.mark.skip("NHA_SKIP_HOSTILE")
