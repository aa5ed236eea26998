"""The scheduler: intervals, failures, timeouts and stuck checks, in-process."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from agentproc import wait_for

from agent.catalog import Catalog
from agent.config import CheckConfig
from agent.findings import Observation, ObservationBuilder
from agent.scheduler import Scheduler
from agent.store import Store

# The core reasons (CheckFailed, CheckTimeout, NotApplicable, …) are all these tests need.
CATALOG = Catalog.declare()


@dataclass
class FakeCheck:
    name: str
    behaviour: str = "ok"  # ok | fail | hang | finding
    runs: int = 0
    release: threading.Event | None = None

    def run(self) -> Observation:
        self.runs += 1
        b = ObservationBuilder(self.name, CATALOG)
        if self.behaviour == "fail":
            raise RuntimeError("boom")
        if self.behaviour == "hang":
            assert self.release is not None
            self.release.wait()
        if self.behaviour == "finding":
            b.finding("sda", "NotApplicable", "a finding from the last good run")
        b.subject("sda", "fine")
        b.sample("node_health_check_stuck", 0, check=self.name)
        return b.build()


def cfg(interval: float = 0.2, timeout: float = 0.3) -> CheckConfig:
    return CheckConfig(enabled=True, interval=interval, timeout=timeout)


@contextmanager
def running(sched: Scheduler) -> Iterator[None]:
    """The scheduler's loop on a thread for the duration of the block."""
    stop = threading.Event()
    t = threading.Thread(target=sched.run, args=(stop,), kwargs={"max_sleep": 0.05}, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        sched.call_soon(lambda: None)
        t.join(5)
        assert not t.is_alive()


def test_run_once_runs_every_check_and_records_success() -> None:
    store = Store()
    sched = Scheduler(store, CATALOG)
    a, b = FakeCheck("a"), FakeCheck("b")
    sched.configure([(a, cfg()), (b, cfg())], immediate=True)
    sched.run_once()
    snap = store.snapshot()
    assert (a.runs, b.runs) == (1, 1)
    assert all(st.ok and st.runs == 1 for st in snap.checks.values())
    assert dict(snap.checks["a"].observation.subjects) == {"sda": "fine"}


def test_exception_becomes_check_failed_finding() -> None:
    store = Store()
    sched = Scheduler(store, CATALOG)
    sched.configure([(FakeCheck("bad", "fail"), cfg())], immediate=True)
    sched.run_once()
    st = store.snapshot().checks["bad"]
    assert not st.ok and st.failures == 1
    (f,) = st.findings
    assert f.reason == "CheckFailed" and f.unknown and "boom" in f.message


def test_a_failing_check_logs_its_own_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """The first failure's log line carries the check's exception, not "NoneType: None" (the error is
    handed over from the check's thread, so there is no exception being handled when it is logged)."""
    from agent.logs import JSONFormatter

    sched = Scheduler(Store(), CATALOG)
    sched.configure([(FakeCheck("bad", "fail"), cfg())], immediate=True)
    with caplog.at_level("ERROR", logger="agent.scheduler"):
        sched.run_once()
    (rec,) = [r for r in caplog.records if r.getMessage().startswith("check bad failed")]
    exc = JSONFormatter().format(rec)
    assert "RuntimeError: boom" in exc and "NoneType: None" not in exc, exc


def test_hang_times_out_is_not_restarted_and_others_keep_running() -> None:
    store = Store()
    sched = Scheduler(store, CATALOG, jitter=0)
    release = threading.Event()
    hung, fine = FakeCheck("hung", "hang", release=release), FakeCheck("fine")
    sched.configure([(hung, cfg(interval=0.1, timeout=0.2)), (fine, cfg(interval=0.1))], immediate=True)
    with running(sched):
        # events, not time: the hung check came due again while stuck (skipped), and the other ran on
        wait_for(lambda: store.snapshot().checks["hung"].skipped >= 2, what="the stuck check skipped twice")
        wait_for(lambda: fine.runs >= 3, what="the other check running on", timeout=10)
    snap = store.snapshot()
    st = snap.checks["hung"]
    assert hung.runs == 1, "a stuck check must not be started again while stuck"
    assert st.stuck and st.timeouts == 1 and st.skipped >= 2
    assert st.error is not None and st.error.reason == "CheckTimeout" and st.error.unknown
    release.set()
    with running(sched):
        wait_for(lambda: store.snapshot().checks["hung"].runs >= 2, what="the released check to run again")
    st = store.snapshot().checks["hung"]
    assert not st.stuck and st.error is None and st.ok, "the run returned: timeout finding cleared"


def test_failure_holds_findings_of_last_good_run_but_drops_samples() -> None:
    store = Store()
    sched = Scheduler(store, CATALOG)
    check = FakeCheck("c", "finding")
    sched.configure([(check, cfg())], immediate=True)
    sched.run_once()
    check.behaviour = "fail"
    sched.run_once()
    st = store.snapshot().checks["c"]
    assert sorted(f.reason for f in st.findings) == ["CheckFailed", "NotApplicable"], "held finding + the failure"
    assert st.samples == ()


def hung_check(name: str) -> tuple[Store, Scheduler, FakeCheck, threading.Event]:
    """A scheduler with one check whose run hangs until the event is set (interval and timeout 0.1 s)."""
    store = Store()
    sched = Scheduler(store, CATALOG, jitter=0)
    release = threading.Event()
    hung = FakeCheck(name, "hang", release=release)
    sched.configure([(hung, cfg(interval=0.1, timeout=0.1))], immediate=True)
    return store, sched, hung, release


def test_reload_keeps_a_stuck_run() -> None:
    store, sched, hung, release = hung_check("hung")
    with running(sched):
        wait_for(lambda: store.snapshot().checks["hung"].skipped >= 1, what="the check stuck and due again")
    sched.configure([(hung, cfg(interval=0.1, timeout=0.1))])
    skipped = store.snapshot().checks["hung"].skipped
    with running(sched):  # proof that it came due after the reload: skipped again, not started
        wait_for(lambda: store.snapshot().checks["hung"].skipped > skipped, what="a due time after the reload")
    assert hung.runs == 1
    release.set()


class FakeClock:
    """time.monotonic for the scheduler, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def start_times(monkeypatch: pytest.MonkeyPatch, jitter: float, rng: random.Random, seconds: float = 20.0) -> list[float]:
    """When the scheduler starts a check of interval 1 s, stepping a fake clock in 5 ms ticks."""
    clock = FakeClock()
    monkeypatch.setattr("agent.scheduler.time.monotonic", clock)
    sched = Scheduler(Store(), CATALOG, jitter=jitter, rng=rng)
    started: list[float] = []
    monkeypatch.setattr(sched, "_start", lambda e, now: started.append(now))  # the start itself, not a thread
    sched.configure([(FakeCheck("c"), cfg(interval=1.0))], immediate=True)
    for tick in range(int(seconds / TICK) + 1):
        clock.now = tick * TICK
        sched._step(0.0)
    return started


TICK = 0.005


@pytest.mark.parametrize("jitter", [0.0, 0.1, 0.5])
def test_intervals_with_jitter_stay_within_the_jitter(monkeypatch: pytest.MonkeyPatch, jitter: float) -> None:
    starts = start_times(monkeypatch, jitter, random.Random(7))
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(gaps) >= 12
    assert all(1.0 - jitter - 1e-9 <= g <= 1.0 + jitter + TICK + 1e-9 for g in gaps), gaps
    if jitter:  # the gaps spread over the jitter's range: a scheduler that ignores it fails here
        assert max(gaps) - min(gaps) > jitter, gaps
    else:
        assert max(gaps) - min(gaps) <= TICK + 1e-9, gaps


class Extreme(random.Random):
    """Always the top (or bottom) of the range asked for."""

    def __init__(self, top: bool) -> None:
        super().__init__(0)
        self.top = top

    def uniform(self, a: float, b: float) -> float:
        return b if self.top else a


@pytest.mark.parametrize(("top", "gap"), [(True, 1.5), (False, 0.5)])
def test_jitter_moves_each_due_time_by_up_to_its_fraction(monkeypatch: pytest.MonkeyPatch, top: bool, gap: float) -> None:
    starts = start_times(monkeypatch, 0.5, Extreme(top), seconds=6.0)
    assert [round(b - a, 3) for a, b in zip(starts, starts[1:])] == [gap] * (len(starts) - 1)
    assert len(starts) == int(6.0 / gap) + 1


def test_first_pass_is_done_when_every_check_finished_or_timed_out_once() -> None:
    """What the daemon waits for before it gives start-up's free memory back (release_free_memory)."""
    sched = Scheduler(Store(), CATALOG, jitter=0)
    release = threading.Event()
    fine, hung = FakeCheck("fine"), FakeCheck("hung", "hang", release=release)
    sched.configure([(fine, cfg(interval=60)), (hung, cfg(interval=60, timeout=0.3))], immediate=True)
    assert not sched.first_pass_done()
    with running(sched):
        wait_for(lambda: fine.runs == 1 and hung.runs == 1, what="both started")
        wait_for(sched.first_pass_done, what="the hung check timed out", timeout=10)
    release.set()
    sched.configure([(fine, cfg(interval=60))])  # a reload: a new first pass
    assert not sched.first_pass_done()


def check_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"check-{name}" and t.is_alive()]


def test_a_check_runs_in_one_thread_kept_between_its_runs_and_ended_by_close() -> None:
    """Issue 29: a thread per run cost ~0.16 ms CPU each; the check's thread now waits for its next run."""
    store = Store()
    sched = Scheduler(store, CATALOG, jitter=0)
    seen: list[int] = []

    class Where(FakeCheck):
        def run(self) -> Observation:
            seen.append(threading.get_ident())
            return super().run()

    sched.configure([(Where("where"), cfg(interval=0.05))], immediate=True)
    with running(sched):
        wait_for(lambda: store.snapshot().checks["where"].runs >= 4, what="four runs")
    assert len(set(seen)) == 1 and len(check_threads("where")) == 1
    sched.close()
    wait_for(lambda: not check_threads("where"), what="the check's thread ended")


def test_a_reload_ends_the_old_checks_thread_after_its_stuck_run_and_the_new_check_gets_its_own() -> None:
    store, sched, hung, release = hung_check("reloaded")
    with running(sched):
        wait_for(lambda: store.snapshot().checks["reloaded"].timeouts >= 1, what="the run stuck")
    (old,) = check_threads("reloaded")
    fresh = FakeCheck("reloaded")
    sched.configure([(fresh, cfg(interval=0.05))])
    release.set()  # the stuck run returns: its result is the old run's, then the new check runs in a new thread
    with running(sched):
        wait_for(lambda: fresh.runs >= 2, what="the new check's runs")
    wait_for(lambda: not old.is_alive(), what="the old check's thread ended")
    assert len(check_threads("reloaded")) == 1 and hung.runs == 1
    sched.close()


def test_a_thread_idle_past_its_time_ends_and_the_next_run_starts_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.scheduler.WORKER_IDLE", 0.05)
    store = Store()
    sched = Scheduler(store, CATALOG, jitter=0)
    check = FakeCheck("idle")
    sched.configure([(check, cfg(interval=0.01))], immediate=True)
    sched.run_once()
    wait_for(lambda: not check_threads("idle"), what="the idle thread ended")
    sched.run_once()  # its ended thread refuses the run: another is started, and the run is not lost
    assert check.runs == 2 and store.snapshot().checks["idle"].runs == 2
    sched.close()
