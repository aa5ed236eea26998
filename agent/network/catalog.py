"""What the network feature declares to the catalog: its reasons and metrics."""

from __future__ import annotations

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity


def _reason(name: str, severity: Severity, summary: str, *, unknown: bool = False) -> Reason:
    return Reason(name, severity, summary, unknown=unknown, family="Network")


W, C = Severity.WARNING, Severity.CRITICAL
REASONS: tuple[Reason, ...] = (
    _reason("InterfaceMissing", C, "A watched interface does not exist (removed, renamed, or its driver failed)."),
    _reason("LinkAdminDown", C, "A watched interface is administratively down (IFF_UP cleared)."),
    _reason(
        "LinkDown", C,
        "A watched interface is up but passes no traffic: no carrier, or operstate other than up (unknown, "
        "which drivers that do not track operstate report, counts as up).",
    ),
    _reason("LinkFlapping", W, "The carrier changed more than flap_threshold times within flap_window."),
    _reason("LinkErrors", W, "rx+tx errors per second at or above error_rate_warning (the message splits rx and tx)."),
    _reason("LinkDrops", W, "rx+tx drops per second at or above drop_rate_warning."),
    _reason(
        "LinkStateUnknown", W,
        "Netlink could not say the link's state, or has no link that sysfs shows (the agent runs in another "
        "network namespace); the message says why.",
        unknown=True,
    ),
    _reason("InterfaceCountersUnknown", W, "/proc/net/dev could not be read, or lacks the interface.", unknown=True),
    _reason(
        "TargetUnreachable", W, "A target did not accept a TCP connection: refused, timed out, no route, DNS failure."
    ),
    _reason(
        "TargetProbeHung",
        W,
        "An earlier probe of the target (name resolution or connect) has still not returned; not probed again until it does.",
        unknown=True,
    ),
)
LINK_REASONS = (
    "InterfaceMissing",
    "LinkAdminDown",
    "LinkDown",
    "LinkFlapping",
    "LinkStateUnknown",
    "InterfaceCountersUnknown",
)

_IF, _T = ("device",), ("target",)
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_network_link_admin_up", "gauge", "1 if the interface is administratively up (IFF_UP).", _IF
    ),
    MetricSpec("node_health_network_link_carrier", "gauge", "1 if the interface has carrier (IFLA_CARRIER).", _IF),
    MetricSpec(
        "node_health_network_link_operstate",
        "gauge",
        "1 for the interface's current RFC 2863 operstate, 0 for the others (all seven are exported).",
        ("device", "operstate"),
    ),
    MetricSpec(
        "node_health_network_link_carrier_changes_total",
        "counter",
        "Carrier up and down transitions since the interface was created (IFLA_CARRIER_CHANGES).",
        _IF,
    ),
    MetricSpec("node_health_network_receive_bytes_total", "counter", "Bytes received (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_receive_packets_total", "counter", "Packets received (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_receive_errors_total", "counter", "Receive errors (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_receive_drops_total", "counter", "Received packets dropped (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_transmit_bytes_total", "counter", "Bytes transmitted (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_transmit_packets_total", "counter", "Packets transmitted (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_transmit_errors_total", "counter", "Transmit errors (/proc/net/dev).", _IF),
    MetricSpec(
        "node_health_network_transmit_drops_total", "counter", "Packets dropped on transmit (/proc/net/dev).", _IF
    ),
    MetricSpec(
        "node_health_network_target_reachable",
        "gauge",
        "1 if the target accepted a TCP connection at the last probe, 0 if not; absent while its probe is hung.",
        _T,
    ),
    MetricSpec(
        "node_health_network_target_connect_duration_seconds",
        "gauge",
        "Name resolution plus TCP connect time of the last successful probe.",
        _T,
    ),
)

CATALOG = Catalog.declare(REASONS, METRICS)
