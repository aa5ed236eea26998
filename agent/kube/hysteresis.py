"""When a finding counts: hysteresis per finding key, persisted.

A finding key (check, subject, reason) becomes *active* when a critical
finding is seen once, or a warning is reported by `raise_cycles` consecutive
runs of its check or continuously for `raise_after`; it is released when it
has been absent for `clear_cycles` consecutive runs or `clear_after`. Only
definite results move a key: while its check has not completed a run since
start, has failed or timed out (the store keeps the last run's findings and
adds CheckFailed/CheckTimeout, subject = the check), or reports an unknown
finding for the key's subject, the key's state is held and its counting starts
over. The active set is what survives a restart (`to_json`/`from_json`); the
counters of pending changes do not, which can only delay a change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..catalog import Catalog
from ..findings import Finding, Severity
from ..statedir import number, text
from ..store import Snapshot
from .families import is_gate
from .settings import HysteresisSection

Key = tuple[str, str, str]  # (check, subject, reason)
ALL = "*"  # held subjects: the whole origin (check failed, not run yet)


@dataclass(slots=True)
class Active:
    check: str
    subject: str
    reason: str
    severity: Severity
    message: str
    since: float  # unix time it became active
    origin: str  # the check or event source that reported it

    @property
    def key(self) -> Key:
        return (self.check, self.subject, self.reason)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check, "subject": self.subject, "reason": self.reason, "severity": self.severity.value,
            "message": self.message, "since": self.since, "origin": self.origin,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Active:
        """What `to_json` wrote; raises state.Damaged (or ValueError) for another shape."""
        check = text(d["check"], "check")
        return cls(
            check, text(d["subject"], "subject"), text(d["reason"], "reason"), Severity(text(d["severity"], "severity")),
            text(d.get("message", ""), "message"), number(d.get("since", 0.0), "since"), text(d.get("origin") or check, "origin"),
        )


@dataclass(slots=True)
class Report:
    """What one check or event source says right now."""

    findings: dict[Key, Finding] = field(default_factory=dict)  # definite, warning or worse
    held: set[str] = field(default_factory=set)  # subjects it cannot tell about (ALL: every subject)
    run: int | None = None  # completed runs of a check (None: a pushed source)

    def holds(self, subject: str) -> bool:
        return ALL in self.held or subject in self.held


@dataclass(slots=True)
class _Count:
    first: float  # monotonic time of the first sighting
    cycles: int
    run: int | None
    origin: str = ""


@dataclass(frozen=True, slots=True)
class Transition:
    kind: str  # "raised" | "cleared"
    finding: Active


def reports(snap: Snapshot, exclude: Iterable[str] = ()) -> dict[str, Report]:
    """Per check and event source, the definite findings and the held subjects."""
    skip = set(exclude)
    out: dict[str, Report] = {}
    for name, st in snap.checks.items():
        if name in skip:
            continue
        rep = Report(run=st.runs)
        if st.observation is None or st.error is not None:
            rep.held.add(ALL)
        _fill(rep, st.findings, name)
        out[name] = rep
    for name in snap.events_known:
        if name in skip:
            continue
        rep = Report()
        if name not in snap.events:
            rep.held.add(ALL)
        _fill(rep, snap.events.get(name, ()), name)
        out[name] = rep
    return out


def wake_key(snap: Snapshot, exclude: Iterable[str], counted: frozenset[str] | None) -> tuple[object, ...]:
    """What of `snap` a reconciler step reads: every origin's report, with its run count only where
    `counted` (None: everywhere) says runs are being counted, and the findings each check and event
    source can report (the watched families). Two snapshots with equal keys step alike, so a check
    result that leaves the key as it was (nearly all of them) need not wake the actuator."""
    skip = set(exclude)
    reps = tuple(
        (name, rep.findings, rep.held, rep.run if counted is None or name in counted else None)
        for name, rep in reports(snap, skip).items()
    )
    known = tuple((name, st.known) for name, st in snap.checks.items() if name not in skip)
    events = tuple((name, triples) for name, triples in snap.events_known.items() if name not in skip)
    return reps, known, events


def _fill(rep: Report, findings: Iterable[Finding], origin: str) -> None:
    for f in findings:
        if f.unknown:
            rep.held.add(ALL if f.subject == origin else f.subject)
        elif f.severity.rank >= Severity.WARNING.rank:
            rep.findings[f.key] = f


class Hysteresis:
    def __init__(self, cfg: HysteresisSection, catalog: Catalog, active: Iterable[Active] = ()) -> None:
        self.cfg = cfg
        self.catalog = catalog  # which reasons are gates
        self.active: dict[Key, Active] = {a.key: a for a in active}
        self._raising: dict[Key, _Count] = {}
        self._clearing: dict[Key, _Count] = {}

    # ------------------------------------------------------------ persistence

    def to_json(self) -> list[dict[str, Any]]:
        return [a.to_json() for a in sorted(self.active.values(), key=lambda a: a.key)]

    @classmethod
    def from_json(cls, cfg: HysteresisSection, catalog: Catalog, data: Iterable[Mapping[str, Any]]) -> Hysteresis:
        return cls(cfg, catalog, (Active.from_json(d) for d in data))

    # ------------------------------------------------------------ evaluation

    def observe(self, reps: Mapping[str, Report], now: float, wall: float) -> tuple[list[Transition], bool]:
        """Advance every key; return the transitions and whether the persisted part changed."""
        out: list[Transition] = []
        changed = False
        for origin, rep in reps.items():
            for key, f in rep.findings.items():
                if rep.holds(key[1]):
                    self._forget(key)
                elif key in self.active:
                    changed |= self._refresh(self.active[key], f)
                    self._clearing.pop(key, None)
                elif self._raise_due(key, f, rep, origin, now):
                    a = Active(*key, f.severity, f.message, wall, origin)
                    self.active[key] = a
                    self._raising.pop(key, None)
                    out.append(Transition("raised", a))
        for key, c in list(self._raising.items()):
            seen = reps.get(c.origin)
            if seen is None or (key not in seen.findings and not seen.holds(key[1])):
                del self._raising[key]  # raising needs consecutive sightings
        for key, a in list(self.active.items()):
            seen = reps.get(a.origin)
            if seen is not None and seen.holds(a.subject):
                self._clearing.pop(key, None)
            elif seen is None or key not in seen.findings:
                if self._clear_due(key, seen, now):
                    del self.active[key]
                    self._clearing.pop(key, None)
                    out.append(Transition("cleared", a))
        return out, changed or bool(out)

    def _refresh(self, a: Active, f: Finding) -> bool:
        changed = a.severity is not f.severity or a.message != f.message
        a.severity, a.message = f.severity, f.message
        return changed

    def _forget(self, key: Key) -> None:
        self._raising.pop(key, None)
        self._clearing.pop(key, None)

    def _raise_due(self, key: Key, f: Finding, rep: Report, origin: str, now: float) -> bool:
        if f.severity is Severity.CRITICAL or is_gate(f.reason, self.catalog):
            return True
        c = self._count(self._raising, key, rep, now)
        c.origin = origin
        return c.cycles >= self.cfg.raise_cycles or now - c.first >= self.cfg.raise_after

    def _clear_due(self, key: Key, rep: Report | None, now: float) -> bool:
        if is_gate(key[2], self.catalog):  # a gate (preflight) that passed releases the node at once
            return True
        c = self._count(self._clearing, key, rep, now)
        return c.cycles >= self.cfg.clear_cycles or now - c.first >= self.cfg.clear_after

    @staticmethod
    def _count(table: dict[Key, _Count], key: Key, rep: Report | None, now: float) -> _Count:
        run = rep.run if rep is not None else None
        c = table.get(key)
        if c is None:
            c = table[key] = _Count(first=now, cycles=1, run=run)
        elif run is not None and run != c.run:
            c.cycles += 1
            c.run = run
        return c

    def counting(self) -> frozenset[str]:
        """The origins whose next run moves a count: a warning on its way to active, an active
        finding on its way to cleared. Another origin's run that reports the same is no news."""
        origins = {c.origin for c in self._raising.values()}
        origins.update(self.active[key].origin for key in self._clearing if key in self.active)
        return frozenset(origins)

    def next_deadline(self) -> float | None:
        """The monotonic time at which a time rule could next fire, if any."""
        times = [c.first + self.cfg.raise_after for c in self._raising.values()]
        times += [c.first + self.cfg.clear_after for c in self._clearing.values()]
        return min(times, default=None)
