"""The catalog of finding reasons and metric names.

Every reason a check can emit and every metric the agent can export is
declared here or in a feature module listed in `FEATURE_MODULES` (each has a
`REASONS` and a `METRICS` tuple). A test fails when code emits a name that is
not declared, and the README's reference tables are generated from it
(`agent docs`), so catalog, code and docs cannot drift apart.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Literal

from .findings import Finding, Observation, Sample, Severity

MetricKind = Literal["gauge", "counter"]

# Feature modules that declare REASONS and METRICS. They keep heavy imports
# (pyroute2, pynvml, kubernetes, iptc) inside functions, so listing them here
# costs nothing at start.
FEATURE_MODULES: tuple[str, ...] = (
    "agent.checks.disk",
    "agent.checks.network",
    "agent.checks.gpu",
    "agent.checks.traffic",
    "agent.checks.burn",
    "agent.kube",
    "agent.web",
)


@dataclass(frozen=True, slots=True)
class Reason:
    name: str
    severity: Severity
    summary: str
    unknown: bool = False  # "cannot tell": shown and exported, never moves node state
    family: str = "Agent"  # problem family: one node condition type per family


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
        "1 for each active finding, 0 for a known finding that is not active.",
        ("check", "subject", "reason", "severity"),
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
    MetricSpec(
        "node_health_state_file_rejected_total",
        "counter",
        "State files found damaged (empty, cut short, not JSON, of another shape) and set aside as <file>.bad-<time>.",
        ("file",),
    ),
)


@cache
def _load() -> tuple[Mapping[str, Reason], Mapping[str, MetricSpec]]:
    reasons = {r.name: r for r in CORE_REASONS}
    metrics = {m.name: m for m in CORE_METRICS}
    for modname in FEATURE_MODULES:
        mod = importlib.import_module(modname)
        for r in getattr(mod, "REASONS", ()):
            if r.name in reasons and reasons[r.name] != r:
                raise RuntimeError(f"reason {r.name} declared twice with different entries ({modname})")
            reasons[r.name] = r
        for m in getattr(mod, "METRICS", ()):
            if m.name in metrics and metrics[m.name] != m:
                raise RuntimeError(f"metric {m.name} declared twice with different entries ({modname})")
            metrics[m.name] = m
    return MappingProxyType(reasons), MappingProxyType(metrics)


def feature_name(module: str) -> str:
    """The feature a declaring module belongs to: ``agent.checks.gpu`` or
    ``agent.gpu.catalog`` -> ``gpu``, ``agent.kube`` -> ``kube``."""
    parts = [p for p in module.split(".") if p not in ("agent", "checks", "catalog")]
    return parts[0] if parts else "core"


def features() -> Mapping[str, tuple[tuple[Reason, ...], tuple[MetricSpec, ...]]]:
    """What each feature declares, by feature name (``core`` for the agent's
    own): the per-feature tables of docs/*.md are generated from it."""
    _load()
    out: dict[str, tuple[tuple[Reason, ...], tuple[MetricSpec, ...]]] = {"core": (CORE_REASONS, CORE_METRICS)}
    for modname in FEATURE_MODULES:
        mod = importlib.import_module(modname)
        name = feature_name(modname)
        had = out.get(name, ((), ()))
        out[name] = (had[0] + tuple(getattr(mod, "REASONS", ())), had[1] + tuple(getattr(mod, "METRICS", ())))
    return MappingProxyType(out)


def reasons() -> Mapping[str, Reason]:
    return _load()[0]


def metrics() -> Mapping[str, MetricSpec]:
    return _load()[1]


def reason(name: str) -> Reason:
    try:
        return reasons()[name]
    except KeyError:
        raise KeyError(f"finding reason {name!r} is not in the catalog (agent/catalog.py)") from None


def metric(name: str) -> MetricSpec:
    try:
        return metrics()[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the catalog (agent/catalog.py)") from None


# ---------------------------------------------------------------- made by the catalog, checked against it


def finding(
    check: str, subject: str, reason: str, message: str, *, severity: Severity | None = None, unknown: bool | None = None
) -> Finding:
    """The one way to make a `Finding`: its severity and its unknown flag come
    from the reason's catalog entry. `severity` replaces the catalog's only
    where a node's configuration says so (an Xid's ``xid_severity``); `unknown`
    only where one reason is sometimes a fact and sometimes "cannot tell"."""
    entry = reasons().get(reason)
    if entry is None:
        raise CatalogError(f"finding reason {reason!r} is not in the catalog (agent/catalog.py)")
    return Finding(
        check=check,
        subject=subject,
        reason=reason,
        severity=severity or entry.severity,
        message=message,
        unknown=entry.unknown if unknown is None else unknown,
    )


class CatalogError(ValueError):
    """A value that the catalog does not declare: a bug in the code that made it."""


def sample_problem(sample: Sample) -> str | None:
    """Why `sample` cannot be exported as it is (None: it can)."""
    spec = metrics().get(sample.name)
    if spec is None:
        return f"metric {sample.name!r} is not in the catalog (agent/catalog.py)"
    names = tuple(k for k, _ in sample.labels)
    if names != spec.labels:
        return f"metric {sample.name!r} has labels {list(names)}; the catalog declares {list(spec.labels)}"
    return None


def check_observation(obs: Observation) -> None:
    """Raise `CatalogError` for the first sample or finding of `obs` that the
    catalog does not declare (the scheduler turns it into that check's
    CheckFailed, so a typo fails its own check and nothing else)."""
    for sample in obs.samples:
        problem = sample_problem(sample)
        if problem is not None:
            raise CatalogError(problem)
    known = reasons()
    for f in obs.findings:
        if f.reason not in known:
            raise CatalogError(f"finding reason {f.reason!r} is not in the catalog (agent/catalog.py)")
