"""Kernel-log faults counted per pattern, with the findings they keep active.

Per pattern: the count this boot (the metric), the times of its last
`threshold` matches (a finding needs `threshold` of them within `window`),
and the active finding with the time it expires (None: until the node
reboots). Times are CLOCK_MONOTONIC, valid for the boot; the source saves
the state with the boot id, so a restart neither re-fires nor forgets and a
reboot starts afresh. Memory is bounded by the table: at most `threshold`
times per pattern.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..findings import Finding, Sample
from ..statedir import integer, number, obj, seq, text
from .catalog import FaultPattern
from .patterns import Table

CHECK = "kernel-log"
MAX_MESSAGE = 300  # characters of the matched message kept in a finding


@dataclass
class Active:
    message: str
    until: float | None  # None: until the node reboots
    count: int  # matches while active


class FaultTracker:
    def __init__(self, table: Table, clock: Callable[[], float] = time.monotonic) -> None:
        self.table, self.clock = table, clock
        self.cursor: int | None = None
        self.counts: dict[str, int] = {}
        self.recent: dict[str, deque[float]] = {}
        self.active: dict[str, Active] = {}
        self.not_kernel = 0

    def record_seq(self, seq: int) -> bool:
        """False when the record was processed before (a restart in the same boot)."""
        if self.cursor is not None and seq <= self.cursor:
            return False
        self.cursor = seq
        return True

    def add(self, p: FaultPattern, message: bytes, at: float) -> bool:
        """One match of `p` at `at`; True (the counters changed, maybe the findings)."""
        self.counts[p.name] = self.counts.get(p.name, 0) + 1
        times = self.recent.get(p.name)
        if times is None:
            times = self.recent[p.name] = deque(maxlen=p.threshold)
        times.append(at)
        if len(times) < p.threshold or at - times[0] > p.window:
            return True
        until = None if p.hold is None else at + p.hold
        if until is not None and until <= self.clock():
            return True  # from the backlog, its hold long over: counted only
        text_ = message.decode("utf-8", "replace")[:MAX_MESSAGE]
        old = self.active.get(p.name)
        count = old.count + 1 if old else len(times)
        if old is not None and old.until is None:
            until = None
        self.active[p.name] = Active(text_, until, count)
        return True

    def next_expiry(self) -> float | None:
        """When the first held fault ends (on `clock`); None when none is held for a time."""
        return min((a.until for a in self.active.values() if a.until is not None), default=None)

    def expire(self) -> bool:
        now = self.clock()
        gone = [name for name, a in self.active.items() if a.until is not None and a.until <= now]
        for name in gone:
            del self.active[name]
        return bool(gone)

    def findings(self) -> list[Finding]:
        out = []
        for name, a in sorted(self.active.items()):
            p = self.table.by_name.get(name)
            if p is None:  # a pattern the operator removed since the state was saved
                continue
            more = f" ({a.count} matches)" if a.count > 1 else ""
            out.append(self.table.catalog.finding(CHECK, name, p.reason, f"{a.message}{more}", severity=p.severity, action=p.action))
        return out

    def samples(self) -> list[Sample]:
        out = [Sample("node_health_kernel_faults_total", float(self.counts.get(p.name, 0)), (("fault", p.name),))
               for p in self.table.patterns]
        out.append(Sample("node_health_kernel_faults_not_kernel_total", float(self.not_kernel)))
        return out

    # ------------------------------------------------------------ state

    def to_json(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "counts": self.counts,
            "recent": {k: list(v) for k, v in self.recent.items()},
            "active": {k: {"message": a.message, "until": a.until, "count": a.count} for k, a in self.active.items()},
            "not_kernel": self.not_kernel,
        }

    def load_json(self, d: dict[str, Any]) -> None:
        self.cursor = d["cursor"]
        self.counts = {k: v for k, v in d["counts"].items() if k in self.table.by_name}
        for k, times in d["recent"].items():
            p = self.table.by_name.get(k)
            if p is not None:
                self.recent[k] = deque(times[-p.threshold:], maxlen=p.threshold)
        self.active = {k: Active(**a) for k, a in d["active"].items() if k in self.table.by_name}
        self.not_kernel = d["not_kernel"]


def check_saved(raw: Any) -> dict[str, Any]:
    """The saved tracker state, validated (`Damaged` when it is not)."""
    d = obj(raw)
    cursor = d["cursor"]
    if cursor is not None:
        integer(cursor, "cursor")
    counts = {text(k, "counts"): integer(v, "counts") for k, v in obj(d["counts"]).items()}
    recent = {}
    for k, times in obj(d["recent"]).items():
        recent[text(k, "recent")] = [number(t, "recent") for t in seq(times, "recent")]
    active = {}
    for k, a in obj(d["active"]).items():
        a = obj(a)
        until = a["until"]
        active[text(k, "active")] = {
            "message": text(a["message"], "message"),
            "until": None if until is None else number(until, "until"),
            "count": integer(a["count"], "count"),
        }
    return {"cursor": cursor, "counts": counts, "recent": recent, "active": active,
            "not_kernel": integer(d["not_kernel"], "not_kernel")}
