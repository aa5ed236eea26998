"""Values that flow from checks to state, policy, metrics and people.

A check returns an `Observation`: samples for metrics, findings (facts about
one subject each), and a one-line detail for every subject it looked at. A
finding with ``unknown=True`` means "cannot tell" (a probe error, a timeout,
a missing privilege): it is shown and exported, but it never moves node state.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    subject: str
    reason: str
    severity: Severity
    message: str
    unknown: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.check, self.subject, self.reason)

    def as_dict(self) -> dict[str, object]:
        return {
            "check": self.check,
            "subject": self.subject,
            "severity": self.severity.value,
            "reason": self.reason,
            "message": self.message,
            "unknown": self.unknown,
        }


@dataclass(frozen=True, slots=True)
class Sample:
    """One metric value. `name` must be in the metric catalog (`agent.catalog`)."""

    name: str
    value: float
    labels: Labels = ()


@dataclass(frozen=True, slots=True)
class Observation:
    samples: tuple[Sample, ...] = ()
    findings: tuple[Finding, ...] = ()
    subjects: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), key=lambda s: s.rank, default=None)


class ObservationBuilder:
    """What a check fills in during `run()`; `build()` freezes it."""

    def __init__(self, check: str) -> None:
        self.check = check
        self._samples: list[Sample] = []
        self._findings: list[Finding] = []
        self._subjects: dict[str, str] = {}

    def sample(self, name: str, value: float, **labels: str) -> None:
        self._samples.append(Sample(name, float(value), tuple(labels.items())))

    def finding(
        self, subject: str, reason: str, message: str, *, severity: Severity | None = None, unknown: bool | None = None
    ) -> Finding:
        """Record a finding; severity and unknown default to the reason's catalog entry."""
        from .catalog import finding

        f = finding(self.check, subject, reason, message, severity=severity, unknown=unknown)
        self._findings.append(f)
        self._subjects.setdefault(subject, "")
        return f

    def subject(self, subject: str, detail: str) -> None:
        """A subject that was looked at, with a short human detail ("12% used")."""
        self._subjects[subject] = detail

    def extend(self, other: Observation) -> None:
        self._samples.extend(other.samples)
        self._findings.extend(other.findings)
        for k, v in other.subjects.items():
            self._subjects.setdefault(k, v)

    def build(self) -> Observation:
        return Observation(tuple(self._samples), tuple(self._findings), MappingProxyType(dict(self._subjects)))


def worst_severity(findings: Iterable[Finding]) -> Severity | None:
    return max((f.severity for f in findings), key=lambda s: s.rank, default=None)
