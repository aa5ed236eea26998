"""Basic auth against any Authorization header (issue 25 item 5): a password
of any length is checked or refused with a 401, counted, and a flood of them
writes one log line, never a traceback per request. bcrypt 5 raises
ValueError past 72 bytes; Go's bcrypt answers ErrPasswordTooLong, which
exporter-toolkit turns into a 401."""

from __future__ import annotations

import base64
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from agentproc import free_port
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config import MetricsSection
from agent.metrics import build_registry
from agent.registry import CATALOG
from agent.store import Store
from agent.web.conns import Throttled
from agent.web.server import MetricsServer, _Auth
from agent.web.tls import load_file

PASSWORD_72 = "p" * 72
HASH = bcrypt.hashpw(PASSWORD_72.encode(), bcrypt.gensalt(4)).decode()
USERS = {"prometheus": HASH}


def basic(user: bytes, password: bytes) -> str:
    return "Basic " + base64.b64encode(user + b":" + password).decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsServer]:
    tmp: Path = tmp_path_factory.mktemp("auth")
    (tmp / "web.yml").write_text(f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    store = Store()
    store.tick()
    srv = MetricsServer(MetricsSection(listen=f"127.0.0.1:{free_port()}"), build_registry(store, CATALOG), store,
                        web=load_file(str(tmp / "web.yml")))
    srv.start()
    yield srv
    srv.stop()


def ask(srv: MetricsServer, authorization: bytes) -> bytes:
    """One raw request: the header's bytes as sent, whatever they are."""
    with socket.create_connection(srv.address[:2], timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + authorization
                     + b"\r\n\r\n")
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out.split(b"\r\n", 1)[0]


def count(srv: MetricsServer, code: int) -> float:
    for s in srv.samples():
        if s.name == "node_health_http_requests_total" and dict(s.labels) == {"handler": "metrics", "code": str(code)}:
            return s.value
    return 0.0


def test_a_72_byte_password_is_checked_and_longer_ones_are_a_401(server: MetricsServer) -> None:
    assert ask(server, basic(b"prometheus", PASSWORD_72.encode()).encode()).startswith(b"HTTP/1.1 200 ")
    # bcrypt reads 72 bytes: the same 72 and more would match if it were given them truncated
    assert ask(server, basic(b"prometheus", PASSWORD_72.encode() + b"extra").encode()).startswith(b"HTTP/1.1 401 ")


def test_200_long_passwords_are_200_counted_401s_and_one_log_line(
    server: MetricsServer, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    before = count(server, 401)
    with caplog.at_level(logging.DEBUG, logger="agent.web"):
        lines = {ask(server, basic(b"prometheus", b"x" * n).encode()) for n in range(73, 273)}
    assert lines == {b"HTTP/1.1 401 Unauthorized"}
    assert count(server, 401) - before == 200
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) <= 1 and all("bcrypt reads at most 72" in w for w in warnings), warnings
    assert "Traceback" not in capfd.readouterr().err
    assert ask(server, basic(b"prometheus", PASSWORD_72.encode()).encode()).startswith(b"HTTP/1.1 200 ")


_quiet = Throttled(logging.getLogger("test"), every=3600)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.text(),
    st.builds(lambda s: "Basic " + s, st.text()),
    st.builds(lambda u, p: basic(u, p), st.sampled_from([b"prometheus", b""]) | st.binary(max_size=20),
              st.binary(max_size=400)),
))
def test_any_authorization_header_is_a_yes_or_no_never_an_exception(header: str) -> None:
    auth = _Auth(_quiet)
    assert auth.check(USERS, header) in (True, False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.binary(max_size=300).map(lambda b: b"".join(bytes([c]) for c in b if c not in b"\r\n")),
    st.binary(max_size=300).map(lambda p: basic(b"prometheus", p).encode()),
))
def test_any_authorization_header_on_the_wire_is_answered_and_counted(server: MetricsServer, raw: bytes) -> None:
    before = count(server, 401) + count(server, 200)
    line = ask(server, raw)
    assert line in (b"HTTP/1.1 401 Unauthorized", b"HTTP/1.1 200 OK"), line
    assert count(server, 401) + count(server, 200) == before + 1
