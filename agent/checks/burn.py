"""GPU burn test: the preflight once per boot (and an optional periodic
re-test), run by an event source so that "pending" is reported the moment the
agent starts; the polled check only shows the persisted result (what
`agent selftest` and `agent run --once` print). See docs/burn.md."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from ..catalog import MetricSpec, Reason
from ..config import CheckConfig, opt
from ..findings import Observation, ObservationBuilder, Severity
from . import CheckContext, CheckSpec

if TYPE_CHECKING:
    from ..burn.model import BurnReport
    from ..burn.runner import Runner, Settings
    from ..sources import EventSource

REASONS: tuple[Reason, ...] = (
    Reason(
        "PreflightPending",
        Severity.WARNING,
        "The boot-time GPU burn test has not passed yet in this boot (it is running); "
        "the node is held back until it does.",
        family="Preflight",
    ),
    Reason(
        "PreflightFailed",
        Severity.CRITICAL,
        "The boot-time GPU burn test failed on this GPU (the message says how); "
        "held until a reboot or a forced re-run passes.",
        family="Preflight",
    ),
    Reason(
        "BurnFailed",
        Severity.CRITICAL,
        "A periodic GPU burn re-test failed on this GPU (the message says how).",
        family="GPU",
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
        "1 for the preflight's state: pending, passed, failed, no_gpu, unavailable or disabled.",
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


def _multiple_of_64(value: int) -> str | None:
    return None if value % 64 == 0 else f"expected a multiple of 64, got {value}"


@dataclass(frozen=True)
class BurnConfig(CheckConfig):
    interval: float = opt(60.0, "How often the check shows the persisted burn result.", duration=True, min=1)
    backend: Literal["auto", "builtin", "dcgm"] = opt(
        "auto",
        "builtin: cuda-bindings + cuBLAS (pip install node-health-agent[gpu]); dcgm: dcgmi diag; "
        "auto: builtin, else dcgm.",
    )
    duration: float = opt(
        60.0, "How long each GPU burns (the GEMM, then the memory test); all GPUs at once.", duration=True, min=1
    )
    matrix_size: int = opt(16384, "Side of the square BF16 GEMM matrices.", min=1024, max=65536, check=_multiple_of_64)
    memory_fraction: float = opt(0.85, "Share of each GPU's free memory the pattern test covers.", min=0.01, max=0.95)
    memory_time_share: float = opt(0.25, "Share of the duration spent on the memory test.", min=0.05, max=0.9)
    hang_timeout: float = opt(
        60.0, "Time past the duration after which a GPU's worker counts as hung (and fails).", duration=True, min=10
    )
    straggler_fraction: float = opt(
        0.85, "A GPU below this share of the node median (same model) fails as slow; 0 turns it off.", min=0, max=1
    )
    expected_gemm_tflops: Mapping[str, float] = opt(
        MappingProxyType({}), "Model name (as NVML says it) = lowest acceptable GEMM TFLOP/s."
    )
    expected_memory_gbps: Mapping[str, float] = opt(
        MappingProxyType({}), "Model name = lowest acceptable memory-test GB/s."
    )
    throttle_share: float = opt(
        0.1,
        "A GPU with hardware slowdown, thermal slowdown or power brake in more than this share of samples fails.",
        min=0,
        max=1,
    )
    watch_interval: float = opt(1.0, "NVML sampling interval during a burn.", duration=True, min=0.1)
    preflight: bool = opt(True, "Burn once per boot, at the agent's first start; PreflightPending until it passes.")
    preflight_force: bool = opt(False, "Burn at every start of the agent, even when this boot already has a result.")
    retest_interval: float = opt(
        0.0, "Burn again this often, when no process uses any GPU; 0s: never.", duration=True, min=0
    )
    dcgm_level: int = opt(2, "dcgmi diag run level for the dcgm backend (1 quick … 4 extended).", min=1, max=4)
    dcgm_timeout: float = opt(1200.0, "Time after which dcgmi diag counts as hung.", duration=True, min=60)

    def validate(self) -> tuple[str, str] | None:
        for key in ("expected_gemm_tflops", "expected_memory_gbps"):
            for model, value in getattr(self, key).items():
                if value <= 0:
                    return f"{key}.{model}", f"expected a positive figure, got {value:g}"
        return None


def settings(cfg: BurnConfig, nvml_library: str = "") -> Settings:
    from ..burn.model import BurnPlan
    from ..burn.runner import Settings
    from ..burn.verdict import Thresholds

    plan = BurnPlan(cfg.duration, cfg.matrix_size, cfg.memory_fraction, cfg.memory_time_share, cfg.hang_timeout)
    th = Thresholds(cfg.straggler_fraction, dict(cfg.expected_gemm_tflops), dict(cfg.expected_memory_gbps))
    return Settings(
        cfg.backend, plan, th, cfg.throttle_share, cfg.watch_interval, cfg.dcgm_level, cfg.dcgm_timeout, nvml_library
    )


def _nvml_library(ctx: CheckContext) -> str:
    """The NVML library the GPU check uses (checks.gpu.nvml_library or driver_root)."""
    from ..gpu.nvml import NvmlUnavailable
    from .gpu import nvml_library

    try:
        return nvml_library(ctx, ctx.config.check("gpu"))
    except NvmlUnavailable:
        return ""  # the GPU check reports the bad driver root; the burn tries the normal lookup


def runner(ctx: CheckContext, cfg: BurnConfig) -> Runner:
    from ..burn.runner import Runner

    return Runner(settings(cfg, _nvml_library(ctx)), ctx.paths)


def known(ctx: CheckContext) -> Iterable[tuple[str, str]]:
    from ..burn.runner import pci_gpu_count

    out = [("preflight", "PreflightPending"), ("preflight", "PreflightFailed"), ("backend", "BurnUnavailable")]
    for i in range(pci_gpu_count(ctx.paths)):
        out += [(f"gpu{i}", "PreflightFailed"), (f"gpu{i}", "BurnFailed")]
    return out


class BurnStatusCheck:
    """Shows the persisted result of this boot's burns; never burns."""

    name = "burn"

    def __init__(self, ctx: CheckContext, cfg: BurnConfig) -> None:
        self.ctx, self.cfg = ctx, cfg

    def run(self) -> Observation:
        from ..burn.preflight import BurnState
        from ..state import StateDir, boot_id

        b = ObservationBuilder(self.name)
        st = BurnState.load(StateDir(self.ctx.state_dir), boot_id(self.ctx.paths))
        for label, report in (("preflight", st.preflight), ("periodic", st.retest)):
            if report is not None:
                b.subject(label, _describe(report))
        if st.preflight is None and self.cfg.preflight:
            b.subject("preflight", "no burn in this boot yet (the agent runs it at start)")
        return b.build()


def _describe(report: BurnReport) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.finished))
    tested = f"{len(report.gpus)} GPU(s), {report.backend}" if report.gpus else report.note or report.unavailable
    return f"{report.status} at {when} ({tested})"


def sources(ctx: CheckContext, cfg: BurnConfig) -> list[EventSource]:
    from ..burn.preflight import Options, PreflightSource
    from ..state import StateDir, boot_id

    opts = Options(preflight=cfg.preflight, force=cfg.preflight_force, retest_interval=cfg.retest_interval)
    return [
        PreflightSource(runner(ctx, cfg), StateDir(ctx.state_dir), lambda: boot_id(ctx.paths), opts, lambda: known(ctx))
    ]


SPEC = CheckSpec(
    name="burn",
    summary="GPU burn test: once per boot before the node takes work (preflight), optionally again when idle.",
    config=BurnConfig,
    build=BurnStatusCheck,
    sources=sources,
)
