"""InfiniBand check: the adapter of `agent.infiniband.monitor` (see docs/infiniband.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ..check import CheckContext, CheckSpec
from ..findings import Observation, ObservationBuilder
from ..infiniband.catalog import CATALOG
from ..infiniband.catalog import METRICS as METRICS
from ..infiniband.catalog import REASONS as REASONS
from ..infiniband.settings import InfinibandConfig as InfinibandConfig


class InfinibandCheck:
    name = "infiniband"

    def __init__(self, ctx: CheckContext, cfg: InfinibandConfig, *, clock: Callable[[], float] = time.time) -> None:
        from ..infiniband.monitor import IbMonitor

        self.monitor = IbMonitor(ctx.paths, ctx.state_dir, cfg, clock)

    def known_findings(self) -> Iterable[tuple[str, str]]:
        return self.monitor.known_findings()

    def run(self) -> Observation:
        b = ObservationBuilder(self.name, CATALOG)
        self.monitor.run(b)
        return b.build()


SPEC = CheckSpec(
    name="infiniband",
    summary="InfiniBand/RoCE ports: state, rate, port count, vanished HCAs, error counters over windows, flaps and drops.",
    config=InfinibandConfig,
    build=InfinibandCheck,
    catalog=CATALOG,
)
