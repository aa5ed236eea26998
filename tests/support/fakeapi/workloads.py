"""Pods, PodDisruptionBudgets and the eviction subresource, as kube-apiserver
and the controllers around it behave (no HTTP here).

The eviction follows ``pkg/registry/core/pod/storage/eviction.go`` step by
step: a terminal, Pending or already terminating pod is deleted without
looking at any budget; more than one matching PDB is a ``Status`` with code
500; a not-Ready pod is deleted without spending the budget while the budget
is met; otherwise ``checkAndDecrement`` (a stale ``observedGeneration`` →
429 with ``retryAfterSeconds`` 10, ``disruptionsAllowed`` < 0 → 403, more
than 2000 ``disruptedPods`` → 403, 0 allowed → 429 with the
``DisruptionBudget`` cause), the pod recorded in ``status.disruptedPods``,
the ``DisruptionTarget`` condition added, and the pod deleted with the
caller's ``deleteOptions``. Success is ``201`` with a ``Status`` of
``Success`` (the create handler fills in ``code``).

Around it, what other components do, at once: the disruption controller
recomputes every PDB's status after each pod write (``expectedPods`` from the
owning ReplicaSet's scale for ``maxUnavailable`` and percentages, as
``getExpectedPodCount`` does); a graceful delete sets ``deletionTimestamp``
and the "kubelet" removes the pod once its containers have stopped (or never,
for a pod marked stuck: a node whose kubelet is gone); a ReplicaSet replaces
a terminating pod on a spare node, Ready after a delay. ``timeline`` records
every step for the tests to replay.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import status as st
from .cluster import clone

Obj = dict[str, Any]
PodKey = tuple[str, str]  # (namespace, name)
MAX_DISRUPTED_PODS = 2000  # eviction.go MaxDisruptedPodSize
DELETION_TIMEOUT = 120.0  # disruption controller: a disrupted pod not deleted by then is counted again
EVICT_MSG = "Cannot evict pod as it would violate the pod's disruption budget."
MULTI_PDB_MSG = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
MIRROR = "kubernetes.io/config.mirror"


def rfc3339(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> float:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


def selector_matches(sel: Obj | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector; an empty or nil selector matches nothing (eviction.go)."""
    if not sel or (not sel.get("matchLabels") and not sel.get("matchExpressions")):
        return False
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    for e in sel.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values, "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op)
        if not ok:
            return False
    return True


def ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def scaled(value: Any, total: int, round_up: bool) -> int:
    """intstr.GetScaledValueFromIntOrPercent."""
    if isinstance(value, str) and value.endswith("%"):
        v = int(value[:-1]) * total / 100
        return math.ceil(v) if round_up else math.floor(v)
    return int(value)


@dataclass
class ReplicaSet:
    namespace: str
    name: str
    replicas: int
    labels: dict[str, str]
    node: str  # where replacements land (the sick node is tainted: never there)
    ready_after: float
    uid: str = ""
    made: int = 0


@dataclass
class Workloads:
    """Installed on a `Cluster`: `put`/`delete` there call `after_pod_write`."""

    cluster: Any
    clock: Callable[[], float]
    wall: Callable[[], float]
    pdb_controller: bool = True  # False: PDB status is not recomputed (observedGeneration lags)
    # The next N evictions that consult a budget answer 409 Conflict on the PodDisruptionBudget and evict
    # nothing: kube-apiserver's answer when concurrent evictions kept updating the same PDB through all of
    # its EvictionsRetry steps (a multi-node drain wave); the request raced another one, so this comes
    # before the budget's own checks.
    pdb_conflicts: int = 0
    stuck: set[PodKey] = field(default_factory=set)  # pods the kubelet never stops
    stop_after: dict[PodKey, float] = field(default_factory=dict)  # seconds a pod takes to exit after SIGTERM
    replicasets: dict[PodKey, ReplicaSet] = field(default_factory=dict)
    timeline: list[tuple[float, str, str, str]] = field(default_factory=list)  # (clock, what, namespace, name)
    _gone_at: dict[PodKey, float] = field(default_factory=dict)  # terminating pods: when the kubelet removes them
    _ready_at: dict[PodKey, float] = field(default_factory=dict)  # replacement pods: when they turn Ready
    _by_uid: dict[str, ReplicaSet] = field(default_factory=dict)  # replicasets by uid

    def note(self, what: str, ns: str, name: str) -> None:
        self.timeline.append((self.clock(), what, ns, name))

    # ------------------------------------------------------------ the kubelet and the ReplicaSet controller

    def reap(self) -> None:
        """Let time act: terminated pods leave, replacements turn Ready."""
        now = self.clock()
        with self.cluster.lock:
            for key, at in sorted(self._gone_at.items(), key=lambda kv: kv[1]):
                if at <= now and key not in self.stuck:
                    del self._gone_at[key]
                    if self.cluster.delete(("", "pods", *key)) is not None:
                        self.note("deleted", *key)
            for key, at in list(self._ready_at.items()):
                if at <= now:
                    del self._ready_at[key]
                    pod = self.cluster.get(("", "pods", *key))
                    if pod is not None:
                        set_ready(pod, True)
                        self.cluster.put(("", "pods", *key), pod)
                        self.note("ready", *key)

    def scale(self, rs: ReplicaSet) -> None:
        """The ReplicaSet controller: terminating pods do not count (FilterActivePods)."""
        active = [p for p in self.cluster.pods_in(rs.namespace)
                  if owned_by(p, rs.uid) and not p["metadata"].get("deletionTimestamp")]
        for _ in range(rs.replicas - len(active)):
            rs.made += 1
            name = f"{rs.name}-r{rs.made}"
            pod = make_pod(rs.namespace, name, rs.node, labels=rs.labels, owner=("ReplicaSet", rs.name, rs.uid), ready=rs.ready_after <= 0)
            self.cluster.put(("", "pods", rs.namespace, name), pod)
            self.note("created", rs.namespace, name)
            if rs.ready_after > 0:
                self._ready_at[(rs.namespace, name)] = self.clock() + rs.ready_after

    def replicaset(self, uid: Any) -> ReplicaSet | None:
        """The ReplicaSet with this uid (an index over `replicasets`, which tests may also fill directly)."""
        rs = self._by_uid.get(uid)
        if rs is None or self.replicasets.get((rs.namespace, rs.name)) is not rs:
            self._by_uid = {r.uid: r for r in self.replicasets.values()}
            rs = self._by_uid.get(uid)
        return rs

    # ------------------------------------------------------------ the disruption controller

    def after_pod_write(self, ns: str) -> None:
        if self.pdb_controller:
            for name in sorted(self.cluster.index.get(("policy", "poddisruptionbudgets", ns), ())):
                self.sync_pdb(("policy", "poddisruptionbudgets", ns, name))

    def sync_pdb(self, key: tuple[str, str, str, str]) -> None:
        pdb = self.cluster.objects.get(key)
        if pdb is None:
            return
        pods = [p for p in self.cluster.pods_in(key[2])
                if selector_matches((pdb.get("spec") or {}).get("selector"), p["metadata"].get("labels") or {})]
        new = clone(pdb)
        new["status"] = self.pdb_status(pdb, pods)
        self.cluster.put(key, new)

    def pdb_status(self, pdb: Obj, pods: list[Obj]) -> Obj:
        spec, old = pdb.get("spec") or {}, pdb.get("status") or {}
        min_av, max_un = spec.get("minAvailable"), spec.get("maxUnavailable")
        if max_un is not None or (isinstance(min_av, str) and min_av.endswith("%")):
            expected = self._controller_scale(pods)
            desired = expected - scaled(max_un, expected, True) if max_un is not None else scaled(min_av, expected, True)
        else:
            expected, desired = len(pods), int(min_av or 0)
        desired = max(0, desired)
        live = {p["metadata"]["name"]: p for p in pods}
        now = self.wall()
        disrupted = {name: t for name, t in (old.get("disruptedPods") or {}).items()
                     if name in live and not live[name]["metadata"].get("deletionTimestamp")
                     and parse_time(t) + DELETION_TIMEOUT > now}
        healthy = sum(1 for p in pods if ready(p) and not p["metadata"].get("deletionTimestamp")
                      and p["metadata"]["name"] not in disrupted)
        allowed = max(0, healthy - desired)
        out: Obj = {
            "observedGeneration": pdb["metadata"].get("generation", 1), "disruptionsAllowed": allowed,
            "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
            "conditions": [{"type": "DisruptionAllowed", "status": "True" if allowed > 0 else "False",
                            "reason": "SufficientPods" if allowed > 0 else "InsufficientPods"}],
        }
        if disrupted:
            out["disruptedPods"] = disrupted
        return out

    def _controller_scale(self, pods: list[Obj]) -> int:
        total, seen = 0, set()
        for p in pods:
            ref = controller_of(p)
            if ref is None:
                total += 1  # the real controller refuses such a PDB (no scale); count the pod
                continue
            rs = self.replicaset(ref.get("uid"))
            if rs is None:
                total += 1
            elif rs.uid not in seen:
                seen.add(rs.uid)
                total += rs.replicas
        return total

    # ------------------------------------------------------------ DELETE pods/{name} and its grace period

    def delete_pod(self, ns: str, name: str, options: Obj) -> Obj:
        key = ("", "pods", ns, name)
        pod = self.cluster.get(key)
        if pod is None:
            raise st.not_found("", "pods", name)
        check_preconditions(pod, options.get("preconditions") or {})
        meta = pod["metadata"]
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        phase = (pod.get("status") or {}).get("phase")
        if grace <= 0 or phase in ("Succeeded", "Failed") or not (pod.get("spec") or {}).get("nodeName"):
            self.cluster.delete(key)  # nothing runs it: gone at once
            self._gone_at.pop((ns, name), None)
            self.note("deleted", ns, name)
            return pod
        if meta.get("deletionTimestamp"):
            left = parse_time(meta["deletionTimestamp"]) - self.wall()
            if grace >= left:
                return pod  # a longer grace period never extends a graceful deletion
        meta["deletionTimestamp"] = rfc3339(self.wall() + grace)
        meta["deletionGracePeriodSeconds"] = grace
        pod = self.cluster.put(key, pod)
        self.note("terminating", ns, name)
        self._gone_at[(ns, name)] = self.clock() + min(float(grace), self.stop_after.get((ns, name), 0.0))
        ref = controller_of(pod)
        owner = self.replicaset(ref.get("uid")) if ref is not None else None
        if owner is not None:
            self.scale(owner)
        return pod

    # ------------------------------------------------------------ POST pods/{name}/eviction

    def evict(self, ns: str, name: str, body: Any) -> tuple[int, Obj]:
        if not isinstance(body, dict) or body.get("kind") not in ("Eviction", None):
            raise st.bad_request(f"not a Eviction object: {type(body).__name__}")
        if (body.get("metadata") or {}).get("name") != name:
            raise st.bad_request("name in URL does not match name in Eviction object")
        options = body.get("deleteOptions") or {}
        dry_run = bool(options.get("dryRun"))
        with self.cluster.lock:
            pod = self.cluster.get(("", "pods", ns, name))
            if pod is None:
                raise st.not_found("", "pods", name)
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
                return self._evicted(pod, options, dry_run, "no budget consulted")
            pdbs = [p for p in self.cluster.list_in("policy", "poddisruptionbudgets", ns)
                    if selector_matches((p.get("spec") or {}).get("selector"), pod["metadata"].get("labels") or {})]
            if len(pdbs) > 1:
                return 500, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                             "message": MULTI_PDB_MSG, "code": 500}
            if not pdbs:
                return self._evicted(pod, options, dry_run, "no budget")
            pdb = pdbs[0]
            s = pdb.get("status") or {}
            if not ready(pod) and s.get("currentHealthy", 0) >= s.get("desiredHealthy", 0) > 0:
                return self._evicted(pod, options, dry_run, "unready, budget met")
            self._check_and_decrement(pdb, name, dry_run)
            return self._evicted(pod, options, dry_run, f"budget {pdb['metadata']['name']}")

    def _check_and_decrement(self, pdb: Obj, pod: str, dry_run: bool) -> None:
        s, meta = pdb.get("status") or {}, pdb["metadata"]
        if self.pdb_conflicts > 0:
            self.pdb_conflicts -= 1
            self.note("eviction conflict", meta["namespace"], pod)
            raise st.conflict("policy", "poddisruptionbudgets", meta["name"])
        if s.get("observedGeneration", 0) < meta.get("generation", 1):
            raise too_many(10, f"The disruption budget {meta['name']} is still being processed by the server.")
        if s.get("disruptionsAllowed", 0) < 0:
            raise st.forbidden("policy", "poddisruptionbudget", meta["name"], "pdb disruptions allowed is negative")
        if len(s.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS:
            raise st.forbidden("policy", "poddisruptionbudget", meta["name"],
                               "DisruptedPods map too big - too many evictions not confirmed by PDB controller")
        if s.get("disruptionsAllowed", 0) == 0:
            raise too_many(0, f"The disruption budget {meta['name']} needs {s.get('desiredHealthy', 0)} healthy pods "
                              f"and has {s.get('currentHealthy', 0)} currently")
        if dry_run:
            return
        new = clone(pdb)
        ns = new.setdefault("status", {})
        ns["disruptionsAllowed"] = s["disruptionsAllowed"] - 1
        ns.setdefault("disruptedPods", {})[pod] = rfc3339(self.wall())
        self.cluster.put(("policy", "poddisruptionbudgets", meta["namespace"], meta["name"]), new)

    def _evicted(self, pod: Obj, options: Obj, dry_run: bool, why: str) -> tuple[int, Obj]:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if not dry_run:
            check_preconditions(pod, options.get("preconditions") or {})
            conds = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != "DisruptionTarget"]
            conds.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                          "message": "Eviction API: evicting"})
            pod.setdefault("status", {})["conditions"] = conds
            self.cluster.put(("", "pods", ns, name), pod)
            self.note(f"evicted ({why})", ns, name)
            self.delete_pod(ns, name, options)
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def too_many(retry_after: int, cause: str) -> st.ApiStatus:
    """errors.NewTooManyRequests + the DisruptionBudget cause; Retry-After only when > 0 (ErrorNegotiated)."""
    details: Obj = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    headers = {}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
        headers["Retry-After"] = str(retry_after)
    return st.ApiStatus(429, "TooManyRequests", EVICT_MSG, details, headers)


def check_preconditions(obj: Obj, pre: Obj, group: str = "", plural: str = "pods") -> None:
    """DeleteOptions.preconditions (uid, resourceVersion): 409 Conflict when they do not hold (apiserver store.go)."""
    meta = obj["metadata"]
    if pre.get("uid") and pre["uid"] != meta.get("uid"):
        raise st.ApiStatus(409, "Conflict", f'Operation cannot be fulfilled on {st.qualified(group, plural)} "{meta["name"]}": '
                           f'Precondition failed: UID in precondition: {pre["uid"]}, UID in object meta: {meta.get("uid")}',
                           {"name": meta["name"], "group": group, "kind": plural})
    if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
        raise st.conflict(group, plural, meta["name"])


def controller_of(pod: Obj) -> Obj | None:
    return next((o for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")), None)


def owned_by(pod: Obj, uid: str) -> bool:
    ref = controller_of(pod)
    return ref is not None and ref.get("uid") == uid


def set_ready(pod: Obj, value: bool) -> None:
    status = pod.setdefault("status", {})
    conds = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"]
    conds.append({"type": "Ready", "status": "True" if value else "False"})
    status["conditions"] = conds


def make_pod(ns: str, name: str, node: str, *, labels: dict[str, str] | None = None,
             owner: tuple[str, str, str] | None = None, mirror: bool = False, phase: str = "Running",
             ready: bool = True, grace: int = 30) -> Obj:
    meta: Obj = {"name": name, "namespace": ns, "labels": dict(labels or {})}
    if owner is not None:
        kind, oname, uid = owner
        api = "apps/v1"
        meta["ownerReferences"] = [{"apiVersion": api, "kind": kind, "name": oname, "uid": uid,
                                    "controller": True, "blockOwnerDeletion": True}]
    if mirror:
        meta["annotations"] = {MIRROR: "0123456789abcdef0123456789abcdef"}
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": "node-uid", "controller": True}]
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": grace,
                         "containers": [{"name": "main", "image": "example/app:1"}]},
                "status": {"phase": phase}}
    set_ready(pod, ready and phase == "Running")
    return pod
