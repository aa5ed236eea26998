"""Network check (placeholder: the implementation lands with its tests)."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import MetricSpec, Reason
from ..config import CheckConfig, opt
from ..findings import Observation, ObservationBuilder
from . import CheckContext, CheckSpec

REASONS: tuple[Reason, ...] = ()
METRICS: tuple[MetricSpec, ...] = ()


@dataclass(frozen=True)
class NetworkConfig(CheckConfig):
    interval: float = opt(15.0, "Time between runs.", duration=True, min=1)
    targets: tuple[str, ...] = opt((), "Reachability targets, \"host:port\".")


class NetworkCheck:
    name = "network"

    def __init__(self, ctx: CheckContext, cfg: NetworkConfig) -> None:
        self.ctx, self.cfg = ctx, cfg

    def run(self) -> Observation:
        return ObservationBuilder(self.name).build()


SPEC = CheckSpec(name="network", summary="Links, carrier, error rates, reachability of targets.", config=NetworkConfig, build=NetworkCheck)
