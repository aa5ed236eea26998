"""What the ladder needs of the cluster, and the stand-in for a host without one.

`Cluster` is the contract with `agent.kube.remediate.KubeRemediation`
(/work/coord/remediation-interface.md): drain (the whole node or the pods of
some UIDs) through the Eviction API, the fleet's disruption budget (a held
slot renewed, `renew_slot`: False when it was taken away; and why
no slot was granted, `slot_wait`: the ladder's one finding says it), the
fleet breaker (`breaker_check` before the claim and each host-changing step:
"" or why not), whether the node carries its taint (`taint_withheld`: "" or
why not; no drain without it), the retired condition and label, events. Its methods may raise
`agent.kube.api.ApiError` or `Wait`: the ladder tries again on its next tick.

`NoCluster` is the bare-metal host (the systemd unit, no ``[kubernetes]``
cluster): nothing to drain, no fleet budget (a slot is always granted: the
budget does not apply), retiring is the ladder's own record and a log line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)


class Progress(Protocol):
    """One step of a drain (`agent.kube.remediate.DrainProgress` is one)."""

    @property
    def done(self) -> bool: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def evicted(self) -> int: ...
    @property
    def blocked(self) -> tuple[str, ...]: ...
    @property
    def remaining(self) -> tuple[str, ...]: ...
    @property
    def pdbs(self) -> dict[str, str]: ...  # "ns/pod" → "ns/pdb" that refused it (the blocked pods it names)


class Cluster(Protocol):
    def plan_drain(self, only_pod_uids: frozenset[str] | None = None) -> list[str]: ...
    def drain(self, now: float, only_pod_uids: frozenset[str] | None = None) -> Progress: ...
    def claim_slot(self, now: float) -> bool: ...
    def renew_slot(self, now: float) -> bool: ...
    def slot_wait(self) -> str: ...
    def release_slot(self, now: float) -> None: ...
    def breaker_check(self, now: float, step: str) -> str: ...
    def taint_withheld(self) -> str: ...
    def set_retired(self, retired: bool, message: str) -> None: ...
    def event(self, reason: str, message: str, warning: bool = False) -> None: ...


@dataclass(frozen=True)
class Drained:
    done: bool = True
    timed_out: bool = False
    evicted: int = 0
    blocked: tuple[str, ...] = ()
    remaining: tuple[str, ...] = ()
    pdbs: dict[str, str] = field(default_factory=dict)


class NoCluster:
    """No Kubernetes: drained at once, a slot always granted, retire logged."""

    present = False

    def plan_drain(self, only_pod_uids: frozenset[str] | None = None) -> list[str]:
        return []

    def drain(self, now: float, only_pod_uids: frozenset[str] | None = None) -> Progress:
        return Drained()

    def claim_slot(self, now: float) -> bool:
        return True

    def renew_slot(self, now: float) -> bool:
        return True

    def slot_wait(self) -> str:
        return ""

    def release_slot(self, now: float) -> None:
        return None

    def breaker_check(self, now: float, step: str) -> str:
        return ""  # no fleet: the ladder's local limits apply

    def taint_withheld(self) -> str:
        return ""  # no Node to carry a taint: nothing to drain either

    def set_retired(self, retired: bool, message: str) -> None:
        log.warning("node %s (no cluster: recorded in the state dir only): %s",
                    "RETIRED" if retired else "un-retired", message)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        (log.warning if warning else log.info)("%s: %s", reason, message)
