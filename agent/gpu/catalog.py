"""What the GPU feature declares to the catalog: the reasons and metrics of the
GPU check and the Xid source. Label `gpu` is the NVML index; identity (UUID,
PCI bus id, model, serial) is only on `node_health_gpu_info`."""

from __future__ import annotations

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity
from . import xid_catalog

G = ("gpu",)

GPU_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("node_health_nvml_up", "gauge", "1 if NVML initialised, 0 if it cannot be used."),
    MetricSpec("node_health_gpus", "gauge", "GPUs by where they were counted (nvml, pci_bus: NVIDIA GPUs on the PCI bus for NVML, expected).", ("source",)),
    MetricSpec("node_health_gpu_info", "gauge", "Always 1; the GPU's identity.", ("gpu", "uuid", "pci_bus_id", "model", "serial")),
    MetricSpec("node_health_gpu_up", "gauge", "1 if NVML answers for the GPU, 0 if it is lost or hung.", G),
    MetricSpec("node_health_gpu_ecc_errors_total", "counter", "ECC errors (volatile: since the driver loaded; aggregate: lifetime).", ("gpu", "error_type", "scope")),
    MetricSpec("node_health_gpu_remapped_rows", "gauge", "Rows remapped, by the error that caused it (Ampere and later).", ("gpu", "kind")),
    MetricSpec("node_health_gpu_row_remap_pending", "gauge", "1 if a row remap waits for a GPU reset.", G),
    MetricSpec("node_health_gpu_row_remap_failed", "gauge", "1 if a row remap failed.", G),
    MetricSpec("node_health_gpu_retired_pages", "gauge", "Retired pages by cause (sbe, dbe; before Ampere).", ("gpu", "cause")),
    MetricSpec("node_health_gpu_retired_pages_pending", "gauge", "1 if pages wait for retirement (reset or reboot).", G),
    MetricSpec("node_health_gpu_temperature_celsius", "gauge", "GPU core temperature.", G),
    MetricSpec("node_health_gpu_temperature_threshold_celsius", "gauge", "The GPU's own slowdown and shutdown temperatures.", ("gpu", "threshold")),
    MetricSpec("node_health_gpu_clock_event_reasons", "gauge", "The clock event (throttle) reasons bitmask.", G),
    MetricSpec("node_health_gpu_clock_event_active", "gauge", "1 while a clock event reason is active.", ("gpu", "reason")),
    MetricSpec("node_health_gpu_pcie_link_generation", "gauge", "PCIe link generation, current and max (device and slot).", ("gpu", "which")),
    MetricSpec("node_health_gpu_pcie_link_width", "gauge", "PCIe link width in lanes, current and max.", ("gpu", "which")),
    MetricSpec("node_health_gpu_nvlink_up", "gauge", "1 if the NVLink is active.", ("gpu", "link")),
    MetricSpec("node_health_gpu_nvlink_errors_total", "counter", "NVLink data-link error counters (replay, recovery, crc_flit, crc_data).", ("gpu", "link", "counter")),
    MetricSpec("node_health_gpu_persistence_mode", "gauge", "1 if persistence mode is enabled, 0 if not (absent where not applicable).", G),
    MetricSpec("node_health_gpu_fabric_state", "gauge", "NVLink fabric state from NVML (1 not started, 2 in progress, 3 completed); absent off a fabric.", G),
    MetricSpec("node_health_fabric_manager_running", "gauge", "1 if nvidia-fabricmanager runs (judged on NVSwitch systems whose driver does not report the fabric state)."),
    MetricSpec("node_health_nvidia_peermem_loaded", "gauge", "1 if nvidia_peermem (or nv_peer_mem) is loaded (judged on nodes with GPUs and InfiniBand)."),
    MetricSpec("node_health_nvml_hung_polls", "gauge", "Polls in a row in which NVML calls for the subject (gpuN; nvml: nvmlInit; gpus: the count) have not returned; 0 once they answer.", ("subject",)),
    MetricSpec("node_health_gpu_stuck_processes", "gauge", "Processes in uninterruptible sleep (D) with a /dev/nvidia* file open, at the last poll."),
    MetricSpec("node_health_gpu_recovery_action", "gauge", "NVML GPU recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, …).", G),
)

XID_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("node_health_gpu_xid_errors_total", "counter", "Xid errors this boot (NVML and kernel log deduplicated); xid is a catalog value or other.", ("gpu", "xid")),
    MetricSpec("node_health_gpu_xid_source_events_total", "counter", "Xid events by the source that reported them (before deduplication).", ("source",)),
    MetricSpec("node_health_kmsg_records_read_total", "counter", "Kernel log records read by the Xid follower."),
    MetricSpec("node_health_kmsg_records_lost_total", "counter", "Kernel log records overwritten before they were read, this boot."),
    MetricSpec("node_health_kmsg_gaps_total", "counter", "Gaps in the kernel log sequence numbers (ring buffer wrapped), this boot."),
    MetricSpec(
        "node_health_kmsg_not_kernel_events_total",
        "counter",
        "NVIDIA events (Xid, SXid, ...) in kernel log records that a process wrote to /dev/kmsg (syslog facility not kern), this boot; never findings.",
    ),
    MetricSpec("node_health_kmsg_up", "gauge", "1 while the kernel log is followed."),
    MetricSpec("node_health_xid_state_save_failing", "gauge", "1 while the Xid stream state (kmsg cursor, findings, counters) cannot be written to the state directory (e.g. it is full)."),
    MetricSpec("node_health_xid_state_save_errors_total", "counter", "Failed writes of the Xid stream state since the agent started."),
    MetricSpec("node_health_nvml_events_up", "gauge", "1 while NVML Xid events are received for at least one GPU."),
)

OWNER = ("gpu", "kind", "owner", "namespace", "pod")
POD_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_gpu_allocation",
        "gauge",
        "Always 1: the kubelet allocated this GPU (gpu: NVML index, empty if no GPU here matches) or its device "
        "(device: the plugin's id, a MIG device's included) to this container; gone with the pod. Join on gpu.",
        ("gpu", "device", "resource", "namespace", "pod", "container"),
    ),
    MetricSpec(
        "node_health_gpu_processes",
        "gauge",
        "Processes NVML lists on the GPU by owner (kind: pod, job, container, unit, other, unknown; owner: pod UID, "
        "job id, container id or unit; namespace and pod where the kubelet's log directory names the UID).",
        OWNER,
    ),
    MetricSpec("node_health_gpu_process_memory_bytes", "gauge", "GPU memory used by those processes, where NVML says.", OWNER),
    MetricSpec("node_health_pod_resources_up", "gauge", "1 if the kubelet's PodResources List answered at the last look, 0 if it failed or its socket is absent."),
)

METRICS: tuple[MetricSpec, ...] = GPU_METRICS + XID_METRICS + POD_METRICS

F = "GPU"
REASONS: tuple[Reason, ...] = (
    Reason("NvmlUnavailable", Severity.INFO, "NVML cannot be used (no driver or library); GPUs are not polled.", family=F),
    Reason("GpuLost", Severity.CRITICAL, "NVML reports GPU_IS_LOST: the GPU fell off the bus.", family=F, action="reboot"),
    Reason("GpuMissing", Severity.CRITICAL, "Fewer GPUs in NVML than expected, or a GPU on the PCI bus that NVML lacks.", family=F, action="reboot"),
    Reason("NvmlCallHung", Severity.WARNING, "An NVML call for this GPU did not return in time.", unknown=True, family=F),
    Reason("GpuUnresponsive", Severity.CRITICAL, "An NVML call (for a GPU, the count or nvmlInit) has stayed hung for checks.gpu.hung_polls polls in a row: the driver no longer answers.", family=F, action="reboot"),
    Reason("GpuProcessStuck", Severity.CRITICAL, "Processes in uninterruptible sleep with /dev/nvidia* open for checks.gpu.hung_polls polls in a row: the driver is wedged.", family=F, action="reboot"),
    Reason("GpuPersistenceModeOff", Severity.WARNING, "Persistence mode is off (nvidia-persistenced not running): every CUDA start re-initialises the GPU.", family=F, action="none"),
    Reason("PcieReplayRate", Severity.WARNING, "PCIe replays above checks.gpu.pcie_replay_rate per minute: a marginal link (riser, slot, cable).", family=F, action="drain_and_diagnose"),
    Reason("FabricManagerNotRunning", Severity.CRITICAL, "NVSwitch system whose NVLink fabric is not trained (NVML fabric state, or nvidia-fabricmanager not running) past checks.gpu.fabric_manager_grace: CUDA cannot use the GPUs.", family=F, action="drain_and_diagnose"),
    Reason("GpuFabricUnhealthy", Severity.CRITICAL, "NVLink fabric training failed for the GPU or NVML reports its fabric unhealthy (limited capacity: warning).", family=F, action="reboot"),
    Reason("NvidiaPeermemNotLoaded", Severity.WARNING, "GPUs and InfiniBand on the node but nvidia_peermem is not loaded: no GPUDirect RDMA.", family=F, action="none"),
    Reason("NvmlError", Severity.WARNING, "NVML returned an unexpected error for this GPU.", unknown=True, family=F),
    Reason("EccUncorrectable", Severity.CRITICAL, "Uncorrectable ECC errors since the driver loaded (or new this boot).", family=F, action="reset_gpu"),
    Reason("EccCorrectedRate", Severity.WARNING, "Corrected ECC errors above checks.gpu.ecc_corrected_rate.", family=F),
    Reason("RowRemapFailure", Severity.CRITICAL, "Row remapping failed: the GPU is out of spare rows (RMA criterion).", family=F, action="rma"),
    Reason("RowRemapPending", Severity.WARNING, "A row remap is pending; it takes effect on a GPU reset.", family=F, action="reset_gpu"),
    Reason("RetiredPagesPending", Severity.WARNING, "Pages are pending retirement (pre-Ampere); reset or reboot.", family=F, action="reset_gpu"),
    Reason("GpuTemperatureSlowdown", Severity.WARNING, "At or above the GPU's own slowdown temperature.", family=F),
    Reason("GpuTemperatureShutdown", Severity.CRITICAL, "At or above the GPU's own shutdown temperature.", family=F, action="drain_and_diagnose"),
    Reason("GpuHwSlowdown", Severity.WARNING, "Clocks cut by hardware slowdown, thermal slowdown or power brake.", family=F),
    Reason("NvLinkDown", Severity.WARNING, "An NVLink that was up earlier this boot is down.", family=F, action="drain_and_diagnose"),
    Reason("NvLinkErrors", Severity.WARNING, "NVLink recovery errors, or CRC/replay errors above the configured rate.", family=F),
    Reason("PcieLinkDegraded", Severity.WARNING, "Under load, the PCIe link runs below its maximum generation or width.", family=F),
    Reason("GpuRecoveryAction", Severity.CRITICAL, "NVML's GPU recovery action (field 230) asks for a reset, reboot or drain.", family=F, action="drain_and_diagnose"),
    Reason("XidOther", Severity.WARNING, "An Xid that is not in the catalog.", family=F, action="drain_and_diagnose"),
    Reason("GpuInitFailed", Severity.CRITICAL, "RmInitAdapter failed: a GPU did not initialise.", family=F, action="reboot"),
    Reason("NvSwitchSXid", Severity.WARNING, "An NVSwitch SXid error (critical when fatal).", family=F, action="drain_and_diagnose"),
    Reason("KmsgCoverageLost", Severity.WARNING, "Kernel log records were lost before the agent read them; Xids may be missed.", unknown=True, family=F),
    Reason("KmsgUnavailable", Severity.WARNING, "The kernel log cannot be read; Xids come from NVML events only.", unknown=True, family=F),
    Reason("PodResourcesUnavailable", Severity.WARNING, "The kubelet's PodResources socket is there but List failed or hung: GPU allocations are unknown.", unknown=True, family=F, action="none"),
    Reason("GpuProcessesUnknown", Severity.WARNING, "NVML cannot list the processes on this GPU: who holds it is unknown.", unknown=True, family=F, action="none"),
    Reason("NvmlEventsUnsupported", Severity.INFO, "NVML cannot deliver Xid events for this GPU; the kernel log still does.", family=F),
    *(
        Reason(
            i.reason, i.severity, f"Xid {i.xid} {i.mnemonic}: {i.meaning}.".replace(" :", ":"), family=F, action=i.action
        )
        for i in xid_catalog.catalog().values()
    ),
)

CATALOG = Catalog.declare(REASONS, METRICS)

# The telemetry check (gpu_telemetry): what dcgm-exporter users read, in base units.
# A series is absent where the GPU or driver lacks it, never 0.
TELEMETRY_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("node_health_gpu_driver_info", "gauge", "Always 1; the NVIDIA driver version NVML reports (dcgm-exporter's DCGM_FI_DRIVER_VERSION label).", ("version",)),
    MetricSpec("node_health_gpu_telemetry_up", "gauge", "1 if the GPU's last telemetry poll answered, 0 if it hung, failed or the GPU is lost.", G),
    MetricSpec("node_health_gpu_power_watts", "gauge", "Board power draw (NVML instantaneous power).", G),
    MetricSpec("node_health_gpu_power_limit_watts", "gauge", "The power limit the GPU enforces now.", G),
    MetricSpec("node_health_gpu_energy_joules_total", "counter", "Energy used since the driver was loaded.", G),
    MetricSpec("node_health_gpu_clock_hertz", "gauge", "Current clock (sm, memory).", ("gpu", "clock")),
    MetricSpec("node_health_gpu_utilization_ratio", "gauge", "Share of the last sample period (1/6 s to 1 s) in which a kernel ran on the GPU.", G),
    MetricSpec("node_health_gpu_memory_utilization_ratio", "gauge", "Share of the last sample period in which device memory was read or written.", G),
    MetricSpec("node_health_gpu_codec_utilization_ratio", "gauge", "Video encoder and decoder utilisation.", ("gpu", "engine")),
    MetricSpec("node_health_gpu_memory_total_bytes", "gauge", "Framebuffer memory in total.", G),
    MetricSpec("node_health_gpu_memory_used_bytes", "gauge", "Framebuffer memory allocated (not counting reserved, from driver 510).", G),
    MetricSpec("node_health_gpu_memory_free_bytes", "gauge", "Framebuffer memory free.", G),
    MetricSpec("node_health_gpu_memory_reserved_bytes", "gauge", "Framebuffer memory reserved by the driver and firmware.", G),
    MetricSpec("node_health_gpu_mig_memory_total_bytes", "gauge", "A MIG device's framebuffer share; device is its UUID (as in node_health_gpu_allocation).", ("gpu", "device")),
    MetricSpec("node_health_gpu_mig_memory_used_bytes", "gauge", "Framebuffer memory allocated on a MIG device.", ("gpu", "device")),
    MetricSpec("node_health_gpu_memory_temperature_celsius", "gauge", "HBM / memory temperature.", G),
    MetricSpec("node_health_gpu_performance_state", "gauge", "Performance state: 0 (P0, highest) to 15 (P15, lowest).", G),
    MetricSpec("node_health_gpu_pcie_bytes_total", "counter", "PCIe bytes transmitted and received by the GPU (can wrap).", ("gpu", "direction")),
    MetricSpec(
        "node_health_gpu_pcie_throughput_bytes_per_second", "gauge",
        "PCIe throughput over NVML's last 20 ms sample, where the driver has no PCIe byte counters.", ("gpu", "direction"),
    ),
    MetricSpec("node_health_gpu_pcie_replay_total", "counter", "PCIe replays (link-level retransmissions) since the driver was loaded.", G),
    MetricSpec("node_health_gpu_nvlink_bytes_total", "counter", "NVLink data bytes per link, transmitted and received.", ("gpu", "link", "direction")),
    MetricSpec("node_health_gpu_clock_event_seconds_total", "counter", "Time the clocks were held down, per reason (NVML violation counters).", ("gpu", "reason")),
    MetricSpec("node_health_gpu_graphics_engine_activity_ratio", "gauge", "GPM: share of time a graphics or compute engine was active (Hopper and later).", G),
    MetricSpec("node_health_gpu_sm_activity_ratio", "gauge", "GPM: share of SMs busy, averaged over the telemetry interval.", G),
    MetricSpec("node_health_gpu_sm_occupancy_ratio", "gauge", "GPM: resident warps per SM against the maximum.", G),
    MetricSpec("node_health_gpu_tensor_activity_ratio", "gauge", "GPM: share of time the SMs ran any tensor-core operation.", G),
    MetricSpec("node_health_gpu_dram_bandwidth_utilization_ratio", "gauge", "GPM: DRAM bandwidth used against the maximum.", G),
)

TELEMETRY_REASONS: tuple[Reason, ...] = tuple(r for r in REASONS if r.name in ("NvmlCallHung", "NvmlError"))

TELEMETRY_CATALOG = Catalog.declare(TELEMETRY_REASONS, TELEMETRY_METRICS)
