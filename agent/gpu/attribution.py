"""Which pods and processes hold a GPU: the lookup remediation uses before it
drains a GPU's pods or resets it (/work contract "remediation-interface"), and
what the ``gpu_pods`` check exports.

Two sources, each covering what the other misses:

- **NVML's process lists** (``nvmlDeviceGetComputeRunningProcesses`` and
  ``...GraphicsRunningProcesses``; on a MIG GPU the parent's list holds every
  instance's processes), each PID traced to its owner through
  ``/proc/<pid>/cgroup`` (`agent.gpu.cgroups`): the pod UID, a Slurm job, a
  systemd unit. It sees what really runs on the GPU, privileged pods that see
  every GPU included, and bare-metal jobs. The PIDs are the host's: the agent
  needs the host's PID namespace (``hostPID`` in a pod) and its /proc.
- **The kubelet's PodResources API** (`agent.gpu.podresources`), where its
  socket is mounted: which container was *allocated* which device, running or
  not, and on a lost GPU that NVML cannot list any more. It names pods by
  namespace and name only; their UIDs come from the kubelet's log directories
  (``/var/log/pods/<namespace>_<name>_<uid>``).

`pods_on_gpu` is the union of both; `processes_on_gpu` is NVML's alone. A
source that cannot answer raises `AttributionError` rather than answering
"nothing": an empty answer lets a GPU be reset.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..hostpaths import HostPaths
from ..probe import Prober
from . import cgroups, nvml, podresources
from .cgroups import Owner

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
POD_LOGS = "/var/log/pods"
HOST = HostPaths()
UNKNOWN = "unknown"  # the owner of a PID whose /proc entry cannot be read (gone, or another PID namespace)


class AttributionError(Exception):
    """Who holds the GPU cannot be told (NVML failed or hung, the kubelet did not answer)."""


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    migs: tuple[str, ...] = ()  # MIG device UUIDs, when MIG is on


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    gpu: int  # NVML index of the (parent) GPU
    used_memory: int | None  # bytes; None when NVML does not say
    owner: Owner


@dataclass(frozen=True, slots=True)
class Allocation:
    """One device the kubelet allocated to a container."""

    device: str  # the device plugin's id
    resource: str
    namespace: str
    pod: str
    container: str
    gpu: int | None  # NVML index of the GPU it is (or is a part of); None when no GPU here matches


@dataclass
class Snapshot:
    gpus: list[Gpu] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)  # GPU index -> why its processes are unknown


# ------------------------------------------------------------------ device ids


def base_device_id(device: str) -> str:
    """A shared replica's id without its replica suffix (NVIDIA time-slicing
    ``GPU-x::3``, GKE ``nvidia0/vgpu2``)."""
    return device.split("::", 1)[0].split("/vgpu", 1)[0]


def gpu_of(device: str, gpus: Iterable[Gpu]) -> int | None:
    """The NVML index of the GPU that the device plugin id `device` is or is part of."""
    dev = base_device_id(device)
    gpus = list(gpus)
    if dev.startswith("MIG-GPU-"):  # MIG ids before driver 470: MIG-GPU-<uuid>/<gi>/<ci>
        dev = dev[4:].split("/", 1)[0]
    for g in gpus:
        if dev == g.uuid or dev in g.migs:
            return g.index
    if dev.startswith("nvidia"):  # GKE: nvidia<index>, nvidia<index>/gi<gi>
        dev = dev[6:].split("/", 1)[0]
    head = dev.split(":", 1)[0]  # the NVIDIA plugin's index strategy: <index>, <index>:<mig>
    if head.isdigit() and any(g.index == int(head) for g in gpus):
        return int(head)
    return None


def allocations(pods: Iterable[podresources.Pod], gpus: Iterable[Gpu], extra_resources: Iterable[str] = ()) -> list[Allocation]:
    """Every GPU or MIG device allocated to a container, mapped to its GPU:
    resources nvidia.com/gpu, nvidia.com/gpu.* (the plugin's renamed shared
    replicas, e.g. nvidia.com/gpu.shared), nvidia.com/mig-* and `extra_resources`."""
    gpus = list(gpus)
    names = {GPU_RESOURCE, *extra_resources}
    out = []
    for pod in pods:
        for c in pod.containers:
            for d in c.devices:
                if d.resource not in names and not d.resource.startswith((MIG_RESOURCE_PREFIX, GPU_RESOURCE + ".")):
                    continue
                for dev in d.ids:
                    out.append(Allocation(dev, d.resource, pod.namespace, pod.name, c.name, gpu_of(dev, gpus)))
    return out


# ------------------------------------------------------------------ pod names and UIDs


def pod_log_dirs(paths: HostPaths, logs_dir: str = POD_LOGS) -> dict[tuple[str, str], set[str]]:
    """(namespace, name) -> pod UIDs, from the kubelet's ``<namespace>_<name>_<uid>``
    log directories (names cannot hold "_": they are DNS labels). A name may
    have two UIDs for a while (a pod recreated under its old name)."""
    out: dict[tuple[str, str], set[str]] = {}
    try:
        entries = os.listdir(paths.root(logs_dir))
    except OSError:
        return out
    for entry in entries:
        parts = entry.split("_")
        if len(parts) == 3 and all(parts):
            out.setdefault((parts[0], parts[1]), set()).add(parts[2])
    return out


# ------------------------------------------------------------------ NVML


def _call(nv: Any, name: str, *args: Any) -> Any:
    return getattr(nv, name)(*args)


def read_gpus(nv: ModuleType) -> list[Gpu]:
    """Every GPU NVML lists, with its MIG devices."""
    out = []
    for i in range(int(nv.nvmlDeviceGetCount())):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        out.append(Gpu(i, nvml.text(nv.nvmlDeviceGetUUID(h)), _migs(nv, h)))
    return out


def _migs(nv: Any, h: Any) -> tuple[str, ...]:
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(h)
        if current != 1:
            return ()
        count = int(nv.nvmlDeviceGetMaxMigDeviceCount(h))
    except Exception as exc:
        if nvml.code(exc) is None:
            raise
        return ()  # no MIG on this GPU or driver
    out = []
    for j in range(count):
        try:
            out.append(nvml.text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j))))
        except Exception as exc:
            if nvml.code(exc) is None:
                raise
            # NOT_FOUND: no MIG device at this slot
    return tuple(out)


def read_processes(nv: Any, index: int) -> list[tuple[int, int | None]]:
    """(pid, used memory) of every process NVML lists on GPU `index`, compute and
    graphics together (a process in both lists once). Raises what NVML raises,
    except that a GPU without a graphics process list has just none."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    seen: dict[int, int | None] = {}
    for kind in ("Compute", "Graphics"):
        try:
            procs = _versioned(nv, f"nvmlDeviceGet{kind}RunningProcesses", h)
        except Exception as exc:
            if kind == "Graphics" and nvml.not_applicable(exc):
                continue
            raise
        for p in procs:
            mem = getattr(p, "usedGpuMemory", None)
            seen.setdefault(int(p.pid), int(mem) if mem is not None else None)
    return sorted(seen.items())


def _versioned(nv: Any, name: str, h: Any) -> Any:
    """The _v3 call, else _v2 on a driver that lacks it (before R510)."""
    try:
        return _call(nv, name + "_v3", h)
    except Exception as exc:
        if nvml.code(exc) != nvml.FUNCTION_NOT_FOUND:
            raise
        return _call(nv, name + "_v2", h)


# ------------------------------------------------------------------ the lookup


class GpuAttribution:
    """Both sources, with the hang protection of every NVML call and a deadline on the kubelet."""

    def __init__(
        self,
        paths: HostPaths = HOST,
        *,
        library: str = "",
        socket: str | None = podresources.DEFAULT_SOCKET,
        logs_dir: str = POD_LOGS,
        call_timeout: float = 5.0,
        extra_resources: tuple[str, ...] = (),
    ) -> None:
        self.paths, self.library, self.logs_dir = paths, library, logs_dir
        self.socket = paths.root(socket) if socket else None
        self.call_timeout = call_timeout
        self.extra_resources = extra_resources
        self.prober = Prober("attribution")

    # -------------------------------------------------------------- NVML side

    def _nvml(self, key: object, fn: Any) -> Any:
        res = self.prober.call(key, fn, self.call_timeout)
        if res.hung_for is not None:
            raise AttributionError(f"NVML has not answered for {res.hung_for:.0f}s")
        if res.error is not None:
            if isinstance(res.error, nvml.NvmlUnavailable):
                raise AttributionError(f"NVML unavailable: {res.error}")
            if nvml.code(res.error) in (nvml.UNINITIALIZED, nvml.DRIVER_NOT_LOADED):
                nvml.invalidate()
            raise AttributionError(f"NVML: {type(res.error).__name__}: {res.error}")
        return res.value

    def gpus(self) -> list[Gpu]:
        nv = self._nvml("init", lambda: nvml.init(self.library))
        gpus: list[Gpu] = self._nvml("gpus", lambda: read_gpus(nv))
        return gpus

    def snapshot(self, gpus: list[Gpu] | None = None) -> Snapshot:
        """Every GPU's processes and their owners; a GPU whose list cannot be read
        is in `errors` (the others are still read)."""
        nv = self._nvml("init", lambda: nvml.init(self.library))
        snap = Snapshot(gpus if gpus is not None else self.gpus())
        for g in snap.gpus:
            try:
                procs = self._nvml(("procs", g.index), lambda i=g.index: read_processes(nv, i))
            except AttributionError as exc:
                snap.errors[g.index] = str(exc)
                continue
            for pid, mem in procs:
                owner = cgroups.owner_of(self.paths, pid) or Owner(UNKNOWN)
                snap.processes.append(GpuProcess(pid, g.index, mem, owner))
        return snap

    def _gpu(self, uuid: str, gpus: list[Gpu]) -> Gpu:
        for g in gpus:
            if uuid == g.uuid or uuid in g.migs:
                return g
        raise AttributionError(f"no GPU {uuid} in NVML")

    def processes_on_gpu(self, uuid: str) -> tuple[int, ...]:
        """PIDs NVML lists on GPU `uuid` (all its MIG instances with it). Raises AttributionError."""
        gpus = self.gpus()
        g = self._gpu(uuid, gpus)
        snap = self.snapshot([g])
        if g.index in snap.errors:
            raise AttributionError(snap.errors[g.index])
        return tuple(p.pid for p in snap.processes)

    # -------------------------------------------------------------- kubelet side

    def allocations(self, gpus: list[Gpu]) -> list[Allocation] | None:
        """The kubelet's GPU allocations; None where its socket is absent (not a
        Kubernetes node, or not mounted). Raises AttributionError when it fails."""
        if self.socket is None or not os.path.exists(self.socket):
            return None
        try:
            pods = podresources.list_pods(self.socket, self.call_timeout)
        except podresources.PodResourcesError as exc:
            raise AttributionError(str(exc)) from None
        return allocations(pods, gpus, self.extra_resources)

    def pods_on_gpu(self, uuid: str) -> frozenset[str]:
        """UIDs of the pods holding GPU `uuid`: a process on it (NVML, through its
        cgroup) or a device of it allocated (PodResources). Raises AttributionError
        when neither source answers; a lost GPU (NVML cannot list its processes)
        is still answered from PodResources."""
        problems = []
        uids: set[str] = set()
        answered = False
        gpus: list[Gpu] = []
        try:
            gpus = self.gpus()
            g = self._gpu(uuid, gpus)
            snap = self.snapshot([g])
            if g.index in snap.errors:
                problems.append(snap.errors[g.index])
            else:
                answered = True
                uids.update(p.owner.pod_uid for p in snap.processes if p.owner.pod_uid)
        except AttributionError as exc:
            problems.append(str(exc))
            g = Gpu(-1, uuid)
        try:
            allocated = self.allocations(gpus or [g])
        except AttributionError as exc:
            problems.append(f"PodResources: {exc}")
            allocated = None
        if allocated is not None:
            answered = True
            uids.update(self._uids(a for a in allocated if a.gpu == g.index or base_device_id(a.device) == uuid))
        if not answered:
            raise AttributionError("; ".join(problems))
        return frozenset(uids)

    def _uids(self, allocated: Iterable[Allocation]) -> set[str]:
        names = pod_log_dirs(self.paths, self.logs_dir)
        out: set[str] = set()
        for a in allocated:
            found = names.get((a.namespace, a.pod))
            if found:
                out |= found
            else:
                log.warning("no pod UID for %s/%s (no %s/%s_%s_<uid>)", a.namespace, a.pod, self.logs_dir, a.namespace, a.pod)
        return out


class GpuUsers:
    """The lookup as the remediation ladder asks it: None for "cannot tell"
    (the reason is logged, once while it stays the same), never an exception."""

    def __init__(self, attribution: GpuAttribution) -> None:
        self.attribution = attribution
        self._said: dict[str, str] = {}

    def pods_on_gpu(self, uuid: str) -> frozenset[str] | None:
        try:
            pods = self.attribution.pods_on_gpu(uuid)
        except AttributionError as exc:
            self._cannot("pods", uuid, exc)
            return None
        self._said.pop(f"pods {uuid}", None)
        return pods

    def processes_on_gpu(self, uuid: str) -> tuple[int, ...] | None:
        try:
            pids = self.attribution.processes_on_gpu(uuid)
        except AttributionError as exc:
            self._cannot("processes", uuid, exc)
            return None
        self._said.pop(f"processes {uuid}", None)
        return pids

    def _cannot(self, what: str, uuid: str, exc: AttributionError) -> None:
        key = f"{what} {uuid}"
        if self._said.get(key) != str(exc):
            self._said[key] = str(exc)
            log.warning("which %s hold GPU %s cannot be told: %s", what, uuid, exc)


def processes_on_gpu(uuid: str, paths: HostPaths = HOST, library: str = "") -> tuple[int, ...]:
    """PIDs NVML lists on GPU `uuid`; raises AttributionError (never () when unknown)."""
    return GpuAttribution(paths, library=library).processes_on_gpu(uuid)


def pods_on_gpu(
    uuid: str, paths: HostPaths = HOST, library: str = "", socket: str | None = podresources.DEFAULT_SOCKET
) -> frozenset[str]:
    """UIDs of the pods holding GPU `uuid` (see `GpuAttribution.pods_on_gpu`)."""
    return GpuAttribution(paths, library=library, socket=socket).pods_on_gpu(uuid)
