"""Fleet-wide budgets, enforced by the API server itself: the taint budget,
and (the same class, another namespace and quota) the disruption budget that
a drain, GPU reset or reboot claims first.

Before it adds a taint, an agent creates a Lease named after its node in a
dedicated namespace whose ResourceQuota caps ``count/leases.coordination.k8s.io``.
Quota admission charges the create atomically, so at most `hard` agents hold a
slot, with no controller and no race; the answer to one create too many is
``403 Forbidden`` "exceeded quota". The Lease's ownerReference to the Node
lets the garbage collector free the slot of a deleted node; the agent deletes
it once its node carries none of its budgeted taints. Admission charges a
create before the store sees the name, so a full quota answers 403 even to an
agent whose Lease exists: a GET of the Lease tells "mine" from "none left".
A missing quota would mean "no cap", so the agent then withholds its taints
(fail closed) and says so. The quota is read again when the last sight of it
is older than the resync interval (and its jitter: the longest retry wait); a
403 "exceeded quota" naming the Lease count is such a sight, so an agent that
waits for a slot costs one create per retry, not a create and a GET of the
quota.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Protocol

from .api import ApiError, KubeApi

log = logging.getLogger(__name__)

QUOTA_KEY = "count/leases.coordination.k8s.io"
JITTER = 0.2  # every retry wait is jittered by ±20 %


class BudgetConfig(Protocol):
    """What a budget section says (`BudgetSection`, `DisruptionBudgetSection`)."""

    @property
    def enabled(self) -> bool: ...
    @property
    def namespace(self) -> str: ...
    @property
    def quota_name(self) -> str: ...
    @property
    def retry_interval(self) -> float: ...


class Budget:
    def __init__(
        self, api: KubeApi | None, cfg: BudgetConfig, node: str, *, held: bool, recheck: float, rng: random.Random,
        what: str = "taint",
    ) -> None:
        self.api, self.cfg, self.node, self.what = api, cfg, node, what
        self.held = held or not cfg.enabled
        self.state = "disabled" if not cfg.enabled else ("held" if held else "idle")
        self.retry_at = 0.0
        self._recheck = recheck  # how long a seen quota is trusted (+ jitter); also the longest retry wait
        self._rng = rng
        self._failures = 0
        self._quota_seen_at: float | None = None
        self._absent = False  # a GET said we hold no Lease, and we created none since
        self._unsure = False  # a create got 403: whether the Lease is ours is still to be read

    def ensure(self, now: float, uid: str) -> bool:
        """True when this node holds a slot (claiming one if needed); may raise Wait/ApiError.

        Every request here may be refused by the rate limit (`Wait`) and the
        step tried again later, so the state between two requests is kept:
        after a 403 the next try starts with the GET, not with another create.
        """
        if self.held:
            return True
        if now < self.retry_at:
            return False
        assert self.api is not None
        if self._unsure:
            mine = self._mine()
            self._unsure = False
            if not mine:
                self._absent = True
                return self._refused(now, "exhausted")
            return self._claimed()
        if not self._quota_present(now):
            return self._refused(now, "missing")
        try:
            self.api.create_lease(self.cfg.namespace, self._lease(uid))
        except ApiError as exc:
            if exc.status == 403 and "exceeded quota" in exc.message:
                if QUOTA_KEY in exc.message:  # admission named the quota that caps Leases: seen now
                    self._quota_seen_at = now
                if self._absent:
                    return self._refused(now, "exhausted")
                self._unsure = True
                return self.ensure(now, uid)
            if exc.status != 409:  # 409 AlreadyExists: our own, from before a restart
                raise
        return self._claimed()

    def _claimed(self) -> bool:
        self.held, self.state, self._failures, self._absent = True, "held", 0, False
        log.info("claimed a %s budget slot (lease %s/%s)", self.what, self.cfg.namespace, self.node)
        return True

    def release(self) -> None:
        if not self.cfg.enabled or not self.held:
            return
        assert self.api is not None
        try:
            self.api.delete_lease(self.cfg.namespace, self.node)
        except ApiError as exc:
            if exc.status != 404:
                raise
        self.held, self.state, self._absent = False, "idle", True
        log.info("released the %s budget slot", self.what)

    def idle(self) -> None:
        """No slot is wanted any more: forget a refused claim."""
        if self.state in ("exhausted", "missing"):
            self.state, self.retry_at, self._failures = "idle", 0.0, 0

    # ------------------------------------------------------------ helpers

    def _lease(self, uid: str) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.node,
                "namespace": self.cfg.namespace,
                "labels": {"app.kubernetes.io/name": "node-health-agent"},
                # Owned by the Node: the garbage collector frees the slot of a deleted node.
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid}],
            },
            "spec": {"holderIdentity": self.node},
        }

    def _mine(self) -> bool:
        assert self.api is not None
        try:
            self.api.read_lease(self.cfg.namespace, self.node)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _quota_present(self, now: float) -> bool:
        if self._quota_seen_at is not None and now - self._quota_seen_at < self._recheck * (1 + JITTER):
            return True
        assert self.api is not None
        try:
            quota = self.api.read_quota(self.cfg.namespace, self.cfg.quota_name)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        if QUOTA_KEY not in ((quota.get("spec") or {}).get("hard") or {}):
            return False
        self._quota_seen_at = now
        return True

    def _refused(self, now: float, state: str) -> bool:
        if self.state != state:
            log.warning(
                "%s budget %s: %s", self.what, state,
                "every slot is taken" if state == "exhausted" else f"no ResourceQuota {self.cfg.namespace}/{self.cfg.quota_name} caps {QUOTA_KEY}",
            )
        self.state = state
        self._failures += 1
        wait = min(self._recheck, self.cfg.retry_interval * 2 ** (self._failures - 1))
        self.retry_at = now + wait * (1 - JITTER + 2 * JITTER * self._rng.random())
        return False
