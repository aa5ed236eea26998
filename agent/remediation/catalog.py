"""What the remediation ladder declares to the catalog: the findings it
reports about itself (check ``remediation``) and its metrics."""

from __future__ import annotations

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity

CHECK = "remediation"  # check name of the ladder's own findings
F = "Remediation"

REASONS: tuple[Reason, ...] = (
    Reason(
        "DisruptionSlotWaiting",
        Severity.WARNING,
        "A remediation step waits for a slot of the fleet's disruption budget: every slot is held by other nodes, "
        "or no ResourceQuota caps the budget (fail closed); the message says which. The one finding, event and "
        "metric (node_health_remediation_waiting{on=\"slot\"}) of a wait.",
        family=F,
        action="none",  # the ladder's own state: never a cause for another step
    ),
    Reason(
        "RemediationHeld",
        Severity.WARNING,
        "A remediation step is held by a guard: minimum uptime, the reboots-per-day cap, processes still on the GPU, "
        "pods the drain could not move (named, with their PodDisruptionBudget), a damaged or unreadable record, a "
        "requested reboot that has not happened, the fleet breaker (tripped), or a node that lacks its taint (no "
        "drain then) (the message says which).",
        family=F,
        action="none",  # the ladder's own state: never a cause for another step
    ),
    Reason(
        "RemediationFailed",
        Severity.WARNING,
        "A remediation step failed (a reset, its verification, a reboot, retire or power-off command); "
        "the message says which and what the ladder does next.",
        family=F,
        action="none",  # the ladder's own state: never a cause for another step
    ),
    Reason(
        "NodeRetired",
        Severity.CRITICAL,
        "The node is retired: reboots did not cure a fault, or the fault needs hardware. No further reboots; "
        "it stays tainted until an operator un-retires it (docs/remediation.md).",
        family=F,
        action="none",  # the ladder's own state: never a cause for another step
    ),
)

L = ("action", "result")
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("node_health_remediation_mode", "gauge", "1 for the ladder's mode (observe, enforce, dry_run, paused).", ("mode",)),
    MetricSpec(
        "node_health_remediation_step", "gauge",
        "1 for the ladder's current step (idle, claim, drain, reset_gpu, verify, reboot, rebooting, settle, hold, retire, retired).",
        ("step",),
    ),
    MetricSpec(
        "node_health_remediation_actions_total", "counter",
        "Remediation actions done by this agent process, by action (drain, reset_gpu, reboot, retire, power_off) and result (ok, failed; drain: forced, past pods "
        "it could not move after force_after). Never moves in observe mode or dry run.",
        L,
    ),
    MetricSpec(
        "node_health_remediation_would", "gauge",
        "1 for each step the ladder would take but does not, by action and cause (observe, dry_run, kill_switch, disabled); "
        "the log names the exact targets.",
        ("action", "cause"),
    ),
    MetricSpec(
        "node_health_remediation_waiting", "gauge",
        "1 while the ladder waits, by what it waits on (slot, uptime, daily_cap, gpu_busy, drain, reboot, record).",
        ("on",),
    ),
    MetricSpec(
        "node_health_remediation_reboots", "gauge",
        "Reboots the agent asked for within the retire window (persisted across reboots).",
    ),
    MetricSpec(
        "node_health_remediation_uncured_reboots", "gauge",
        "Of those, reboots after which the same fault came back (retire.after_reboots of them retire the node).",
    ),
    MetricSpec("node_health_remediation_retired", "gauge", "1 when the node is retired."),
)

CATALOG = Catalog.declare(REASONS, METRICS)
