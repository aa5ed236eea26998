"""The software around the GPUs, seen from the host: NVSwitches and the Fabric
Manager service that trains them, and the GPUDirect RDMA module.

All of it is read under the configured roots (sysfs, procfs), so the DaemonSet
sees the host's, and tests point at fixture trees.

* **NVSwitch system**: NVIDIA functions of PCI class 0x0680 (bridge, other) on
  the bus. HGX/DGX boards with NVSwitch need ``nvidia-fabricmanager`` running
  before CUDA can use the GPUs. Where the driver reports the GPU's fabric state
  through NVML (``nvmlDeviceGetGpuFabricInfo``), that is judged per GPU
  (`agent.gpu.judge`); only where it does not is the service's state used.
  On GB200 compute trays the switches are not on the host's bus and FM does not
  run there (gpu-operator#610): NVML's fabric state is all there is.
* **The service's state**: systemd runs each service in its own cgroup,
  ``system.slice/nvidia-fabricmanager.service``, which holds processes exactly
  while the service runs (cgroup v2 ``cgroup.events`` says ``populated 1``; v1
  has the ``name=systemd`` hierarchy's ``cgroup.procs``). Where FM runs outside
  systemd, a process named ``nv-fabricmanager`` (comm is cut to 15 bytes) will do.
* **nvidia_peermem**: a loaded module has ``/sys/module/<name>``; the older
  Mellanox module ``nv_peer_mem`` does the same job. Needed for GPUDirect RDMA
  on a node that has both GPUs and InfiniBand/RoCE devices
  (``/sys/class/infiniband`` not empty), unless DMA-BUF is used instead.
"""

from __future__ import annotations

import os

from ..hostpaths import HostPaths, read_text
from .pci import NVIDIA_VENDOR

NVSWITCH_CLASS = "0x0680"
FM_UNIT = "nvidia-fabricmanager.service"
FM_COMM = "nv-fabricmanage"  # "nv-fabricmanager", cut to TASK_COMM_LEN - 1
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


def nvswitches(paths: HostPaths) -> int:
    """NVIDIA NVSwitch functions on the PCI bus."""
    base = paths.sys("bus/pci/devices")
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    n = 0
    for name in names:
        dev = os.path.join(base, name)
        vendor = (read_text(os.path.join(dev, "vendor"), "") or "").lower()
        cls = (read_text(os.path.join(dev, "class"), "") or "").lower()
        n += vendor == NVIDIA_VENDOR and cls[:6] == NVSWITCH_CLASS
    return n


def fabric_manager_running(paths: HostPaths) -> bool:
    """Whether nvidia-fabricmanager runs: its systemd cgroup holds processes, or a process has its name."""
    cg = paths.sys("fs/cgroup")
    events = read_text(os.path.join(cg, "system.slice", FM_UNIT, "cgroup.events"))
    if events is not None and "populated 1" in events.splitlines():
        return True
    procs = read_text(os.path.join(cg, "systemd", "system.slice", FM_UNIT, "cgroup.procs"))
    if procs:
        return True
    return _process_named(paths, FM_COMM)


def _process_named(paths: HostPaths, comm: str) -> bool:
    try:
        pids = [p for p in os.listdir(paths.procfs) if p.isdigit()]
    except OSError:
        return False
    return any(read_text(paths.proc(pid, "comm")) == comm for pid in pids)


def infiniband_devices(paths: HostPaths) -> list[str]:
    try:
        return sorted(os.listdir(paths.sys("class/infiniband")))
    except OSError:
        return []


def peermem_loaded(paths: HostPaths) -> bool:
    return any(os.path.isdir(paths.sys("module", name)) for name in PEERMEM_MODULES)
