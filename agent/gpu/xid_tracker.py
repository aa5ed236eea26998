"""One stream of Xid events from two sources, deduplicated, with the findings
it keeps active and the counters it exports.

Deduplication: NVML reports every Xid as an event and the driver prints the
same Xid to the kernel log. A new event matches a recent one (within
``dedupe_window``) for the same GPU and Xid that its source has not yet
matched; then it is the same event, seen twice. Each source pairs off one to
one, so three Xid 13 lines and three NVML events make three events, not one
or six. A ``GPU … has fallen off the bus`` line (or the driver's three-line
"… installed in this system has / fallen off the bus …" message) counts as
Xid 79 and pairs with the Xid 79 line and event. Records read from the ring
buffer at start (the backlog) happened before NVML events were registered, so
they never pair with NVML; among themselves they pair the same way (a
fallen-off-the-bus message with its Xid 79 line, one event), timed by the
kernel's record time rather than by when they are read, in a table of their own.

How (constant time per event, bounded memory, for Xid storms of thousands of
lines a second): per GPU and Xid, one queue per source of the times of the
sightings that source has not matched yet, oldest first. A new event takes
the oldest unexpired time from its own source's queue (a duplicate), or else
adds its time to the other sources' queues (a new event). That is the
pairing above exactly, as long as a queue holds at most `PAIR_DEPTH`
sightings: beyond that the oldest are forgotten, so when one source runs more
than `PAIR_DEPTH` events of one GPU and Xid ahead of the other within the
window, the excess is counted twice rather than lost. At most `MAX_KEYS`
GPU/Xid pairs are kept (those with nothing left to pair go first).

State (`to_json`): the kmsg cursor (last sequence number), the active
findings with their expiry and their latest event (CLOCK_MONOTONIC, valid
for the boot), the counters; the source saves it with the boot id, so a restart resumes and a
reboot starts afresh.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..findings import ACTION_TEXT, ACTIONS, Finding, Sample, Severity
from ..parsers.xid import KIND_DRIVER_LOADED, KIND_FALLEN_OFF_BUS, KIND_SXID, KIND_XID
from ..statedir import Damaged, integer, number, obj, seq, text
from .catalog import CATALOG
from .xid_catalog import (
    NVLINK5_XIDS,
    XID_FALLEN_OFF_BUS,
    XID_RECOVERY_ACTION,
    Verdict,
    classify,
    metric_label,
)

CHECK = "xid"
PAIR_DEPTH = 64  # unmatched sightings kept per GPU, Xid and source
MAX_KEYS = 4096  # GPU/Xid pairs with sightings kept
_SOURCES = ("kmsg", "nvml")
_SOURCES_79 = ("kmsg", "nvml", "kmsg-fallen")  # a fallen-off-the-bus line is a third sighting of Xid 79
_BACKLOG_79 = ("kmsg", "kmsg-fallen")  # what pairs in the backlog: no NVML events were registered then
_MESSAGE_XIDS = NVLINK5_XIDS | {XID_RECOVERY_ACTION}  # Xids whose verdict depends on the line's text, as SXids' does
_NVLINK5_REASONS = frozenset(f"Xid{x}" for x in NVLINK5_XIDS)
_SAVED_NONFATAL = re.compile(r"\bNonfatal\s+XC[01]\b")  # "<unit> Nonfatal XC0 i0 Link …" in a saved message


class Event(NamedTuple):
    source: str  # "kmsg" | "nvml"
    kind: int
    xid: int
    pci: str  # normalised; "" when unknown
    message: str
    at: float  # CLOCK_MONOTONIC when it happened (start of its hold)
    backlog: bool = False


@dataclass
class Active:
    severity: Severity
    message: str
    action: str
    until: float | None  # None: until reboot
    count: int = 1
    last: float = 0.0  # CLOCK_MONOTONIC of its latest event (0: not known, saved by an older agent)


class XidStream:
    def __init__(
        self,
        *,
        dedupe_window: float,
        app_hold: float,
        coverage_hold: float,
        overrides: Mapping[int, Severity],
        subject_of: Callable[[str, int], tuple[str, str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window, self.app_hold, self.coverage_hold = dedupe_window, app_hold, coverage_hold
        self.overrides, self.subject_of, self.clock = overrides, subject_of, clock
        self.active: dict[tuple[str, str], Active] = {}
        self.resets: dict[str, float] = {}  # subject -> CLOCK_MONOTONIC of its latest verified reset
        # (pci, xid) -> source -> times of the sightings that source has not matched yet
        self.unmatched: dict[tuple[str, int], dict[str, deque[float]]] = {}
        # the same for backlog records, timed by their record time: a fallen-off-the-bus line with its Xid 79 line
        self.unmatched_backlog: dict[tuple[str, int], dict[str, deque[float]]] = {}
        self._verdicts: dict[tuple[int, int], Verdict | None] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self.source_events: dict[str, int] = {"kmsg": 0, "nvml": 0}
        self.cursor: int | None = None
        self.records_read = self.lost = self.gaps = 0
        self.not_kernel = 0  # NVIDIA-looking events in records a process wrote (not facility kern)
        self.coverage_until = 0.0
        self.coverage_message = ""

    # ------------------------------------------------------------ input

    def record_seq(self, seq: int) -> bool:
        """Accounts one kmsg sequence number; False when it was processed before."""
        if self.cursor is not None and seq <= self.cursor:
            return False
        expected = 0 if self.cursor is None else self.cursor + 1
        if seq > expected:
            self.lost += seq - expected
            self.gaps += 1
            self.coverage_until = self.clock() + self.coverage_hold
            self.coverage_message = (
                f"{seq - expected} kernel log records (seq {expected}..{seq - 1}) were overwritten before the agent "
                f"read them; Xids among them are missed ({self.lost} lost this boot)"
            )
        self.cursor = seq
        return True

    def add(self, ev: Event) -> bool:
        """Takes one event; True when it changed the findings or counters."""
        self.source_events[ev.source] = self.source_events.get(ev.source, 0) + 1
        if ev.kind == KIND_DRIVER_LOADED:
            return self._driver_loaded()
        verdict = self._verdict(ev)
        if verdict is None:
            return False
        subject, gpu = self.subject_of(ev.pci, ev.kind)
        if self._duplicate(ev, verdict.xid):
            old = self.active.get((subject, verdict.reason))
            if old is not None and verdict.xid in _MESSAGE_XIDS:
                # The kernel's line grades what NVML's event could not (144-150: Fatal or Nonfatal; 154: the action).
                _merge(old, verdict, None if verdict.sticky else ev.at + self.app_hold)
            if ev.source == "kmsg" and old is not None:
                old.message = f"{verdict.title}: {ev.message} (action: {ACTION_TEXT[old.action]})"
            return True
        if verdict.reason.startswith("Xid"):
            key = (gpu, metric_label(verdict.xid))
            self.counts[key] = self.counts.get(key, 0) + 1
        until = None if verdict.sticky else ev.at + self.app_hold
        if until is not None and until <= self.clock():
            return True  # an application Xid from the backlog whose hold is long over: counted only
        if verdict.action == "reset_gpu" and ev.at <= self.resets.get(subject, -1.0):
            return True  # before a verified reset of its GPU (a backlog read again): counted only
        msg = f"{verdict.title}: {ev.message} (action: {ACTION_TEXT[verdict.action]})"
        old = self.active.get((subject, verdict.reason))
        if old is not None:
            _merge(old, verdict, until)
            msg = f"{verdict.title}: {ev.message} (action: {ACTION_TEXT[old.action]})"
            old.message, old.count, old.last = msg, old.count + 1, max(old.last, ev.at)
        else:
            self.active[(subject, verdict.reason)] = Active(verdict.severity, msg, verdict.action, until, last=ev.at)
        return True

    def _verdict(self, ev: Event) -> Verdict | None:
        """`classify`, remembered per kind and Xid where the message does not change it."""
        if ev.kind == KIND_SXID or (ev.kind == KIND_XID and ev.xid in _MESSAGE_XIDS):
            return classify(ev.kind, ev.xid, ev.message, self.overrides)
        key = (ev.kind, ev.xid)
        v = self._verdicts.get(key, False)
        if v is False:
            if len(self._verdicts) >= MAX_KEYS:
                self._verdicts.clear()
            v = self._verdicts[key] = classify(ev.kind, ev.xid, ev.message, self.overrides)
        return v  # type: ignore[return-value]

    def _duplicate(self, ev: Event, xid: int) -> bool:
        if not ev.pci:
            return False
        token = "kmsg-fallen" if ev.kind == KIND_FALLEN_OFF_BUS else ev.source
        if ev.backlog:
            # Only the kernel log has a backlog: its Xid 79 line and its fallen-off-the-bus message pair.
            if xid != XID_FALLEN_OFF_BUS or token not in _BACKLOG_79:
                return False
            return self._pair(self.unmatched_backlog, (ev.pci, xid), token, _BACKLOG_79, ev.at)
        others = _SOURCES_79 if xid == XID_FALLEN_OFF_BUS else _SOURCES
        return self._pair(self.unmatched, (ev.pci, xid), token, others, self.clock())

    def _pair(
        self,
        table: dict[tuple[str, int], dict[str, deque[float]]],
        key: tuple[str, int],
        token: str,
        sources: tuple[str, ...],
        now: float,
    ) -> bool:
        waiting = table.get(key)
        if waiting is None:
            if len(table) >= MAX_KEYS:
                self._prune(now, table)
            waiting = table[key] = {}
        else:
            mine = waiting.get(token)
            if mine:
                while mine and now - mine[0] > self.window:
                    mine.popleft()
                if mine:
                    mine.popleft()  # the oldest sighting this source had not matched: the same event
                    return True
        for other in sources:
            if other != token:
                q = waiting.get(other)
                if q is None:
                    q = waiting[other] = deque(maxlen=PAIR_DEPTH)
                q.append(now)
        return False

    def _prune(self, now: float, table: dict[tuple[str, int], dict[str, deque[float]]] | None = None) -> None:
        """Makes room for a new GPU/Xid pair: drops those with nothing left to
        pair within the window, else the oldest half (insertion order)."""
        table = self.unmatched if table is None else table
        stale = [k for k, w in table.items() if not any(q and now - q[-1] <= self.window for q in w.values())]
        for k in stale:
            del table[k]
        if len(table) >= MAX_KEYS:
            for k in list(table)[: MAX_KEYS // 2]:
                del table[k]

    def _driver_loaded(self) -> bool:
        # A driver (re)load resets every GPU: what needed a GPU reset is done.
        gone = [k for k, a in self.active.items() if a.action == "reset_gpu"]
        for k in gone:
            del self.active[k]
        return bool(gone)

    def forget_reset(self, subject: str, at: float) -> list[str]:
        """A verified reset of the GPU `subject` at `at` (CLOCK_MONOTONIC, agent.gpu.resets): its
        findings whose action is reset_gpu and whose last event came before then are cured. An Xid
        after the reset counts again; one from before it that is read later (the backlog read again
        after a restart) does not. The reasons dropped."""
        self.resets[subject] = max(at, self.resets.get(subject, at))
        gone = [k for k, a in self.active.items() if k[0] == subject and a.action == "reset_gpu" and a.last <= at]
        for k in gone:
            del self.active[k]
        return [r for _, r in gone]

    def next_expiry(self) -> float | None:
        """When the first held finding (or the coverage warning) ends, on `clock`; None: nothing ends."""
        ends = [a.until for a in self.active.values() if a.until is not None]
        if self.coverage_message:
            ends.append(self.coverage_until)
        return min(ends, default=None)

    def expire(self) -> bool:
        now = self.clock()
        gone = [k for k, a in self.active.items() if a.until is not None and a.until <= now]
        for k in gone:
            del self.active[k]
        if self.coverage_message and self.coverage_until <= now:
            self.coverage_message = ""
            return True
        return bool(gone)

    # ------------------------------------------------------------ output

    def findings(self) -> list[Finding]:
        out = [
            CATALOG.finding(CHECK, subject, reason, a.message + (f" [{a.count} events]" if a.count > 1 else ""),
                            severity=a.severity, action=a.action)
            for (subject, reason), a in sorted(self.active.items())
        ]
        if self.coverage_message:
            out.append(CATALOG.finding(CHECK, "kmsg", "KmsgCoverageLost", self.coverage_message))
        return out

    def samples(self) -> list[Sample]:
        out = [Sample("node_health_gpu_xid_errors_total", n, (("gpu", g), ("xid", x))) for (g, x), n in sorted(self.counts.items())]
        out += [Sample("node_health_gpu_xid_source_events_total", n, (("source", s),)) for s, n in sorted(self.source_events.items())]
        out.append(Sample("node_health_kmsg_records_read_total", self.records_read))
        out.append(Sample("node_health_kmsg_records_lost_total", self.lost))
        out.append(Sample("node_health_kmsg_gaps_total", self.gaps))
        out.append(Sample("node_health_kmsg_not_kernel_events_total", self.not_kernel))
        return out

    # ------------------------------------------------------------ persistence

    def to_json(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "active": [[s, r, a.severity.value, a.message, a.action, a.until, a.count, a.last]
                       for (s, r), a in self.active.items()],
            "counts": [[g, x, n] for (g, x), n in self.counts.items()],
            "lost": self.lost,
            "gaps": self.gaps,
            "not_kernel": self.not_kernel,
            "coverage": [self.coverage_until, self.coverage_message],
        }

    def load_json(self, data: Mapping[str, Any]) -> None:
        """Restores what `to_json` wrote (validated by `check_saved`)."""
        self.cursor = data.get("cursor")
        for s, r, sev, msg, action, until, count, *last in data.get("active", []):
            at = last[0] if last else 0.0
            if r in _NVLINK5_REASONS and action == "reset_gpu" and _SAVED_NONFATAL.search(msg):
                # Saved by an agent before 144-150 were graded by the line: a Nonfatal one asks for nothing.
                action, until = "none", (at or self.clock()) + self.app_hold
            self.active[(s, r)] = Active(Severity(sev), msg, action, until, count, at)
        self.counts = {(g, x): n for g, x, n in data.get("counts", [])}
        self.lost, self.gaps = data.get("lost", 0), data.get("gaps", 0)
        self.not_kernel = data.get("not_kernel", 0)
        self.coverage_until, self.coverage_message = data.get("coverage", [0.0, ""])


def _merge(old: Active, verdict: Verdict, until: float | None) -> None:
    """One more event for an active finding: the worse severity, the stronger action
    (later in ACTIONS), and the longer hold."""
    old.severity = max(old.severity, verdict.severity, key=lambda s: s.rank)
    old.action = max(old.action, verdict.action, key=ACTIONS.index)
    old.until = None if old.until is None or until is None else max(old.until, until)


def check_saved(raw: Any) -> dict[str, Any]:
    """`raw` if it has the shape `XidStream.to_json` writes; raises state.Damaged."""
    d = obj(raw, "stream")
    if d.get("cursor") is not None:
        integer(d["cursor"], "stream.cursor")
    for i, row in enumerate(seq(d.get("active", []), "stream.active")):
        s, r, sev, msg, action, until, count, *last = _row(row, (7, 8), f"stream.active[{i}]")  # 7: before `last`
        for value, what in ((s, "subject"), (r, "reason"), (msg, "message"), (action, "action")):
            text(value, f"stream.active[{i}].{what}")
        Severity(text(sev, f"stream.active[{i}].severity"))
        integer(count, f"stream.active[{i}].count")
        if until is not None:
            number(until, f"stream.active[{i}].until")
        for value in last:
            number(value, f"stream.active[{i}].last")
    for i, row in enumerate(seq(d.get("counts", []), "stream.counts")):
        gpu, xid, n = _row(row, 3, f"stream.counts[{i}]")
        text(gpu, f"stream.counts[{i}].gpu")
        text(xid, f"stream.counts[{i}].xid")
        integer(n, f"stream.counts[{i}].count")
    integer(d.get("lost", 0), "stream.lost")
    integer(d.get("gaps", 0), "stream.gaps")
    integer(d.get("not_kernel", 0), "stream.not_kernel")
    until, message = _row(d.get("coverage", [0.0, ""]), 2, "stream.coverage")
    number(until, "stream.coverage[0]")
    text(message, "stream.coverage[1]")
    return d


def _row(value: Any, n: int | tuple[int, ...], where: str) -> list[Any]:
    row = seq(value, where)
    ns = n if isinstance(n, tuple) else (n,)
    if len(row) not in ns:
        raise Damaged(f"{where}: expected {' or '.join(map(str, ns))} fields, got {len(row)}")
    return row
