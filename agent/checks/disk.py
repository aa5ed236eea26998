"""Disk check: the adapter of `agent.disk.monitor` (see docs/disk.md)."""

from __future__ import annotations

from ..check import CheckContext, CheckSpec
from ..disk.catalog import CATALOG
from ..disk.catalog import METRICS as METRICS
from ..disk.catalog import REASONS as REASONS
from ..disk.settings import DiskConfig as DiskConfig
from ..findings import Observation, ObservationBuilder


class DiskCheck:
    name = "disk"

    def __init__(self, ctx: CheckContext, cfg: DiskConfig) -> None:
        from ..disk.monitor import DiskMonitor

        self.monitor = DiskMonitor(ctx.paths, ctx.state_dir, cfg)

    def known_findings(self) -> list[tuple[str, str]]:
        return self.monitor.known_findings()

    def run(self) -> Observation:
        b = ObservationBuilder(self.name, CATALOG)
        self.monitor.run(b)
        return b.build()


SPEC = CheckSpec(
    name="disk",
    summary="Filesystems: mounted, writable, free space and inodes, I/O errors.",
    config=DiskConfig,
    build=DiskCheck,
    catalog=CATALOG,
)
