"""Runs each check on its own interval (with jitter) and timeout.

Every check runs in a daemon thread of its own (one per check, kept between its
runs: a thread started per run cost ~0.16 ms of CPU each time), so a check that
hangs cannot stop the others: when it passes its timeout it is reported
(CheckTimeout, held until it returns), and it is not started again while it is
stuck. All results come back to one loop thread, which alone writes the
`Store`; event sources hand their updates to the same loop with `call_soon`,
so whatever listens to the store sees one ordered stream.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from .catalog import Catalog
from .check import Check
from .findings import Finding, Observation
from .schema import CheckConfig
from .store import CheckStatus, Store

log = logging.getLogger(__name__)

FIRST_RUN_SPREAD = 5.0  # the first runs after start are spread over at most this many seconds
WORKER_IDLE = 60.0  # a check's thread ends after max(this, 3 intervals) without a run (a scheduler let go)


class _Worker:
    """One check's thread: its runs, one after another. It waits without a timer between runs (a timed
    wait that a run ends first never fires) and ends when closed or idle for `idle` seconds."""

    def __init__(self, name: str, idle: float) -> None:
        self._q: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ended = False
        self._idle = idle
        threading.Thread(target=self._loop, name=f"check-{name}", daemon=True).start()

    def submit(self, fn: Callable[[], None]) -> bool:
        """Run `fn` next; False when the thread has ended (idle): the caller starts another."""
        with self._lock:
            if self._ended:
                return False
            self._q.put(fn)
            return True

    def close(self) -> None:
        """End the thread after the run it may be in (a stuck run keeps it, as it would any thread)."""
        with self._lock:
            self._ended = True
            self._q.put(None)

    def _loop(self) -> None:
        while True:
            try:
                fn = self._q.get(timeout=self._idle)
            except queue.Empty:
                with self._lock:
                    if self._q.empty():
                        self._ended = True
                        return
                continue
            if fn is None:
                return
            fn()


@dataclass(slots=True)
class _Run:
    started: float  # monotonic
    timed_out: bool = False


@dataclass(slots=True)
class _Entry:
    check: Check
    cfg: CheckConfig
    due: float
    running: _Run | None = None
    completed_once: bool = False
    failing: bool = False  # for logging once per state change
    worker: _Worker | None = None  # the check's thread, once it ran


class Scheduler:
    def __init__(
        self, store: Store, catalog: Catalog, *, jitter: float = 0.1, rng: random.Random | None = None
    ) -> None:
        self._store = store
        self._catalog = catalog  # what a check may emit, and the findings about a check (CheckFailed, CheckTimeout)
        self._jitter = jitter
        self._rng = rng or random.Random()
        self._entries: dict[str, _Entry] = {}
        self._q: queue.SimpleQueue[tuple[object, ...]] = queue.SimpleQueue()

    # ------------------------------------------------------------ setup

    def configure(self, checks: Iterable[tuple[Check, CheckConfig]], *, immediate: bool = False) -> None:
        """Install the checks (at start and on reload). A check that is running
        keeps its run: a stuck check is not started twice because of a reload."""
        now = time.monotonic()
        entries: dict[str, _Entry] = {}
        for check, cfg in checks:
            old = self._entries.get(check.name)
            if immediate:
                due = now
            elif old is not None:
                due = min(old.due, now + cfg.interval)
            else:
                due = now + self._rng.uniform(0, min(FIRST_RUN_SPREAD, cfg.interval * max(self._jitter, 0.01)))
            keep = old.worker if old is not None and old.check is check else None
            entries[check.name] = _Entry(check, cfg, due, running=old.running if old else None, worker=keep)
        for old in self._entries.values():
            if old.worker is not None and all(e.worker is not old.worker for e in entries.values()):
                old.worker.close()  # a replaced or removed check: its thread ends after the run it may be in
        self._entries = entries
        known = {}
        for name, e in entries.items():
            known_fn = getattr(e.check, "known_findings", None)
            own = ((name, "CheckFailed"), (name, "CheckTimeout"))  # what the scheduler itself can report
            known[name] = own + (tuple(known_fn()) if known_fn else ())
        self._store.set_checks(entries, known)

    def first_pass_done(self) -> bool:
        """Every configured check has finished (or timed out in) its first run since `configure`."""
        return all(e.completed_once or (e.running is not None and e.running.timed_out) for e in self._entries.values())

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop thread as soon as possible (thread-safe)."""
        self._q.put(("call", fn))

    # ------------------------------------------------------------ loops

    def run(self, stop: threading.Event, on_tick: Callable[[], None] | None = None, max_sleep: float = 1.0) -> None:
        """The daemon's loop; returns when `stop` is set (wake it with `call_soon`)."""
        while not stop.is_set():
            self._step(max_sleep)
            if on_tick:
                on_tick()

    def run_once(self) -> None:
        """Run every configured check once, now, and return when each has finished or timed out."""
        for e in self._entries.values():
            e.due = time.monotonic()
            e.completed_once = False
        while any(not e.completed_once and not (e.running and e.running.timed_out) for e in self._entries.values()):
            self._step(0.5, schedule_next=False)

    def _step(self, max_sleep: float, schedule_next: bool = True) -> None:
        now = time.monotonic()
        self._store.tick()
        wake = now + max_sleep
        for e in self._entries.values():
            if e.running and not e.running.timed_out:
                deadline = e.running.started + e.cfg.timeout
                if now >= deadline:
                    self._timed_out(e, now)
                else:
                    wake = min(wake, deadline)
            if now >= e.due:
                if e.running:
                    self._skipped(e, now)
                else:
                    self._start(e, now)
                e.due = self._next_due(e, now) if schedule_next else float("inf")
            wake = min(wake, e.due)
        self._drain(max(0.0, wake - time.monotonic()))

    def _next_due(self, e: _Entry, now: float) -> float:
        j = self._jitter
        return now + e.cfg.interval * (1 + self._rng.uniform(-j, j))

    def _drain(self, timeout: float) -> None:
        try:
            item = self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return

    def _handle(self, item: tuple[object, ...]) -> None:
        if item[0] == "call":
            try:
                item[1]()  # type: ignore[operator]
            except Exception:
                log.exception("error in a loop callback")
            return
        _, name, run, obs, err, duration = item
        e = self._entries.get(str(name))
        if e is None or e.running is not run:
            return  # the check was removed or replaced by a reload
        e.running = None
        e.completed_once = True
        self._finished(e, obs, err, duration)  # type: ignore[arg-type]

    # ------------------------------------------------------------ transitions

    def _start(self, e: _Entry, now: float) -> None:
        run = _Run(started=now)
        e.running = run
        check = e.check

        def work() -> None:
            t0 = time.monotonic()
            obs: Observation | None = None
            err: BaseException | None = None
            try:
                obs = check.run()
                if not isinstance(obs, Observation):
                    raise TypeError(f"run() returned {type(obs).__name__}, not an Observation")
                self._catalog.check_observation(obs)  # an undeclared sample fails this run, not the scrape
            except BaseException as exc:  # noqa: BLE001 - a check can fail, the agent cannot
                err = exc
            self._q.put(("done", check.name, run, obs, err, time.monotonic() - t0))

        if e.worker is None or not e.worker.submit(work):
            e.worker = _Worker(check.name, max(WORKER_IDLE, 3 * e.cfg.interval))
            e.worker.submit(work)

    def close(self) -> None:
        """End the checks' threads (each after the run it may be in)."""
        for e in self._entries.values():
            if e.worker is not None:
                e.worker.close()
                e.worker = None

    def _finished(self, e: _Entry, obs: Observation | None, err: BaseException | None, duration: float) -> None:
        name = e.check.name
        if err is None:
            if e.failing:
                log.info("check %s recovered", name)
            e.failing = False
            self._store.update_check(
                name,
                lambda st: replace(
                    st, observation=obs, ok=True, duration=duration, finished_at=time.time(), error=None,
                    runs=st.runs + 1, stuck=False,
                ),
            )
            return
        msg = f"{type(err).__name__}: {err}"
        (log.debug if e.failing else log.error)("check %s failed: %s", name, msg, exc_info=None if e.failing else err)
        e.failing = True
        finding = self._finding(name, "CheckFailed", f"the check raised {msg}")
        self._store.update_check(
            name,
            lambda st: replace(
                st, ok=False, duration=duration, finished_at=time.time(), error=finding,
                runs=st.runs + 1, failures=st.failures + 1, stuck=False,
            ),
        )

    def _timed_out(self, e: _Entry, now: float) -> None:
        assert e.running is not None
        e.running.timed_out = True
        name = e.check.name
        (log.debug if e.failing else log.error)("check %s passed its timeout of %.1fs", name, e.cfg.timeout)
        e.failing = True
        finding = self._finding(name, "CheckTimeout", f"still running after its timeout of {e.cfg.timeout:g}s")
        self._store.update_check(
            name, lambda st: replace(st, ok=False, error=finding, timeouts=st.timeouts + 1, stuck=True)
        )

    def _skipped(self, e: _Entry, now: float) -> None:
        assert e.running is not None
        if not e.running.timed_out:
            return  # a slow run that is still inside its timeout: just not started twice
        name = e.check.name
        running_for = now - e.running.started
        log.warning("check %s not started: its previous run is stuck (%.0fs)", name, running_for)
        finding = self._finding(
            name, "CheckTimeout", f"stuck for {running_for:.0f}s (timeout {e.cfg.timeout:g}s); not restarted while stuck"
        )
        self._store.update_check(name, lambda st: replace(st, error=finding, skipped=st.skipped + 1))

    def _finding(self, check: str, reason: str, message: str) -> Finding:
        """A finding about the check itself, as the catalog declares its reason."""
        return self._catalog.finding(check, check, reason, message)


__all__ = ["CheckStatus", "Scheduler"]
