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

Expiry (the disruption budget; `expiry` > 0): a slot must not outlive its
holder. A node that dies holding one (the agent gone, the machine off) would
hold it forever: the garbage collector frees the slot of a *deleted* Node
(the ownerReference), but nothing frees that of a node that is only gone
quiet. So the holder writes ``spec.renewTime`` when it claims the slot and
renews it every ``expiry / 6`` of its own monotonic clock while it holds it
(a merge patch of that one field). A waiting agent whose create was refused
lists the namespace's Leases (at most every ``expiry / 6``: a waiter's
retries cost no more than before in between) and judges expiry the way
client-go's leader election does: it remembers, per Lease, the
resourceVersion and renewTime it saw and *when it saw them change*, on its
own monotonic clock, and deletes a Lease only after it has itself watched it
not change for ``max(expiry, the Lease's leaseDurationSeconds)``. The
holder's renewTime is never compared with the waiter's clock, so hours of
skew between the two never free a live holder's slot. Each DELETE carries
the resourceVersion last seen as a precondition (a Lease renewed in between
is kept: 409); then the waiter creates its own. Quota admission still counts
every create, so no more than `hard` Leases exist at any time. A waiter that
restarts forgets what it saw and watches again (later, never sooner). A
holder that finds its Lease gone when it renews (404) has lost the slot and
claims one again before its next disruptive step. Only a 409 AlreadyExists
to a create is "ours already": a 409 Conflict is quota admission racing
another create (kubernetes#67761), nothing was created, and the claim is
tried again. The expiry must be longer
than the longest reboot plus boot, or a slow node's slot is taken while it
boots (it then waits for a slot before anything else).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from .api import ApiError, KubeApi
from .nodes import micro_time_str

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
        what: str = "taint", expiry: float = 0.0, wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.cfg, self.node, self.what = api, cfg, node, what
        # expiry 0: slots never expire (the taint budget). `wall` only writes renewTime (for people to read);
        # every judgement of time (when to renew, when a Lease expired) is on `mono`, this process's own clock.
        self.expiry, self.wall, self.mono = expiry, wall, mono
        self._renewed = float("-inf")  # mono time of the last write of our renewTime (-inf: not since this start)
        self._scanned = float("-inf")  # mono time of the last look for expired Leases (at most every expiry/6)
        # Lease name -> (resourceVersion, renewTime) last seen, and the mono time it was first seen so
        # (client-go leader election's observedRecord / observedTime).
        self._observed: dict[str, tuple[tuple[str, str], float]] = {}
        # The API server's clock, as the creationTimestamp it wrote on our last create, and our mono time then.
        self.server_at: tuple[float, float] | None = None
        self.reclaimed = 0  # expired Leases of other nodes this agent deleted
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
                return self._full(now, uid)
            return self._found()
        if not self._quota_present(now):
            return self._refused(now, "missing")
        try:
            self._created(self.api.create_lease(self.cfg.namespace, self._lease(uid)))
        except ApiError as exc:
            if exc.status == 403 and "exceeded quota" in exc.message:
                if QUOTA_KEY in exc.message:  # admission named the quota that caps Leases: seen now
                    self._quota_seen_at = now
                if self._absent:
                    return self._full(now, uid)
                self._unsure = True
                return self.ensure(now, uid)
            if not _exists(exc):  # 409 AlreadyExists: our own, from before a restart
                raise
            return self._found()
        return self._claimed(True)

    def _full(self, now: float, uid: str) -> bool:
        """Every slot is taken: reclaim the expired ones (if slots expire), and try once more."""
        if not self.expiry or self.mono() - self._scanned < self.expiry / 6 or not self._reclaim():
            return self._refused(now, "exhausted")
        assert self.api is not None
        try:
            self._created(self.api.create_lease(self.cfg.namespace, self._lease(uid)))
        except ApiError as exc:
            if exc.status == 403 and "exceeded quota" in exc.message:
                return self._refused(now, "exhausted")  # another waiter took the freed slot first
            if not _exists(exc):
                raise
            return self._found()
        return self._claimed(True)

    def _reclaim(self) -> bool:
        """Deletes the Leases of other nodes this agent has watched not change for the expiry; True when one went.

        As client-go's leader election: a Lease's resourceVersion and renewTime are compared with what this
        agent saw last, and their age is how long *this agent's* monotonic clock has seen them unchanged;
        the holder's renewTime is never compared with a local clock (skew between nodes cannot expire it)."""
        assert self.api is not None
        mono, freed = self.mono(), False
        self._scanned = mono
        seen: dict[str, tuple[tuple[str, str], float]] = {}
        for lease in self.api.list_leases(self.cfg.namespace):
            meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
            name = str(meta.get("name", ""))
            if not name or name == self.node:
                continue
            rv = str(meta.get("resourceVersion", ""))
            record = (rv, str(spec.get("renewTime") or ""))
            old = self._observed.get(name)
            since = old[1] if old is not None and old[0] == record else mono  # changed (or new): watch it again
            seen[name] = (record, since)
            try:
                duration = float(spec.get("leaseDurationSeconds") or 0)
            except (TypeError, ValueError):
                duration = 0.0
            limit = max(self.expiry, duration)
            if not rv or mono - since < limit:
                continue
            try:
                self.api.delete_lease(self.cfg.namespace, name, resource_version=rv)
            except ApiError as exc:
                if exc.status in (404, 409):  # gone already, or renewed in between: not ours to take
                    continue
                raise
            freed = True
            seen.pop(name, None)
            self.reclaimed += 1
            log.warning("reclaimed the %s budget slot of %s: this agent saw its Lease unchanged for %.0fs (expiry %.0fs)",
                        self.what, name, mono - since, limit)
        self._observed = seen  # Leases no longer listed are forgotten (bounded by the quota)
        return freed

    def renew(self) -> bool:
        """While a slot is held and slots expire: renews its Lease every expiry/6. False when the Lease is
        gone (reclaimed after our expiry, or collected): the slot is lost. May raise Wait/ApiError."""
        if not self.held or not self.expiry or not self.cfg.enabled:
            return True
        mono = self.mono()
        if mono - self._renewed < self.expiry / 6:
            return True
        if not self._touch():
            log.error("the %s budget slot of %s was taken away (its Lease is gone): claiming one again before "
                      "the next step", self.what, self.node)
            self.held, self.state, self._absent = False, "idle", True
            return False
        self._renewed = mono
        return True

    def _touch(self) -> bool:
        """Writes our Lease's renewTime (a new resourceVersion); False when the Lease is gone (404)."""
        assert self.api is not None
        try:
            self.api.patch_lease(self.cfg.namespace, self.node, {"spec": {"renewTime": micro_time_str(self.wall())}})
        except ApiError as exc:
            if exc.status != 404:
                raise
            return False
        return True

    def _found(self) -> bool:
        """Our own Lease, from before a restart: renewed before it counts as held. Unrenewed for longer than the
        expiry, a waiter may be about to delete it; the renewal changes its resourceVersion, so that delete
        (preconditioned on what the waiter saw) fails. Gone meanwhile (404): no slot, the next try creates one."""
        if not self.expiry or not self.cfg.enabled:
            return self._claimed()
        if not self._touch():
            log.warning("the %s budget Lease of %s was deleted as it was found (expired): claiming again", self.what, self.node)
            self._absent = True
            return False
        return self._claimed(True)

    def _claimed(self, created: bool = False) -> bool:
        """Holding a slot; `created`: its renewTime was just written (created, or renewed as found), else renew it soon."""
        self.held, self.state, self._failures, self._absent = True, "held", 0, False
        self._renewed = self.mono() if created else float("-inf")
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
            "spec": self._spec(),
        }

    def _spec(self) -> dict[str, Any]:
        if not self.expiry:
            return {"holderIdentity": self.node}
        now = micro_time_str(self.wall())
        return {"holderIdentity": self.node, "acquireTime": now, "renewTime": now,
                "leaseDurationSeconds": int(self.expiry)}

    def _created(self, lease: dict[str, Any]) -> None:
        stamp = (lease.get("metadata") or {}).get("creationTimestamp")
        if isinstance(stamp, str) and stamp:
            try:
                self.server_at = (dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp(), self.mono())
            except ValueError:
                pass

    def server_now(self) -> float | None:
        """The API server's clock now, from our last create (None: none yet in this process)."""
        if self.server_at is None:
            return None
        return self.server_at[0] + (self.mono() - self.server_at[1])

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


def _exists(exc: ApiError) -> bool:
    """A create answered 409 AlreadyExists: the Lease named after this node is there (ours). A 409 Conflict is not:
    quota admission answers it to a create that raced another one ("Operation cannot be fulfilled on
    resourcequotas", kubernetes#67761), and nothing was created."""
    return exc.status == 409 and exc.reason == "AlreadyExists"
