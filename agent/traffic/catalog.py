"""What the traffic feature declares to the catalog: its reasons and metrics."""

from __future__ import annotations

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity

REASONS: tuple[Reason, ...] = (
    Reason(
        "TrafficBackendUnavailable",
        Severity.WARNING,
        "The iptables backend in use cannot be driven from here (tools or python-iptables missing); "
        "traffic is not counted.",
        unknown=True,
    ),
    Reason(
        "TrafficRulesNotInPlace",
        Severity.WARNING,
        "The agent's traffic accounting rules are missing or altered and could not be put back; "
        "the traffic counters are held (in a dry run, at info: what would be fixed).",
        unknown=True,
    ),
    Reason(
        "TrafficDatapathBypass",
        Severity.WARNING,
        "The node's traffic does not pass the iptables hooks the counters hang on (Cilium eBPF host routing, "
        "or most bytes on the uplinks unseen by them): traffic accounting is unknown and its counters withheld.",
        unknown=True,
        action="none",
    ),
)

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_traffic_bytes_total",
        "counter",
        "Bytes (IP headers included) from (internet-in) or to (internet-out) addresses outside the internal ranges, "
        "received, sent or forwarded by this node; monotonic across rule re-creation and agent restarts.",
        ("direction", "family"),
    ),
    MetricSpec(
        "node_health_traffic_packets_total",
        "counter",
        "Packets from (internet-in) or to (internet-out) addresses outside the internal ranges, "
        "received, sent or forwarded by this node.",
        ("direction", "family"),
    ),
    MetricSpec(
        "node_health_traffic_rules_repaired_total",
        "counter",
        "Times the agent found its accounting rules missing, altered or duplicated and put them back.",
        ("family",),
    ),
    MetricSpec(
        "node_health_traffic_rules_in_place",
        "gauge",
        "1 when the agent's accounting rules were all present and in order after the last run.",
        ("family",),
    ),
    MetricSpec(
        "node_health_traffic_accounting_up",
        "gauge",
        "1 while the traffic counters see the node's traffic as far as can be told; 0 when a datapath bypasses "
        "the iptables hooks (the byte and packet counters are withheld meanwhile).",
    ),
    MetricSpec(
        "node_health_traffic_unseen_ratio",
        "gauge",
        "Share of the bytes the uplinks carried in the last judged window that the iptables hooks did not see.",
    ),
    MetricSpec("node_health_traffic_backend_info", "gauge", "1 for the iptables backend in use.", ("backend",)),
)

CATALOG = Catalog.declare(REASONS, METRICS)
