"""The fleet breaker (agent/kube/breaker.py) against the fake API server: records counted on the server's
clock, percent and count, the taint budget as a signal, the trip written to the kill-switch ConfigMap and
read back by every node, fail closed, and a person's reset."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from typing import Any

import pytest

from agent.kube.api import ApiError
from agent.kube.remediate import KubeRemediation
from agent.kube.settings import KubernetesSection
from fakeapi import FakeApiServer
from kube_support import BUDGET_NS, QUOTA, make_api, settings

DISRUPTION_NS, DISRUPTION_QUOTA = "node-health-disruption", "node-health-disruption-budget"
RECORDS = "node-health-disrupted"
KS_NS, KS = "node-health", "ks"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def server() -> Iterator[tuple[FakeApiServer, Clock]]:
    wall = Clock(1_800_000_000.0)  # the API server's clock
    f = FakeApiServer(bookmark_interval=0.2, wall=wall)
    f.start()
    f.set_quota(BUDGET_NS, QUOTA, 10)
    f.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 50)
    f.set_configmap(KS_NS, KS, {"paused": "false"})
    yield f, wall
    f.stop()


def breaker_settings(count: int = 3, percent: float = 100.0, window: float = 3600.0, min_tainted: int = 5) -> KubernetesSection:
    cfg = settings(kill_switch=KS)
    fast = {"qps": 1000.0, "burst": 1000}
    return dataclasses.replace(
        cfg,
        breaker=dataclasses.replace(cfg.breaker, max_disrupted_percent=percent, window=window, min_tainted=min_tainted),
        disruption_budget=dataclasses.replace(cfg.disruption_budget, **fast),
        remediation_writes=dataclasses.replace(cfg.remediation_writes, **fast),
    )


def fleet(fake: FakeApiServer, n: int, count: int) -> list[str]:
    names = [f"node-{i:03d}" for i in range(n)]
    for name in names:
        fake.add_node(name)
    fake.set_quota(RECORDS, RECORDS, count)
    return names


MONO = Clock(1000.0)  # the agents' monotonic clock (only the breaker's trust in an earlier read reads it)


def agent(fake: FakeApiServer, tmp: Any, node: str, cfg: KubernetesSection, skew: float = 0.0) -> KubeRemediation:
    api = make_api(fake, str(tmp), cfg)
    wall = fake.wall
    return KubeRemediation(api, node, fake.node(node)["metadata"]["uid"], cfg, namespace="node-health",
                           rng=random.Random(node), wall=lambda: wall() + skew, mono=MONO)


def records(fake: FakeApiServer) -> list[str]:
    return sorted(o["metadata"]["name"] for o in fake.objects("coordination.k8s.io", "leases", RECORDS))


def switch(fake: FakeApiServer) -> dict[str, str]:
    (cm,) = [o for o in fake.objects("", "configmaps", KS_NS) if o["metadata"]["name"] == KS]
    return dict(cm.get("data") or {})


def reset(fake: FakeApiServer) -> None:
    """The documented reset: delete the records, then set the breaker key to "false"."""
    for name in records(fake):
        fake.cluster.delete(("coordination.k8s.io", "leases", RECORDS, name))
    fake.set_configmap(KS_NS, KS, {**switch(fake), "breaker": "false"})


def test_the_count_trips_it_for_every_node_until_a_person_resets_it(server: Any, tmp_path: Any) -> None:
    fake, _ = server
    cfg = breaker_settings()
    names = fleet(fake, 10, count=3)
    agents = [agent(fake, tmp_path, n, cfg) for n in names]
    for a in agents[:3]:
        assert a.breaker_check(0, "claim") == "" and a.breaker_check(0, "drain") == ""
    assert records(fake) == names[:3]
    why = agents[3].breaker_check(0, "drain")
    assert "fleet breaker is tripped" in why and "3 nodes were disrupted within 1 h" in why and names[3] in why
    assert "kubectl -n node-health-disrupted delete leases --all" in why, "the message says how to reset it"
    data = switch(fake)
    assert data["breaker"] == "tripped" and data["breaker-signal"] == "disrupted" and data["breaker-node"] == names[3]
    assert data["paused"] == "false", "the kill switch's own key is untouched: taints go on"
    assert [e["reason"] for e in fake.events()] == ["FleetBreakerTripped"]
    assert records(fake) == names[:3], "the tripping node is not recorded: it disrupts nothing"
    # Every node reads it again before its next step, whether it holds a record or not.
    assert "tripped by node-003" in agents[0].breaker_check(0, "reboot")
    assert "tripped" in agents[5].breaker_check(0, "claim")
    states = [dict(s.labels) for s in agents[0].samples() if s.name == "node_health_kube_breaker"]
    assert states == [{"state": "tripped", "signal": "disrupted"}]
    assert {dict(s.labels)["signal"]: s.value for s in agents[3].samples()
            if s.name == "node_health_kube_breaker_trips_total"} == {"disrupted": 1.0}
    reset(fake)
    assert "tripped" in agents[3].breaker_check(0, "claim"), "a waiting node trusts its last read for a while"
    assert agents[3].breaker_check(0, "drain") == "", "a host-changing step reads it again: reset"
    MONO.t += 1200 * 1.2  # the resync interval, jittered: a waiting node reads it again (from the watch cache)
    for a in agents[4:6]:
        assert a.breaker_check(0, "claim") == "" and a.breaker_check(0, "drain") == "", "resumed after the reset"
    cached = [r for r in fake.log(verbs=("list",)) if r.path.endswith(f"/{KS_NS}/configmaps")]
    assert cached and all(r.query.get("resourceVersion") == "0" for r in cached), "claims read the watch cache"
    assert "tripped" in agents[6].breaker_check(0, "drain"), "and stops again after the count"


def test_the_percent_of_the_fleet_trips_it_before_the_count(server: Any, tmp_path: Any) -> None:
    fake, _ = server
    cfg = breaker_settings(percent=5.0)  # 5 % of 40 nodes: 2
    names = fleet(fake, 40, count=30)
    agents = [agent(fake, tmp_path, n, cfg) for n in names[:3]]
    assert agents[0].breaker_check(0, "drain") == "" and agents[1].breaker_check(0, "drain") == ""
    why = agents[2].breaker_check(0, "drain")
    assert "3 nodes would be disrupted within 1 h, more than 2 (min of the count 30 and 5% of 40 nodes)" in why
    assert records(fake) == names[:2], "its own record deleted again"
    nodes_lists = [r for r in fake.log(verbs=("list",)) if r.path.endswith("/nodes")]
    assert nodes_lists and all(r.query.get("limit") == "1" for r in nodes_lists), "the fleet's size: one paged item"
    assert len(nodes_lists) == 3, "once per agent (cached)"


def test_the_window_is_the_servers_clock_whatever_the_nodes_clocks_say(server: Any, tmp_path: Any) -> None:
    """Records older than the window by the API server's creationTimestamp stop counting (and are deleted);
    a node whose own clock is hours ahead or behind changes nothing."""
    fake, wall = server
    cfg = breaker_settings()
    names = fleet(fake, 10, count=2)
    early = [agent(fake, tmp_path, n, cfg, skew=s) for n, s in zip(names[:2], (-7200.0, 7200.0), strict=True)]
    assert all(a.breaker_check(0, "drain") == "" for a in early)
    wall.t += 1800  # within the window: both still count (a node 2 h ahead does not make them old)
    late = agent(fake, tmp_path, names[2], cfg, skew=+7200.0)
    assert "tripped" in late.breaker_check(0, "drain")
    reset(fake)
    for a in early:  # a new episode each: recorded again (at the server's T + 30 min)
        a.breaker.forget()
        assert a.breaker_check(0, "drain") == ""
    assert records(fake) == names[:2]
    wall.t += 3601  # past the window on the server's clock
    assert late.claim_slot(0), "the slot's create tells the server's clock"
    assert late.breaker_check(0, "drain") == "", "the old records expired (quota full: 403, then looked at)"
    assert records(fake) == [names[2]]
    assert any(r.status == 403 for r in fake.log(verbs=("create",)) if f"/{RECORDS}/" in r.path)


def test_a_full_taint_budget_trips_it_before_a_claim(server: Any, tmp_path: Any) -> None:
    fake, _ = server
    cfg = breaker_settings(min_tainted=5)
    names = fleet(fake, 20, count=10)
    fake.set_quota(BUDGET_NS, QUOTA, 5)
    for n in names[:5]:  # five nodes hold every taint-budget slot
        fake.cluster.put(("coordination.k8s.io", "leases", BUDGET_NS, n),
                         {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": n, "namespace": BUDGET_NS}})
    with fake.cluster.lock:
        fake.cluster._refresh_quotas(BUDGET_NS)
    a = agent(fake, tmp_path, names[10], cfg)
    why = a.breaker_check(0, "claim")
    assert "the taint budget is full: 5 of 5 slots held" in why and switch(fake)["breaker-signal"] == "tainted"


def test_fail_closed_no_quota_an_unreadable_or_unknown_state(server: Any, tmp_path: Any) -> None:
    fake, _ = server
    cfg = breaker_settings()
    fake.add_node("node-x")
    a = agent(fake, tmp_path, "node-x", cfg)
    why = a.breaker_check(0, "drain")
    assert "no ResourceQuota node-health-disrupted/node-health-disrupted" in why and "fail closed" in why
    assert "breaker" not in switch(fake), "no quota is not a trip: nothing is written"
    fake.set_quota(RECORDS, RECORDS, 5)
    fake.set_configmap(KS_NS, KS, {"paused": "false", "breaker": "maybe"})  # anything but ""/"false": tripped
    assert "tripped" in a.breaker_check(0, "reboot")
    fake.set_configmap(KS_NS, KS, {"paused": "false"})
    assert a.breaker_check(0, "reboot") == ""
    fake.inject(403, method="GET", path="/configmaps/")
    with pytest.raises(ApiError):
        a.breaker_check(0, "reboot")  # the step does not run


def test_disabled_asks_nothing(server: Any, tmp_path: Any) -> None:
    fake, _ = server
    cfg = breaker_settings()
    cfg = dataclasses.replace(cfg, breaker=dataclasses.replace(cfg.breaker, enabled=False))
    fake.add_node("node-y")
    a = agent(fake, tmp_path, "node-y", cfg)
    before = len(fake.log())
    assert a.breaker_check(0, "claim") == "" and a.breaker_check(0, "drain") == "" and len(fake.log()) == before
