"""The Drainer against the fake API server, through the real client, in the test's own time.

The fake server's timeline (every eviction, termination, deletion, new and
Ready pod, at the fake clock) is the witness: an application behind a
PodDisruptionBudget never loses more pods at once than its budget allows.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from typing import Any

import pytest

from agent.kube.api import Wait
from agent.kube.drain import Drainer, DrainProgress
from agent.kube.settings import DrainSection
from fakeapi import FakeApiServer
from kube_support import NODE, Clock, make_api, settings

APP = "team-a"
AGENT_NS = "node-health"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeApiServer]:
    f = FakeApiServer(clock=clock, wall=lambda: 1.8e9 + clock.t)
    f.start()
    f.add_node(NODE)
    yield f
    f.stop()


def drainer(fake: FakeApiServer, tmp_path: Any, clock: Clock, **kw: Any) -> Drainer:
    cfg = dataclasses.replace(DrainSection(), **kw)
    api = make_api(fake, str(tmp_path), settings(), clock)
    return Drainer(api, NODE, cfg, own_namespace=AGENT_NS, rng=random.Random(3))


def run(d: Drainer, clock: Clock, *, until: float, only: frozenset[str] | None = None, dt: float = 1.0) -> list[DrainProgress]:
    """Step once a second (as the ladder's tick would) until done or `until` fake seconds passed."""
    out: list[DrainProgress] = []
    end = clock.t + until
    while clock.t < end:
        try:
            out.append(d.step(clock.t, only))
        except Wait:
            pass
        if out and out[-1].done:
            break
        clock.t += dt
    return out


def bystanders(fake: FakeApiServer) -> list[str]:
    """Pods a drain must leave alone."""
    fake.add_pod(AGENT_NS, "node-health-agent-x", NODE, owner=("DaemonSet", "node-health-agent"))
    fake.add_pod("monitoring", "exporter-x", NODE, owner=("DaemonSet", "exporter"))
    fake.add_pod("kube-system", "coredns-1", NODE, owner=("ReplicaSet", "coredns"))
    fake.add_pod("kube-system", f"etcd-{NODE}", NODE, mirror=True)
    fake.add_pod(APP, "job-done", NODE, phase="Succeeded")
    return sorted(["node-health-agent-x", "exporter-x", "coredns-1", f"etcd-{NODE}", "job-done"])


def unavailable_peak(fake: FakeApiServer, ns: str, prefix: str, replicas: int) -> int:
    """Replay the fake's timeline: the most pods of the app not available (Ready, not terminating) at once."""
    available = {f"{prefix}-{i}" for i in range(replicas)}
    peak = 0
    for _, what, pns, name in fake.workloads.timeline:
        if pns != ns or not name.startswith(prefix):
            continue
        if what.startswith("evicted") or what in ("terminating", "deleted"):
            available.discard(name)
        elif what == "ready":
            available.add(name)
        peak = max(peak, replicas - len(available))
    return peak


def test_two_pods_behind_max_unavailable_1_go_one_at_a_time(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    kept = bystanders(fake)
    fake.add_replicaset(APP, "web", 2, NODE, labels={"app": "web"}, ready_after=20)
    fake.add_pdb(APP, "web", {"app": "web"}, max_unavailable=1)
    d = drainer(fake, tmp_path, clock)
    assert d.plan() == [f"{APP}/web-0", f"{APP}/web-1"]
    steps = run(d, clock, until=600)
    assert steps[-1].done and steps[-1].evicted == 2 and not steps[-1].timed_out
    assert any(s.blocked == (f"{APP}/web-1",) for s in steps), "the second eviction waited for the budget"
    assert unavailable_peak(fake, APP, "web", 2) == 1, "never both gone at once"
    evicted = [(t, name) for t, what, _, name in fake.workloads.timeline if what.startswith("evicted")]
    assert [n for _, n in evicted] == ["web-0", "web-1"] and evicted[1][0] - evicted[0][0] >= 20
    assert sorted(p["metadata"]["name"] for p in fake.pods(NODE)) == kept
    refused = [r for r in fake.log(verbs=("create",)) if r.path.endswith("/eviction") and r.status == 429]
    assert 1 <= len(refused) <= 5, "retried with backoff, not hammered"
    assert d.api.gate.backing_off_until == 0, "a budget's 429 does not hold back the agent's other requests"
    lists = [r for r in fake.log(verbs=("list",)) if r.path == "/api/v1/pods"]
    assert lists and all(r.query["fieldSelector"] == f"spec.nodeName={NODE}" for r in lists)


def test_one_refusal_holds_back_every_pod_of_that_budget(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    fake.add_replicaset(APP, "api", 8, NODE, labels={"app": "api"}, ready_after=10)
    fake.add_pdb(APP, "api", {"app": "api"}, max_unavailable=1)
    d = drainer(fake, tmp_path, clock)
    steps = run(d, clock, until=1200)
    assert steps[-1].done and steps[-1].evicted == 8
    assert unavailable_peak(fake, APP, "api", 8) == 1
    refused = [r for r in fake.log(verbs=("create",)) if r.path.endswith("/eviction") and r.status == 429]
    # The first pass tries each pod once (7 refusals); afterwards the budget "api" is retried as one, not per pod.
    assert len(refused) <= 7 + 2 * 7, len(refused)
    lists = [r for r in fake.log(verbs=("list",)) if r.path == "/api/v1/pods"]
    assert len(lists) < len(steps) / 2, "no list while every pod only waits for its budget's backoff"


def test_wait_policy_keeps_the_pod_and_reports_the_timeout(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    fake.add_pod(APP, "solo", NODE, labels={"app": "solo"}, owner=("ReplicaSet", "solo"))
    fake.add_pdb(APP, "solo", {"app": "solo"}, min_available=1)
    d = drainer(fake, tmp_path, clock, timeout=120.0)
    steps = run(d, clock, until=300)
    last = steps[-1]
    assert not last.done and last.timed_out and last.remaining == (f"{APP}/solo",) and last.blocked == (f"{APP}/solo",)
    assert not any(s.timed_out for s in steps[:120]) and all(s.timed_out for s in steps[121:]), "one step a second"
    assert [p["metadata"]["name"] for p in fake.pods(NODE)] == ["solo"]
    assert not fake.log(verbs=("delete",)), "wait: never deleted"


def test_delete_policy_deletes_with_the_pods_own_grace_at_the_timeout(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    fake.add_pod(APP, "solo", NODE, labels={"app": "solo"}, owner=("ReplicaSet", "solo"), grace=45, stop_after=10)
    fake.add_pod("batch", "other", NODE, labels={"app": "other"}, owner=("ReplicaSet", "other"))
    for ns, name in ((APP, "solo"), ("batch", "other")):
        fake.add_pdb(ns, name, {"app": name}, min_available=1)
    d = drainer(fake, tmp_path, clock, timeout=120.0, namespace_on_timeout={APP: "delete"})
    steps = run(d, clock, until=400)
    deletes = fake.log(verbs=("delete",))
    assert len(deletes) == 1 and deletes[0].path == f"/api/v1/namespaces/{APP}/pods/solo"
    assert deletes[0].body["gracePeriodSeconds"] == 45 and deletes[0].t >= 1000 + 120
    assert [p["metadata"]["name"] for p in fake.pods(NODE)] == ["other"], "batch waits (the default policy)"
    assert steps[-1].remaining == ("batch/other",) and steps[-1].timed_out


def test_partial_drain_evicts_only_the_selected_pods(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    gpu0 = fake.add_pod(APP, "on-gpu0", NODE, owner=("ReplicaSet", "a"))
    fake.add_pod(APP, "on-gpu1", NODE, owner=("ReplicaSet", "b"))
    only = frozenset({gpu0["metadata"]["uid"]})
    d = drainer(fake, tmp_path, clock)
    assert d.plan(only) == [f"{APP}/on-gpu0"]
    steps = run(d, clock, until=60, only=only)
    assert steps[-1].done and steps[-1].evicted == 1
    assert [p["metadata"]["name"] for p in fake.pods(NODE)] == ["on-gpu1"]


def test_a_pod_stuck_past_its_grace_period_stops_holding_the_drain(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    fake.add_pod(APP, "stuck", NODE, grace=30, stuck=True)
    d = drainer(fake, tmp_path, clock)
    steps = run(d, clock, until=300)
    assert steps[-1].done and steps[-1].evicted == 1
    done_after = len(steps)
    assert 30 < done_after <= 30 + 30 + 10, "waited for the grace period (and the slack), not forever"
    assert [p["metadata"]["name"] for p in fake.pods(NODE)] == ["stuck"], "still listed: the kubelet never stopped it"
    assert len([r for r in fake.log(verbs=("create",)) if r.path.endswith("/eviction")]) == 1, "evicted once"


def test_a_pod_under_two_budgets_is_blocked_not_retried_hard(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    fake.add_pod(APP, "a", NODE, labels={"app": "a", "tier": "x"})
    fake.add_pdb(APP, "by-app", {"app": "a"}, min_available=0)
    fake.add_pdb(APP, "by-tier", {"tier": "x"}, min_available=0)
    d = drainer(fake, tmp_path, clock)
    steps = run(d, clock, until=200)
    assert steps[-1].blocked == (f"{APP}/a",) and not steps[-1].done
    attempts = [r for r in fake.log(verbs=("create",)) if r.path.endswith("/eviction")]
    assert all(r.status == 500 for r in attempts) and len(attempts) <= 5, "retry_max apart"
    assert d.api.gate.backing_off_until == 0
    assert d.results["blocked"] == len(attempts)


def test_gone_pods_count_as_done(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    fake.add_pod(APP, "a", NODE)
    d = drainer(fake, tmp_path, clock)
    d.step(clock.t, frozenset({"no-such-uid"}))  # nothing selected: done at once
    d.reset()
    fake.before(lambda r: r.path.endswith("/eviction"), lambda: fake.cluster.delete(("", "pods", APP, "a")))
    progress = d.step(clock.t)
    assert d.results["gone"] == 1 and progress.done and progress.evicted == 0


def _drainer_for(fake: FakeApiServer, tmp_path: Any, clock: Clock, node: str, seed: int) -> Drainer:
    api = make_api(fake, str(tmp_path), settings(), clock)
    return Drainer(api, node, DrainSection(), own_namespace=AGENT_NS, rng=random.Random(seed))


def test_a_409_is_not_gone_two_replicas_on_two_faulty_nodes(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    """Issue 23 item 4: kube-apiserver answers 409 when concurrent evictions keep updating one PDB. Two nodes drain
    at once, each with one replica of a 2-replica app under maxUnavailable 1; node B's first eviction races
    node A's (which spends the budget) and is answered 409. Each node "reboots" (its pods die with it) when its drain says done: the app
    never has both replicas down."""
    other = "gpu-node-2"
    fake.add_node(other)
    fake.add_replicaset(APP, "web", 2, NODE, labels={"app": "web"}, ready_after=30)
    fake.edit_pod(APP, "web-1", lambda p: p["spec"].__setitem__("nodeName", other))
    fake.add_pdb(APP, "web", {"app": "web"}, max_unavailable=1)
    a, b = _drainer_for(fake, tmp_path, clock, NODE, 1), _drainer_for(fake, tmp_path, clock, other, 2)
    fake.before(lambda r: r.path.endswith("/web-1/eviction"), lambda: setattr(fake.workloads, "pdb_conflicts", 1))
    rebooted: dict[str, float] = {}
    seen: list[DrainProgress] = []
    for _ in range(600):
        for node, d in ((NODE, a), (other, b)):  # node B's eviction races node A's and meets the conflict
            if node in rebooted:
                continue
            try:
                p = d.step(clock.t)
            except Wait:
                continue
            seen.append(p)
            if p.done:  # the ladder would reboot now: whatever is still on the node goes down with it
                rebooted[node] = clock.t
                for pod in fake.pods(node):
                    fake.cluster.delete(("", "pods", APP, pod["metadata"]["name"]))
                    fake.workloads.note("deleted", APP, pod["metadata"]["name"])
        if len(rebooted) == 2:
            break
        clock.t += 1.0
    conflicts = [r for r in fake.log(verbs=("create",)) if r.path.endswith("/web-1/eviction") and r.status == 409]
    assert len(conflicts) == 1, "the race happened"
    assert unavailable_peak(fake, APP, "web", 2) == 1, "never both replicas down"
    assert b.results["conflict"] == 1 and b.results["gone"] == 0, "a 409 is not counted as gone"
    assert len(rebooted) == 2 and rebooted[other] > rebooted[NODE], "node B waited for the budget, then went"
    assert any(p.blocked == (f"{APP}/web-1",) and p.pdbs == {f"{APP}/web-1": f"{APP}/web"} for p in seen), "the refusing PDB is named"


def test_a_409_for_a_replaced_pod_is_gone_after_the_pod_is_read_again(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    """A failed UID precondition (a same-named pod took its place on another node) is gone, but only once the
    next read shows it: the drain counts a conflict, lists again and is done without a second eviction."""
    fake.add_pod(APP, "a", NODE)

    def replace_elsewhere() -> None:
        fake.cluster.delete(("", "pods", APP, "a"))
        fake.add_pod(APP, "a", "spare-node")  # same name, new UID, not on this node

    d = drainer(fake, tmp_path, clock)
    fake.before(lambda r: r.path.endswith("/eviction"), replace_elsewhere)
    first = d.step(clock.t)  # lists (the pod is there), evicts: 409 on the UID precondition
    assert not first.done and d.results["conflict"] == 1 and d.results["gone"] == 0
    steps = run(d, clock, until=60)
    assert steps[-1].done and steps[-1].evicted == 0
    assert len([r for r in fake.log(verbs=("create",)) if r.path.endswith("/eviction")]) == 1, "never evicted again"
    lists = [r for r in fake.log(verbs=("list",)) if r.path == "/api/v1/pods"]
    assert len(lists) == 2, "read again once, after the 409"


def test_a_pdb_that_never_allows_is_named_in_the_progress(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    fake.add_pod(APP, "db-0", NODE, labels={"app": "db"}, owner=("StatefulSet", "db"))
    fake.add_pdb(APP, "db", {"app": "db"}, max_unavailable=0)
    d = drainer(fake, tmp_path, clock, timeout=60.0)
    steps = run(d, clock, until=120)
    last = steps[-1]
    assert last.timed_out and not last.done
    assert last.remaining == last.blocked == (f"{APP}/db-0",) and last.pdbs == {f"{APP}/db-0": f"{APP}/db"}
    assert d.results["blocked"] >= 2 and d.results["gone"] == 0
