"""The ``gpu_pods`` engine: who holds each GPU, exported for PromQL joins.

- ``node_health_gpu_allocation{gpu, device, resource, namespace, pod, container} 1``
  from the kubelet's PodResources List, one series per allocated device; a
  series is gone at the first look after its pod is;
- ``node_health_gpu_processes`` and ``node_health_gpu_process_memory_bytes`` by
  owner, from NVML's process lists and each process's cgroup. Labels are owners
  (a pod UID, a job id, a unit), never PIDs: as many series as there are
  owners on the GPUs at once, and no new series per process started.

It polls on its own interval; each source has a deadline, so a hung kubelet
or NVML ends the run with a finding, and /metrics serves the last run
meanwhile. The GPU check reports NVML itself being unavailable; this one only
says so in its subjects.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..findings import ObservationBuilder
from ..hostpaths import HostPaths
from . import nvml
from .attribution import AttributionError, Gpu, GpuAttribution, GpuProcess, pod_log_dirs
from .settings import GpuConfig, GpuPodsConfig, nvml_library


class GpuPodsMonitor:
    def __init__(self, paths: HostPaths, cfg: GpuPodsConfig, gpu_cfg: GpuConfig) -> None:
        self.paths, self.cfg, self.gpu_cfg = paths, cfg, gpu_cfg
        self.attribution = GpuAttribution(
            paths,
            socket=cfg.pod_resources_socket or None,
            logs_dir=cfg.pod_logs_dir,
            call_timeout=cfg.call_timeout,
            extra_resources=cfg.resource_names,
        )

    def known_findings(self) -> list[tuple[str, str]]:
        return [("pod_resources", "PodResourcesUnavailable")] if self.cfg.pod_resources_socket else []

    def run(self, b: ObservationBuilder) -> None:
        gpus = self._gpus(b)
        if gpus and self.cfg.processes:
            self._processes(b, gpus)
        self._allocations(b, gpus)

    def _gpus(self, b: ObservationBuilder) -> list[Gpu]:
        try:
            self.attribution.library = nvml_library(self.paths, self.gpu_cfg)
            gpus = self.attribution.gpus()
        except (nvml.NvmlUnavailable, AttributionError) as exc:
            b.subject("gpus", f"no GPU list from NVML ({exc}); allocations are exported without their gpu label")
            return []
        migs = sum(len(g.migs) for g in gpus)
        b.subject("gpus", f"{len(gpus)} GPUs in NVML" + (f", {migs} MIG devices" if migs else ""))
        return gpus

    def _processes(self, b: ObservationBuilder, gpus: list[Gpu]) -> None:
        snap = self.attribution.snapshot(gpus)
        for index, why in sorted(snap.errors.items()):
            b.finding(f"gpu{index}", "GpuProcessesUnknown", why)
        names = {uid: key for key, uids in pod_log_dirs(self.paths, self.cfg.pod_logs_dir).items() for uid in uids}
        counts: dict[tuple[str, ...], list[int]] = {}
        for p in snap.processes:
            ns, pod = names.get(p.owner.pod_uid, ("", "")) if p.owner.pod_uid else ("", "")
            key = (str(p.gpu), p.owner.kind, p.owner.name, ns, pod)
            entry = counts.setdefault(key, [0, 0, 0])
            entry[0] += 1
            if p.used_memory is not None:
                entry[1] += p.used_memory
                entry[2] = 1
        for (gpu, kind, owner, ns, pod), (n, mem, has_mem) in sorted(counts.items()):
            labels = {"gpu": gpu, "kind": kind, "owner": owner, "namespace": ns, "pod": pod}
            b.sample("node_health_gpu_processes", n, **labels)
            if has_mem:
                b.sample("node_health_gpu_process_memory_bytes", mem, **labels)
        for g in gpus:
            if g.index not in snap.errors:
                b.subject(f"gpu{g.index}", _describe(p for p in snap.processes if p.gpu == g.index))

    def _allocations(self, b: ObservationBuilder, gpus: list[Gpu]) -> None:
        if not self.cfg.pod_resources_socket:
            return
        try:
            allocated = self.attribution.allocations(gpus)
        except AttributionError as exc:
            b.sample("node_health_pod_resources_up", 0)
            b.finding("pod_resources", "PodResourcesUnavailable", f"{self.cfg.pod_resources_socket}: {exc}")
            return
        if allocated is None:
            b.sample("node_health_pod_resources_up", 0)
            b.subject("pod_resources", f"no socket at {self.cfg.pod_resources_socket} (not a Kubernetes node, or not mounted)")
            return
        b.sample("node_health_pod_resources_up", 1)
        for a in sorted(allocated, key=lambda a: (a.gpu if a.gpu is not None else -1, a.device, a.namespace, a.pod, a.container)):
            b.sample(
                "node_health_gpu_allocation", 1,
                gpu="" if a.gpu is None else str(a.gpu), device=a.device, resource=a.resource,
                namespace=a.namespace, pod=a.pod, container=a.container,
            )
        pods = {(a.namespace, a.pod) for a in allocated}
        b.subject("pod_resources", f"{len(allocated)} GPU devices allocated to {len(pods)} pods")


def _describe(procs: Iterable[GpuProcess]) -> str:
    owners = sorted({replace(p.owner, container="", runtime="") for p in procs}, key=lambda o: (o.kind, o.name))
    if not owners:
        return "no processes"
    return "processes of " + ", ".join(f"{o.kind} {o.name}".strip() for o in owners)
