"""Checks: one module per concern, each declaring a `SPEC`.

A check is a small object with a name and ``run() -> Observation``; it knows
nothing of Kubernetes or Prometheus. Its module declares its config (a
`CheckConfig` subclass: ``[checks.<name>]``), the finding reasons and metrics
it can emit (`REASONS`, `METRICS`, collected by `agent.catalog`), and a
`build` function; `agent.registry` lists the checks. Modules keep heavy imports inside functions so that a
disabled check costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..hostpaths import HostPaths

if TYPE_CHECKING:
    from ..schema import CheckConfig, ConfigView
    from ..findings import Observation
    from ..sources import EventSource

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
    config: ConfigView
    dry_run: bool = False  # look, but change nothing on the node (`agent run --dry-run`, `agent selftest`)


@dataclass(frozen=True, slots=True)
class CheckSpec:
    name: str
    summary: str
    config: type[CheckConfig]
    build: Callable[[CheckContext, Any], Check]
    # Event sources that run beside the check while it is enabled (see agent.sources).
    sources: Callable[[CheckContext, Any], list[EventSource]] | None = None
