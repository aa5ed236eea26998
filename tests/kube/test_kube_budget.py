"""The fleet-wide taint budget: N agents, B slots, enforced by the (fake) API server's quota."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from agent.kube.budget import Budget


from fakeapi import FakeApiServer
from kube_support import (
    BUDGET_NS, QUOTA, NODE, PREFIX, Clock, fake, finding, make_api, make_reconciler, our_taints, sample_value, settings,  # noqa: F401
    snapshot, start_actuator, wait_for,  # noqa: F401
)



def budget_settings(retry: float = 0.3) -> Any:
    cfg = settings()
    return dataclasses.replace(cfg, budget=dataclasses.replace(cfg.budget, retry_interval=retry))


def leases(fake: FakeApiServer) -> list[str]:
    return sorted(o["metadata"]["name"] for o in fake.objects("coordination.k8s.io", "leases", BUDGET_NS))


def test_n_agents_competing_for_b_slots_never_taint_more_than_b(fake: FakeApiServer, tmp_path: Any) -> None:
    n, b = 12, 4
    fake.set_quota(BUDGET_NS, QUOTA, b)
    nodes = [f"node-{i:02d}" for i in range(n)]
    for name in nodes:
        fake.add_node(name)
    agents = [start_actuator(fake, str(tmp_path), budget_settings(retry=60), node=name) for name in nodes]
    try:
        for act in agents:  # every node fails at once
            act.offer(snapshot([finding("FakeDiskFull")], runs=1))

        def settled() -> bool:
            return all(a.reconciler.synced_at > 0 and not a.reconciler.outbox for a in agents)

        wait_for(settled, timeout=20)
        tainted = [name for name in nodes if our_taints(fake, name)]
        assert len(tainted) == b and leases(fake) == tainted
        for act, name in zip(agents, nodes):
            cond = {c["type"]: c for c in fake.node(name)["status"]["conditions"]}["NodeHealthDiskProblem"]
            assert cond["status"] == "True", "conditions are reported whatever the budget"
            if name not in tainted:
                assert [f.reason for f in act.reconciler.findings()] == ["TaintBudgetExhausted"]
                wait_for(lambda: sample_value(act, "node_health_would_taint", key=PREFIX + "disk", cause="budget") == 1)
                assert sample_value(act, "node_health_kube_budget", state="exhausted") == 1
        reasons = [e["reason"] for e in fake.events()]
        assert reasons.count("TaintBudgetExhausted") == n - b and reasons.count("FakeDiskFull") == n
    finally:
        for act in agents:
            act.stop()


def test_a_released_node_frees_its_slot(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.set_quota(BUDGET_NS, QUOTA, 1)
    fake.add_node("second")
    first = start_actuator(fake, str(tmp_path), budget_settings())
    second = start_actuator(fake, str(tmp_path), budget_settings(), node="second")
    try:
        first.offer(snapshot([finding("FakeDiskFull")], runs=1))
        wait_for(lambda: our_taints(fake) != [])
        second.offer(snapshot([finding("FakeDiskFull")], runs=1))
        wait_for(lambda: second.reconciler.withheld != [])
        assert our_taints(fake, "second") == []
        first.offer(snapshot([], runs=2))  # the first node recovers: untainted, slot released
        wait_for(lambda: our_taints(fake, "second") != [], timeout=10)
        assert our_taints(fake) == [] and leases(fake) == ["second"]
        assert second.reconciler.findings() == ()
    finally:
        first.stop()
        second.stop()


def test_missing_quota_fails_closed(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.cluster.delete(("", "resourcequotas", BUDGET_NS, QUOTA))
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(), clock=clock)
    rec.step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    assert our_taints(fake) == [] and leases(fake) == []
    assert [f.reason for f in rec.findings()] == ["TaintBudgetMissing"]
    assert [e["reason"] for e in fake.events()] == ["FakeDiskFull", "TaintBudgetMissing"]


def test_a_restart_with_a_full_quota_finds_its_own_lease(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.set_quota(BUDGET_NS, QUOTA, 1)
    clock = Clock()
    state = str(tmp_path / "state")
    make_reconciler(fake, str(tmp_path), settings(), clock=clock, state=state).step(
        clock(), snapshot([finding("FakeDiskFull")], runs=1))
    fake.edit_node(NODE, lambda n: n["spec"].update(taints=[]))  # our taint lost while we were down
    (tmp_path / "state" / "kubernetes.json").unlink()  # and the state with it: a fresh install
    again = make_reconciler(fake, str(tmp_path), settings(), clock=clock, state=state)
    again.step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    assert our_taints(fake) == [(PREFIX + "disk", "FakeDiskFull", "NoSchedule")]
    creates = [r.status for r in fake.log(verbs=("create",)) if r.path.endswith("/leases")]
    assert creates == [201, 403], "quota admission refuses even our own name; the GET tells it is ours"


def test_the_lease_is_owned_by_the_node(fake: FakeApiServer, tmp_path: Any) -> None:
    clock = Clock()
    make_reconciler(fake, str(tmp_path), settings(), clock=clock).step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    (lease,) = fake.objects("coordination.k8s.io", "leases", BUDGET_NS)
    (owner,) = lease["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", NODE, fake.node(NODE)["metadata"]["uid"])
    fake.cluster.delete(("", "nodes", "", NODE))
    assert leases(fake) == [], "deleting the node frees the slot (garbage collection)"


def test_a_waiting_agent_reads_the_quota_once_while_creates_say_it_is_full(fake: FakeApiServer, tmp_path: Any) -> None:
    """403 "exceeded quota" names the quota that caps Leases: proof enough that it is there. A node waiting for
    hours costs one create per retry, not a GET of the quota every resync interval too (7,500 nodes wait at once)."""
    fake.set_quota(BUDGET_NS, QUOTA, 0)
    clock, cfg = Clock(), budget_settings(retry=60)
    budget = Budget(make_api(fake, str(tmp_path), cfg, clock), cfg.budget, NODE, held=False, recheck=cfg.resync_interval,
                    rng=random.Random(1))
    uid, tries, end = fake.node(NODE)["metadata"]["uid"], 0, clock.t + 5 * cfg.resync_interval
    while clock.t < end:
        assert not budget.ensure(clock.t, uid) and budget.state == "exhausted"
        tries += 1
        clock.t = budget.retry_at
    reads = [(r.verb, r.path.split("/namespaces/")[1].split("/")[1], r.status) for r in fake.log(verbs=("get", "create"))]
    assert reads.count(("get", "resourcequotas", 200)) == 1, reads
    assert reads.count(("create", "leases", 403)) == tries > 7, "every retry is one create of the Lease"
    assert reads.count(("get", "leases", 404)) == 1, "the first refusal asks whether the Lease is ours; later ones know"
    fake.cluster.delete(("", "resourcequotas", BUDGET_NS, QUOTA))
    clock.t += cfg.resync_interval  # no refusal seen for a whole interval: the quota is read again
    assert not budget.ensure(clock.t, uid) and budget.state == "missing"
    assert leases(fake) == []
