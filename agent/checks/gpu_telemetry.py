"""GPU telemetry check: power, energy, clocks, utilisation, framebuffer, PCIe
and NVLink traffic, throttle time and GPM profiling per GPU, every 10 s
(`agent.gpu.telemetry`), so that no node needs dcgm-exporter beside the agent.

See docs/gpu.md ("Telemetry"). NVML is found as ``[checks.gpu]`` says
(``nvml_library``, ``driver_root``); pynvml is imported only when it runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..check import CheckContext, CheckSpec
from ..findings import Observation, ObservationBuilder
from ..gpu.catalog import TELEMETRY_CATALOG
from ..gpu.catalog import TELEMETRY_METRICS as METRICS
from ..gpu.catalog import TELEMETRY_REASONS as REASONS
from ..gpu.pci import bus_gpus
from ..gpu.settings import TelemetryConfig

__all__ = ["METRICS", "REASONS", "SPEC", "GpuTelemetryCheck"]


class GpuTelemetryCheck:
    name = "gpu_telemetry"

    def __init__(self, ctx: CheckContext, cfg: TelemetryConfig) -> None:
        from ..gpu.telemetry import TelemetryPoller

        self.ctx, self.cfg = ctx, cfg
        self.poller = TelemetryPoller(ctx.paths, cfg, ctx.config.check("gpu"))
        self.prober = self.poller.prober

    def known_findings(self) -> Iterable[tuple[str, str]]:
        for i in range(len(bus_gpus(self.ctx.paths))):
            yield (f"gpu{i}", "NvmlCallHung")

    def run(self) -> Observation:
        b = ObservationBuilder(self.name, TELEMETRY_CATALOG)
        self.poller.poll(b)
        return b.build()


SPEC = CheckSpec(
    name="gpu_telemetry",
    summary="GPU telemetry through NVML (power, energy, clocks, utilisation, memory, PCIe/NVLink traffic, throttling, GPM).",
    config=TelemetryConfig,
    build=GpuTelemetryCheck,
    catalog=TELEMETRY_CATALOG,
)
