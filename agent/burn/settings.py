"""The ``[checks.burn]`` section, and the runner it configures."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from ..hostpaths import HostPaths
from ..schema import CheckConfig, opt

if TYPE_CHECKING:
    from ..gpu.settings import GpuConfig
    from .runner import Runner, Settings


def _multiple_of_64(value: int) -> str | None:
    return None if value % 64 == 0 else f"expected a multiple of 64, got {value}"


@dataclass(frozen=True)
class BurnConfig(CheckConfig):
    interval: float = opt(
        60.0,
        "How often the check shows the persisted burn result, and a deferred preflight looks at the GPUs again.",
        duration=True,
        min=1,
    )
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
    preflight: bool = opt(
        True,
        "Burn once per boot, at the agent's first start, once no GPU has a process or a pod; "
        "PreflightPending while it runs, PreflightDeferred while it waits.",
    )
    hold_while_deferred: bool = opt(
        False,
        "While the preflight waits for busy GPUs, also report PreflightPending (the preflight taint: no new pods); "
        "false: the node keeps taking work until its GPUs are idle.",
    )
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
    from .model import BurnPlan
    from .runner import Settings
    from .verdict import Thresholds

    plan = BurnPlan(cfg.duration, cfg.matrix_size, cfg.memory_fraction, cfg.memory_time_share, cfg.hang_timeout)
    th = Thresholds(cfg.straggler_fraction, dict(cfg.expected_gemm_tflops), dict(cfg.expected_memory_gbps))
    return Settings(
        cfg.backend, plan, th, cfg.throttle_share, cfg.watch_interval, cfg.dcgm_level, cfg.dcgm_timeout, nvml_library
    )


def runner(paths: HostPaths, cfg: BurnConfig, gpu: GpuConfig) -> Runner:
    """The burn runner, with the NVML library the GPU check uses (its nvml_library or driver_root)."""
    from ..gpu.nvml import NvmlUnavailable
    from ..gpu.settings import nvml_library
    from .runner import Runner

    try:
        library = nvml_library(paths, gpu)
    except NvmlUnavailable:
        library = ""  # the GPU check reports the bad driver root; the burn tries the normal lookup
    return Runner(settings(cfg, library), paths)


def known(paths: HostPaths) -> Iterable[tuple[str, str]]:
    """(subject, reason) pairs the burn exports at 0 from the start."""
    from .runner import pci_gpu_count

    out = [
        ("preflight", "PreflightPending"),
        ("preflight", "PreflightDeferred"),
        ("preflight", "PreflightFailed"),
        ("backend", "BurnUnavailable"),
    ]
    for i in range(pci_gpu_count(paths)):
        out += [(f"gpu{i}", "PreflightFailed"), (f"gpu{i}", "BurnFailed")]
    return out
