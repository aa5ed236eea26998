"""Disk check (placeholder: the implementation lands with its tests)."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import MetricSpec, Reason
from ..config import CheckConfig, opt
from ..findings import Observation, ObservationBuilder
from . import CheckContext, CheckSpec

REASONS: tuple[Reason, ...] = ()
METRICS: tuple[MetricSpec, ...] = ()


@dataclass(frozen=True)
class DiskConfig(CheckConfig):
    interval: float = opt(30.0, "Time between runs.", duration=True, min=1)
    paths: tuple[str, ...] = opt(("/",), "Mount points to check (host paths).")


class DiskCheck:
    name = "disk"

    def __init__(self, ctx: CheckContext, cfg: DiskConfig) -> None:
        self.ctx, self.cfg = ctx, cfg

    def run(self) -> Observation:
        return ObservationBuilder(self.name).build()


SPEC = CheckSpec(name="disk", summary="Filesystems: mounted, writable, free space and inodes, I/O errors.", config=DiskConfig, build=DiskCheck)
