"""The kernel-log follower's waits (issue 29): it blocks on the log until the earliest time a
subscriber asked to be called, a new subscriber or a stop wakes it at once, and it leaves no
file descriptor behind."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import pytest
from agentproc import wait_for

from agent import kmsg_follower
from agent.kmsg import KmsgError, Record

KMSG = "/dev/kmsg"


class Sub:
    """A subscriber that records its calls; `due` is what kmsg_next_due answers."""

    def __init__(self, due: float | None = None) -> None:
        self.due = due
        self.opened = 0
        self.calls: list[tuple[int, bool, float]] = []  # (records, backlog, when)
        self.lock = threading.Lock()

    def kmsg_opened(self) -> None:
        self.opened += 1

    def kmsg_failed(self, exc: KmsgError) -> None:
        raise AssertionError(exc)

    def kmsg_records(self, records: Sequence[Record], backlog: bool) -> None:
        with self.lock:
            self.calls.append((len(records), backlog, time.monotonic()))

    def kmsg_next_due(self) -> float | None:
        return self.due


class Plain:
    """A subscriber without kmsg_next_due."""

    def kmsg_records(self, records: Sequence[Record], backlog: bool) -> None: ...


class Broken:
    def kmsg_next_due(self) -> float | None:
        raise RuntimeError("a bug")


def _timeout(*subs: object) -> float:
    return kmsg_follower.Follower("unused")._timeout([kmsg_follower._Sub(s) for s in subs])  # type: ignore[arg-type]


def test_the_wait_is_the_earliest_due_time_between_its_bounds() -> None:
    now = time.monotonic()
    assert _timeout(Sub(None)) == kmsg_follower.WAIT_MAX  # nothing to do without records
    assert _timeout(Sub(None), Plain()) == kmsg_follower.WAIT  # one that does not say: as before
    assert _timeout(Broken()) == pytest.approx(kmsg_follower.WAIT, abs=0.1)
    assert 2.0 < _timeout(Sub(now + 3.0), Sub(now + 30.0)) <= 3.0
    assert _timeout(Sub(now - 5.0)) == kmsg_follower.WAIT_MIN  # a due time in the past cannot spin
    assert _timeout(Sub(now + 600.0)) == kmsg_follower.WAIT_MAX


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def kmsg() -> str:
    if not os.access(KMSG, os.R_OK):
        pytest.skip(f"{KMSG} is not readable here")
    return KMSG


@pytest.mark.privileged
def test_a_due_subscriber_is_called_a_newcomer_and_a_stop_wake_the_wait(kmsg: str) -> None:
    before = _fds()
    first = Sub(None)
    kmsg_follower.subscribe(kmsg, first)
    follower = kmsg_follower._followers[kmsg]
    try:
        wait_for(lambda: first.calls and not follower._subs[0].backlog, what="the first subscriber caught up")
        # It now waits for records only (WAIT_MAX). A due time is honoured once it is asked again...
        first.due = time.monotonic()  # ...after the next call: a newcomer's reopen makes one at once
        second = Sub(None)
        kmsg_follower.subscribe(kmsg, second)  # wakes the wait: the newcomer gets its backlog now, not in 60 s
        wait_for(lambda: second.opened == 1 and second.calls, what="the newcomer's backlog", timeout=10)
        n = len(first.calls)
        wait_for(lambda: len(first.calls) > n + 2, what="calls while the first subscriber is due", timeout=10)
        first.due = None
        kmsg_follower.unsubscribe(kmsg, second)
    finally:
        thread = follower._thread
        kmsg_follower.unsubscribe(kmsg, first)  # joins the thread for up to 2 s: the wake pipe ends its wait
    assert thread is not None and not thread.is_alive()
    assert kmsg_follower.readers() == 0
    assert _fds() == before  # the log and the wake pipe are closed


def test_the_kernel_fault_tracker_is_next_due_when_its_first_hold_ends() -> None:
    from agent.kernel.faults import Active, FaultTracker
    from agent.kernel.patterns import DEFAULT

    t = FaultTracker(DEFAULT, clock=lambda: 100.0)
    assert t.next_expiry() is None
    t.active["a"] = Active("m", None, 1)  # until a reboot: never due
    assert t.next_expiry() is None
    t.active["b"], t.active["c"] = Active("m", 700.0, 1), Active("m", 400.0, 1)
    assert t.next_expiry() == 400.0
    del t.active["c"]
    assert t.next_expiry() == 700.0


@pytest.mark.privileged
def test_a_kick_makes_the_follower_ask_for_due_times_again(kmsg: str) -> None:
    """The Xid source adds findings with a hold from the NVML thread: kick() ends the current wait."""
    sub = Sub(None)
    kmsg_follower.subscribe(kmsg, sub)
    follower = kmsg_follower._followers[kmsg]
    try:
        wait_for(lambda: sub.calls and not follower._subs[0].backlog, what="caught up")
        n = len(sub.calls)
        sub.due = time.monotonic()
        kmsg_follower.kick(kmsg)  # without it the follower would sleep on for WAIT_MAX
        wait_for(lambda: len(sub.calls) > n, what="a call after the kick", timeout=10)
        sub.due = None
    finally:
        kmsg_follower.unsubscribe(kmsg, sub)
    kmsg_follower.kick(kmsg)  # no follower any more: nothing happens
