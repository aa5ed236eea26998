"""GPU pods check: which pods, jobs and units hold each GPU (`agent.gpu.pods`):
the kubelet's allocations as a join series and NVML's processes by owner.

See docs/gpu.md ("Which pod uses which GPU"). pynvml and h2 are imported only
when the check runs.
"""

from __future__ import annotations

from ..check import CheckContext, CheckSpec
from ..findings import Observation, ObservationBuilder
from ..gpu.catalog import CATALOG
from ..gpu.settings import GpuConfig, GpuPodsConfig


class GpuPodsCheck:
    name = "gpu_pods"

    def __init__(self, ctx: CheckContext, cfg: GpuPodsConfig) -> None:
        from ..gpu.pods import GpuPodsMonitor

        gpu_cfg = ctx.config.check("gpu") if "gpu" in ctx.config.checks else GpuConfig()
        self.monitor = GpuPodsMonitor(ctx.paths, cfg, gpu_cfg)

    def known_findings(self) -> list[tuple[str, str]]:
        return self.monitor.known_findings()

    def run(self) -> Observation:
        b = ObservationBuilder(self.name, CATALOG)
        self.monitor.run(b)
        return b.build()


SPEC = CheckSpec(
    name="gpu_pods",
    summary="Who holds each GPU: the kubelet's device allocations (a join series) and NVML's processes by pod, job or unit.",
    config=GpuPodsConfig,
    build=GpuPodsCheck,
    catalog=CATALOG,
)
