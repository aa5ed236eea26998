"""The catalog of finding reasons and metric names.

Every reason a check can emit and every metric the agent can export is
declared: the agent's own here (`CORE_REASONS`, `CORE_METRICS`), each
feature's in its ``agent/<feature>/catalog.py`` (`REASONS`, `METRICS`, and its
`Catalog` of them plus the core ones). `agent.registry` merges them into the
one `Catalog` of the application, which is passed to the scheduler, the
metrics renderer and the policy; a test builds its own. A test fails when
code emits a name that is not declared, and the README's reference tables are
generated from it (`agent docs`), so catalog, code and docs cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from .findings import ACTIONS, Finding, Observation, Sample, Severity

MetricKind = Literal["gauge", "counter"]

@dataclass(frozen=True, slots=True)
class Reason:
    name: str
    severity: Severity
    summary: str
    unknown: bool = False  # "cannot tell": shown and exported, never moves node state
    family: str = "Agent"  # problem family: one node condition type per family
    action: str = "none"  # what a finding of this reason asks of the node (agent.findings.ACTIONS)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()


CORE_REASONS: tuple[Reason, ...] = (
    Reason("CheckFailed", Severity.WARNING, "The check raised an error; its subjects are unknown.", unknown=True),
    Reason(
        "CheckTimeout",
        Severity.WARNING,
        "The check ran past its timeout; it is not started again until the stuck run returns.",
        unknown=True,
    ),
    Reason(
        "InsufficientPrivilege",
        Severity.INFO,
        "The agent lacks a privilege the check needs (the message names it); nothing is reported for that subject.",
        unknown=True,
    ),
    Reason("NotApplicable", Severity.INFO, "The hardware or feature the check looks at is not present here."),
)

CORE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_build_info",
        "gauge",
        "Always 1; labels say the version, whether native parsers are in use, and the Python version.",
        ("version", "native", "python"),
    ),
    MetricSpec(
        "node_health_native_fallback_total",
        "counter",
        "Calls of a native parser that its Python twin answered (a string held a NUL byte); 0 when all ran natively.",
        ("parser",),
    ),
    MetricSpec("node_health_start_time_seconds", "gauge", "Unix time the agent started."),
    MetricSpec("node_health_check_success", "gauge", "1 if the check's last run completed (whatever it found), 0 if it failed or timed out.", ("check",)),
    MetricSpec("node_health_check_duration_seconds", "gauge", "Duration of the check's last completed run.", ("check",)),
    MetricSpec(
        "node_health_check_last_run_timestamp_seconds", "gauge", "Unix time the check's last run completed.", ("check",)
    ),
    MetricSpec("node_health_check_runs_total", "counter", "Completed runs of the check.", ("check",)),
    MetricSpec("node_health_check_failures_total", "counter", "Runs of the check that raised an error.", ("check",)),
    MetricSpec("node_health_check_timeouts_total", "counter", "Runs of the check that passed their timeout.", ("check",)),
    MetricSpec(
        "node_health_check_skipped_total",
        "counter",
        "Times the check was due but not started because its previous run is still stuck.",
        ("check",),
    ),
    MetricSpec("node_health_check_stuck", "gauge", "1 while a run of the check is past its timeout and still running.", ("check",)),
    MetricSpec(
        "node_health_finding",
        "gauge",
        "1 for each active finding, 0 for a known finding that is not active; check: the check or its event "
        "source (xid, kernel-log); gpu: the GPU's index when the subject is one GPU (gpu<N>), else empty.",
        ("check", "subject", "reason", "severity", "gpu"),
    ),
    MetricSpec(
        "node_health_scheduler_last_tick_timestamp_seconds",
        "gauge",
        "Unix time of the scheduler loop's last iteration (/healthz fails when it stalls).",
    ),
    MetricSpec(
        "node_health_config_reloads_total", "counter", "Configuration reloads (SIGHUP) by result.", ("result",)
    ),
    MetricSpec(
        "node_health_render_dropped_total",
        "counter",
        "Samples and findings a /metrics render skipped because the catalog does not declare their metric, "
        "labels or reason (the log names each once); every other series is still served.",
    ),
    MetricSpec(
        "node_health_config_last_reload_successful", "gauge", "1 if the last configuration reload succeeded."
    ),
    # The per-link NVLink families folded per GPU at render ([metrics] nvlink_per_link = false, the default).
    MetricSpec("node_health_gpu_nvlink_links_active", "gauge", "NVLinks of the GPU that are active (node_health_gpu_nvlink_up summed over its links).", ("gpu",)),
    MetricSpec(
        "node_health_gpu_nvlink_gpu_errors_total", "counter",
        "NVLink data-link error counters of the GPU, summed over its links (replay, recovery, crc_flit, crc_data).", ("gpu", "counter"),
    ),
    MetricSpec(
        "node_health_gpu_nvlink_gpu_bytes_total", "counter",
        "NVLink data bytes of the GPU, summed over its links, transmitted and received.", ("gpu", "direction"),
    ),
    MetricSpec(
        "node_health_state_file_rejected_total",
        "counter",
        "State files found damaged (empty, cut short, not JSON, of another shape) and set aside as <file>.bad-<time>.",
        ("file",),
    ),
    MetricSpec(
        "node_health_state_file_ignored_total",
        "counter",
        "State files found unreadable (permission, I/O error, not a file) and left in place, ignored: counted "
        "once each time it begins, not on every read.",
        ("file",),
    ),
)


@dataclass(frozen=True)
class Catalog:
    """Reasons and metrics by name: what may be emitted, with its severity, family, help and labels."""

    reasons: Mapping[str, Reason]
    metrics: Mapping[str, MetricSpec]

    @classmethod
    def declare(cls, reasons: Iterable[Reason] = (), metrics: Iterable[MetricSpec] = ()) -> Catalog:
        """The core entries and these (a feature's `REASONS` and `METRICS`)."""
        return cls.merge(_CORE, _of(reasons, metrics))

    def configurable(self) -> Catalog:
        """This catalog, plus the reasons a configuration names (`configure`): the daemon's one catalog,
        which every holder of it sees change on a reload."""
        return Catalog(ConfiguredReasons(self.reasons), self.metrics)

    def configure(self, reasons: Iterable[Reason]) -> None:
        """Declare the reasons a configuration names (a `configurable` catalog only)."""
        if not isinstance(self.reasons, ConfiguredReasons):
            raise CatalogError("configure() needs a catalog made by configurable()")
        self.reasons.declare(reasons)

    @classmethod
    def merge(cls, *parts: Catalog) -> Catalog:
        """One catalog of all `parts`; a name declared twice must be declared the same."""
        return _of(
            (r for part in parts for r in part.reasons.values()), (m for part in parts for m in part.metrics.values())
        )

    def reason(self, name: str) -> Reason:
        try:
            return self.reasons[name]
        except KeyError:
            raise KeyError(f"finding reason {name!r} is not in the catalog (agent/catalog.py)") from None

    def metric(self, name: str) -> MetricSpec:
        try:
            return self.metrics[name]
        except KeyError:
            raise KeyError(f"metric {name!r} is not in the catalog (agent/catalog.py)") from None

    # ------------------------------------------------------------ made by the catalog, checked against it

    def finding(
        self, check: str, subject: str, reason: str, message: str, *,
        severity: Severity | None = None, unknown: bool | None = None, action: str | None = None,
    ) -> Finding:
        """The one way to make a `Finding`: its severity, its unknown flag and its
        action come from the reason's catalog entry. `severity` replaces the
        catalog's only where a node's configuration says so (an Xid's
        ``xid_severity``); `unknown` only where one reason is sometimes a fact and
        sometimes "cannot tell"; `action` only where the finding's own data names
        the cure (NVML's recovery action, Xid 154)."""
        entry = self.reasons.get(reason)
        if entry is None:
            raise CatalogError(f"finding reason {reason!r} is not in the catalog (agent/catalog.py)")
        return Finding(
            check=check,
            subject=subject,
            reason=reason,
            severity=severity or entry.severity,
            message=message,
            unknown=entry.unknown if unknown is None else unknown,
            action=_action(entry.action if action is None else action),
        )

    def sample_problem(self, sample: Sample) -> str | None:
        """Why `sample` cannot be exported as it is (None: it can)."""
        spec = self.metrics.get(sample.name)
        if spec is None:
            return f"metric {sample.name!r} is not in the catalog (agent/catalog.py)"
        names = tuple(k for k, _ in sample.labels)
        if names != spec.labels:
            return f"metric {sample.name!r} has labels {list(names)}; the catalog declares {list(spec.labels)}"
        return None

    def check_observation(self, obs: Observation) -> None:
        """Raise `CatalogError` for the first sample or finding of `obs` that the
        catalog does not declare (the scheduler turns it into that check's
        CheckFailed, so a typo fails its own check and nothing else)."""
        for sample in obs.samples:
            problem = self.sample_problem(sample)
            if problem is not None:
                raise CatalogError(problem)
        for f in obs.findings:
            if f.reason not in self.reasons:
                raise CatalogError(f"finding reason {f.reason!r} is not in the catalog (agent/catalog.py)")


class ConfiguredReasons(Mapping[str, Reason]):
    """The declared reasons, then those the running configuration names (an operator's named kernel
    patterns). A reload declares its set; a reason it no longer names stays declared with its last
    entry until the process ends, so a finding of it that is still active (held by hysteresis, an
    episode of the ladder) keeps its family and severity while it clears. A declared reason's
    entry is never replaced by a configured one."""

    def __init__(self, fixed: Mapping[str, Reason]) -> None:
        self._fixed = fixed
        self._added: Mapping[str, Reason] = MappingProxyType({})

    def declare(self, reasons: Iterable[Reason]) -> None:
        added = dict(self._added)
        for r in reasons:
            _action(r.action)
            if r.name not in self._fixed:
                added[r.name] = r
        self._added = MappingProxyType(added)  # one reference swap: readers on other threads see old or new

    def __getitem__(self, name: str) -> Reason:
        try:
            return self._fixed[name]
        except KeyError:
            return self._added[name]

    def __contains__(self, name: object) -> bool:
        return name in self._fixed or name in self._added

    def __iter__(self) -> Iterator[str]:
        added = self._added
        yield from self._fixed
        yield from (n for n in added if n not in self._fixed)

    def __len__(self) -> int:
        return len(self._fixed) + len(self._added)


class CatalogError(ValueError):
    """A value that the catalog does not declare: a bug in the code that made it."""


def _of(reasons: Iterable[Reason], metrics: Iterable[MetricSpec]) -> Catalog:
    by_reason: dict[str, Reason] = {}
    by_metric: dict[str, MetricSpec] = {}
    for r in reasons:
        _action(r.action)
        if by_reason.setdefault(r.name, r) != r:
            raise ValueError(f"reason {r.name} declared twice with different entries")
    for m in metrics:
        if by_metric.setdefault(m.name, m) != m:
            raise ValueError(f"metric {m.name} declared twice with different entries")
    return Catalog(MappingProxyType(by_reason), MappingProxyType(by_metric))


def _action(action: str) -> str:
    if action not in ACTIONS:
        raise CatalogError(f"action {action!r} is not one of {', '.join(ACTIONS)} (agent/findings.py)")
    return action


_CORE = _of(CORE_REASONS, CORE_METRICS)
