"""Kernel check: EDAC memory-error counts polled (`agent.kernel.edac`), plus
the kernel-fault event source (`agent.kernel.source`), which matches the
kernel log against the fault table as it is written.

See docs/kernel.md. The source shares the one kernel-log reader with the GPU
check's Xid follower (`agent.kmsg_follower`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..check import CheckContext, CheckSpec
from ..findings import Observation, ObservationBuilder
from ..kernel.catalog import CATALOG, with_reasons
from ..kernel.catalog import METRICS as METRICS
from ..kernel.catalog import REASONS as REASONS
from ..kernel.settings import KernelConfig
from ..statedir import StateDir


class KernelCheck:
    name = "kernel"

    def __init__(self, ctx: CheckContext, cfg: KernelConfig) -> None:
        from ..kernel.edac import EdacMonitor

        self.ctx, self.cfg = ctx, cfg
        self.edac = EdacMonitor(ctx.paths, StateDir(ctx.state_dir), cfg.edac_ce_per_day)
        self._scanned = False
        # the kernel catalog with the reasons the operator's patterns name (a selftest's scan finds them)
        self.catalog = with_reasons(r for _, r in cfg.reasons())

    def known_findings(self) -> Iterable[tuple[str, str]]:
        from ..kernel.edac import read_controllers

        if self.cfg.edac:
            for c in read_controllers(self.ctx.paths):
                yield (c.name, "EdacUncorrectable")

    def run(self) -> Observation:
        b = ObservationBuilder(self.name, self.catalog)
        if self.cfg.edac:
            self.edac.run(b, dry_run=self.ctx.dry_run)
        if not self._scanned:
            self._scanned = True
            from ..kernel import source

            source.scan_once_unless_live(self.ctx, self.cfg, b)
        return b.build()


def _sources(ctx: CheckContext, cfg: KernelConfig) -> list[Any]:
    if not cfg.log_faults:
        return []
    from ..kernel.source import KernelLogSource

    return [KernelLogSource(ctx, cfg)]


SPEC = CheckSpec(
    name="kernel",
    summary="Kernel faults from the kernel log (hung tasks, lockups, oops, OOM kills, machine checks, mlx5, NVMe) "
    "and EDAC memory-error counts.",
    config=KernelConfig,
    build=KernelCheck,
    catalog=CATALOG,
    sources=_sources,
    finding_sources=("kernel-log",),  # its source's findings (selftest's single pass reports them under it too)
    reasons=KernelConfig.reasons,
)
