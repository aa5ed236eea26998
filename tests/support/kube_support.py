"""Shared helpers for the Kubernetes tests: the fake cluster, settings, snapshots, reconcilers."""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Iterable, Iterator
from types import MappingProxyType
from typing import Any

import pytest

import kube_catalog
from agentproc import wait_for as wait_for  # the one wait_for of the tests
from agent import config
from agent.catalog import Catalog
from agent.findings import Finding, Observation
from agent.kube.api import KubeApi, Stats
from agent.kube.connect import ClusterSource, build_client
from agent.kube.ratelimit import Gate
from agent.kube.reconciler import Reconciler
from agent.kube.settings import HysteresisSection, KubernetesSection
from agent.registry import CATALOG as REGISTRY_CATALOG
from agent.statedir import StateDir
from agent.store import CheckStatus, Snapshot
from fakeapi import FakeApiServer

NODE = "gpu-node-1"
PREFIX = "node-health-agent/"
BUDGET_NS = "node-health-budget"
QUOTA = "node-health-taint-budget"
# The [kubernetes] part of an `agent run` config against the fake API server:
# no start-up jitter, and the kill switch watched.
AGENT_KUBE_CONFIG = """
[kubernetes]
startup_jitter = "0s"
[kubernetes.kill_switch]
name = "ks"
"""


# The agent's catalog and the test-only reasons ("Fake…") the Kubernetes tests use.
CATALOG = Catalog.merge(REGISTRY_CATALOG, Catalog.declare(kube_catalog.REASONS, kube_catalog.METRICS))


@pytest.fixture
def fake(tmp_path: Any) -> Iterator[FakeApiServer]:
    f = FakeApiServer(bookmark_interval=0.2)
    f.start()
    f.add_node(NODE)
    f.set_quota(BUDGET_NS, QUOTA, 10)
    yield f
    f.stop()


def settings(**kw: Any) -> KubernetesSection:
    """Test defaults: no start-up jitter, no kill switch, immediate hysteresis unless asked."""
    base = config.defaults().kubernetes
    hyst = kw.pop("hysteresis", HysteresisSection(raise_cycles=1, raise_after=0, clear_cycles=1, clear_after=0))
    ks = dataclasses.replace(base.kill_switch, name=kw.pop("kill_switch", ""))
    kw.setdefault("startup_jitter", 0.0)
    kw.setdefault("qps", 1000.0)
    kw.setdefault("burst", 1000)
    return dataclasses.replace(base, hysteresis=hyst, kill_switch=ks, **kw)


class Clock:
    """A monotonic clock the test moves by hand (shared by the reconciler and the gate)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def in_process_api(fake: FakeApiServer, clock: Any, cfg: KubernetesSection, rng: random.Random) -> KubeApi:
    """A node's KubeApi: the real kubernetes client, its urllib3 pool replaced by the fake's in-process one
    (no sockets: fleet benches and state machines run many of them)."""
    from kubernetes import client

    conf = client.Configuration()
    conf.host = "http://fake-apiserver"
    conf.api_key = {"BearerToken": fake.token}
    conf.api_key_prefix = {"BearerToken": "Bearer"}
    conf.retries = False
    api_client = client.ApiClient(conf)
    api_client.rest_client.pool_manager = fake.pool()
    gate = Gate(qps=cfg.qps, burst=cfg.burst, backoff_max=cfg.backoff_max, now=clock(), rng=rng)
    return KubeApi(api_client, gate=gate, clock=clock, stats=Stats(), timeout=cfg.request_timeout)


def make_api(fake: FakeApiServer, tmp: str, cfg: KubernetesSection, clock: Any = time.monotonic,
             stats: Stats | None = None, token: str | None = None) -> KubeApi:
    path = fake.kubeconfig(os.path.join(tmp, f"kubeconfig-{random.randrange(1 << 30)}"), token=token)
    client, reauth = build_client(ClusterSource("kubeconfig", path))
    gate = Gate(qps=cfg.qps, burst=cfg.burst, backoff_max=cfg.backoff_max, now=clock(), rng=random.Random(7))
    return KubeApi(client, gate=gate, clock=clock, stats=stats or Stats(), timeout=cfg.request_timeout, reauth=reauth)


def make_reconciler(fake: FakeApiServer | None, tmp: str, cfg: KubernetesSection, *, node: str = NODE,
                    clock: Any = time.monotonic, dry_run: bool = False, state: str | None = None) -> Reconciler:
    stats = Stats()
    api = make_api(fake, tmp, cfg, clock, stats) if fake is not None else None
    sd = StateDir(state or os.path.join(tmp, f"state-{node}"))
    sd.ensure()
    return Reconciler(cfg, node, sd, catalog=CATALOG, api=api, dry_run=dry_run, now=clock(), stats=stats, rng=random.Random(1))


def finding(reason: str, subject: str = "/data", check: str = "disk", message: str = "") -> Finding:
    entry = CATALOG.reason(reason)
    return Finding(check, subject, reason, entry.severity, message or f"{reason} on {subject}", entry.unknown)


def snapshot(findings: Iterable[Finding] = (), *, runs: int = 1, check: str = "disk",
             known: Iterable[str] = ("FakeDiskFull", "FakeDiskSlow"), failed: bool = False) -> Snapshot:
    """One check's latest run; `known` are the reasons it declares (their families get conditions)."""
    error = Finding(check, check, "CheckFailed", CATALOG.reason("CheckFailed").severity, "boom", True) if failed else None
    st = CheckStatus(check, Observation(findings=tuple(findings)), ok=not failed, runs=runs, error=error,
                     known=tuple(("/data", r) for r in known))
    return Snapshot(runs, MappingProxyType({check: st}), MappingProxyType({}), MappingProxyType({}),
                    MappingProxyType({}), time.time(), time.time())


def our_taints(fake: FakeApiServer, node: str = NODE) -> list[tuple[str, str, str]]:
    return sorted((t["key"], t.get("value", ""), t["effect"]) for t in fake.node(node)["spec"].get("taints", [])
                  if t["key"].startswith(PREFIX))


def conditions(fake: FakeApiServer, node: str = NODE) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in fake.node(node)["status"]["conditions"]}


def start_actuator(fake: FakeApiServer | None, tmp: str, cfg: KubernetesSection, *, node: str = NODE,
                   dry_run: bool = False, state: str | None = None) -> Any:
    """A running actuator (real threads, real clock); `.published` holds its last samples."""
    from agent.kube.actuator import Actuator

    rec = make_reconciler(fake, tmp, cfg, node=node, dry_run=dry_run, state=state)
    box: dict[str, Any] = {"samples": []}
    act = Actuator(rec, kill_switch=cfg.kill_switch, publish_samples=lambda s: box.__setitem__("samples", s))
    act.published = box  # type: ignore[attr-defined]
    act.start()
    return act




def sample_value(act: Any, name: str, **labels: str) -> float | None:
    for s in act.published["samples"]:
        if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items()):
            return float(s.value)
    return None
