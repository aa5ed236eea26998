"""What a check is: the `Check` protocol, the `CheckContext` it is built with,
and the `CheckSpec` its adapter module declares.

A check is a small object with a name and ``run() -> Observation``; it knows
nothing of Kubernetes or Prometheus. Engines (``agent/<feature>/``) may take a
`CheckContext`; only the adapters in `agent.checks` declare a `CheckSpec`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .hostpaths import HostPaths

if TYPE_CHECKING:
    from .catalog import Catalog, Reason
    from .findings import Observation
    from .pods import PodView
    from .schema import CheckConfig, ConfigView
    from .sources import EventSource


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
    pods: PodView | None = None  # the node's pods, where the agent talks to a cluster (agent.pods)
    # One pass with no event sources beside the checks (`agent selftest`, `agent run --once`): a check that
    # stands for a source (the burn) then reports what that source would publish for the same state.
    single_pass: bool = False


@dataclass(frozen=True, slots=True)
class CheckSpec:
    name: str
    summary: str
    config: type[CheckConfig]
    build: Callable[[CheckContext, Any], Check]
    # The reasons and metrics the check (and its sources) may emit: its feature's catalog.
    catalog: Catalog
    # Event sources that run beside the check while it is enabled (see agent.sources).
    sources: Callable[[CheckContext, Any], list[EventSource]] | None = None
    # The names its event sources report their findings under (the `check` label of node_health_finding,
    # the first part of a remediation record's fault key) where they are not the check's own name: "xid" for
    # the gpu check's Xid stream. `agent selftest --only` and [kubernetes.policy] overrides accept them.
    finding_sources: tuple[str, ...] = ()
    # Whether the check, so configured, reads the node's pods (CheckContext.pods): the runtime starts the one pod
    # watch (agent.kube) only when an enabled check says yes.
    needs_pods: Callable[[Any], bool] | None = None
    # The pod annotation keys the check, so configured, reads: the only annotations the pod watch keeps.
    pod_annotations: Callable[[Any], Iterable[str]] | None = None
    # The reasons the check's configuration names beyond its catalog (an operator's named kernel patterns),
    # each with the key (under [checks.<name>]) that first names it: the config loader refuses one that is
    # another feature's reason, and the daemon declares the rest (`agent.registry.configured_reasons`).
    reasons: Callable[[Any], Iterable[tuple[str, Reason]]] | None = None
