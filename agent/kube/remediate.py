"""The Kubernetes side of the remediation ladder (`agent.remediation` calls it).

The contract (kept with the ladder's owner): `plan_drain`, `drain`,
`claim_slot`, `renew_slot`, `slot_wait`, `release_slot`, `breaker_check`, `set_retired`, `event`. Every method may raise
`Wait` (the rate limit) or `ApiError`; the ladder then tries again on its next
tick. Nothing here is persisted: the ladder records its own step, and after a
restart the slot is found again (a create of our own Lease answers 409, or 403
with a full quota and a GET that finds it).

- **Request budgets**: three client-side token buckets (each with its own
  backoff), apart from the taint writer's: the drain's (``[kubernetes.drain]
  qps/burst``), the disruption budget's and the fleet breaker's
  (``[kubernetes.disruption_budget] qps/burst``), and the retire writes' and
  events' (``[kubernetes.remediation_writes]``). A drain that has used up its
  bucket never delays the release of the slot, a retire write or an event.
- **Drain**: `Drainer` (drain.py), behind the drain's bucket.
- **Disruption budget**: the same `Budget` as the taint budget, in its own
  namespace under its own ResourceQuota (``[kubernetes.disruption_budget]``):
  a wave of tainted-but-running nodes cannot stop a reboot, nor the other way
  round. A held slot is renewed (`renew_slot`) and expires when it is not
  (see budget.py). No slot → wait: `slot_wait` says why in one sentence, and the ladder
  reports it as its one ``DisruptionSlotWaiting`` finding, event and metric
  (nothing here reports it a second time).
- **Fleet breaker** (breaker.py): `breaker_check` before the claim and
  before each host-changing step; the disruption records, the trip and the
  reads of its state go through the budget's bucket.
- **Retire**: the condition ``<condition_prefix>NeedsHardwareRepair`` (a
  strategic-merge patch of nodes/status with that one type), the label
  ``<taint_prefix>retired=true`` an inventory can select on (a strategic-merge
  patch of the labels map: merged by key, no precondition needed), an event.
  The admission policy (daemonset/vap.yaml) lets the agent change exactly
  these on its own node.
"""

from __future__ import annotations

import logging
import os
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..findings import Finding, Sample
from . import SOURCE
from .api import KubeApi
from .breaker import Breaker
from .budget import Budget
from .catalog import CATALOG
from .drain import RESULTS, Drainer, DrainProgress
from .events import EventRecorder
from .nodes import rfc3339
from .policy import EventSpec
from .ratelimit import Gate
from .settings import KubernetesSection

log = logging.getLogger(__name__)

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
RETIRED_CONDITION = "NeedsHardwareRepair"  # after the condition prefix
RETIRED_LABEL = "retired"  # after the taint prefix
EVENT_ACTION = "Remediate"


def own_namespace(environ: dict[str, str] | None = None, path: str = NAMESPACE_FILE) -> str:
    """The agent's namespace: $POD_NAMESPACE, else the service account's, else "" (not in a pod)."""
    env = os.environ if environ is None else environ
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


class KubeRemediation:
    def __init__(
        self, api: KubeApi, node: str, node_uid: str, cfg: KubernetesSection, *, namespace: str | None = None,
        wall: Callable[[], float] = time.time, rng: random.Random | None = None,
        watched: Callable[[], list[dict[str, Any]] | None] | None = None, mono: Callable[[], float] | None = None,
    ) -> None:
        self.node, self.node_uid, self.cfg, self.wall = node, node_uid, cfg, wall
        rng = rng or random.Random()
        self.mono = mono or api.clock  # the budget's expiry and renewals: this process's own monotonic clock

        def gate(qps: float, burst: int) -> Gate:
            return Gate(qps=qps, burst=burst, backoff_max=cfg.backoff_max, now=api.clock(), rng=rng)

        # Three buckets (and backoffs): evicting a hundred pods never delays the slot's release, a retire
        # write or an event, nor the other way round.
        self.api = api.with_gate(gate(cfg.drain.qps, cfg.drain.burst))  # the drain
        self.budget_api = api.with_gate(gate(cfg.disruption_budget.qps, cfg.disruption_budget.burst))
        self.writes_api = api.with_gate(gate(cfg.remediation_writes.qps, cfg.remediation_writes.burst))
        ns = own_namespace() if namespace is None else namespace
        self.drainer = Drainer(self.api, node, cfg.drain, own_namespace=ns, rng=rng, watched=watched)
        self.budget = Budget(self.budget_api, cfg.disruption_budget, node, held=False, recheck=cfg.resync_interval,
                             rng=rng, what="disruption", expiry=cfg.disruption_budget.expiry, wall=wall, mono=self.mono)
        self.recorder = EventRecorder(self.writes_api, node, burst=cfg.event_burst, refill=cfg.event_refill, now=api.clock())
        self.breaker = Breaker(self.budget_api, cfg, node, node_uid, mono=self.mono, wall=wall, event=self.event,
                               server_now=self.budget.server_now, rng=rng)
        self.label = cfg.taint_prefix + RETIRED_LABEL
        self.condition = cfg.condition_prefix + RETIRED_CONDITION
        self.progress: DrainProgress | None = None
        self._only: frozenset[str] | None = None

    # ------------------------------------------------------------ drain

    def plan_drain(self, only_pod_uids: frozenset[str] | None = None) -> list[str]:
        return self.drainer.plan(only_pod_uids)

    def drain(self, now: float, only_pod_uids: frozenset[str] | None = None) -> DrainProgress:
        """One step; a call after a finished drain, or for other pods, starts a new one."""
        if (self.progress is not None and self.progress.done) or only_pod_uids != self._only:
            self.drainer.reset()
        self._only = only_pod_uids
        self.progress = self.drainer.step(now, only_pod_uids)
        return self.progress

    # ------------------------------------------------------------ the disruption budget

    def claim_slot(self, now: float) -> bool:
        return self.budget.ensure(now, self.node_uid)

    def renew_slot(self, now: float) -> bool:
        """While the slot is held: its Lease renewed (every expiry/6). False: the slot was lost (reclaimed)."""
        return self.budget.renew()

    def slot_wait(self) -> str:
        """Why the last claim got no slot, in one sentence ("" while one is held or none was refused)."""
        db = self.cfg.disruption_budget
        if self.budget.held:
            return ""
        if self.budget.state == "exhausted":
            return f"every slot of the fleet's disruption budget (Leases in {db.namespace}) is held by other nodes"
        if self.budget.state == "missing":
            return (f"no ResourceQuota {db.namespace}/{db.quota_name} caps the disruption budget: "
                    "no remediation step runs until an operator creates it (fail closed)")
        return ""

    # ------------------------------------------------------------ the fleet breaker

    def breaker_check(self, now: float, step: str) -> str:
        """Before a claim or a host-changing step: "" when the fleet breaker allows it, else why not (breaker.py)."""
        return self.breaker.check(step)

    def release_slot(self, now: float) -> None:
        self.budget.release()
        self.breaker.forget()
        self.budget.idle()
        self.drainer.reset()
        self.progress = None

    # ------------------------------------------------------------ retire

    def set_retired(self, retired: bool, message: str) -> None:
        cond = {
            "type": self.condition, "status": "True" if retired else "False",
            "reason": "RepeatedFailures" if retired else "Returned",
            "message": message[:256], "lastHeartbeatTime": rfc3339(self.wall()), "lastTransitionTime": rfc3339(self.wall()),
        }
        self.writes_api.patch_node_status(self.node, {"status": {"conditions": [cond]}})
        self.writes_api.patch_node(self.node, {"metadata": {"labels": {self.label: "true" if retired else None}}})
        self.event("NodeRetired" if retired else "NodeReturned", message, warning=retired)
        log.warning("node %s %s: %s", self.node, "retired" if retired else "returned to service", message)

    def node_retired(self) -> bool:
        """Whether the Node carries our retired label (read back at start: the cluster's word outlives a lost record)."""
        node = self.api.read_node(self.node)
        return ((node.get("metadata") or {}).get("labels") or {}).get(self.label) == "true"

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        spec = EventSpec("Warning" if warning else "Normal", reason, EVENT_ACTION, message[:1024])
        name = f"{self.node}.{uuid.uuid4().hex[:16]}"
        self.recorder.send(spec, self.node_uid, self.api.clock(), self.wall(), name)

    # ------------------------------------------------------------ what it reports

    def findings(self) -> tuple[Finding, ...]:
        out = []
        p = self.progress
        if p is not None and p.timed_out:
            out.append(CATALOG.finding(SOURCE, "drain", "DrainTimedOut",
                                       f"{len(p.remaining)} pods left after the drain timeout: {', '.join(p.remaining[:5])}"))
        return tuple(out)

    def samples(self) -> list[Sample]:
        out = [Sample("node_health_kube_evictions_total", float(self.drainer.results[r]), (("result", r),)) for r in RESULTS]
        out.append(Sample("node_health_kube_drain_pods_remaining", float(self.drainer.remaining)))
        return out + self.breaker.samples()
