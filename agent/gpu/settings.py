"""The ``[checks.gpu]`` section and where the NVML library is found."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..findings import Severity
from ..hostpaths import HostPaths
from ..schema import CheckConfig, opt
from . import xid_catalog

SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class GpuConfig(CheckConfig):
    interval: float = opt(30.0, "Time between NVML polls.", duration=True, min=1)
    timeout: float = opt(60.0, "A poll longer than this is reported as CheckTimeout.", duration=True, min=0.1)
    nvml_library: str = opt("", "Path of libnvidia-ml.so.1 (host path); empty: the normal library lookup.")
    driver_root: str = opt(
        "",
        'Host root of the driver whose libnvidia-ml.so.1 is used; several separated by ":" are tried in order '
        '(e.g. "/run/nvidia/driver:/": the GPU Operator\'s containerised driver, else the host\'s).',
    )
    call_timeout: float = opt(5.0, "NVML calls for one GPU longer than this are reported as NvmlCallHung.", duration=True, min=0.1)
    hung_polls: int = opt(
        5,
        "An NVML call that stays hung for this many polls in a row (or a process in uninterruptible sleep on "
        "/dev/nvidia* for as many) is GpuUnresponsive / GpuProcessStuck (critical, reboot); 0: never.",
        min=0,
    )
    expected_count: int = opt(0, "GPUs this node must have; 0: the NVIDIA GPUs on the PCI bus (and those seen this boot).", min=0)
    ecc_corrected_rate: float = opt(1000.0, "Corrected ECC errors per hour above which EccCorrectedRate is raised; 0: never.", min=0)
    nvlink_error_rate: float = opt(100.0, "NVLink CRC + replay errors per second on one link above which NvLinkErrors is raised.", min=0)
    pcie_replay_rate: float = opt(
        8.0, "PCIe replays per minute on one GPU above which PcieReplayRate is raised (DCGM's PCIe watch: 8); 0: never.", min=0
    )
    fabric_manager_grace: float = opt(
        300.0,
        "How long after it is first seen an untrained NVLink fabric (or, on an NVSwitch system, a stopped "
        "nvidia-fabricmanager) is given before FabricManagerNotRunning.",
        duration=True,
        min=0,
    )
    peermem: bool = opt(
        True,
        "On a node with GPUs and InfiniBand, expect nvidia_peermem (GPUDirect RDMA); turn off where DMA-BUF is used instead.",
    )
    xid_events: bool = opt(True, "Follow Xid errors as they happen (NVML events and the kernel log).")
    kmsg_path: str = opt("/dev/kmsg", "Kernel log to follow (host path); also a file or FIFO of /dev/kmsg records.")
    dedupe_window: float = opt(10.0, "An Xid from NVML and from the kernel log for the same GPU within this window is one event.", duration=True, min=0.1, max=600)
    app_xid_hold: float = opt(300.0, "How long a finding for an Xid whose action is none or restart_app stays.", duration=True, min=0)
    coverage_lost_hold: float = opt(3600.0, "How long KmsgCoverageLost stays after the last lost record.", duration=True, min=0)
    xid_severity: Mapping[str, str] = opt(
        MappingProxyType({}), 'Severity per Xid, overriding the catalog: { "109" = "warning", "13" = "critical" }.'
    )

    def validate(self) -> tuple[str, str] | None:
        if self.nvml_library and self.driver_root:
            return "driver_root", "set either nvml_library or driver_root, not both"
        if any(not root.startswith("/") for root in self.driver_roots()):
            return "driver_root", f'expected absolute host paths separated by ":", got "{self.driver_root}"'
        for key, value in self.xid_severity.items():
            if not key.isdigit() or int(key) not in xid_catalog.catalog():
                return f"xid_severity.{key}", f'expected an Xid from the catalog (see "agent xid {key}"), got "{key}"'
            if value not in SEVERITIES:
                return f"xid_severity.{key}", f'expected one of "info", "warning", "critical", got "{value}"'
        return None

    def driver_roots(self) -> list[str]:
        return [root for root in self.driver_root.split(":") if root]

    def severity_overrides(self) -> dict[int, Severity]:
        return {int(k): Severity(v) for k, v in self.xid_severity.items()}


def nvml_library(paths: HostPaths, cfg: GpuConfig) -> str:
    """The library to load ("" for the normal lookup), resolved under the host root."""
    from . import nvml

    if cfg.nvml_library:
        return paths.root(cfg.nvml_library)
    if cfg.driver_root:
        return nvml.find_library(*(paths.root(root) for root in cfg.driver_roots()))
    return ""


@dataclass(frozen=True)
class TelemetryConfig(CheckConfig):
    """The ``[checks.gpu_telemetry]`` section; NVML is found as ``[checks.gpu]`` says."""

    interval: float = opt(10.0, "Time between telemetry polls (power, clocks, utilisation, memory, PCIe, NVLink, GPM).", duration=True, min=1)
    timeout: float = opt(30.0, "A poll longer than this is reported as CheckTimeout.", duration=True, min=0.1)
    call_timeout: float = opt(
        3.0, "NVML calls for one GPU longer than this: its telemetry is absent (NvmlCallHung) until they return.", duration=True, min=0.1
    )
    gpm: bool = opt(True, "Profiling ratios through NVML GPM where the GPU has it (Hopper and later); coexists with DCGM profiling.")


def _host_path_or_empty(value: str) -> str | None:
    return None if not value or value.startswith("/") else "expected an absolute host path or an empty string"


@dataclass(frozen=True)
class GpuPodsConfig(CheckConfig):
    """The ``[checks.gpu_pods]`` section: who holds each GPU (agent.gpu.attribution).
    NVML is found as ``[checks.gpu]`` says (nvml_library, driver_root)."""

    interval: float = opt(15.0, "Time between looks at the GPUs' processes and the kubelet's allocations.", duration=True, min=1)
    timeout: float = opt(30.0, "A run longer than this is reported as CheckTimeout.", duration=True, min=0.1)
    call_timeout: float = opt(5.0, "NVML calls and the kubelet's List longer than this are reported as failed.", duration=True, min=0.1)
    processes: bool = opt(True, "List the processes NVML sees on each GPU and trace each through its cgroup to a pod, job or unit.")
    pod_resources_socket: str = opt(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "The kubelet's PodResources socket (host path); empty: do not ask the kubelet.",
        check=_host_path_or_empty,
    )
    pod_logs_dir: str = opt("/var/log/pods", "The kubelet's pod log directories (host path): pod namespace and name to UID.", check=_host_path_or_empty)
    resource_names: tuple[str, ...] = opt(
        (), 'Device plugin resources that are GPUs besides nvidia.com/gpu, nvidia.com/gpu.* and nvidia.com/mig-* (e.g. "example.com/gpu").'
    )
