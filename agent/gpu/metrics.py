"""Metric declarations of the GPU check and the Xid source (collected by
`agent.catalog` through `agent.checks.gpu`). Label `gpu` is the NVML index;
identity (UUID, PCI bus id, model, serial) is only on `node_health_gpu_info`."""

from __future__ import annotations

from ..catalog import MetricSpec

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
