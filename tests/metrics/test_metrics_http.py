"""/metrics rendering and the HTTP endpoint: known findings at 0, TLS, basic auth, a stalled loop."""

from __future__ import annotations

import base64
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from agentproc import Agent, free_port, wait_for
from conftest import require_tool
from prometheus_client.exposition import generate_latest

from agent.config import MetricsSection, TLSSection
from agent.findings import Finding, Severity
from agent.metrics import build_registry
from agent.web.server import MetricsServer
from agent.registry import CATALOG
from agent.scheduler import Scheduler
from agent.store import Store


def render(store: Store) -> str:
    return generate_latest(build_registry(store, CATALOG)).decode()


def test_known_findings_exported_at_zero_and_active_at_one() -> None:
    store = Store()
    store.set_checks(["disk"], {"disk": (("/", "NotApplicable"), ("/data", "NotApplicable"))})
    text = render(store)
    assert 'node_health_finding{check="disk",gpu="",reason="NotApplicable",severity="info",subject="/"} 0.0' in text
    store.set_events("xid", [Finding("gpu", "gpu0", "CheckFailed", Severity.WARNING, "m", unknown=True)])
    text = render(store)
    assert 'node_health_finding{check="gpu",gpu="0",reason="CheckFailed",severity="warning",subject="gpu0"} 1.0' in text


@pytest.mark.parametrize(("subject", "gpu"), [
    pytest.param("gpu3", "3", id="one GPU: its NVML index, as every GPU series labels it"),
    pytest.param("gpu12", "12", id="two digits"),
    pytest.param("gpus", "", id="the GPUs as a whole"),
    pytest.param("gpu", "", id="an Xid of no known GPU"),
    pytest.param("pci-0000:18:00", "", id="a GPU not in the inventory"),
    pytest.param("nvswitch-0000:05:00", "", id="an NVSwitch"),
    pytest.param("gpu\u0663", "", id="a non-ASCII digit is no index"),
    pytest.param("/data", "", id="a mount"),
])
def test_a_gpu_finding_carries_the_gpu_label_the_gpu_series_carry(subject: str, gpu: str) -> None:
    """`node_health_finding{gpu="3"}` joins `node_health_gpu_*{gpu="3"}` (and dcgm-exporter's) on gpu."""
    store = Store()
    store.set_events("xid", [Finding("xid", subject, "Xid79", Severity.CRITICAL, "m")])
    [line] = [ln for ln in render(store).splitlines() if ln.startswith("node_health_finding{")]
    assert f'gpu="{gpu}"' in line and f'subject="{subject}"' in line, line


def test_every_rendered_metric_is_in_the_catalog() -> None:

    store = Store()
    store.set_checks(["disk"], {})
    names = {line.split(" ")[2] for line in render(store).splitlines() if line.startswith("# HELP node_health")}
    assert names and names <= set(CATALOG.metrics)


def _cert(tmp: Path) -> tuple[str, str]:
    require_tool("openssl")
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True,
    )
    return str(cert), str(key)


def test_tls_and_basic_auth(tmp_path: Path) -> None:
    cert, key = _cert(tmp_path)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    cfg = f"""
[metrics.tls]
cert_file = "{cert}"
key_file = "{key}"
[metrics.basic_auth_users]
prometheus = "{hashed}"
"""
    agent = Agent(tmp_path, cfg, scheme="https")
    try:
        agent.wait_ready()  # /healthz needs no auth
        assert agent.get("/metrics")[0] == 401
        bad = base64.b64encode(b"prometheus:wrong").decode()
        assert agent.get("/metrics", {"Authorization": f"Basic {bad}"})[0] == 401
        good = base64.b64encode(b"prometheus:s3cret").decode()
        code, body = agent.get("/metrics", {"Authorization": f"Basic {good}"})
        assert code == 200 and b"node_health_build_info" in body
        with pytest.raises(OSError):  # plain HTTP to a TLS port is refused
            urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/healthz", timeout=5).read()
    finally:
        assert agent.stop() == 0


def test_healthz_fails_while_the_loop_is_stalled() -> None:
    store = Store()
    sched = Scheduler(store, CATALOG)
    sched.configure([])
    port = free_port()
    server = MetricsServer(MetricsSection(listen=f"127.0.0.1:{port}", tls=TLSSection()), build_registry(store, CATALOG), store,
                           stall_after=1.0)
    server.start()
    stop = threading.Event()
    pings: list[float] = []
    loop = threading.Thread(target=sched.run, args=(stop, lambda: pings.append(time.monotonic())),
                            kwargs={"max_sleep": 0.1}, daemon=True)
    loop.start()

    def healthz() -> int:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        assert wait_for(lambda: healthz() == 200, what="healthy")
        release = threading.Event()
        stalled_at: list[int] = []

        def block() -> None:  # the loop thread blocks here
            stalled_at.append(len(pings))
            release.wait(10)

        sched.call_soon(block)
        wait_for(lambda: healthz() == 503, what="503 while stalled")  # itself proof of stall_after without ticks
        assert [len(pings)] == stalled_at, "no watchdog ticks while the loop is stalled"
        release.set()
        wait_for(lambda: healthz() == 200, what="healthy again")
        assert len(pings) > stalled_at[0]
    finally:
        stop.set()
        sched.call_soon(lambda: None)
        server.stop()
