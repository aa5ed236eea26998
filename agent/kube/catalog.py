"""What the Kubernetes feature declares to the catalog: the reasons of the
findings the actuator reports about itself, and its metrics."""

from __future__ import annotations

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity

REASONS: tuple[Reason, ...] = (
    Reason(
        "TaintBudgetExhausted",
        Severity.WARNING,
        "Every slot of the fleet-wide taint budget is taken: the taint this node should carry is withheld "
        "(its condition and event still report the problem).",
    ),
    Reason(
        "TaintBudgetMissing",
        Severity.WARNING,
        "The budget namespace has no ResourceQuota capping Leases, so taints are withheld (fail closed) "
        "until an operator creates it.",
    ),
    Reason(
        "DrainTimedOut",
        Severity.WARNING,
        "The drain timeout passed with pods still on the node (refused by their PodDisruptionBudgets, or in a "
        "namespace whose timeout policy is wait); the message names them.",
        action="none",  # about the remediation itself: never remediated
    ),
    Reason(
        "PodsUnknown",
        Severity.WARNING,
        "The node's pods are unknown (not listed yet, or the pod watch has been down longer than "
        "[kubernetes.pods] stale_after): per-pod features report unknown, never zero.",
        unknown=True,
    ),
    Reason(
        "KillSwitchDeleted",
        Severity.INFO,
        "The kill switch ConfigMap was deleted: its last known state (paused or active; kept in kill-switch.json "
        "across restarts) is kept until it is back (a deletion never lifts a pause).",
    ),
    Reason(
        "KubeApiError",
        Severity.WARNING,
        "Requests to the API server fail (the message has the status); node state catches up when they succeed.",
    ),
)

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_kube_requests_total", "counter", "API requests by verb, resource and HTTP code (error: no response).",
        ("verb", "resource", "code"),
    ),
    MetricSpec(
        "node_health_kube_retries_total", "counter", "Requests repeated, by reason: conflict (409), throttled (429), server_error (5xx), connection, unauthorized (401).",
        ("reason",),
    ),
    MetricSpec("node_health_kube_conflicts_total", "counter", "409 Conflict answers to a taint write (stale resourceVersion)."),
    MetricSpec("node_health_kube_throttled_total", "counter", "429 Too Many Requests answers."),
    MetricSpec(
        "node_health_kube_last_sync_timestamp_seconds", "gauge", "Unix time the node last matched the desired state."
    ),
    MetricSpec(
        "node_health_kube_kill_switch", "gauge", "1 for the kill switch's current state (paused, active, unknown, disabled).",
        ("state",),
    ),
    MetricSpec(
        "node_health_kube_kill_switch_missing", "gauge",
        "1 while the kill switch ConfigMap does not exist (deleted: its last known state is kept; none ever read: "
        "active, as its key absent).",
    ),
    MetricSpec(
        "node_health_kube_budget", "gauge", "1 for the taint budget's current state (idle, held, exhausted, missing, disabled).",
        ("state",),
    ),
    MetricSpec("node_health_kube_dry_run", "gauge", "1 when no change is written (dry run, or no cluster configured)."),
    MetricSpec("node_health_kube_taint", "gauge", "1 for each taint of the agent's prefix seen on the node.", ("key", "effect")),
    MetricSpec(
        "node_health_kube_active_finding", "gauge", "1 for each finding that counts after hysteresis.",
        ("check", "subject", "reason", "severity"),
    ),
    MetricSpec(
        "node_health_would_taint", "gauge", "1 for each taint the agent would add but does not (cause: dry_run, kill_switch, budget).",
        ("key", "effect", "cause"),
    ),
    MetricSpec(
        "node_health_would_untaint", "gauge", "1 for each of its taints the agent would remove but does not (cause: dry_run, kill_switch).",
        ("key", "effect", "cause"),
    ),
    MetricSpec(
        "node_health_would_set_condition", "gauge", "1 for each condition the agent would write but does not (dry run).",
        ("type", "status", "cause"),
    ),
    MetricSpec(
        "node_health_kube_evictions_total", "counter",
        "Pod evictions by result: evicted (201), blocked (a PodDisruptionBudget refused: 429, or 500 for a pod under "
        "two budgets), gone (404), deleted (at the drain timeout, policy delete), forbidden (403/422), conflict (409: "
        "the pod is read again and tried later; gone only when the read no longer shows it).",
        ("result",),
    ),
    MetricSpec("node_health_kube_drain_pods_remaining", "gauge",
               "Pods the current drain still waits for (to evict, or terminating within their grace period)."),
    MetricSpec("node_health_kube_pod_watch_up", "gauge",
               "1 while the watch on this node's pods is open (only when an enabled check reads pods)."),
    MetricSpec("node_health_kube_pod_watch_pods", "gauge",
               "Pods on this node known to the pod watch; absent while they are unknown."),
    MetricSpec(
        "node_health_kube_pod_watch_relists_total", "counter",
        "Lists of this node's pods by the pod watch, by reason: initial, expired (410 Gone), too_large (a server "
        "behind the last resourceVersion).", ("reason",),
    ),
    MetricSpec(
        "node_health_kube_breaker", "gauge",
        "1 for the fleet breaker's state as this node last read it before a remediation step (closed, tripped, "
        "unknown, disabled) and the signal that tripped it (disrupted, tainted, unknown; none while closed).",
        ("state", "signal"),
    ),
    MetricSpec("node_health_kube_breaker_trips_total", "counter",
               "Times this node tripped the fleet breaker, by signal (disrupted, tainted).", ("signal",)),
    MetricSpec("node_health_kube_events_total", "counter", "Events by result (created, series, dropped, failed, dry_run).", ("result",)),
)

CATALOG = Catalog.declare(REASONS, METRICS)
