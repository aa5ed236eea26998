"""A burn report as findings and metric samples.

Only PreflightPending, PreflightFailed and PreflightDeferred carry the family
"Preflight" (the Kubernetes side maps that family to the `<prefix>/preflight`
NoSchedule taint; PreflightDeferred is info, which never taints: whether a
deferred preflight holds the node is PreflightPending's, as
checks.burn.hold_while_deferred says); a failed periodic re-test is a GPU fault like any other (BurnFailed),
and a burn that could not run is "unknown", which never moves node state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..findings import Finding, ObservationBuilder, Sample
from .catalog import CATALOG
from .model import BurnReport, GpuVerdict

CHECK = "burn"
PREFLIGHT = "preflight"  # the subject of findings about the preflight as a whole
# The subject of "the burn could not run": apart from PREFLIGHT on purpose (and
# not the source's own name, which would mean "every subject is unknown"). A
# burn that cannot run (no backend, no driver) says nothing about the GPUs, so
# it must neither hold the node nor be the reason it is held: the preflight
# subject itself is then definitely no longer pending, and the gate opens,
# while BurnUnavailable stays visible (a deployment problem to fix, not a
# reason to keep every GPU node of a fleet out of service).
BURN = "backend"
STATES = ("pending", "deferred", "passed", "failed", "no_gpu", "unavailable", "disabled")
KINDS = ("preflight", "periodic", "manual")


def pending(message: str) -> list[Finding]:
    b = ObservationBuilder(CHECK, CATALOG)
    b.finding(PREFLIGHT, "PreflightPending", message)
    return list(b.build().findings)


def deferred(message: str) -> list[Finding]:
    b = ObservationBuilder(CHECK, CATALOG)
    b.finding(PREFLIGHT, "PreflightDeferred", message)
    return list(b.build().findings)


def findings(report: BurnReport, kind: str) -> list[Finding]:
    b = ObservationBuilder(CHECK, CATALOG)
    failed = "PreflightFailed" if kind == "preflight" else "BurnFailed"
    if report.error:
        b.finding(PREFLIGHT, failed, report.error)
    for g in report.failed():
        b.finding(g.subject, failed, g.summary())
    if report.unavailable or any(g.status == "unknown" for g in report.gpus):
        b.finding(BURN, "BurnUnavailable", unknown_message(report))
    if report.no_gpu and kind == "preflight":
        b.finding(PREFLIGHT, "NotApplicable", f"{report.note}: the preflight passes")
    return list(b.build().findings)


def unknown_message(report: BurnReport) -> str:
    if report.unavailable:
        return f"the burn cannot run here: {report.unavailable}"
    untested = [g for g in report.gpus if g.status == "unknown"]
    parts = [f"GPU {g.index}: " + ("; ".join(g.notes) or "not tested") for g in untested]
    return "not tested: " + " | ".join(parts) if parts else "no GPU was tested"


def state_of(report: BurnReport | None, running: bool) -> str:
    if running or report is None:
        return "pending"
    if report.no_gpu:
        return "no_gpu"
    return {"pass": "passed", "fail": "failed"}.get(report.status, "unavailable")


def samples(last: BurnReport | None, preflight_state: str, runs: Mapping[tuple[str, str], int]) -> list[Sample]:
    b = ObservationBuilder(CHECK, CATALOG)
    for st in STATES:
        b.sample("node_health_burn_preflight_state", 1 if st == preflight_state else 0, state=st)
    for (kind, result), n in sorted(runs.items()):
        b.sample("node_health_burn_runs_total", n, kind=kind, result=result)
    if last is not None and last.gpus:
        b.sample("node_health_burn_duration_seconds", last.duration)
        b.sample("node_health_burn_last_timestamp_seconds", last.finished)
        for g in last.gpus:
            _gpu_samples(b, g)
    return list(b.build().samples)


def _gpu_samples(b: ObservationBuilder, g: GpuVerdict) -> None:
    gpu = str(g.index)
    if g.status != "unknown":
        b.sample("node_health_burn_gpu_pass", 1 if g.status == "pass" else 0, gpu=gpu)
    b.sample("node_health_burn_gpu_errors", g.compute_errors, gpu=gpu, kind="compute")
    b.sample("node_health_burn_gpu_errors", g.memory_errors, gpu=gpu, kind="memory")
    optional: Iterable[tuple[str, float | None]] = (
        ("node_health_burn_gpu_gemm_flops_per_second", g.gemm_flops),
        ("node_health_burn_gpu_memory_bandwidth_bytes_per_second", g.memory_bandwidth),
        ("node_health_burn_gpu_power_watts", g.telemetry.power_watts_mean),
        ("node_health_burn_gpu_sm_clock_hertz", g.telemetry.sm_clock_hz_mean),
        ("node_health_burn_gpu_temperature_max_celsius", g.telemetry.temperature_max_c),
    )
    for name, value in optional:
        if value is not None:
            b.sample(name, value, gpu=gpu)
