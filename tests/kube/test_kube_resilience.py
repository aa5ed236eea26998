"""Gentle on a sick API server: 429 and Retry-After for every verb, 5xx, outages, token rotation."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

import pytest

from agent.kube.connect import ClusterSource
from fakeapi import FakeApiServer
from kube_support import (
    NODE, PREFIX, fake, finding, our_taints, settings, snapshot, start_actuator, wait_for,  # noqa: F401
)



def tainted(fake: FakeApiServer) -> bool:
    return our_taints(fake) != []


@pytest.mark.parametrize(
    ("method", "path", "form"),
    [
        pytest.param("GET", r"^/api/v1/nodes$", "text", id="GET (list node), APF plain text"),
        pytest.param("PATCH", rf"^/api/v1/nodes/{NODE}$", "text", id="PATCH taints, APF plain text"),
        pytest.param("POST", r"/leases$", "json", id="POST lease, Status with retryAfterSeconds"),
        pytest.param("PATCH", rf"/nodes/{NODE}/status$", "json", id="PATCH status"),
    ],
)
def test_retry_after_is_honoured_for_every_verb(fake: FakeApiServer, tmp_path: Any, method: str, path: str, form: str) -> None:
    fake.inject(429, method=method, path=path, retry_after=2, form=form)
    act = start_actuator(fake, str(tmp_path), settings())
    try:
        act.offer(snapshot([finding("FakeDiskFull")], runs=1))

        def answered() -> bool:
            log = fake.log()
            return tainted(fake) and any(r.status == 429 for r in log[:-1])

        wait_for(answered)
        log = fake.log()
        i = next(i for i, r in enumerate(log) if r.status == 429)
        assert log[i + 1].t - log[i].t >= 2.0, "the next request waited for Retry-After"
        assert act.reconciler.stats.throttled == 1
    finally:
        act.stop()


def test_429_without_retry_after_backs_off_exponentially(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.inject(429, method="PATCH", path=rf"^/api/v1/nodes/{NODE}$", form="none", times=2)
    act = start_actuator(fake, str(tmp_path), settings())
    try:
        act.offer(snapshot([finding("FakeDiskFull")], runs=1))
        wait_for(lambda: tainted(fake), timeout=20)
        times = [r.t for r in fake.log(verbs=("patch",)) if r.path.endswith(NODE)]
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert len(gaps) == 2 and gaps[0] >= 1.0 and gaps[1] >= 2.0
    finally:
        act.stop()


def test_server_errors_back_off_and_recover(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.inject(503, path=rf"^/api/v1/nodes/{NODE}$", retry_after=1, times=2)
    act = start_actuator(fake, str(tmp_path), settings())
    try:
        act.offer(snapshot([finding("FakeDiskFull")], runs=1))
        wait_for(lambda: tainted(fake), timeout=20)
        assert act.reconciler.stats.retries["server_error"] == 2
    finally:
        act.stop()


def test_api_down_for_a_while_then_catches_up(fake: FakeApiServer, tmp_path: Any) -> None:
    act = start_actuator(fake, str(tmp_path), settings(backoff_max=1.0))
    try:
        act.offer(snapshot([], runs=1))
        wait_for(lambda: act.reconciler.synced_at > 0)
        fake.stop()
        act.offer(snapshot([finding("FakeDiskFull")], runs=2))
        wait_for(lambda: act.reconciler.error is not None)
        # down for a while: proof that time passed is the actuator trying again, with backoff
        wait_for(lambda: act.reconciler.stats.retries["connection"] >= 2)
        assert all(t.is_alive() for t in act._threads)
        assert [f.reason for f in act.reconciler.findings()] == ["KubeApiError"]
        fake.start()
        wait_for(lambda: tainted(fake))
        wait_for(lambda: act.reconciler.error is None)
        assert act.reconciler.stats.retries["connection"] >= 2
    finally:
        act.stop()


def _tls(tmp: str) -> tuple[str, str]:
    cert, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def test_in_cluster_token_rotation_is_picked_up_after_401(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.kube.api import KubeApi, Stats
    from agent.kube.connect import build_client
    from agent.kube.ratelimit import Gate
    from conftest import require_tool

    require_tool("openssl")
    cert, key = _tls(str(tmp_path))
    fake = FakeApiServer(token="token-1")
    fake.start(tls=(cert, key))
    fake.add_node(NODE)
    try:
        token_file = tmp_path / "token"
        token_file.write_text("token-1")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(fake.port))
        client, reauth = build_client(ClusterSource("in-cluster", token_file=str(token_file), ca_file=cert))
        api = KubeApi(client, gate=Gate(qps=100, burst=100, backoff_max=1, now=time.monotonic()),
                      clock=time.monotonic, stats=Stats(), timeout=5, reauth=reauth)
        assert api.read_node(NODE)["metadata"]["name"] == NODE
        token_file.write_text("token-2")  # the kubelet rotated the projected token
        fake.tokens = {"token-2": fake.user}  # and the old one is no longer accepted
        with pytest.raises(Exception) as info:
            api.read_node(NODE)
        assert getattr(info.value, "status", None) == 401
        time.sleep(1.1)  # the backoff after the 401
        assert api.read_node(NODE)["metadata"]["name"] == NODE
    finally:
        fake.stop()
