"""What the InfiniBand feature declares to the catalog: its reasons and metrics."""

from __future__ import annotations

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity

W, C, INFO = Severity.WARNING, Severity.CRITICAL, Severity.INFO
_DRAIN = "drain_and_diagnose"  # a cable, optic or switch port: the node cannot mend it itself


def _r(name: str, severity: Severity, action: str, summary: str, *, unknown: bool = False) -> Reason:
    return Reason(name, severity, summary, unknown=unknown, family="Infiniband", action=action)


REASONS: tuple[Reason, ...] = (
    _r(
        "IbDeviceMissing", C, "reboot",
        "An InfiniBand/RoCE device seen earlier (remembered in the state dir, across reboots) is gone from "
        "/sys/class/infiniband: the HCA fell off the bus, or its driver failed to load.",
    ),
    _r("IbPortsMissing", C, _DRAIN, "Fewer watched ports are ACTIVE than expected_ports."),
    _r(
        "IbPortDown", W, "none",
        "An expected port (seen ACTIVE before, or most of its peers are ACTIVE) is down, for less than "
        "drop_after so far: a flap may still bring it back.",
    ),
    _r("IbPortDropped", C, _DRAIN, "An expected port has been down for drop_after or longer."),
    _r("IbPortDisabled", C, _DRAIN, "An expected port's physical state is Disabled (ibportstate disable, or firmware)."),
    _r(
        "IbPortInitializing", W, "none",
        "An expected port has a physical link (LinkUp) but is INIT or ARMED: the subnet manager has not "
        "activated it. A fabric matter, not the node's.",
    ),
    _r("IbPortFlapping", C, _DRAIN, "The port went down flap_threshold times or more within flap_window."),
    _r(
        "IbPortRateLow", C, _DRAIN,
        "An ACTIVE port runs below min_rate_gbps or, with none set, below the rate most of its peers of the "
        "same model run at (a lane that did not train, a bad cable).",
    ),
    _r("IbLinkDowned", C, _DRAIN, "link_downed increased within fatal_window: the link went down."),
    _r(
        "IbLinkIntegrityErrors", C, _DRAIN,
        "local_link_integrity_errors increased within fatal_window (the physical errors passed LocalPhyErrors).",
    ),
    _r(
        "IbBufferOverrunErrors", C, _DRAIN,
        "excessive_buffer_overrun_errors increased within fatal_window (consecutive flow-control overruns).",
    ),
    _r(
        "IbSymbolErrors", W, "none",
        "symbol_error increased by more than symbol_error_limit within symbol_error_window (120 per hour: the "
        "IBTA 10^-12 bit error rate bound).",
    ),
    _r("IbReceiveErrors", W, "none", "port_rcv_errors increased by more than rcv_error_limit within rcv_error_window."),
    _r(
        "IbLinkErrorRecovery", W, "none",
        "link_error_recovery increased by more than link_error_recovery_limit within link_error_recovery_window.",
    ),
    _r(
        "IbCounterSaturated", INFO, "none",
        "An error counter sits at its maximum (IBTA port counters saturate, they do not wrap): its increases "
        "cannot be seen until it is cleared (perfquery -x). Information: the increases that took it there were "
        "judged as they were seen, and a healthy port's old errors are no fault.",
        unknown=True,
    ),
    _r(
        "IbPortUnreadable", W, "none",
        "The port's state, physical state or rate could not be read or parsed; the message says which.",
        unknown=True,
    ),
)

_P = ("device", "port")
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_infiniband_device_info", "gauge",
        "Always 1 for each watched device; labels say its board id (PSID), HCA type and firmware version.",
        ("device", "board_id", "hca_type", "fw_ver"),
    ),
    MetricSpec("node_health_infiniband_port_info", "gauge", "Always 1; the port's link layer (InfiniBand, Ethernet for RoCE).", (*_P, "link_layer")),
    MetricSpec("node_health_infiniband_port_state", "gauge", "Logical port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.", _P),
    MetricSpec(
        "node_health_infiniband_port_phys_state", "gauge",
        "Physical port state: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, "
        "6 LinkErrorRecovery, 7 Phy Test.",
        _P,
    ),
    MetricSpec("node_health_infiniband_port_active", "gauge", "1 if the port is ACTIVE with a physical link (LinkUp).", _P),
    MetricSpec("node_health_infiniband_port_rate_bytes_per_second", "gauge", "The port's signalling rate: sysfs rate (Gb/s) in bytes per second (400 Gb/s = 5e10).", _P),
    MetricSpec(
        "node_health_infiniband_port_transmit_bytes_total", "counter",
        "Bytes transmitted (counters/port_xmit_data, which counts 4-byte words, times 4).", _P,
    ),
    MetricSpec(
        "node_health_infiniband_port_receive_bytes_total", "counter",
        "Bytes received (counters/port_rcv_data, which counts 4-byte words, times 4).", _P,
    ),
    MetricSpec("node_health_infiniband_port_transmit_packets_total", "counter", "Packets transmitted (counters/port_xmit_packets).", _P),
    MetricSpec("node_health_infiniband_port_receive_packets_total", "counter", "Packets received (counters/port_rcv_packets).", _P),
    MetricSpec(
        "node_health_infiniband_port_errors_total", "counter",
        "An error or event counter of the port, named as in counters/ or hw_counters/ (a fixed list: see "
        "docs/infiniband.md). The small IBTA counters saturate at their maximum.",
        (*_P, "counter"),
    ),
    MetricSpec("node_health_infiniband_port_down_events", "gauge", "Times the port went down within flap_window.", _P),
    MetricSpec(
        "node_health_infiniband_ports", "gauge",
        "Watched ports: present, active (ACTIVE and LinkUp) and expected (expected_ports, or present when unset).",
        ("state",),
    ),
    MetricSpec(
        "node_health_infiniband_skipped_files", "gauge",
        "Counter files of the device not read this boot: a read failed with EINVAL (a firmware-restricted "
        "function; every read would log ACCESS_REG errors).",
        ("device",),
    ),
)

CATALOG = Catalog.declare(REASONS, METRICS)
