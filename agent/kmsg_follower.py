"""The one reader of the kernel log: a thread per path that reads its records
in batches and hands every batch to each feature that follows the log (the
GPU feature's Xid stream, the kernel feature's fault table).

One reader, not one per feature: every reader of ``/dev/kmsg`` gets its own
copy of every record, so two would double the cost of a log storm, and a
feature that joins later would see a different slice of the ring.

A subscriber keeps its own cursor (the last sequence number it processed,
persisted with its own state), so the follower needs none. A subscriber that
joins a follower that is already reading makes it open the log again: the
newcomer gets the whole ring from its start (its backlog), and those already
there skip again what their cursors say they have seen; in a file without
sequence numbers (``dmesg`` text fed by a test) they skip, by position, the
records they were given before.

The records come as a `agent.kmsg.RecordBatch`, parsed in one native pass;
a subscriber with a ``kmsg_screen`` attribute (the fault table's screen, as
`agent.kernel.patterns.Table.screen`) gets that screen's candidates from the
same pass (`RecordBatch.screened`).

Everything a subscriber is given runs on the follower's thread; a subscriber
that raises is logged (once per kind of error) and the others go on.

Wake-ups (issue 29): between records the thread blocks in select() on the log
and on a wake pipe (a new subscriber, a stop), until the earliest time a
subscriber asked to be called without records (``kmsg_next_due``: a finding's
hold ends, a cursor save is due), at the latest `WAIT_MAX`. A subscriber
without ``kmsg_next_due`` is called every `WAIT`, as all were before.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from .kmsg import BATCH, Kmsg, KmsgError, Record

log = logging.getLogger(__name__)

# Between two full batches the follower sleeps this long: a scrape waiting for the
# GIL gets it at once instead of after the switch interval, over and over.
STORM_YIELD = 0.001
RETRY_OPEN = 30.0  # seconds between attempts to open a log that cannot be opened
WAIT = 1.0  # a subscriber without kmsg_next_due is called at least this often
WAIT_MAX = 60.0  # the longest wait for new records when every subscriber says when it is next due
WAIT_MIN = 0.05  # the shortest: a due time in the past (a subscriber's bug) cannot make the thread spin


class Subscriber(Protocol):
    def kmsg_opened(self) -> None:
        """The log was opened (again); what follows starts at the ring's oldest record."""
        ...

    def kmsg_failed(self, exc: KmsgError) -> None:
        """The log cannot be opened; tried again every `RETRY_OPEN` seconds."""
        ...

    def kmsg_records(self, records: Sequence[Record], backlog: bool) -> None:
        """The next records (maybe none: called when the subscriber is due, see below),
        a `RecordBatch` or (after a reopen, in a file without sequence numbers) a list.
        `backlog`: they were in the ring before this subscriber caught up.

        Optional: ``kmsg_next_due() -> float | None``, the `time.monotonic()` time at which the
        subscriber wants ``kmsg_records`` called even if no record comes (None: only for records);
        asked after every call. Without it: every `WAIT` seconds."""
        ...


class _Sub:
    def __init__(self, sub: Subscriber) -> None:
        self.sub = sub
        self.backlog = True
        self.unsequenced = 0  # records without a sequence number given since the log was opened
        self.skip = 0  # of those, how many to skip after a reopen (given before it)
        self.errors: set[str] = set()


class Follower:
    def __init__(self, path: str) -> None:
        self.path = path
        self._subs: list[_Sub] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reopen = False
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1  # a pipe while the thread runs; closed by the thread, under _lock

    def add(self, sub: Subscriber) -> None:
        with self._lock:
            self._subs.append(_Sub(sub))
            self._reopen = self._thread is not None
            if self._thread is None:
                self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                self._thread = threading.Thread(target=self._run, name="kmsg", daemon=True)
                self._thread.start()
            else:
                self._wake()

    def remove(self, sub: Subscriber) -> bool:
        """True when it was the last subscriber: the thread is stopped."""
        with self._lock:
            self._subs = [s for s in self._subs if s.sub is not sub]
            if self._subs:
                return False
            self._stop.set()
            self._wake()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)
        return True

    def kick(self) -> None:
        """Ask the subscribers for their due times again now (one was changed from another thread)."""
        with self._lock:
            self._wake()

    def _wake(self) -> None:
        """Under `_lock`: make the thread's wait return (a full pipe already will)."""
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"!")
            except BlockingIOError:
                pass

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    k = Kmsg(self.path)
                except KmsgError as exc:
                    log.debug("kernel log: %s", exc)
                    for s in self._current():
                        self._call(s, s.sub.kmsg_failed, exc)
                    self._stop.wait(RETRY_OPEN)
                    continue
                try:
                    self._read(k)
                finally:
                    k.close()
        finally:
            with self._lock:
                for fd in (self._wake_r, self._wake_w):
                    if fd >= 0:
                        os.close(fd)
                self._wake_r = self._wake_w = -1

    def _current(self) -> list[_Sub]:
        with self._lock:
            return list(self._subs)

    def _read(self, k: Kmsg) -> None:
        with self._lock:
            self._reopen = False
            subs = list(self._subs)
        for s in subs:
            s.skip, s.unsequenced = s.unsequenced, 0
            self._call(s, s.sub.kmsg_opened)
        while not self._stop.is_set():
            with self._lock:
                if self._reopen:
                    return
                subs = list(self._subs)
            screen = next((sc for s in subs if (sc := getattr(s.sub, "kmsg_screen", b""))), b"")
            records = k.read_batch(screen=screen)
            caught_up = len(records) < BATCH
            for s in subs:
                self._give(s, records)
                if caught_up:
                    s.backlog = False
            if caught_up:
                k.wait(self._timeout(subs), self._wake_r)
                self._drain_wake()
            else:  # a storm: read on, but give the GIL away once a batch, so /metrics is served meanwhile
                time.sleep(STORM_YIELD)

    def _timeout(self, subs: list[_Sub]) -> float:
        """Seconds until the earliest subscriber is due (`WAIT` for one that does not say)."""
        now = time.monotonic()
        wait = WAIT_MAX
        for s in subs:
            next_due = getattr(s.sub, "kmsg_next_due", None)
            if next_due is None:
                wait = min(wait, WAIT)
                continue
            try:
                due = next_due()
            except Exception:  # noqa: BLE001 - a subscriber's bug: called as often as before
                due = now + WAIT
            if due is not None:
                wait = min(wait, due - now)
        return max(wait, WAIT_MIN)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 64):
                pass
        except OSError:  # empty (EAGAIN)
            pass

    def _give(self, s: _Sub, records: Sequence[Record]) -> None:
        mine: Sequence[Record] = records
        if s.skip:
            kept: list[Record] = []
            for r in records:
                if r.seq is None:
                    s.unsequenced += 1
                    if s.unsequenced <= s.skip:
                        continue
                kept.append(r)
            mine = kept
        elif records and (records[0].seq is None or records[-1].seq is None):  # a file of dmesg text
            s.unsequenced += sum(1 for r in records if r.seq is None)
        self._call(s, s.sub.kmsg_records, mine, s.backlog)

    def _call(self, s: _Sub, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a subscriber's bug must not stop the others
            kind = type(exc).__name__
            if kind not in s.errors:
                s.errors.add(kind)
                log.exception("kernel log subscriber %s failed (logged once per kind of error)", type(s.sub).__name__)


_followers: dict[str, Follower] = {}
_registry_lock = threading.Lock()


def subscribe(path: str, sub: Subscriber) -> None:
    """Follow the log at `path` (a host path already resolved): one reader per path."""
    with _registry_lock:
        f = _followers.get(path)
        if f is None:
            f = _followers[path] = Follower(path)
        f.add(sub)


def unsubscribe(path: str, sub: Subscriber) -> None:
    with _registry_lock:
        f = _followers.get(path)
        if f is None:
            return
        if f.remove(sub):
            del _followers[path]


def kick(path: str) -> None:
    """A subscriber of `path` changed its due time from another thread (a finding with a hold added by
    the NVML event thread): the follower asks again at once, instead of after its current wait."""
    with _registry_lock:
        f = _followers.get(path)
    if f is not None:
        f.kick()


def readers() -> int:
    """Followers running now (tests: one per path, whatever the subscribers)."""
    with _registry_lock:
        return len(_followers)
