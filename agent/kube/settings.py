"""The ``[kubernetes]`` configuration section (no kubernetes import here).

Validation is strict because these values end up in the API server: a taint
prefix outside the agent's own domain, or a resync loop of seconds across
7,500 nodes, is refused at load time with one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from ..schema import opt

Effect = Literal["none", "NoSchedule", "PreferNoSchedule", "NoExecute"]
OnTimeout = Literal["wait", "delete"]

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"^(?P<domain>{_LABEL}(\.{_LABEL})*)/(?P<name>[A-Za-z0-9][-A-Za-z0-9_.]*)?$")
# Kubernetes reserves these domains; node.kubernetes.io/* taints belong to the
# node lifecycle controller and the kubelet:
# https://kubernetes.io/docs/reference/labels-annotations-taints/
RESERVED_DOMAINS = ("kubernetes.io", "k8s.io")
_CONDITION_PREFIX = re.compile(r"^[A-Z][A-Za-z0-9]{0,39}$")
_NAME = re.compile(rf"^{_LABEL}$")


def check_taint_prefix(value: str) -> str | None:
    m = _PREFIX.match(value)
    if not m or len(m["domain"]) > 253 or len(m["name"] or "") > 40:
        return f'expected "<your-domain>/" optionally followed by a short name prefix (e.g. "health.example.com/"), got "{value}"'
    domain = m["domain"]
    if any(domain == r or domain.endswith("." + r) for r in RESERVED_DOMAINS):
        return f'expected a domain of your own, got "{domain}" (reserved for Kubernetes components)'
    return None


def check_condition_prefix(value: str) -> str | None:
    if not _CONDITION_PREFIX.match(value):
        return f'expected a CamelCase word of at most 40 letters/digits (e.g. "NodeHealth"), got "{value}"'
    return None


def check_name(value: str) -> str | None:
    if not _NAME.match(value) or len(value) > 63:
        return f'expected a Kubernetes object name (lowercase letters, digits, "-"), got "{value}"'
    return None


def check_optional_name(value: str) -> str | None:
    return None if value == "" else check_name(value)


def check_heartbeat(value: float) -> str | None:
    if value == 0 or value >= 300:
        return None
    return 'expected 0 (no heartbeat) or at least "5m" (KEP-589: every node status write fans out to every Node watcher)'


@dataclass(frozen=True)
class HysteresisSection:
    raise_cycles: int = opt(
        3, "A warning counts after this many consecutive runs of its check report it (critical: at once).", min=1, max=1000
    )
    raise_after: float = opt(
        300.0, "... or after it has been reported continuously this long (the rule for pushed findings).", duration=True, min=0
    )
    clear_cycles: int = opt(
        5, "An active finding is released after this many consecutive runs of its check without it.", min=1, max=1000
    )
    clear_after: float = opt(600.0, "... or after it has been absent this long, whichever comes first.", duration=True, min=0)


@dataclass(frozen=True)
class PolicySection:
    critical: Effect = opt("NoSchedule", "Taint effect for an active critical finding (none: condition and event only).")
    warning: Effect = opt("none", "Taint effect for an active warning finding.")
    overrides: Mapping[str, Effect] = opt(
        MappingProxyType({}),
        '"check" or "check/Reason" ("*/Reason": any check) = effect; wins over the severity default.',
    )

    # The names in `overrides` are checked against the registry by agent.config.


@dataclass(frozen=True)
class KillSwitchSection:
    namespace: str = opt("node-health", "Namespace of the kill-switch ConfigMap.", check=check_name)
    name: str = opt(
        "node-health-agent-kill-switch", "Name of the kill-switch ConfigMap; empty: no kill switch.", check=check_optional_name
    )
    key: str = opt("paused", 'Data key whose value "true" pauses every agent\'s taint changes.')


@dataclass(frozen=True)
class BudgetSection:
    enabled: bool = opt(True, "Claim a slot (a Lease under a ResourceQuota) before tainting; false: no fleet-wide cap.")
    namespace: str = opt("node-health-budget", "Namespace holding the slot Leases and their ResourceQuota.", check=check_name)
    quota_name: str = opt(
        "node-health-taint-budget",
        "ResourceQuota that caps count/leases.coordination.k8s.io; missing: no taint is applied (fail closed).",
        check=check_name,
    )
    retry_interval: float = opt(
        60.0, "First wait before trying again for a slot after the budget was full (doubles up to resync_interval).",
        duration=True, min=5,
    )


@dataclass(frozen=True)
class DisruptionBudgetSection:
    """Same shape as the taint budget (one `Budget` serves both), its own namespace and quota."""

    enabled: bool = opt(
        True, "Claim a slot (a Lease under a ResourceQuota) before a drain, GPU reset or reboot; false: no fleet-wide cap."
    )
    namespace: str = opt("node-health-disruption", "Namespace holding the disruption slot Leases and their ResourceQuota.",
                         check=check_name)
    quota_name: str = opt(
        "node-health-disruption-budget",
        "ResourceQuota that caps count/leases.coordination.k8s.io; missing: no disruption at all (fail closed).",
        check=check_name,
    )
    retry_interval: float = opt(
        60.0, "First wait before trying again for a slot after the budget was full (doubles up to resync_interval).",
        duration=True, min=5,
    )
    expiry: float = opt(
        3600.0,
        "A holder renews its slot's Lease (spec.renewTime) every expiry/6; an agent that finds every slot taken "
        "deletes a Lease not renewed for this long (the holder died, or its node is gone). Longer than a reboot "
        "plus a boot of the slowest node.",
        duration=True, min=600,
    )
    qps: float = opt(
        0.2, "Client-side rate limit of the budget's and the fleet breaker's requests (their own bucket, apart from "
        "the drain's and the retire writes'): sustained per second.", min=0.01, max=100,
    )
    burst: int = opt(
        12, "Client-side rate limit of the budget's and the breaker's requests: at once (a claim and the breaker's "
        "checks and record of one disruption take about 10).", min=1, max=100,
    )


@dataclass(frozen=True)
class BreakerSection:
    """The fleet breaker (agent/kube/breaker.py): stops remediation fleet-wide on a fleet-wide pattern."""

    enabled: bool = opt(
        True, "Check the fleet breaker before a disruption slot is claimed and before each drain, GPU reset, reboot "
        "and retirement; false: no breaker (the disruption budget alone caps how many nodes are disrupted at once).",
    )
    namespace: str = opt(
        "node-health-disrupted", "Namespace of the disruption records: one Lease per node disrupted within the window.",
        check=check_name,
    )
    quota_name: str = opt(
        "node-health-disrupted",
        "ResourceQuota capping count/leases.coordination.k8s.io there: its hard value is the breaker's count (the most "
        "nodes disrupted within the window); missing: nothing is disrupted (fail closed).", check=check_name,
    )
    window: float = opt(
        21600.0, "Nodes disrupted (drained, GPU-reset, rebooted, retired) within this sliding window are counted.",
        duration=True, min=600, max=7 * 86400,
    )
    max_disrupted_percent: float = opt(
        5.0, "Trip when one more node would be disrupted within the window than this percent of the fleet (at least "
        "1 node), or than the quota's count, whichever is smaller.", min=0.01, max=100,
    )
    min_tainted: int = opt(
        5, "Also trip when the taint budget is full (every slot held: that share of the fleet is tainted) and at "
        "least this many nodes are tainted; 0: the taint budget is not a signal.", min=0, max=100000,
    )
    key: str = opt(
        "breaker", "Data key of the kill-switch ConfigMap that holds the breaker's state: absent, \"\" or \"false\": "
        "closed; any other value: tripped (the agent writes \"tripped\", with the reason, the node and the time).",
    )


@dataclass(frozen=True)
class RemediationWritesSection:
    """The retire writes (condition, label) and the ladder's events: a bucket of their own."""

    qps: float = opt(0.2, "Client-side rate limit of the retire writes and the remediation events: sustained per second.",
                     min=0.01, max=100)
    burst: int = opt(6, "Client-side rate limit of the retire writes and the remediation events: at once.", min=1, max=100)


@dataclass(frozen=True)
class DrainSection:
    timeout: float = opt(
        1800.0, "How long a drain retries evictions refused by PodDisruptionBudgets before on_timeout applies.",
        duration=True, min=60,
    )
    on_timeout: OnTimeout = opt(
        "wait", "At the timeout: wait (keep the pods, go on retrying evictions) or delete (DELETE with the pod's own grace period)."
    )
    namespace_on_timeout: Mapping[str, OnTimeout] = opt(
        MappingProxyType({}), "namespace = wait | delete: on_timeout for the pods of that namespace."
    )
    skip_namespaces: tuple[str, ...] = opt(
        ("kube-system",), "Namespaces whose pods are never evicted (the agent's own namespace always is).", check=check_name
    )
    retry_interval: float = opt(
        5.0, "First wait before evicting a pod again after its budget refused (429); doubles, jittered, up to retry_max.",
        duration=True, min=1,
    )
    retry_max: float = opt(60.0, "Longest wait between two evictions of one refused pod.", duration=True, min=1)
    poll_interval: float = opt(
        5.0, "List the node's pods at most this often while draining (while the pod watch is open: read from it).",
        duration=True, min=1,
    )
    qps: float = opt(1.0, "Client-side rate limit of the drain's requests (its own bucket): sustained per second.",
                     min=0.01, max=100)
    burst: int = opt(10, "Client-side rate limit of the drain's requests: at once.", min=1, max=100)

    def validate(self) -> tuple[str, str] | None:
        if self.retry_max < self.retry_interval:
            return "retry_max", f'expected at least retry_interval ("{self.retry_interval:g}s"), got "{self.retry_max:g}s"'
        for ns in self.namespace_on_timeout:
            problem = check_name(ns)
            if problem:
                return f"namespace_on_timeout.{ns}", problem
        return None

    def policy_for(self, namespace: str) -> OnTimeout:
        return self.namespace_on_timeout.get(namespace, self.on_timeout)

    @property
    def deletes(self) -> bool:
        """Whether any namespace's pods may be deleted at the timeout (RBAC then needs pods delete)."""
        return self.on_timeout == "delete" or "delete" in self.namespace_on_timeout.values()


@dataclass(frozen=True)
class PodWatchSection:
    """The one watch on the node's pods (agent/kube/podwatch.py), started only when an enabled check reads pods."""

    stale_after: float = opt(
        300.0, "With the watch down this long, the node's pods are unknown (features say unknown, never \"no pods\").",
        duration=True, min=10, max=86400,
    )
    watch_timeout: float = opt(
        1800.0, "Server-side timeout of one watch request, jittered up to twice this (the kill switch's 30-60 minutes).",
        duration=True, min=60, max=3600,
    )


@dataclass(frozen=True)
class KubernetesSection:
    enabled: bool = opt(True, "Turn active findings into taints, conditions and events on this node.")
    kubeconfig: str = opt(
        "", "kubeconfig file; empty: $KUBECONFIG, else the pod's service account, else no cluster (dry run)."
    )
    dry_run: bool = opt(False, "Decide and log the exact changes, write nothing (as `agent run --dry-run`).")
    taint_prefix: str = opt(
        "node-health-agent/", "Prefix of every taint key the agent owns; taints outside it are never touched.",
        check=check_taint_prefix,
    )
    condition_prefix: str = opt(
        "NodeHealth", "Prefix of the node condition types the agent owns (<prefix><Family>Problem).",
        check=check_condition_prefix,
    )
    resync_interval: float = opt(
        1200.0, "Re-read the Node this often (±20%) to repair drift such as a removed taint.", duration=True, min=600
    )
    condition_heartbeat: float = opt(
        0.0, "Re-send unchanged conditions this often; 0: write only on change.", duration=True, check=check_heartbeat
    )
    startup_jitter: float = opt(30.0, "Wait up to this long (at random) before the first request.", duration=True, min=0, max=600)
    qps: float = opt(0.2, "Client-side rate limit: sustained requests per second.", min=0.001, max=100)
    burst: int = opt(8, "Client-side rate limit: requests allowed at once.", min=1, max=100)
    backoff_max: float = opt(
        300.0, "Longest wait after a 429, a 5xx or a connection error (exponential, jittered, never below Retry-After).",
        duration=True, min=1,
    )
    request_timeout: float = opt(10.0, "Timeout of one API request.", duration=True, min=1, max=120)
    conflict_retries: int = opt(5, "Fresh read-and-retry attempts of a taint write after 409 Conflict.", min=1, max=20)
    event_burst: int = opt(25, "Events this agent may send at once (client-go's default).", min=1, max=1000)
    event_refill: float = opt(300.0, "One more event is allowed per this interval.", duration=True, min=1)
    hysteresis: HysteresisSection = field(default_factory=HysteresisSection, metadata={"doc": "When findings count."})
    policy: PolicySection = field(default_factory=PolicySection, metadata={"doc": "Which taint effect a finding gets."})
    kill_switch: KillSwitchSection = field(default_factory=KillSwitchSection, metadata={"doc": "Cluster-wide pause."})
    budget: BudgetSection = field(default_factory=BudgetSection, metadata={"doc": "Fleet-wide cap on tainted nodes."})
    drain: DrainSection = field(default_factory=DrainSection, metadata={"doc": "Eviction of the node's pods (remediation)."})
    disruption_budget: DisruptionBudgetSection = field(
        default_factory=DisruptionBudgetSection,
        metadata={"doc": "Fleet-wide cap on nodes being drained, reset or rebooted (smaller than the taint budget)."},
    )
    breaker: BreakerSection = field(
        default_factory=BreakerSection,
        metadata={"doc": "The fleet breaker: a fleet-wide pattern stops remediation everywhere until a person resets it."},
    )
    remediation_writes: RemediationWritesSection = field(
        default_factory=RemediationWritesSection,
        metadata={"doc": "The retire writes and the remediation events (their own rate limit)."},
    )
    pods: PodWatchSection = field(
        default_factory=PodWatchSection, metadata={"doc": "The watch on this node's pods (when a check reads pods)."}
    )
