"""The latest observations: what /metrics renders and what state and policy read.

Checks' results and event sources' findings are published here, from the
scheduler's loop thread only. Readers take an immutable `Snapshot`; a scrape
never waits on a check. A check that failed or timed out keeps the findings of
its last completed run ("unknown never clears") and gains a CheckFailed or
CheckTimeout finding; its samples are dropped, since they would be stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from .findings import Finding, Observation, Sample, Severity


@dataclass(frozen=True, slots=True)
class CheckStatus:
    name: str
    observation: Observation | None = None  # last completed run
    ok: bool = False  # the last run completed (whatever it found)
    duration: float = 0.0
    finished_at: float = 0.0  # unix time
    error: Finding | None = None  # CheckFailed / CheckTimeout while it applies
    runs: int = 0
    failures: int = 0
    timeouts: int = 0
    skipped: int = 0
    stuck: bool = False
    known: tuple[tuple[str, str], ...] = ()  # (subject, reason) exported at 0

    @property
    def findings(self) -> tuple[Finding, ...]:
        held = self.observation.findings if self.observation else ()
        return held + ((self.error,) if self.error else ())

    @property
    def samples(self) -> tuple[Sample, ...]:
        return self.observation.samples if (self.observation and self.ok) else ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    generation: int
    checks: Mapping[str, CheckStatus]
    events: Mapping[str, tuple[Finding, ...]]  # event source → its active findings
    events_known: Mapping[str, tuple[tuple[str, str, str], ...]]  # event source → (check, subject, reason) at 0
    event_samples: Mapping[str, tuple[Sample, ...]]
    last_tick: float  # unix time of the scheduler loop's last iteration
    started: float
    extra: Mapping[str, tuple[Sample, ...]] = field(default_factory=dict)

    def findings(self) -> list[Finding]:
        out = [f for st in self.checks.values() for f in st.findings]
        out.extend(f for fs in self.events.values() for f in fs)
        return out

    def samples(self) -> Iterable[Sample]:
        for st in self.checks.values():
            yield from st.samples
        for ss in self.event_samples.values():
            yield from ss
        for ss in self.extra.values():
            yield from ss

    @property
    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings()), key=lambda s: s.rank, default=None)


Listener = Callable[[Snapshot], None]


class Store:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checks: dict[str, CheckStatus] = {}
        self._events: dict[str, tuple[Finding, ...]] = {}
        self._events_known: dict[str, tuple[tuple[str, str, str], ...]] = {}
        self._event_samples: dict[str, tuple[Sample, ...]] = {}
        self._extra: dict[str, tuple[Sample, ...]] = {}
        self._generation = 0
        self._last_tick = time.time()
        self._started = time.time()
        self._listeners: list[Listener] = []
        self._snapshot: Snapshot | None = None

    # -- writers (scheduler loop thread)

    def set_checks(self, names: Iterable[str], known: Mapping[str, tuple[tuple[str, str], ...]]) -> None:
        """The set of checks after start or a reload; statuses of kept checks survive."""
        names = list(names)
        with self._lock:
            self._checks = {
                n: replace(self._checks.get(n) or CheckStatus(n), known=known.get(n, ())) for n in names
            }
        self._changed()

    def update_check(self, name: str, fn: Callable[[CheckStatus], CheckStatus]) -> None:
        with self._lock:
            if name not in self._checks:
                return  # removed by a reload while it ran
            self._checks[name] = fn(self._checks[name])
        self._changed()

    def set_events(self, source: str, findings: Iterable[Finding], samples: Iterable[Sample] | None = None) -> None:
        with self._lock:
            self._events[source] = tuple(findings)
            if samples is not None:
                self._event_samples[source] = tuple(samples)
        self._changed()

    def set_sources(self, known: Mapping[str, tuple[tuple[str, str, str], ...]]) -> None:
        """The set of event sources after start or a reload, with their known findings."""
        with self._lock:
            self._events = {k: v for k, v in self._events.items() if k in known}
            self._event_samples = {k: v for k, v in self._event_samples.items() if k in known}
            self._events_known = dict(known)
        self._changed()

    def set_extra(self, source: str, samples: Iterable[Sample]) -> None:
        """Samples that are not tied to a check (traffic counters, API client stats)."""
        with self._lock:
            self._extra[source] = tuple(samples)
            self._snapshot = None

    def tick(self) -> None:
        with self._lock:
            self._last_tick = time.time()
            self._snapshot = None

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _changed(self) -> None:
        with self._lock:
            self._generation += 1
            self._snapshot = None
        snap = self.snapshot()
        for listener in list(self._listeners):
            listener(snap)

    # -- readers (any thread)

    def snapshot(self) -> Snapshot:
        with self._lock:
            if self._snapshot is None:
                self._snapshot = Snapshot(
                    generation=self._generation,
                    checks=MappingProxyType(dict(self._checks)),
                    events=MappingProxyType(dict(self._events)),
                    events_known=MappingProxyType(dict(self._events_known)),
                    event_samples=MappingProxyType(dict(self._event_samples)),
                    last_tick=self._last_tick,
                    started=self._started,
                    extra=MappingProxyType(dict(self._extra)),
                )
            return self._snapshot
