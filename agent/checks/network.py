"""Network check: the adapter of `agent.network.monitor`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ..check import CheckContext, CheckSpec
from ..findings import Observation, ObservationBuilder
from ..network.catalog import CATALOG
from ..network.catalog import METRICS as METRICS
from ..network.catalog import REASONS as REASONS
from ..network.settings import NetworkConfig as NetworkConfig


class NetworkCheck:
    name = "network"

    def __init__(self, ctx: CheckContext, cfg: NetworkConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        from ..network.monitor import NetworkMonitor

        self.monitor = NetworkMonitor(ctx.paths, ctx.state_dir, cfg, clock)

    def known_findings(self) -> Iterable[tuple[str, str]]:
        return self.monitor.known_findings()

    def run(self) -> Observation:
        b = ObservationBuilder(self.name, CATALOG)
        self.monitor.run(b)
        return b.build()


SPEC = CheckSpec(
    name="network",
    summary="Links (admin state, carrier, operstate, flapping), error and drop rates, reachability of targets.",
    config=NetworkConfig,
    build=NetworkCheck,
    catalog=CATALOG,
)
