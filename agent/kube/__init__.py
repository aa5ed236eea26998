"""Kubernetes: findings become taints, conditions and events on this node.

Reading order: `settings` (the ``[kubernetes]`` config), `hysteresis` (when a
finding counts, persisted), `policy` (pure: active findings → desired node
state), `api` (every request, one rate limit and one backoff), `reconciler`
(makes the Node match, step by step), `actuator` (the threads and the hook
into the daemon). Only `api`/`connect` import the ``kubernetes`` package, and
only once a cluster is configured. This module declares the reasons and
metrics of the feature for `agent.catalog`.
"""

from __future__ import annotations

# agent.config imports our settings module for its [kubernetes] section, and
# settings imports opt() from agent.config: load config first, whichever of the
# two is imported first.
from .. import config as _config  # noqa: F401
from ..catalog import MetricSpec, Reason
from ..findings import Severity

SOURCE = "kubernetes"  # check name of the findings the actuator reports about itself

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
    MetricSpec("node_health_kube_events_total", "counter", "Events by result (created, series, dropped, failed, dry_run).", ("result",)),
)
