"""The pods on this node, as features other than `kube` may see them.

`agent.kube` learns them (one watch on pods with ``spec.nodeName=<node>``);
features such as `traffic` read them through `PodView` without importing
`kube` (features do not import each other): the runtime hands a view to the
checks in `CheckContext.pods`. A node without a cluster has no view (None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class PodAddr:
    """One pod on this node: who it is, its addresses, and the annotations features act on."""

    namespace: str
    name: str
    uid: str
    ips: tuple[str, ...]  # status.podIPs (IPv4 and/or IPv6); empty until the CNI has given it one
    host_network: bool = False  # spec.hostNetwork: its traffic is the node's, never counted per pod
    annotations: Mapping[str, str] = field(default_factory=dict)


class PodView(Protocol):
    def pods(self) -> Sequence[PodAddr] | None:
        """The node's pods now; None while not known (not yet listed, or the watch is down past its staleness
        limit): a caller then reports "unknown", never "no pods"."""
        ...

    def generation(self) -> int:
        """Changes whenever the set of pods or any of their addresses or annotations changes (cheap change test)."""
        ...
