"""Checks: one module per concern, each declaring a `SPEC`.

A check is a small object with a name and ``run() -> Observation``; it knows
nothing of Kubernetes or Prometheus. Its module declares its config (a
`CheckConfig` subclass: ``[checks.<name>]``), the finding reasons and metrics
it can emit (`REASONS`, `METRICS`, collected by `agent.catalog`), and a
`build` function. Modules keep heavy imports inside functions so that a
disabled check costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

from ..hostpaths import HostPaths

if TYPE_CHECKING:
    from ..config import CheckConfig, Config
    from ..findings import Observation
    from ..sources import EventSource

# Order here is the order of `agent selftest` and of the config reference.
CHECK_MODULES: tuple[str, ...] = (
    "agent.checks.disk",
    "agent.checks.network",
    "agent.checks.gpu",
    "agent.checks.traffic",
    "agent.checks.burn",
)


class Check(Protocol):
    name: str

    def run(self) -> Observation: ...


class KnowsFindings(Protocol):
    def known_findings(self) -> Iterable[tuple[str, str]]:
        """(subject, reason) pairs exported at 0 from start, so "no problem" differs from "not reporting"."""
        ...


@dataclass(frozen=True, slots=True)
class CheckContext:
    """What a check may know about the agent around it."""

    paths: HostPaths
    state_dir: str
    config: Config
    dry_run: bool = False  # look, but change nothing on the node (`agent run --dry-run`, `agent selftest`)


@dataclass(frozen=True, slots=True)
class CheckSpec:
    name: str
    summary: str
    config: type[CheckConfig]
    build: Callable[[CheckContext, Any], Check]
    # Event sources that run beside the check while it is enabled (see agent.sources).
    sources: Callable[[CheckContext, Any], list[EventSource]] | None = None


@cache
def registry() -> Mapping[str, CheckSpec]:
    specs: dict[str, CheckSpec] = {}
    for modname in CHECK_MODULES:
        spec: CheckSpec = importlib.import_module(modname).SPEC
        specs[spec.name] = spec
    return specs


def build_enabled(ctx: CheckContext, only: Iterable[str] | None = None) -> list[tuple[Check, CheckConfig]]:
    """Instantiate the enabled checks (or exactly `only`, enabled or not)."""
    wanted = set(only) if only else None
    out = []
    for name, spec in registry().items():
        cfg = ctx.config.checks[name]
        if (wanted is None and cfg.enabled) or (wanted is not None and name in wanted):
            out.append((spec.build(ctx, cfg), cfg))
    return out


def build_sources(ctx: CheckContext) -> list[EventSource]:
    """The event sources of the enabled checks."""
    out: list[EventSource] = []
    for name, spec in registry().items():
        cfg = ctx.config.checks[name]
        if cfg.enabled and spec.sources is not None:
            out.extend(spec.sources(ctx, cfg))
    return out
