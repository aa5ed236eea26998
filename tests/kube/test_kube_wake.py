"""The actuator's thread is woken only by a snapshot a step would read differently (issue 29).

A check result that changes no finding, and no run count the hysteresis or the adoption is counting,
does not wake the thread: on a healthy node nearly every result is such a one. The property test below
holds the promise that makes this safe: a reconciler fed through the filter decides exactly what one
stepped on every snapshot decides (active findings, desired taints and conditions), at every moment,
whatever the order of check results, clock moves and thread runs.
"""

from __future__ import annotations

import os
import threading
import time
from types import MappingProxyType

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube_support import CATALOG, Clock, finding, make_reconciler
from kube_support import settings as kube_settings
from agent.findings import Finding, Observation
from agent.kube import SOURCE
from agent.kube.actuator import Actuator
from agent.kube.hysteresis import wake_key
from agent.kube.settings import HysteresisSection
from agent.store import CheckStatus, Snapshot

CHECKS = ("disk", "net")
SAYS = {
    "ok": (),
    "slow": (("disk", "/data", "FakeDiskSlow"),),  # a warning: counted run by run
    "full": (("disk", "/data", "FakeDiskFull"),),  # critical: at once
    "flap": (("net", "eth0", "FakeNicFlap"),),  # a warning of another family
    "both": (("disk", "/data", "FakeDiskSlow"), ("net", "eth0", "FakeNicFlap")),
    "unknown": (("disk", "/data", "FakeProbeError"),),  # holds /data: nothing moves
    "failed": (),  # the run failed: CheckFailed holds the whole check
}


class World:
    """Two checks' latest results, as the store would snapshot them."""

    def __init__(self) -> None:
        self.status = {c: CheckStatus(c, known=(("/data", "FakeDiskSlow"), ("eth0", "FakeNicFlap"))) for c in CHECKS}
        self.generation = 0

    def run(self, check: str, says: str, message: str = "") -> Snapshot:
        findings = tuple(finding(reason, subject, check=check, message=message or f"{reason} on {subject}")
                         for _, subject, reason in SAYS[says])
        old = self.status[check]
        error = None
        if says == "failed":
            error = Finding(check, check, "CheckFailed", CATALOG.reason("CheckFailed").severity, "boom", True)
        self.status[check] = CheckStatus(
            check, Observation(findings=findings) if error is None else old.observation, ok=error is None,
            runs=old.runs + 1, error=error, known=old.known,
        )
        self.generation += 1
        return self.snapshot()

    def snapshot(self) -> Snapshot:
        empty: MappingProxyType[str, tuple[object, ...]] = MappingProxyType({})
        return Snapshot(self.generation, MappingProxyType(dict(self.status)), empty, empty, empty,  # type: ignore[arg-type]
                        time.time(), time.time())


def hysteresis(raise_cycles: int = 3, clear_cycles: int = 2) -> HysteresisSection:
    return HysteresisSection(raise_cycles=raise_cycles, raise_after=1800, clear_cycles=clear_cycles, clear_after=3600)


def actuator(tmp: str, clock: Clock, hyst: HysteresisSection, name: str) -> Actuator:
    rec = make_reconciler(None, tmp, kube_settings(hysteresis=hyst), clock=clock, state=os.path.join(tmp, name))
    return Actuator(rec, kill_switch=None, publish_samples=lambda s: None)


def test_the_key_counts_a_checks_runs_only_where_a_count_is_pending() -> None:
    w = World()
    a = w.run("disk", "ok")
    b = w.run("disk", "ok")
    assert wake_key(a, (SOURCE,), frozenset()) == wake_key(b, (SOURCE,), frozenset())
    assert wake_key(a, (SOURCE,), frozenset({"disk"})) != wake_key(b, (SOURCE,), frozenset({"disk"}))
    assert wake_key(a, (SOURCE,), None) != wake_key(b, (SOURCE,), None)  # adoption: every run counts
    assert wake_key(a, (SOURCE,), frozenset({"net"})) == wake_key(b, (SOURCE,), frozenset({"net"}))
    c = w.run("disk", "slow")
    assert wake_key(c, (SOURCE,), frozenset()) != wake_key(b, (SOURCE,), frozenset())  # a new finding
    d = w.run("disk", "slow", message="FakeDiskSlow on /data: 3 s")
    assert wake_key(d, (SOURCE,), frozenset()) != wake_key(c, (SOURCE,), frozenset())  # its message is read too


def test_a_healthy_nodes_results_wake_the_thread_only_until_adoption_ends(tmp_path) -> None:
    clock = Clock()
    act = actuator(str(tmp_path), clock, hysteresis(raise_cycles=2, clear_cycles=2), "a")
    w = World()
    woken = []
    for i in range(12):
        clock.t += 5
        act.offer(w.run(CHECKS[i % 2], "ok"))
        woken.append(act._wake.is_set())
        if act._wake.is_set():
            act._once(clock.t)
    assert not act.reconciler.adoption.holding
    # Adoption counts every check's definite runs (2 each), then nothing on a healthy node wakes the thread.
    assert woken[:4] == [True] * 4 and woken[-6:] == [False] * 6, woken


def test_a_warning_is_counted_run_by_run_and_raised_after_raise_cycles(tmp_path) -> None:
    clock = Clock()
    act = actuator(str(tmp_path), clock, hysteresis(raise_cycles=3, clear_cycles=2), "a")
    act.reconciler.adoption.holding = False
    w = World()
    w.run("net", "ok")  # net's first result is news (it held every subject until then): had before the loop
    steps = 0
    for says in ("ok", "ok", "slow", "slow", "slow", "slow", "ok", "ok", "ok"):
        clock.t += 5
        act.offer(w.run("disk", says))
        if act._wake.is_set():
            steps += 1
            act._once(clock.t)
        act.offer(w.run("net", "ok"))  # another check's result: never news here
        assert not act._wake.is_set()
        if says == "slow" and w.status["disk"].runs == 5:
            assert ("disk", "/data", "FakeDiskSlow") in act.reconciler.hyst.active  # the third sighting
    assert not act.reconciler.hyst.active  # cleared after two clean runs
    # Woken by the first ok (the first snapshot), each slow run while raising, the first clean run and the
    # second (clearing): not by the 4th slow run nor by the last ok.
    assert steps == 6, steps


def test_a_snapshot_offered_during_a_step_is_judged_by_the_counts_the_step_left(tmp_path) -> None:
    clock = Clock()
    act = actuator(str(tmp_path), clock, hysteresis(raise_cycles=3), "a")
    act.reconciler.adoption.holding = False
    w = World()
    act.offer(w.run("disk", "ok"))
    act._once(clock.t)
    first = w.run("disk", "slow")
    act.offer(first)
    second = w.run("disk", "slow")  # the next run lands while the thread steps on the first
    real = act.reconciler.step

    def step(now: float, snap: Snapshot | None = None) -> float:
        out = real(now, snap)
        act.offer(second)  # judged by the counts before the step: no pending count of disk then
        return out

    act.reconciler.step = step  # type: ignore[method-assign]
    act._once(clock.t)
    act.reconciler.step = real  # type: ignore[method-assign]
    assert act._wake.is_set()  # the step began counting disk, so the second sighting is news after all
    act._once(clock.t)
    act.offer(w.run("disk", "slow"))
    act._once(clock.t)
    assert ("disk", "/data", "FakeDiskSlow") in act.reconciler.hyst.active


def test_the_kill_switch_wakes_the_ladder_as_well(tmp_path) -> None:
    act = actuator(str(tmp_path), Clock(), hysteresis(), "a")
    kicked = threading.Event()
    act.on_paused = kicked.set
    act._paused(True)
    assert kicked.is_set() and act.reconciler.paused is True


def _decided(act_or_rec: object) -> tuple[object, ...]:
    rec = act_or_rec.reconciler if isinstance(act_or_rec, Actuator) else act_or_rec
    active = sorted((k, a.severity, a.message, a.origin) for k, a in rec.hyst.active.items())  # type: ignore[attr-defined]
    return tuple(active), rec.desired, rec.adoption.holding  # type: ignore[attr-defined]


EVENT = st.one_of(
    # A healthy result half of the time (those are what the filter skips); a new message now and then.
    st.tuples(st.just("run"), st.sampled_from(CHECKS), st.sampled_from(["ok"] * 6 + sorted(SAYS)),
              st.sampled_from(["", "", "", "x"])),
    # Mostly short moves, so that run counts decide; now and then past a time rule (raise_after, clear_after).
    st.tuples(st.just("clock"), st.sampled_from([1.0, 5.0, 5.0, 30.0, 30.0, 120.0, 1801.0, 3601.0])),
    st.tuples(st.just("thread")),
    st.tuples(st.just("healthy")),  # a healthy round: each check reports nothing, then the threads run
)


@settings(
    max_examples=int(os.environ.get("NHA_WAKE_EXAMPLES", "150")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(events=st.lists(EVENT, min_size=1, max_size=60), raise_cycles=st.sampled_from([1, 2, 3]),
       clear_cycles=st.sampled_from([1, 2, 3]))
def test_the_filter_never_changes_what_the_reconciler_decides(tmp_path_factory, events, raise_cycles, clear_cycles) -> None:
    """`every` steps on each offered snapshot, as the actuator did before the filter; `filtered` is the
    actuator, stepping only when woken. Both also step when their own timers are due. After every event
    both have decided the same: the same findings active, the same taints and conditions desired."""
    tmp = str(tmp_path_factory.mktemp("wake"))
    clock = Clock()
    hyst = hysteresis(raise_cycles, clear_cycles)
    every = make_reconciler(None, tmp, kube_settings(hysteresis=hyst), clock=clock, state=os.path.join(tmp, "every"))
    filtered = actuator(tmp, clock, hyst, "filtered")
    w = World()
    pending, latest = False, None
    due_every = due_filtered = float("inf")
    for event in events:
        if event[0] in ("run", "healthy"):
            for check, says, message in [event[1:]] if event[0] == "run" else [(c, "ok", "") for c in CHECKS]:
                latest = w.run(check, says, message and f"{says} {message}")
                filtered.offer(latest)
            pending = True
        if event[0] == "clock":
            clock.t += event[1]
        elif event[0] in ("thread", "healthy"):  # the threads run: each steps if it was woken or its timer is due
            if pending or clock.t >= due_every:
                due_every = every.step(clock.t, latest)
                pending = False
            if filtered._wake.is_set() or clock.t >= due_filtered:
                due_filtered = filtered._once(clock.t)
            assert _decided(filtered) == _decided(every), event
