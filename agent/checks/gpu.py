"""GPU check: NVML polled per GPU (`agent.gpu.poller`), plus the Xid event
source (`agent.gpu.xid_source`).

See docs/gpu.md for what is judged and why. pynvml is imported only when the
check runs (`agent.gpu.nvml`), so a node without GPUs pays nothing for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ..check import CheckContext, CheckSpec
from ..findings import Observation, ObservationBuilder
from ..gpu.catalog import CATALOG
from ..gpu.catalog import METRICS as METRICS
from ..gpu.catalog import REASONS as REASONS
from ..gpu.pci import bus_gpus
from ..gpu.settings import GpuConfig
from ..statedir import StateDir


class GpuCheck:
    name = "gpu"

    def __init__(self, ctx: CheckContext, cfg: GpuConfig) -> None:
        from ..gpu.poller import GpuPoller

        self.ctx, self.cfg = ctx, cfg
        self.poller = GpuPoller(ctx.paths, StateDir(ctx.state_dir), cfg)
        self.prober = self.poller.prober
        self._scanned = False

    def known_findings(self) -> Iterable[tuple[str, str]]:
        yield ("gpus", "GpuMissing")
        yield ("gpus", "GpuProcessStuck")
        for i in range(len(bus_gpus(self.ctx.paths))):
            for reason in ("GpuLost", "GpuUnresponsive", "EccUncorrectable", "RowRemapFailure", "GpuRecoveryAction", "GpuHwSlowdown"):
                yield (f"gpu{i}", reason)

    def run(self) -> Observation:
        b = ObservationBuilder(self.name, CATALOG)
        seen = self.poller.poll(b, time.time())
        if not self._scanned:
            self._scanned = True
            from ..gpu import xid_source

            xid_source.scan_once_unless_live(self.ctx, self.cfg, b, seen)
        return b.build()


def _sources(ctx: CheckContext, cfg: GpuConfig) -> list[Any]:
    if not cfg.xid_events:
        return []
    from ..gpu.xid_source import XidSource

    return [XidSource(ctx, cfg)]


SPEC = CheckSpec(
    name="gpu",
    summary="NVIDIA GPUs through NVML (ECC, remapped rows, thermals, NVLink, PCIe, count) and Xid errors as they happen.",
    config=GpuConfig,
    build=GpuCheck,
    catalog=CATALOG,
    sources=_sources,
    finding_sources=("xid",),  # its source's findings (selftest's single pass reports them under it too)
)
