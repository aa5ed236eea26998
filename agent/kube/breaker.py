"""The fleet breaker: a fleet-wide pattern stops remediation everywhere and waits for a person.

The disruption budget caps how many nodes are disrupted *at once*; a retired
node frees its slot, so a false positive on every node (a bad driver, a bad
pattern pushed fleet-wide) would go on until the whole fleet was handled.
The breaker caps how many nodes are disrupted *in total* within a sliding
window, without a controller, and costs the API server nearly nothing: only
a node about to disrupt itself asks anything.

- **Records.** Before its first host-changing step of an episode (the
  drain, a GPU reset, a reboot, a retirement) a node creates a Lease named
  after itself in ``[kubernetes.breaker] namespace``, owned by its Node.
  That namespace's ResourceQuota caps ``count/leases.coordination.k8s.io``:
  its ``hard`` value is the breaker's count, enforced atomically by quota
  admission (403 "exceeded quota": the count is reached).
- **The window, on the server's clock.** The answer to the create carries
  ``metadata.creationTimestamp`` written by the API server: the server's
  "now". The node then lists the records (watch cache, at most `hard` small
  objects) and deletes, with a resourceVersion precondition, those the
  server created longer than ``window`` before that. No node's own clock is
  compared with another's, so clock skew cannot hide a disruption.
- **Percent and count.** The records left (this node's included) are the
  nodes disrupted within the window. Past ``min(hard, max(1,
  floor(max_disrupted_percent x fleet / 100)))`` the breaker trips and this
  node deletes its own record and does nothing. The fleet's size is a paged
  LIST of one Node (``limit=1``: ``remainingItemCount``), cached.
- **The taint budget as a signal.** Before a slot is claimed: when the taint
  budget is full (``status.used`` >= ``hard`` of its ResourceQuota, one
  cached GET) with at least ``min_tainted`` nodes tainted, the breaker trips.
- **Tripped** is written into the kill-switch ConfigMap under ``key``
  (``breaker: tripped`` with ``breaker-reason``, ``breaker-signal``,
  ``breaker-node``, ``breaker-at``): cluster-wide and persistent. The kill
  switch's own ``paused`` key is not touched, so taints, conditions, events
  and metrics go on; only remediation stops. Every node reads the ConfigMap
  again immediately before each host-changing step (drain ticks after the
  first: at most every `DRAIN_RECHECK`); before
  a claim, a read of the last resync interval counts, from the watch cache; any value other than absent, "" or
  "false" is tripped (fail closed), and a ConfigMap that cannot be read
  stops the step too. A person resets it (docs/remediation.md): delete the
  records, then set the key to "false".
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import random
from collections.abc import Callable
from typing import Any

from ..findings import Sample
from .api import ApiError, KubeApi
from .budget import QUOTA_KEY
from .nodes import micro_time_str, rfc3339
from .settings import KubernetesSection

log = logging.getLogger(__name__)

SIGNALS = ("disrupted", "tainted", "unknown")
STATES = ("closed", "tripped", "unknown")
DRAIN_RECHECK = 60.0  # while a drain goes on, the breaker's state is read again at most this often
CACHE = 300.0  # the quotas' status is trusted this long (the fleet's size: resync_interval)


def reset_commands(cfg: KubernetesSection) -> str:
    b, ks = cfg.breaker, cfg.kill_switch
    return (f"kubectl -n {b.namespace} delete leases --all && kubectl -n {ks.namespace} patch configmap {ks.name} "
            f"--type merge -p '{{\"data\":{{\"{b.key}\":\"false\"}}}}'")


class Breaker:
    def __init__(
        self, api: KubeApi, cfg: KubernetesSection, node: str, node_uid: str, *, mono: Callable[[], float],
        wall: Callable[[], float], event: Callable[[str, str, bool], None],
        server_now: Callable[[], float | None] = lambda: None, rng: random.Random | None = None,
    ) -> None:
        self.api, self.cfg, self.b, self.node, self.uid = api, cfg, cfg.breaker, node, node_uid
        self.mono, self.wall, self.event, self.server_now = mono, wall, event, server_now
        self.state = "" if self.b.enabled else "disabled"  # "": not read yet
        self.signal = ""
        self.reason = ""
        self.trips: dict[str, int] = {}
        self.recorded = False  # this node's record exists for the current episode
        self._read_at = float("-inf")
        self._pending: dict[str, str] | None = None  # a trip not yet written to the ConfigMap
        self._fleet: tuple[int, float] | None = None
        self._quotas: dict[str, tuple[int, int, float]] = {}  # namespace -> (used, hard, mono read)
        self._rng = rng or random.Random()
        self._claim_trust = 0.0  # how long the last read is trusted for a claim (resync interval, jittered)

    # ------------------------------------------------------------ the one entry point

    def check(self, step: str) -> str:
        """Before `step` ("claim", "drain", "reset_gpu", "reboot", "retire"): "" when it may go on, else why not.

        Every step but the claim records this node's disruption first (once per episode). May raise
        `ApiError`/`Wait`: the step does not run (the ladder tries again)."""
        if not self.b.enabled:
            return ""
        why = self._read(step)
        if why:
            return why
        if step == "claim":
            return self._tainted()
        if not self.recorded:
            return self._record()
        return ""

    def forget(self) -> None:
        """The episode ended: the next one records again (its record may still be within the window)."""
        self.recorded = False

    # ------------------------------------------------------------ the state (the kill-switch ConfigMap)

    def _read(self, step: str) -> str:
        """The state: read again just before a host-changing step (drain ticks after the first: at most every
        `DRAIN_RECHECK`); for a claim (nothing changes on a host yet, and in a
        fleet-wide wave every node waits there) a read of the last resync interval (jittered) counts, and it
        comes from the watch cache: a waiting fleet costs the API server next to nothing."""
        if self._pending is not None:
            self._persist()
            return self._message()
        ks = self.cfg.kill_switch
        if not ks.name:  # no ConfigMap: the state lives in this process only
            return self._message() if self.state == "tripped" else ""
        claim = step == "claim"
        trust = self._claim_trust if claim else (DRAIN_RECHECK if step == "drain" and self.recorded else 0.0)
        if self.mono() - self._read_at < trust and self.state in ("closed", "tripped"):
            return self._message() if self.state == "tripped" else ""
        try:
            obj = self.api.read_configmap(ks.namespace, ks.name, cached=claim)
        except ApiError as exc:
            if exc.status != 404:
                self.state = "unknown"
                raise
            obj = {}
        self._read_at = self.mono()
        self._claim_trust = self.cfg.resync_interval * (0.8 + 0.4 * self._rng.random())
        data = obj.get("data") or {}
        value = str(data.get(self.b.key, "")).strip()
        if value.lower() in ("", "false"):
            if self.state == "tripped":
                log.warning("fleet breaker: reset by a person (%s/%s %s=%r); remediation may go on", ks.namespace,
                            ks.name, self.b.key, value)
            self.state, self.signal, self.reason = "closed", "", ""
            return ""
        signal = str(data.get(f"{self.b.key}-signal", ""))
        self.state, self.signal = "tripped", signal if signal in SIGNALS else "unknown"
        self.reason = (f"{data.get(f'{self.b.key}-reason') or value} (tripped by {data.get(f'{self.b.key}-node') or '?'} "
                       f"at {data.get(f'{self.b.key}-at') or '?'})")
        return self._message()

    def _message(self) -> str:
        return (f"the fleet breaker is tripped: {self.reason}; nothing is disrupted on any node until a person "
                f"resets it: {reset_commands(self.cfg)}")

    def _trip(self, signal: str, why: str) -> str:
        at = rfc3339(self.wall())
        self.state, self.signal, self.reason = "tripped", signal, f"{why} (tripped by {self.node} at {at})"
        self.trips[signal] = self.trips.get(signal, 0) + 1
        log.error("FLEET BREAKER TRIPPED by %s: %s", self.node, why)
        k = self.b.key
        self._pending = {k: "tripped", f"{k}-reason": why[:1000], f"{k}-signal": signal, f"{k}-node": self.node, f"{k}-at": at}
        try:
            self.event("FleetBreakerTripped", f"{why}; remediation stops on every node until a person resets it: "
                       f"{reset_commands(self.cfg)}", True)
        except Exception as exc:  # an event is best effort
            log.debug("FleetBreakerTripped event not sent: %s", exc)
        self._persist()
        return self._message()

    def _persist(self) -> None:
        ks, data = self.cfg.kill_switch, self._pending
        if data is None or not ks.name:
            self._pending = None
            return
        try:
            self.api.patch_configmap(ks.namespace, ks.name, {"data": data})
        except ApiError as exc:
            if exc.status == 404:
                log.error("fleet breaker: the kill-switch ConfigMap %s/%s does not exist: the trip holds on this node "
                          "only (until the agent restarts)", ks.namespace, ks.name)
                self._pending = None
                return
            raise  # tried again before the next step; the trip holds here meanwhile
        self._pending = None
        self._read_at = self.mono()

    # ------------------------------------------------------------ signals

    def _quota(self, ns: str, name: str) -> tuple[int, int] | None:
        """(used, hard) of the quota capping Leases in `ns`, cached; None: there is none."""
        got = self._quotas.get(ns)
        if got is not None and self.mono() - got[2] < max(CACHE, self._claim_trust):
            return got[0], got[1]
        try:
            q = self.api.read_quota(ns, name)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        hard = ((q.get("spec") or {}).get("hard") or {}).get(QUOTA_KEY)
        used = ((q.get("status") or {}).get("used") or {}).get(QUOTA_KEY, "0")
        try:
            pair = (int(str(used)), int(str(hard)))
        except ValueError:
            return None
        self._quotas[ns] = (*pair, self.mono())
        return pair

    def _tainted(self) -> str:
        tb = self.cfg.budget
        if not self.b.min_tainted or not tb.enabled:
            return ""
        q = self._quota(tb.namespace, tb.quota_name)
        if q is None or q[0] < q[1] or q[0] < self.b.min_tainted:
            return ""
        return self._trip("tainted", f"the taint budget is full: {q[0]} of {q[1]} slots held ({tb.namespace}): "
                          "a fleet-wide pattern, not a fault of a few nodes")

    def _fleet_size(self) -> int | None:
        if self._fleet is not None and self.mono() - self._fleet[1] < self.cfg.resync_interval:
            return self._fleet[0]
        n = self.api.count_nodes()
        if n is not None:
            self._fleet = (n, self.mono())
        return n

    def _record(self) -> str:
        b = self.b
        q = self._quota(b.namespace, b.quota_name)
        if q is None:
            self.state = "unknown"
            return (f"no ResourceQuota {b.namespace}/{b.quota_name} caps the fleet breaker's records: nothing is "
                    "disrupted until an operator creates it (fail closed)")
        hard = q[1]
        fleet = self._fleet_size()
        if fleet is None:
            self.state = "unknown"
            return "the fleet's size is unknown (the API server gave no remainingItemCount): nothing is disrupted (fail closed)"
        limit = min(hard, max(1, math.floor(b.max_disrupted_percent * fleet / 100)))
        server_now = self._create()
        if server_now is None:  # 403: `hard` records, maybe some stale: look, and try once more
            hint = self.server_now()  # the server's clock from the slot's create, else the newest record
            if not self._expire(hint if hint is not None else self._newest_known()) or (server_now := self._create()) is None:
                return self._trip("disrupted", f"{hard} nodes were disrupted within {_span(b.window)} (the count of "
                                  f"{b.namespace}/{b.quota_name}); {self.node} would be one more")
        fresh = self._expire(server_now, count=True)
        if fresh > limit:
            self._delete_own()
            return self._trip("disrupted", f"{fresh} nodes would be disrupted within {_span(b.window)}, more than "
                              f"{limit} (min of the count {hard} and {b.max_disrupted_percent:g}% of {fleet} nodes)")
        self.recorded = True
        log.info("fleet breaker: disruption recorded (%d of at most %d nodes within %s)", fresh, limit, _span(b.window))
        return ""

    def _create(self) -> float | None:
        """Creates this node's record; the server's time of the create, or None when the quota is full."""
        body = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.node, "namespace": self.b.namespace,
                         "labels": {"app.kubernetes.io/name": "node-health-agent"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.uid}]},
            "spec": {"holderIdentity": self.node, "acquireTime": micro_time_str(self.wall()),
                     "leaseDurationSeconds": int(self.b.window)},
        }
        for attempt in (1, 2):
            try:
                got = self.api.create_lease(self.b.namespace, body)
            except ApiError as exc:
                if exc.status == 403 and "exceeded quota" in exc.message:
                    return None
                if exc.status != 409 or attempt == 2:
                    raise
                self._delete_own()  # a record of an earlier episode: counted again from now
                continue
            at = _time((got.get("metadata") or {}).get("creationTimestamp"))
            return at if at is not None else self._newest_known()
        return None  # not reached

    def _newest_known(self) -> float:
        """The latest creationTimestamp among the records: a lower bound of the server's now."""
        times = [_time((o.get("metadata") or {}).get("creationTimestamp")) for o in self.api.list_leases(self.b.namespace)]
        return max((t for t in times if t is not None), default=float("-inf"))

    def _expire(self, server_now: float, count: bool = False) -> int:
        """Deletes the records created longer than `window` before `server_now` (server clock); returns how
        many were deleted, or with `count` how many fresh records remain (this node's included)."""
        fresh, freed, mine = 0, 0, False
        for o in self.api.list_leases(self.b.namespace):
            meta = o.get("metadata") or {}
            at = _time(meta.get("creationTimestamp"))
            if at is not None and server_now - at > self.b.window:
                try:
                    self.api.delete_lease(self.b.namespace, str(meta.get("name", "")),
                                          resource_version=str(meta.get("resourceVersion", "")))
                    freed += 1
                except ApiError as exc:
                    if exc.status not in (404, 409):
                        raise
                continue
            fresh += 1
            mine = mine or meta.get("name") == self.node
        if count and not mine:
            fresh += 1  # the cache has not seen our create yet
        return fresh if count else freed

    def _delete_own(self) -> None:
        try:
            self.api.delete_lease(self.b.namespace, self.node)
        except ApiError as exc:
            if exc.status != 404:
                raise

    # ------------------------------------------------------------ what it reports

    def samples(self) -> list[Sample]:
        out = []
        if self.state:
            out.append(Sample("node_health_kube_breaker", 1, (("state", self.state), ("signal", self.signal or "none"))))
        out += [Sample("node_health_kube_breaker_trips_total", float(n), (("signal", s),)) for s, n in sorted(self.trips.items())]
        return out


def _span(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min"


def _time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
