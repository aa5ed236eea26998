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
from typing import Protocol


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}

Labels = tuple[tuple[str, str], ...]

# What a finding asks of the node (the remediation ladder acts on it): each reason
# of the catalog declares one, and a finding may name another for itself (NVML's
# recovery action, Xid 154). Kept as strings so that state files stay plain JSON.
ACTIONS: tuple[str, ...] = ("none", "restart_app", "reset_gpu", "reboot", "drain_and_diagnose", "rma")
ACTION_TEXT: Mapping[str, str] = MappingProxyType({
    "none": "no action",
    "restart_app": "restart the application",
    "reset_gpu": "drain the node and reset the GPU",
    "reboot": "drain the node and reboot it",
    "drain_and_diagnose": "drain the node and run diagnostics (dcgmi diag -r 3, field diagnostics)",
    "rma": "drain the node and replace the GPU (RMA)",
})


def gpu_of(subject: str) -> str:
    """The NVML index a GPU subject names ("gpu3" -> "3", the value of the ``gpu`` label of every GPU
    series), "" for any other subject ("gpus", "pci-0000:18:00", "nvswitch-…", "/data", "eth0")."""
    if subject.startswith("gpu") and subject[3:].isdigit() and subject[3:].isascii():
        return subject[3:]
    return ""


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    subject: str
    reason: str
    severity: Severity
    message: str
    unknown: bool = False
    action: str = "none"  # one of ACTIONS: what the finding asks of the node

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.check, self.subject, self.reason)

    @property
    def gpu(self) -> str:
        """`gpu_of` its subject: the NVML index of the GPU it is about, "" when it is about no one GPU."""
        return gpu_of(self.subject)

    def as_dict(self) -> dict[str, object]:
        return {
            "check": self.check,
            "subject": self.subject,
            "severity": self.severity.value,
            "reason": self.reason,
            "message": self.message,
            "unknown": self.unknown,
            "action": self.action,
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


class Findings(Protocol):
    """Where a builder makes its findings (an `agent.catalog.Catalog`: the one factory)."""

    def finding(
        self, check: str, subject: str, reason: str, message: str, *,
        severity: Severity | None = None, unknown: bool | None = None, action: str | None = None,
    ) -> Finding: ...


class ObservationBuilder:
    """What a check fills in during `run()`; `build()` freezes it."""

    def __init__(self, check: str, catalog: Findings) -> None:
        self.check = check
        self.catalog = catalog
        self._samples: list[Sample] = []
        self._findings: list[Finding] = []
        self._subjects: dict[str, str] = {}

    def sample(self, name: str, value: float, **labels: str) -> None:
        self._samples.append(Sample(name, float(value), tuple(labels.items())))

    def finding(
        self, subject: str, reason: str, message: str, *,
        severity: Severity | None = None, unknown: bool | None = None, action: str | None = None,
    ) -> Finding:
        """Record a finding; severity, unknown and action default to the reason's catalog entry."""
        f = self.catalog.finding(self.check, subject, reason, message, severity=severity, unknown=unknown, action=action)
        self._findings.append(f)
        self._subjects.setdefault(subject, "")
        return f

    def subject(self, subject: str, detail: str) -> None:
        """A subject that was looked at, with a short human detail ("12% used")."""
        self._subjects[subject] = detail

    def add(self, f: Finding) -> None:
        """Record a finding made elsewhere, under its own check name (an event source's findings that a
        single pass reports in the check's place: the Xid and kernel-log scans of `agent selftest`)."""
        self._findings.append(f)
        self._subjects.setdefault(f.subject, "")

    def extend(self, other: Observation) -> None:
        self._samples.extend(other.samples)
        self._findings.extend(other.findings)
        for k, v in other.subjects.items():
            self._subjects.setdefault(k, v)

    def build(self) -> Observation:
        return Observation(tuple(self._samples), tuple(self._findings), MappingProxyType(dict(self._subjects)))


def worst_severity(findings: Iterable[Finding]) -> Severity | None:
    return max((f.severity for f in findings), key=lambda s: s.rank, default=None)
