"""Whether the GPUs are idle enough to burn: no process on any of them (NVML's
compute and graphics process lists) and no GPU allocated to a pod (the
kubelet's PodResources List, where its socket is present).

The decision is per node, not per GPU: the preflight burns every GPU or none.
A burn of the idle GPUs beside a busy one still takes the node's shared
power and cooling (every GPU at its power cap), the NVLink/NVSwitch fabric
and PCIe switches a job on the busy GPU may be using, and host memory and CPU;
and the straggler verdict compares each GPU with its peers burned at the same
moment. So a single busy GPU defers the whole node's preflight.

Anything that cannot be told counts as busy (fail closed): NVML unavailable or
hung, a kubelet that does not answer, a GPU allocation that matches no GPU
listed here. A PodResources socket that does not exist is "not a Kubernetes
node" (or not mounted) and is not asked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..probe import Prober
from .backend import Inventory
from .model import GpuInfo

NVML_TIMEOUT = 30.0  # listing the processes; longer means a GPU is hanging the driver
UNIDENTIFIED = -1  # the key of holders of a GPU device that matches no GPU here


@dataclass(frozen=True, slots=True)
class Occupancy:
    """Who holds the GPUs: GPU index → holders ("pid 4242", "pod ns/name");
    `unknown` says why it cannot be told (which counts as busy)."""

    busy: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    unknown: str = ""

    @property
    def idle(self) -> bool:
        return not self.unknown and not any(self.busy.values())

    def describe(self) -> str:
        parts = [
            ("a GPU not listed here" if i == UNIDENTIFIED else f"GPU {i}") + ": " + ", ".join(h)
            for i, h in sorted(self.busy.items())
            if h
        ]
        if self.unknown:
            parts.append(f"cannot tell whether the GPUs are in use ({self.unknown})")
        return "; ".join(parts) or "idle"


# The kubelet's allocations as (GPU index or None, "namespace/name") pairs; None
# where its socket is absent. Raises PodResourcesError when the kubelet fails.
PodLookup = Callable[[Sequence[GpuInfo]], list[tuple[int | None, str]] | None]


class Idleness:
    def __init__(self, inventory: Inventory, pods: PodLookup | None = None) -> None:
        self.inventory, self.pods = inventory, pods
        self._prober = Prober("burn-idle")

    def occupancy(self, gpus: Sequence[GpuInfo]) -> Occupancy:
        busy: dict[int, list[str]] = {}
        unknown: list[str] = []
        res = self._prober.call("nvml-processes", self.inventory.processes, NVML_TIMEOUT)
        if res.hung_for is not None:
            unknown.append(f"NVML has not answered for {res.hung_for:.0f}s")
        elif res.error is not None:
            unknown.append(f"NVML: {type(res.error).__name__}: {res.error}")
        elif res.value is None:
            unknown.append("NVML is not available to list the GPUs' processes")
        else:
            for index, pids in res.value.items():
                busy.setdefault(index, []).extend(f"pid {p}" for p in pids)
        if self.pods is not None:
            from ..gpu.podresources import PodResourcesError

            try:
                allocated = self.pods(gpus)
            except PodResourcesError as exc:
                unknown.append(f"the kubelet's PodResources: {exc}")
                allocated = None
            for gpu, pod in allocated or ():
                holders = busy.setdefault(UNIDENTIFIED if gpu is None else gpu, [])
                if f"pod {pod}" not in holders:
                    holders.append(f"pod {pod}")
        return Occupancy({i: tuple(h) for i, h in busy.items() if h}, "; ".join(unknown))


def pod_lookup(socket: str, call_timeout: float, extra_resources: tuple[str, ...] = ()) -> PodLookup:
    """Allocations from the kubelet's PodResources socket `socket` (a path on this
    machine); None when the socket does not exist."""
    from ..gpu import attribution, podresources

    def lookup(gpus: Sequence[GpuInfo]) -> list[tuple[int | None, str]] | None:
        if not os.path.exists(socket):
            return None
        pods = podresources.list_pods(socket, call_timeout)
        known = [attribution.Gpu(g.index, g.uuid) for g in gpus]
        return [(a.gpu, f"{a.namespace}/{a.pod}") for a in attribution.allocations(pods, known, extra_resources)]

    return lookup
