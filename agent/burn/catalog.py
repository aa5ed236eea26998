"""What the burn feature declares to the catalog: its reasons and metrics."""

from __future__ import annotations

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity

REASONS: tuple[Reason, ...] = (
    Reason(
        "PreflightPending",
        Severity.WARNING,
        "The boot-time GPU burn test has not passed yet in this boot (it is running); "
        "the node is held back until it does.",
        family="Preflight",
    ),
    Reason(
        "PreflightDeferred",
        Severity.INFO,
        "The boot-time GPU burn test waits: a GPU has a process or a pod (the message names them), whether "
        "it has cannot be told, or this is a dry run; it runs once every GPU is idle.",
        family="Preflight",
    ),
    Reason(
        "PreflightFailed",
        Severity.CRITICAL,
        "The boot-time GPU burn test failed on this GPU (the message says how); "
        "held until a reboot or a forced re-run passes.",
        family="Preflight", action="drain_and_diagnose",
    ),
    Reason(
        "BurnFailed",
        Severity.CRITICAL,
        "A periodic GPU burn re-test failed on this GPU (the message says how).",
        family="GPU", action="drain_and_diagnose",
    ),
    Reason(
        "BurnUnavailable",
        Severity.WARNING,
        "The GPU burn test could not run here, or could not test some GPUs (no backend, no driver, MIG); "
        "nothing is known.",
        unknown=True,
        family="GPU",
    ),
)

_GPU = ("gpu",)
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_burn_preflight_state",
        "gauge",
        "1 for the preflight's state: pending, deferred (GPUs in use, or a dry run), passed, failed, no_gpu, "
        "unavailable or disabled.",
        ("state",),
    ),
    MetricSpec(
        "node_health_burn_runs_total",
        "counter",
        "Burns since the agent started, by kind (preflight, periodic) and result (pass, fail, unknown).",
        ("kind", "result"),
    ),
    MetricSpec("node_health_burn_duration_seconds", "gauge", "Wall time of the last burn."),
    MetricSpec("node_health_burn_last_timestamp_seconds", "gauge", "Unix time the last burn finished."),
    MetricSpec(
        "node_health_burn_gpu_pass",
        "gauge",
        "1 if the GPU passed the last burn, 0 if it failed (absent: not tested).",
        _GPU,
    ),
    MetricSpec(
        "node_health_burn_gpu_errors",
        "gauge",
        "Errors the last burn found: compute (GEMM results that differ) or memory (words read back wrong).",
        ("gpu", "kind"),
    ),
    MetricSpec(
        "node_health_burn_gpu_gemm_flops_per_second", "gauge", "BF16 tensor-core GEMM rate in the last burn.", _GPU
    ),
    MetricSpec(
        "node_health_burn_gpu_memory_bandwidth_bytes_per_second",
        "gauge",
        "Bytes written and read back per second by the last burn's memory pattern test.",
        _GPU,
    ),
    MetricSpec("node_health_burn_gpu_power_watts", "gauge", "Mean board power during the last burn (NVML).", _GPU),
    MetricSpec("node_health_burn_gpu_sm_clock_hertz", "gauge", "Mean SM clock during the last burn (NVML).", _GPU),
    MetricSpec(
        "node_health_burn_gpu_temperature_max_celsius",
        "gauge",
        "Highest GPU temperature during the last burn (NVML).",
        _GPU,
    ),
)

CATALOG = Catalog.declare(REASONS, METRICS)
