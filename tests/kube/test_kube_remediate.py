"""KubeRemediation, the ladder's Kubernetes side: the disruption budget (N agents, B slots),
retire (condition, label, event), and what it reports."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from typing import Any

import pytest

from agent.kube.api import ApiError, Wait
from agent.kube.remediate import KubeRemediation, own_namespace
from agent.kube.settings import KubernetesSection
from fakeapi import FakeApiServer
from kube_support import BUDGET_NS, NODE, QUOTA, Clock, fake, make_api, settings, wait_for  # noqa: F401 - fixture

DISRUPTION_NS = "node-health-disruption"
DISRUPTION_QUOTA = "node-health-disruption-budget"


def remediation_settings(retry: float = 0.2) -> KubernetesSection:
    cfg = settings()
    drain = dataclasses.replace(cfg.drain, poll_interval=0.05, retry_interval=0.05, retry_max=0.2, qps=1000.0, burst=1000)
    budget = dataclasses.replace(cfg.disruption_budget, retry_interval=retry, qps=1000.0, burst=1000)
    writes = dataclasses.replace(cfg.remediation_writes, qps=1000.0, burst=1000)
    return dataclasses.replace(cfg, drain=drain, disruption_budget=budget, remediation_writes=writes)


def remediation(fake: FakeApiServer, tmp: Any, node: str = NODE, cfg: KubernetesSection | None = None,
                clock: Any = time.monotonic) -> KubeRemediation:
    cfg = cfg or remediation_settings()
    api = make_api(fake, str(tmp), cfg, clock)
    uid = fake.node(node)["metadata"]["uid"]
    return KubeRemediation(api, node, uid, cfg, namespace="node-health", rng=random.Random(node))


def test_n_agents_with_every_node_faulty_never_disrupt_more_than_b(fake: FakeApiServer, tmp_path: Any) -> None:
    n, b = 10, 3
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, b)
    nodes = [f"node-{i:02d}" for i in range(n)]
    for name in nodes:
        fake.add_node(name)
        fake.add_pod("team-a", f"{name}-job", name, owner=("ReplicaSet", name), stop_after=0.05)
    agents = [remediation(fake, tmp_path, name) for name in nodes]
    handled: list[str] = []
    errors: list[BaseException] = []

    def agent(rem: KubeRemediation) -> None:
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if rem.claim_slot(time.monotonic()):
                        break
                except (Wait, ApiError):
                    pass
                time.sleep(0.02)
            else:
                raise AssertionError(f"{rem.node} never got a slot")
            while not rem.drain(time.monotonic()).done:
                time.sleep(0.02)
            time.sleep(0.1)  # the "reboot"
            handled.append(rem.node)
            rem.release_slot(time.monotonic())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    assert sorted(handled) == nodes, "all eventually handled"
    assert fake.leases_held_peak(DISRUPTION_NS) == b, "never more than B at once, and the budget was used"
    assert not fake.objects("coordination.k8s.io", "leases", DISRUPTION_NS), "every slot released"
    assert not [p for p in fake.pods() if p["spec"]["nodeName"] in nodes], "every node drained"
    assert not fake.events(), "waiting is the ladder's one finding and event (DisruptionSlotWaiting), not this side's"


def test_no_slot_is_said_once_by_the_ladder_not_here(fake: FakeApiServer, tmp_path: Any) -> None:
    """The Kubernetes side only says why (slot_wait): the ladder's DisruptionSlotWaiting is the one
    finding, event and metric of a wait (issue 12: not two findings for one wait)."""
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    fake.add_node("holder")
    holder, waiter = remediation(fake, tmp_path, "holder"), remediation(fake, tmp_path)
    assert holder.claim_slot(time.monotonic()) and holder.slot_wait() == ""
    assert not waiter.claim_slot(time.monotonic())
    assert "held by other nodes" in waiter.slot_wait() and DISRUPTION_NS in waiter.slot_wait()
    assert waiter.findings() == () and fake.events() == []
    assert not [s for s in waiter.samples() if "disruption_budget" in s.name]
    holder.release_slot(time.monotonic())
    wait_for(lambda: waiter.claim_slot(time.monotonic()), timeout=10)  # at its next retry
    assert waiter.slot_wait() == ""


def test_the_disruption_budget_is_not_the_taint_budget(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.set_quota(BUDGET_NS, QUOTA, 0)  # no taint slot left anywhere
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    rem = remediation(fake, tmp_path)
    assert rem.claim_slot(time.monotonic())
    (lease,) = fake.objects("coordination.k8s.io", "leases", DISRUPTION_NS)
    assert lease["metadata"]["name"] == NODE
    assert lease["metadata"]["ownerReferences"][0]["uid"] == fake.node(NODE)["metadata"]["uid"]


def test_a_missing_quota_fails_closed(fake: FakeApiServer, tmp_path: Any) -> None:
    rem = remediation(fake, tmp_path)
    assert not rem.claim_slot(time.monotonic())
    assert f"no ResourceQuota {DISRUPTION_NS}/{DISRUPTION_QUOTA}" in rem.slot_wait() and rem.findings() == ()
    assert not fake.objects("coordination.k8s.io", "leases", DISRUPTION_NS)


def test_a_restarted_agent_finds_its_own_slot_with_a_full_quota(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    assert remediation(fake, tmp_path).claim_slot(time.monotonic())
    again = remediation(fake, tmp_path)  # a new process: nothing in memory
    assert again.claim_slot(time.monotonic()), "403 exceeded quota, then a GET finds the Lease is ours"


def test_retire_sets_the_condition_the_label_and_an_event_and_returning_undoes_them(
        fake: FakeApiServer, tmp_path: Any) -> None:
    fake.edit_node(NODE, lambda n: n["metadata"]["labels"].update({"team": "ml"}))
    rem = remediation(fake, tmp_path)
    rem.set_retired(True, "Xid79 came back after 2 reboots in 7 days")
    node = fake.node(NODE)
    assert node["metadata"]["labels"] == {"kubernetes.io/hostname": NODE, "team": "ml", "node-health-agent/retired": "true"}
    cond = {c["type"]: c for c in node["status"]["conditions"]}["NodeHealthNeedsHardwareRepair"]
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "True", "RepeatedFailures", "Xid79 came back after 2 reboots in 7 days")
    assert {c["type"] for c in node["status"]["conditions"]} == {"Ready", "NodeHealthNeedsHardwareRepair"}
    (ev,) = fake.events()
    assert (ev["type"], ev["reason"], ev["action"], ev["note"]) == (
        "Warning", "NodeRetired", "Remediate", "Xid79 came back after 2 reboots in 7 days")
    patches = [r for r in fake.writes() if r.path == f"/api/v1/nodes/{NODE}"]
    assert patches[0].body == {"metadata": {"labels": {"node-health-agent/retired": "true"}}}, "the label alone"
    rem.set_retired(False, "repaired: RMA ticket 1234 closed")
    node = fake.node(NODE)
    assert "node-health-agent/retired" not in node["metadata"]["labels"] and node["metadata"]["labels"]["team"] == "ml"
    assert {c["type"]: c for c in node["status"]["conditions"]}["NodeHealthNeedsHardwareRepair"]["status"] == "False"


def test_a_finished_drain_starts_anew_and_reports_its_metrics(fake: FakeApiServer, tmp_path: Any) -> None:
    clock = Clock()
    fake.clock = clock
    fake.workloads.clock = clock
    fake.add_pod("team-a", "a", NODE)
    rem = remediation(fake, tmp_path, clock=clock)
    assert rem.plan_drain() == ["team-a/a"]
    assert rem.drain(clock.t).evicted == 1
    clock.t += 1
    assert rem.drain(clock.t).done
    fake.add_pod("team-a", "b", NODE)
    clock.t += 10
    p = rem.drain(clock.t)
    assert p.evicted == 1 and not p.done, "a new drain: its own count"
    samples = {(s.name, s.labels): s.value for s in rem.samples()}
    assert samples[("node_health_kube_evictions_total", (("result", "evicted"),))] == 2
    assert samples[("node_health_kube_drain_pods_remaining", ())] == 1


@pytest.mark.parametrize("env, expected", [({"POD_NAMESPACE": "agents"}, "agents"), ({}, "from-file")])
def test_own_namespace(tmp_path: Any, env: dict[str, str], expected: str) -> None:
    path = tmp_path / "namespace"
    path.write_text("from-file\n")
    assert own_namespace(env, str(path)) == expected
    assert own_namespace({}, str(tmp_path / "absent")) == ""


# ---------------------------------------------------------------- slots expire (issue 12: a dead holder)


class Wall:
    """The agents' clock, moved by the test: their wall clock (renewTime) and, by default, their monotonic one
    (the renewals and the expiry)."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


class Offset:
    """A clock `by` seconds apart from `base` (a skewed wall clock, or a monotonic clock of another origin)."""

    def __init__(self, base: Wall, by: float) -> None:
        self.base, self.by = base, by

    def __call__(self) -> float:
        return self.base.t + self.by


def expiring(fake: FakeApiServer, tmp: Any, node: str, wall: Any, expiry: float = 3600.0, mono: Any = None) -> KubeRemediation:
    cfg = remediation_settings(retry=5.0)
    cfg = dataclasses.replace(cfg, disruption_budget=dataclasses.replace(cfg.disruption_budget, expiry=expiry))
    if not any(n["metadata"]["name"] == node for n in fake.objects("", "nodes")):
        fake.add_node(node)
    api = make_api(fake, str(tmp), cfg)
    return KubeRemediation(api, node, fake.node(node)["metadata"]["uid"], cfg, namespace="node-health",
                           rng=random.Random(node), wall=wall, mono=mono or wall)


def lease_names(fake: FakeApiServer) -> list[str]:
    return sorted(o["metadata"]["name"] for o in fake.objects("coordination.k8s.io", "leases", DISRUPTION_NS))


def lease_deletes(fake: FakeApiServer, name: str) -> int:
    return sum(1 for r in fake.log(verbs=("delete",)) if r.path.endswith(f"/{DISRUPTION_NS}/leases/{name}") and r.status < 300)


def test_an_expired_holder_is_reclaimed_and_a_live_one_never(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 2)
    wall = Wall()
    dead, live, waiter = (expiring(fake, tmp_path, n, wall) for n in ("dead", "live", "waiter"))
    start = wall.t
    assert dead.claim_slot(wall.t) and live.claim_slot(wall.t)
    (spec,) = [o["spec"] for o in fake.objects("coordination.k8s.io", "leases", DISRUPTION_NS) if o["metadata"]["name"] == "dead"]
    assert spec["leaseDurationSeconds"] == 3600 and spec["renewTime"] == spec["acquireTime"]
    got_at = None
    for _ in range(12):  # two hours in steps of 10 minutes; "dead" never renews again
        wall.t += 600
        assert live.renew_slot(wall.t), "a live holder keeps its slot"
        if got_at is None and waiter.claim_slot(wall.t):
            got_at = wall.t - start
    assert got_at == 4200, "1 h after the waiter first saw it (its first try, at 600 s), at that try"
    assert lease_names(fake) == ["live", "waiter"] and waiter.budget.reclaimed == 1
    assert lease_deletes(fake, "live") == 0 and lease_deletes(fake, "dead") == 1
    assert not dead.renew_slot(wall.t), "the dead holder, back, learns that its slot is gone"
    assert not dead.claim_slot(wall.t), "and waits for one like any other node"
    assert fake.leases_held_peak(DISRUPTION_NS) == 2


@pytest.mark.parametrize("holder_skew, waiter_skew", [(-7200.0, 0.0), (0.0, 7200.0), (-7200.0, 7200.0), (7200.0, -7200.0)])
def test_hours_of_clock_skew_never_put_two_holders_in_one_slot(
    fake: FakeApiServer, tmp_path: Any, holder_skew: float, waiter_skew: float,
) -> None:
    """Budget 1; the holder's wall clock 2 h behind (or ahead) and the waiter's 2 h ahead (or behind), their
    monotonic clocks of different origins. The waiter never deletes the live holder's Lease, however old its
    renewTime looks by the waiter's wall clock; once the holder stops renewing, the waiter takes the slot
    one expiry after it saw the Lease last change, by its own clock, whatever the skew."""
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    t = Wall()
    holder = expiring(fake, tmp_path, "holder", Offset(t, holder_skew), mono=Offset(t, -1.7e9))
    waiter = expiring(fake, tmp_path, "waiter", Offset(t, waiter_skew), mono=Offset(t, -1.8e9 + 12345.0))
    assert holder.claim_slot(t.t)
    for _ in range(36):  # six hours in steps of 10 minutes, the holder alive and renewing
        t.t += 600
        assert holder.renew_slot(t.t), "a live holder keeps its slot"
        assert not waiter.claim_slot(t.t), "never a second holder in the one slot"
        assert lease_names(fake) == ["holder"]
    assert waiter.budget.reclaimed == 0 and lease_deletes(fake, "holder") == 0
    assert fake.leases_held_peak(DISRUPTION_NS) == 1
    died = t.t  # the holder dies: its Lease stops changing
    got_at = None
    for _ in range(18):
        t.t += 600
        if waiter.claim_slot(t.t):
            got_at = t.t - died
            break
    # Not before the expiry; at most two of the waiter's retry waits (≤ resync_interval + 20 %) after it:
    # one until it sees the last change, one after the expiry.
    assert got_at is not None and 3600 <= got_at <= 3600 + 2 * 1200 * 1.2, got_at
    assert lease_names(fake) == ["waiter"] and waiter.budget.reclaimed == 1


def test_a_lease_renewed_since_it_was_read_is_not_deleted(fake: FakeApiServer, tmp_path: Any) -> None:
    """The delete carries the resourceVersion that was read: a holder that renewed in between keeps its slot."""
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    wall = Wall()
    slow, waiter = expiring(fake, tmp_path, "slow", wall), expiring(fake, tmp_path, "waiter", wall)
    assert slow.claim_slot(wall.t)
    assert not waiter.claim_slot(wall.t)  # the waiter sees the Lease for the first time
    wall.t += 3601

    def renewed() -> None:  # the holder renews between the waiter's LIST and its DELETE
        key = ("coordination.k8s.io", "leases", DISRUPTION_NS, "slow")
        lease = fake.cluster.get(key)
        assert lease is not None
        lease["spec"]["renewTime"] = "2027-01-15T09:00:00.500000Z"  # a later renewal (not the claim's own time)
        fake.cluster.put(key, lease)

    fake.before(lambda r: r.method == "DELETE" and r.path.endswith("/leases/slow"), renewed)
    assert not waiter.claim_slot(wall.t)
    assert lease_names(fake) == ["slow"] and waiter.budget.reclaimed == 0
    assert any(r.status == 409 and r.path.endswith("/leases/slow") for r in fake.log(verbs=("delete",)))


def test_a_lagging_watch_cache_never_costs_a_live_holder_its_slot(fake: FakeApiServer, tmp_path: Any) -> None:
    """The waiter lists Leases from the watch cache (resourceVersion=0); a cache that still shows the holder's
    old renewTime leads to a DELETE with the old resourceVersion: 409, the renewed holder keeps its slot."""
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    wall = Wall()
    holder, waiter = expiring(fake, tmp_path, "holder", wall), expiring(fake, tmp_path, "waiter", wall)
    assert holder.claim_slot(wall.t)
    assert not waiter.claim_slot(wall.t)  # the waiter sees the Lease for the first time
    fake.cluster.freeze_cache()  # the cache stops here: it keeps the claim's renewTime
    wall.t += 3000
    assert holder.renew_slot(wall.t)  # renewed in etcd, not in the cache
    wall.t += 1000  # past the expiry by the cached renewTime, well within it by the real one
    assert not waiter.claim_slot(wall.t)
    assert lease_names(fake) == ["holder"] and waiter.budget.reclaimed == 0
    lists = [r for r in fake.log(verbs=("list",)) if r.path.endswith(f"/{DISRUPTION_NS}/leases")]
    assert lists and all(r.query.get("resourceVersion") == "0" for r in lists)
    assert any(r.status == 409 and r.path.endswith("/leases/holder") for r in fake.log(verbs=("delete",)))
    assert holder.renew_slot(wall.t + 600)


def test_many_agents_some_dying_with_a_slot_never_more_than_b_and_all_handled(fake: FakeApiServer, tmp_path: Any) -> None:
    """Virtual time in steps of 5 minutes: each live agent claims, holds its slot 30 minutes (renewing),
    releases; three agents die holding a slot. The dead slots are reclaimed after the expiry, every live
    node is handled, no live holder ever loses its slot, and the fake server's log never shows more than
    B Leases at once."""
    n, b = 9, 3
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, b)
    wall = Wall()
    names = [f"node-{i}" for i in range(n)]
    dying = {"node-0", "node-1", "node-4"}
    agents = {name: expiring(fake, tmp_path, name, wall) for name in names}
    held_since: dict[str, float] = {}
    done: set[str] = set()
    for _ in range(60):  # 5 hours
        wall.t += 300
        for name, rem in agents.items():
            if name in done:
                continue
            if name in held_since:
                if name in dying:
                    continue  # dead: never renews, never releases
                assert rem.renew_slot(wall.t), f"{name} lost its slot while alive"
                if wall.t - held_since[name] >= 1800:
                    rem.release_slot(wall.t)
                    done.add(name)
            elif rem.claim_slot(wall.t):
                held_since[name] = wall.t
        if done == set(names) - dying:
            break
    assert done == set(names) - dying, f"not handled: {sorted(set(names) - dying - done)}"
    assert fake.leases_held_peak(DISRUPTION_NS) <= b
    left = lease_names(fake)  # a dead slot nobody needed any more stays until someone does
    assert set(left) <= dying and sum(rem.budget.reclaimed for rem in agents.values()) + len(left) == len(dying)
    assert sum(rem.budget.reclaimed for rem in agents.values()) >= 1
    for name in done:
        assert lease_deletes(fake, name) == 1, f"{name}'s Lease deleted only by its own release"


def test_a_409_conflict_on_the_create_is_no_slot(fake: FakeApiServer, tmp_path: Any) -> None:
    """Quota admission answers a Lease create that raced another one with 409 Conflict "Operation cannot be
    fulfilled on resourcequotas" (kubernetes#67761: a mass event is such a race): nothing was created, so it is
    no slot; only 409 AlreadyExists (our own Lease, from before a restart) is. Found by test_cluster_stateful."""
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    wall = Wall()
    holder, waiter = expiring(fake, tmp_path, "holder", wall), expiring(fake, tmp_path, "waiter", wall)
    assert holder.claim_slot(wall.t)
    holder.release_slot(wall.t)
    fake.inject(409, method="POST", path=r"/leases$")
    with pytest.raises(ApiError) as err:
        waiter.claim_slot(wall.t)
    assert err.value.status == 409 and not waiter.budget.held and lease_names(fake) == []
    assert waiter.claim_slot(wall.t) and lease_names(fake) == ["waiter"], "the next try creates it"
    again = expiring(fake, tmp_path, "waiter", wall)  # restarted: 409 AlreadyExists is its own Lease
    assert again.claim_slot(wall.t) and again.budget.held


def test_a_deleted_node_frees_its_slot_at_once(fake: FakeApiServer, tmp_path: Any) -> None:
    """The Lease is owned by the Node: the garbage collector frees the slot of a deleted node (no expiry needed)."""
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    wall = Wall()
    gone, waiter = expiring(fake, tmp_path, "gone", wall), expiring(fake, tmp_path, "waiter", wall)
    assert gone.claim_slot(wall.t) and not waiter.claim_slot(wall.t)
    fake.cluster.delete(("", "nodes", "", "gone"))
    wall.t += 60
    assert waiter.claim_slot(wall.t) and lease_names(fake) == ["waiter"] and waiter.budget.reclaimed == 0


# ---------------------------------------------------------------- own request budgets (issue 23)


def test_a_drain_that_used_up_its_bucket_never_delays_the_slot_release_or_the_retire_writes(
    fake: FakeApiServer, tmp_path: Any,
) -> None:
    """Shipped rates (settings() raises only the taint writer's): a drain of 30 pods takes every token of its
    bucket and is told to wait (client-side: no request sent); the disruption budget's Lease DELETE, the retire
    writes and their event go out at once all the same, each through its own bucket."""
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    shipped = KubernetesSection()
    cfg = dataclasses.replace(settings(), drain=shipped.drain, disruption_budget=shipped.disruption_budget,
                              remediation_writes=shipped.remediation_writes)
    for i in range(30):
        fake.add_pod("team-a", f"job-{i}", NODE, owner=("ReplicaSet", f"job-{i}"))
    clock = Clock()
    rem = remediation(fake, tmp_path, cfg=cfg, clock=clock)
    assert rem.claim_slot(clock())
    with pytest.raises(Wait):
        for _ in range(100):
            rem.drain(clock())
    assert rem.api.gate.admit(clock()) > 0, "the drain's bucket is empty"
    before = len(fake.log())
    rem.release_slot(clock())  # no Wait: its own bucket
    rem.set_retired(True, "two reboots did not cure XidCritical79")
    sent = fake.log()[before:]
    assert [(r.method, r.path.rsplit("/", 2)[-2:]) for r in sent if r.method == "DELETE"] == [("DELETE", ["leases", NODE])]
    assert not lease_names(fake)
    assert sum(1 for r in sent if r.method == "PATCH") == 2 and fake.events()


def test_a_lease_found_at_a_restart_is_renewed_before_it_counts_as_held(fake: FakeApiServer, tmp_path: Any) -> None:
    """An agent back after its Lease went unrenewed past the expiry: a waiter that watched it unchanged for the
    expiry may be deleting it right now. The agent renews it before it says "held" (the waiter's delete,
    preconditioned on the resourceVersion it saw, then fails); found deleted meanwhile, it holds no slot."""
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    wall = Wall()
    assert expiring(fake, tmp_path, "holder", wall).claim_slot(wall.t)
    (before,) = [o for o in fake.objects("coordination.k8s.io", "leases", DISRUPTION_NS)]
    wall.t += 7200  # the agent was away two expiries
    back = expiring(fake, tmp_path, "holder", wall)  # a new process: nothing in memory
    assert back.claim_slot(wall.t)
    (after,) = [o for o in fake.objects("coordination.k8s.io", "leases", DISRUPTION_NS)]
    assert after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
    assert after["spec"]["renewTime"] != before["spec"]["renewTime"], "renewed before held"
    wall.t += 7200
    gone = expiring(fake, tmp_path, "holder", wall)
    # a waiter's delete lands between the agent finding its Lease and renewing it
    fake.before(lambda r: r.method == "PATCH" and r.path.endswith("/leases/holder"),
                lambda: fake.cluster.delete(("coordination.k8s.io", "leases", DISRUPTION_NS, "holder")))
    assert not gone.claim_slot(wall.t), "deleted as it was found: no slot"
    assert gone.budget.state != "held" and lease_names(fake) == []
