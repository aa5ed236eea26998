"""The scheduler: intervals, failures, timeouts and stuck checks, in-process."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

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


def run_for(sched: Scheduler, seconds: float) -> None:
    stop = threading.Event()
    t = threading.Thread(target=sched.run, args=(stop,), kwargs={"max_sleep": 0.05}, daemon=True)
    t.start()
    time.sleep(seconds)
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


def test_hang_times_out_is_not_restarted_and_others_keep_running() -> None:
    store = Store()
    sched = Scheduler(store, CATALOG, jitter=0)
    release = threading.Event()
    hung, fine = FakeCheck("hung", "hang", release=release), FakeCheck("fine")
    sched.configure([(hung, cfg(interval=0.1, timeout=0.2)), (fine, cfg(interval=0.1))], immediate=True)
    run_for(sched, 1.2)
    snap = store.snapshot()
    st = snap.checks["hung"]
    assert hung.runs == 1, "a stuck check must not be started again while stuck"
    assert st.stuck and st.timeouts == 1 and st.skipped >= 1
    assert st.error is not None and st.error.reason == "CheckTimeout" and st.error.unknown
    assert fine.runs >= 3, "a hung check must not stop the others"
    release.set()
    run_for(sched, 0.5)
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


def test_reload_keeps_a_stuck_run() -> None:
    store = Store()
    sched = Scheduler(store, CATALOG, jitter=0)
    release = threading.Event()
    hung = FakeCheck("hung", "hang", release=release)
    sched.configure([(hung, cfg(interval=0.1, timeout=0.1))], immediate=True)
    run_for(sched, 0.4)
    sched.configure([(hung, cfg(interval=0.1, timeout=0.1))])
    run_for(sched, 0.4)
    assert hung.runs == 1
    release.set()


@pytest.mark.parametrize("jitter", [0.0, 0.1, 0.5])
def test_intervals_with_jitter_stay_near_the_interval(jitter: float) -> None:
    store = Store()
    sched = Scheduler(store, CATALOG, jitter=jitter)
    check = FakeCheck("c")
    sched.configure([(check, cfg(interval=0.1))], immediate=True)
    run_for(sched, 1.0)
    # 1 s at 0.1 s ± jitter: a loose bound (shared CI machines are noisy)
    assert 4 <= check.runs <= 25
