"""Starting with no usable state (kubernetes.json damaged and set aside, or
absent) never releases a node that carries our taints before the checks have
run and found it healthy: the taints found on the node are held until every
check has reported definitely for max(raise_cycles, clear_cycles) runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType

import pytest

from agent.kube.settings import HysteresisSection
from agent.store import Snapshot
from fakeapi import FakeApiServer
from kube_support import (
    NODE, PREFIX, Clock, fake, finding, make_reconciler, our_taints, settings, snapshot,  # noqa: F401
)

SLOW = HysteresisSection(raise_cycles=3, raise_after=300, clear_cycles=4, clear_after=600)
TAINT = (PREFIX + "disk", "FakeDiskFull", "NoSchedule")
DAMAGE = {"list": "[1]", "cut short": '{"version": 1, "act', "absent": None}


def not_run() -> Snapshot:
    """The disk check as the store shows it before its first run."""
    snap = snapshot([], runs=0)
    st = dataclasses.replace(snap.checks["disk"], observation=None, ok=False)
    return dataclasses.replace(snap, checks=MappingProxyType({"disk": st}))


def tainted_node(fake: FakeApiServer, tmp_path: Path, damage: str | None) -> str:
    fake.edit_node(NODE, lambda n: n["spec"].update(taints=[dict(zip(("key", "value", "effect"), TAINT))]))
    state = tmp_path / "state"
    state.mkdir()
    if damage is not None:
        (state / "kubernetes.json").write_text(damage)
    return str(state)


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_taint_is_held_until_the_checks_found_the_node_healthy(fake: FakeApiServer, tmp_path: Path, damage: str | None) -> None:
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock,
                          state=tainted_node(fake, tmp_path, damage))
    rec.step(clock(), not_run())
    for runs in (1, 2, 3):  # clean runs, but fewer than max(raise_cycles, clear_cycles)
        clock.t += 30
        rec.step(clock(), snapshot([], runs=runs))
        assert our_taints(fake) == [TAINT], f"released after {runs} runs"
    clock.t += 30
    rec.step(clock(), snapshot([], runs=4))
    assert our_taints(fake) == [], "found healthy for 4 runs: released"


def test_a_failing_check_never_releases_an_adopted_taint(fake: FakeApiServer, tmp_path: Path) -> None:
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock,
                          state=tainted_node(fake, tmp_path, "[1]"))
    for runs in range(1, 60):
        clock.t += 30
        rec.step(clock(), snapshot([], runs=runs, failed=runs % 3 == 0))  # fails every third run
        assert our_taints(fake) == [TAINT]


def test_still_sick_node_stays_tainted_through_the_raise_period(fake: FakeApiServer, tmp_path: Path) -> None:
    clock = Clock()
    cfg = settings(hysteresis=SLOW)
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, warning="PreferNoSchedule"))
    rec = make_reconciler(fake, str(tmp_path), cfg, clock=clock,
                          state=tainted_node(fake, tmp_path, "[1]"))
    for runs in range(1, 10):  # the warning is still there: raised after 3 runs, never a gap in between
        clock.t += 30
        rec.step(clock(), snapshot([finding("FakeDiskSlow")], runs=runs))
        assert [k for k, _, _ in our_taints(fake)] == [PREFIX + "disk"], f"run {runs}"
    assert our_taints(fake) == [(PREFIX + "disk", "FakeDiskSlow", "PreferNoSchedule")]


def test_time_rule_ends_adoption_for_slow_checks(fake: FakeApiServer, tmp_path: Path) -> None:
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock,
                          state=tainted_node(fake, tmp_path, "[1]"))
    wake = rec.step(clock(), snapshot([], runs=1))
    assert our_taints(fake) == [TAINT]
    assert wake <= clock() + 600, "woken when max(raise_after, clear_after) has passed"
    clock.t += 600
    rec.step(clock(), snapshot([], runs=2))
    assert our_taints(fake) == []


def test_with_its_state_kept_a_restart_releases_a_stale_taint_at_once(fake: FakeApiServer, tmp_path: Path) -> None:
    """Adoption is for a start without state: a valid, empty active set is the truth."""
    clock = Clock()
    state = tainted_node(fake, tmp_path, '{"version": 1, "active": [], "outbox": [], "slot": false}')
    rec = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock, state=state)
    rec.step(clock(), snapshot([], runs=1))
    assert our_taints(fake) == []
    assert Path(state, "kubernetes.json").exists()


def test_damaged_state_is_set_aside(fake: FakeApiServer, tmp_path: Path) -> None:
    state = Path(tainted_node(fake, tmp_path, "[1]"))
    make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), state=str(state))
    assert [p.name.startswith("kubernetes.json.bad-") for p in state.iterdir()] == [True]


def test_immediate_hysteresis_still_acts_on_the_first_definite_run(fake: FakeApiServer, tmp_path: Path) -> None:
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(), clock=clock, state=tainted_node(fake, tmp_path, None))
    rec.step(clock(), not_run())
    assert our_taints(fake) == [TAINT]
    rec.step(clock(), snapshot([], runs=1))
    assert our_taints(fake) == []


def test_an_adopted_preflight_gate_follows_the_burn_once_every_check_reported(fake: FakeApiServer, tmp_path: Path) -> None:
    """A new node: the kubelet registered the preflight taint and there is no state yet.
    The burn's pass releases it on its first run, without waiting out the hysteresis."""
    fake.edit_node(NODE, lambda n: n["spec"].update(taints=[{"key": PREFIX + "preflight", "effect": "NoSchedule"}]))
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock)
    burn = dataclasses.replace(snapshot([], runs=0, check="burn", known=("PreflightPending", "PreflightFailed")))
    not_yet = dataclasses.replace(burn, checks=MappingProxyType(
        {"burn": dataclasses.replace(burn.checks["burn"], observation=None, ok=False)}))
    rec.step(clock(), not_yet)
    assert our_taints(fake) == [(PREFIX + "preflight", "", "NoSchedule")], "held until the burn has reported"
    rec.step(clock(), snapshot([], runs=1, check="burn", known=("PreflightPending", "PreflightFailed")))
    assert our_taints(fake) == []


def test_each_check_is_counted_from_its_own_first_definite_run() -> None:
    """Adoption ends once every check has reported definitely for `cycles` runs, each counted from its
    own first definite run: the slowest check decides, not the sum of them all (the count of a later
    check used to begin only once every check before it had passed). While it holds, only the checks
    still short of their count are news to the actuator (`counting`)."""
    from agent.kube.adoption import Adoption
    from agent.kube.hysteresis import Report

    a = Adoption(HysteresisSection(raise_cycles=3, raise_after=3600, clear_cycles=2, clear_after=3600), fresh=True)

    def seen(disk: int, kernel: int, now: float) -> bool:
        return a.observe({"disk": Report(run=disk), "kernel": Report(run=kernel), "xid": Report()}, now)

    assert not seen(1, 1, 0.0) and a.counting() == {"disk", "kernel"}
    assert not seen(2, 2, 30.0) and a.counting() == {"disk", "kernel"}
    assert not seen(3, 2, 60.0) and a.counting() == {"kernel"}  # disk has its 3 runs: its next ones are no news
    assert seen(4, 3, 90.0) and not a.holding  # kernel's third run: both have theirs
    assert a.counting() == frozenset()
