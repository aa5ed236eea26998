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
    Reason(
        "TrafficFamilyNotCounted",
        Severity.WARNING,
        "An address family (IPv6 with the default internal_ranges) has no internal range, so its internet traffic "
        "is neither counted nor shaped, while the node has a default route of it or pods have addresses of it "
        "(subject: the family). Add the cluster's ranges of that family to internal_ranges.",
        unknown=True,
        action="none",
    ),
    Reason(
        "TrafficShapingAnnotationInvalid",
        Severity.INFO,
        "A pod's internet egress limit (its annotation or its namespace's default) is not a rate the agent accepts, "
        "or the pod uses the host's network: the pod is not shaped (subject: namespace/pod; the message quotes at "
        "most a short, escaped excerpt). A tenant's input: never a taint, a condition or a Node Event.",
        action="none",
    ),
    Reason(
        "TrafficPodInputRefused",
        Severity.INFO,
        "A pod's uid or name is not what Kubernetes gives, an address in its status.podIPs is not a single IP "
        "(a network, a zone, garbage), or two pods list the same address (subject: the address; the message names "
        "both): no counting or shaping rule is written for it. Never a taint, a condition or a Node Event.",
        action="none",
    ),
    Reason(
        "TrafficShapingNotInstalled",
        Severity.WARNING,
        "Internet egress shaping could not be put in place on an uplink (the root qdisc is someone else's, no uplink "
        "was found, or the kernel refused a class): the pods to be shaped there are not limited.",
        action="none",
    ),
    Reason(
        "PodTrafficUnknown",
        Severity.WARNING,
        "The node's pods are not known (the pod watch has not listed them yet or is down past its staleness "
        "limit): per-pod internet traffic is unknown and its series withheld; the rules of the pods last known count on.",
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
    MetricSpec(
        "node_health_traffic_family_counted",
        "gauge",
        "1 when the address family's internet traffic is counted (internal_ranges holds a range of it), 0 when it "
        "is neither counted nor shaped.",
        ("family",),
    ),
    MetricSpec(
        "node_health_pod_egress_limit_bytes_per_second",
        "gauge",
        "The internet egress limit configured for a shaped pod (its annotation or its namespace's default, "
        "given in bits per second), in bytes per second as Prometheus' base unit.",
        ("namespace", "pod"),
    ),
    MetricSpec(
        "node_health_pod_egress_shaped_bytes_total",
        "counter",
        "Bytes a shaped pod sent to the internet through its class on the uplinks (HTB class stats; restarts "
        "from 0 when the class is re-created).",
        ("namespace", "pod"),
    ),
    MetricSpec(
        "node_health_pod_egress_dropped_packets_total",
        "counter",
        "Packets of a shaped pod's internet egress dropped by its class's queue on the uplinks.",
        ("namespace", "pod"),
    ),
    MetricSpec(
        "node_health_pod_traffic_bytes_total",
        "counter",
        "Bytes (IP headers included) a pod on this node received from (internet-in) or sent to (internet-out) "
        "addresses outside the internal ranges, all its addresses together; a series exists while the pod is on the "
        "node (host-network pods are the node's). Monotonic across rule re-creation and agent restarts.",
        ("namespace", "pod", "direction"),
    ),
    MetricSpec(
        "node_health_pod_traffic_packets_total",
        "counter",
        "Packets a pod on this node received from (internet-in) or sent to (internet-out) addresses outside the "
        "internal ranges.",
        ("namespace", "pod", "direction"),
    ),
    MetricSpec(
        "node_health_pod_traffic_accounting_up",
        "gauge",
        "1 while the per-pod series are complete; 0 while unknown (pods not known, or the datapath bypasses the "
        "iptables hooks): the per-pod series are withheld then, never shown as zero.",
    ),
    MetricSpec("node_health_pod_traffic_rules", "gauge", "Per-pod count rules the agent keeps, all families and directions."),
)

CATALOG = Catalog.declare(REASONS, METRICS)
