"""The reconciler against the fake API server: taints, conditions, events, conflicts, restarts."""

from __future__ import annotations

import time
from typing import Any


from agent.kube.settings import HysteresisSection
from fakeapi import FakeApiServer
from kube_support import (
    NODE, PREFIX, Clock, conditions, fake, finding, make_reconciler, our_taints, settings, snapshot,  # noqa: F401
)

SLOW = HysteresisSection(raise_cycles=3, raise_after=300, clear_cycles=3, clear_after=600)
TAINT = (PREFIX + "disk", "FakeDiskFull", "NoSchedule")
FOREIGN = [
    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"},
    {"key": "other.team/maintenance", "value": "yes", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"},
    {"key": PREFIX + "preflight", "effect": "NoSchedule"},
]


def is_patch_of_node(req: Any) -> bool:
    return req.method == "PATCH" and req.path == f"/api/v1/nodes/{NODE}"


def test_fault_taints_and_recovery_releases_after_hysteresis(fake: FakeApiServer, tmp_path: Any) -> None:
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock)
    rec.step(clock(), snapshot([], runs=1))
    assert conditions(fake)["NodeHealthDiskProblem"]["status"] == "False"
    rec.step(clock(), snapshot([finding("FakeDiskFull")], runs=2))
    assert our_taints(fake) == [TAINT]
    cond = conditions(fake)["NodeHealthDiskProblem"]
    assert (cond["status"], cond["reason"]) == ("True", "FakeDiskFull")
    assert [(e["type"], e["reason"]) for e in fake.events()] == [("Warning", "FakeDiskFull")]
    for runs in (3, 4):  # two clean runs: not yet released
        clock.t += 30
        rec.step(clock(), snapshot([], runs=runs))
        assert our_taints(fake) == [TAINT]
    clock.t += 30
    rec.step(clock(), snapshot([], runs=5))
    assert our_taints(fake) == []
    assert conditions(fake)["NodeHealthDiskProblem"]["status"] == "False"
    assert [e["reason"] for e in fake.events()] == ["FakeDiskFull", "FakeDiskFullCleared"]
    assert fake.objects("coordination.k8s.io", "leases") == [], "the budget slot is released"
    assert "Ready" in conditions(fake), "the kubelet's conditions are untouched"


def test_concurrent_writer_conflict_is_retried_and_both_taints_stay(fake: FakeApiServer, tmp_path: Any) -> None:
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(), clock=clock)
    rec.step(clock(), snapshot([], runs=1))  # reads the node once
    other = {"key": "other.team/drain", "effect": "NoSchedule"}
    fake.before(is_patch_of_node, lambda: fake.edit_node(NODE, lambda n: n["spec"].setdefault("taints", []).append(other)))
    start = time.monotonic()
    rec.step(clock(), snapshot([finding("FakeDiskFull")], runs=2))
    taints = fake.node(NODE)["spec"]["taints"]
    assert other in taints and our_taints(fake) == [TAINT]
    node_calls = [(r.verb, r.status) for r in fake.log(since=start) if r.path == f"/api/v1/nodes/{NODE}"]
    assert node_calls == [("patch", 409), ("get", 200), ("patch", 200)]
    assert rec.stats.conflicts == 1


def test_foreign_taints_are_never_touched(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.edit_node(NODE, lambda n: n["spec"].update(taints=[dict(t) for t in FOREIGN]))
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(), clock=clock)
    rec.step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    assert fake.node(NODE)["spec"]["taints"] == FOREIGN + [dict(zip(("key", "value", "effect"), TAINT))]
    rec.step(clock(), snapshot([], runs=2))
    assert fake.node(NODE)["spec"]["taints"] == FOREIGN


def test_restart_keeps_the_taint_and_sends_no_duplicate_event(fake: FakeApiServer, tmp_path: Any) -> None:
    clock = Clock()
    first = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock)
    first.step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    assert our_taints(fake) == [TAINT] and len(fake.events()) == 1
    del first  # killed: no shutdown path runs
    start = time.monotonic()
    again = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock)
    again.step(clock())  # woken before the store has published anything: it must not act
    not_run_yet = snapshot([], runs=0)
    for _ in range(5):  # the checks have not run since the restart: state is held
        clock.t += 60
        again.step(clock(), not_run_yet)
    clock.t += 30
    again.step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    assert our_taints(fake) == [TAINT]
    assert len(fake.events()) == 1, "no duplicate event after the restart"
    assert fake.writes(since=start) == [], "nothing to change: nothing written"


def test_unknown_never_changes_a_taint(fake: FakeApiServer, tmp_path: Any) -> None:
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(), clock=clock)
    rec.step(clock(), snapshot([finding("FakeProbeError", subject="/other")], runs=1))
    assert our_taints(fake) == [], "an unknown finding never adds"
    rec.step(clock(), snapshot([finding("FakeDiskFull")], runs=2))
    for runs in range(3, 10):  # the check now fails every run
        clock.t += 3600
        rec.step(clock(), snapshot([finding("FakeDiskFull")], runs=runs, failed=True))
        rec.step(clock(), snapshot([finding("FakeProbeError")], runs=runs))
    assert our_taints(fake) == [TAINT], "unknown never removes"


def test_drift_is_repaired_at_resync(fake: FakeApiServer, tmp_path: Any) -> None:
    clock = Clock()
    cfg = settings(resync_interval=600.0)
    rec = make_reconciler(fake, str(tmp_path), cfg, clock=clock)
    wake = rec.step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    assert 480 <= wake - clock() <= 720, "next wake: the jittered resync"
    fake.edit_node(NODE, lambda n: n["spec"].update(taints=[]))  # someone removed our taint
    clock.t = wake
    rec.step(clock())
    assert our_taints(fake) == [TAINT]


def test_stale_cache_read_is_caught_by_the_precondition(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.cluster.freeze_cache()  # resourceVersion=0 reads now lag behind
    fake.edit_node(NODE, lambda n: n["metadata"]["labels"].update(changed="yes"))
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(), clock=clock)
    rec.step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    assert our_taints(fake) == [TAINT] and fake.node(NODE)["metadata"]["labels"]["changed"] == "yes"
    assert [r.status for r in fake.log(verbs=("patch",)) if r.path.endswith(NODE)] == [409, 200]


def test_no_execute_taints_carry_time_added(fake: FakeApiServer, tmp_path: Any) -> None:
    import dataclasses
    from types import MappingProxyType

    cfg = settings()
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, overrides=MappingProxyType({"disk": "NoExecute"})))
    clock = Clock()
    make_reconciler(fake, str(tmp_path), cfg, clock=clock).step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    (taint,) = [t for t in fake.node(NODE)["spec"]["taints"] if t["key"].startswith(PREFIX)]
    assert taint["effect"] == "NoExecute" and taint["timeAdded"].endswith("Z")


def test_healthy_steady_state_writes_nothing(fake: FakeApiServer, tmp_path: Any) -> None:
    clock = Clock()
    cfg = settings(resync_interval=1200.0, hysteresis=SLOW)
    rec = make_reconciler(fake, str(tmp_path), cfg, clock=clock)
    rec.step(clock(), snapshot([], runs=1))  # start-up: the first condition write
    start = time.monotonic()
    wake = clock()
    for runs in range(2, 2 + 6 * 60 * 4):  # four hours of a check every 10 s
        clock.t += 10
        if clock() >= wake or runs % 7 == 0:
            wake = rec.step(clock(), snapshot([], runs=runs))
    log = fake.log(since=start)
    assert [r for r in log if r.verb not in ("get", "list", "watch")] == [], "zero writes"
    assert len(log) <= 4 * 6, "at most 6 requests per node-hour"
