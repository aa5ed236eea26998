"""The fake API server's state and request handling (no HTTP here).

One global resourceVersion increases on every write; a write that changes
nothing keeps the object's resourceVersion and emits no watch event (etcd's
GuaranteedUpdate skips identical bytes). Every write goes to the watch
history, bounded, so a watch from a resourceVersion that fell out of it gets
the in-stream 410 ``Expired``.
"""

from __future__ import annotations

import copy
import json
import queue
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from . import status as st
from .patch import PatchError, json_patch, merge_patch, strategic_merge

Obj = dict[str, Any]
Key = tuple[str, str, str, str]  # (group, plural, namespace, name)

RESOURCES: dict[tuple[str, str], tuple[str, str, bool]] = {  # (group, plural) → (kind, apiVersion, namespaced)
    ("", "nodes"): ("Node", "v1", False),
    ("", "namespaces"): ("Namespace", "v1", False),
    ("", "configmaps"): ("ConfigMap", "v1", True),
    ("", "events"): ("Event", "v1", True),
    ("", "resourcequotas"): ("ResourceQuota", "v1", True),
    ("events.k8s.io", "events"): ("Event", "events.k8s.io/v1", True),
    ("coordination.k8s.io", "leases"): ("Lease", "coordination.k8s.io/v1", True),
    ("", "pods"): ("Pod", "v1", True),
    ("policy", "poddisruptionbudgets"): ("PodDisruptionBudget", "policy/v1", True),
}
PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
}
QUOTA_LEASES = "count/leases.coordination.k8s.io"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    user: str = ""

    @classmethod
    def parse(cls, method: str, target: str, headers: dict[str, str], body: bytes) -> Request:
        path, _, qs = target.partition("?")
        query = {k: v[-1] for k, v in parse_qs(qs, keep_blank_values=True).items()}
        return cls(method.upper(), path, query, {k.lower(): v for k, v in headers.items()}, body)

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError as exc:
            raise st.bad_request(f"error decoding request body: {exc}") from None


@dataclass
class Route:
    group: str
    plural: str
    namespace: str
    name: str
    sub: str
    kind: str
    api_version: str


@dataclass
class Watcher:
    group: str
    plural: str
    namespace: str
    name: str | None
    q: queue.Queue[tuple[str, Obj] | None] = field(default_factory=queue.Queue)
    # A field selector other than metadata.name (pods: spec.nodeName=...): (object → passes); None: every object.
    passes: Callable[[Obj], bool] | None = None

    def matches(self, key: Key) -> bool:
        g, p, ns, name = key
        return (g, p) == (self.group, self.plural) and (not self.namespace or ns == self.namespace) and (
            self.name is None or name == self.name)

    def event(self, kind: str, obj: Obj, old: Obj | None) -> tuple[str, Obj] | None:
        """What this watcher sees of a write, as the cacher filters it (cache_watcher.go convertToWatchEvent): an
        object that starts passing the selector is ADDED, one that stops passing is DELETED (its previous content,
        at the event's resourceVersion), one that passes neither before nor after is not sent."""
        if self.passes is None:
            return kind, obj
        now = kind != "DELETED" and self.passes(obj)
        before = old is not None and self.passes(old)
        if now:
            return ("MODIFIED" if before else "ADDED"), obj
        if before:
            gone = clone(old)
            gone.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
            return "DELETED", gone
        return None


def clone(obj: Any) -> Any:
    """A deep copy of a JSON-like object (dicts, lists, scalars), several times faster than copy.deepcopy
    (no memo: objects in the store are trees); anything else falls back to copy.deepcopy."""
    t = type(obj)
    if t is dict:
        return {k: v if type(v) in _SCALARS else clone(v) for k, v in obj.items()}
    if t is list:
        return [v if type(v) in _SCALARS else clone(v) for v in obj]
    if t in _SCALARS:
        return obj
    return copy.deepcopy(obj)


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _stamp(wall: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(wall, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Cluster:
    wall: Callable[[], float] | None = None  # the server's clock (set by FakeApiServer)

    def __init__(self, *, history: int = 1000) -> None:
        self.lock = threading.RLock()
        self.objects: dict[Key, Obj] = {}
        self.rv = 1
        self.history: deque[tuple[int, str, Key, Obj, Obj | None]] = deque(maxlen=history)  # (rv, kind, key, obj, old)
        self.compacted = 0  # resourceVersions up to this one have left the history
        self.watchers: list[Watcher] = []
        self.cache: dict[Key, Obj] | None = None  # frozen watch cache (resourceVersion=0 reads), None: live
        self.index: dict[tuple[str, str, str], set[str]] = {}  # (group, plural, namespace) → names
        self.pods_by_node: dict[str, set[tuple[str, str]]] = {}  # spec.nodeName → (namespace, name)
        self._pod_node: dict[tuple[str, str], str] = {}
        self.workloads: Any = None  # workloads.Workloads: the controllers and kubelets around pods
        for ns in ("default", "kube-system"):
            self.create_namespace(ns)

    # ------------------------------------------------------------ storage

    def get(self, key: Key) -> Obj | None:
        with self.lock:
            obj = self.objects.get(key)
            return clone(obj) if obj is not None else None

    def put(self, key: Key, obj: Obj, *, create: bool = False) -> Obj:
        """Store `obj` (a new resourceVersion and a watch event unless nothing changed)."""
        with self.lock:
            old = self.objects.get(key)
            meta = obj.setdefault("metadata", {})
            if old is not None and not create and _same(old, obj):
                return clone(old)
            self.rv += 1
            meta["resourceVersion"] = str(self.rv)
            if old is None:
                meta.setdefault("uid", str(uuid.uuid4()))
                # Stamped by the server's clock, as the API server does (the fleet breaker's window reads it).
                meta.setdefault("creationTimestamp", _stamp(self.wall()) if self.wall is not None else "2026-01-01T00:00:00Z")
            self.objects[key] = clone(obj)
            self.index.setdefault(key[:3], set()).add(key[3])
            self._publish("ADDED" if old is None else "MODIFIED", key, obj, old)
            self._after_write(key)
            return clone(obj)

    def delete(self, key: Key) -> Obj | None:
        with self.lock:
            obj = self.objects.pop(key, None)
            if obj is None:
                return None
            self.index.get(key[:3], set()).discard(key[3])
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._publish("DELETED", key, obj, obj)
            self._after_write(key)
            if key[1] == "nodes":
                self._collect_garbage(obj["metadata"]["uid"])
            return obj

    def _publish(self, kind: str, key: Key, obj: Obj, old: Obj | None) -> None:
        if len(self.history) == self.history.maxlen:
            self.compacted = self.history[0][0]
        old = clone(old)
        self.history.append((self.rv, kind, key, clone(obj), old))
        for w in list(self.watchers):
            ev = w.event(kind, obj, old) if w.matches(key) else None
            if ev is not None:
                w.q.put((ev[0], clone(ev[1])))

    def _after_write(self, key: Key) -> None:
        if key[:2] == ("coordination.k8s.io", "leases"):
            self._refresh_quotas(key[2])
        elif key[:2] == ("", "pods"):
            self._index_pod(key)
            if self.workloads is not None:
                self.workloads.after_pod_write(key[2])
        elif key[:2] == ("policy", "poddisruptionbudgets") and self.workloads is not None and self.workloads.pdb_controller:
            self.workloads.sync_pdb(key)

    def _index_pod(self, key: Key) -> None:
        pod, ref = self.objects.get(key), (key[2], key[3])
        old = self._pod_node.pop(ref, None)
        if old is not None:
            self.pods_by_node[old].discard(ref)
        node = (pod.get("spec") or {}).get("nodeName") if pod is not None else None
        if node:
            self._pod_node[ref] = node
            self.pods_by_node.setdefault(node, set()).add(ref)

    def pods_in(self, ns: str) -> list[Obj]:
        """The pods of a namespace, by name (the index: no scan of every object; do not modify them)."""
        return self.list_in("", "pods", ns)

    def list_in(self, group: str, plural: str, ns: str) -> list[Obj]:
        return [self.objects[(group, plural, ns, n)] for n in sorted(self.index.get((group, plural, ns), ()))]

    def _collect_garbage(self, uid: str) -> None:
        """The garbage collector: objects owned by a deleted Node go with it."""
        for key, obj in list(self.objects.items()):
            owners = obj.get("metadata", {}).get("ownerReferences") or []
            if any(o.get("uid") == uid for o in owners):
                self.delete(key)

    def compact(self) -> None:
        """Forget the watch history (as etcd compaction does): older resourceVersions now answer 410."""
        with self.lock:
            self.compacted = self.rv
            self.history.clear()

    # ------------------------------------------------------------ quota

    def leases_in(self, ns: str) -> int:
        return len(self.index.get(("coordination.k8s.io", "leases", ns), ()))

    def _quotas(self, ns: str) -> list[tuple[Key, Obj]]:
        keys = [("", "resourcequotas", ns, name) for name in sorted(self.index.get(("", "resourcequotas", ns), ()))]
        return [(k, self.objects[k]) for k in keys]

    def _refresh_quotas(self, ns: str) -> None:
        used = self.leases_in(ns)
        for key, quota in self._quotas(ns):
            hard = (quota.get("spec") or {}).get("hard") or {}
            if QUOTA_LEASES in hard:
                q = clone(quota)
                q["status"] = {"hard": dict(hard), "used": {QUOTA_LEASES: str(used)}}
                self.put(key, q)

    def admit_quota(self, key: Key) -> None:
        """ResourceQuota admission for a create: charge one Lease, atomically (caller holds the lock)."""
        ns = key[2]
        for _, quota in self._quotas(ns):
            hard = (quota.get("spec") or {}).get("hard") or {}
            if QUOTA_LEASES not in hard:
                continue
            limit, used = int(hard[QUOTA_LEASES]), self.leases_in(ns)
            if used + 1 > limit:
                name = quota["metadata"]["name"]
                raise st.forbidden("coordination.k8s.io", "leases", key[3], (
                    f"exceeded quota: {name}, requested: {QUOTA_LEASES}=1, used: {QUOTA_LEASES}={used}, "
                    f"limited: {QUOTA_LEASES}={limit}"))

    # ------------------------------------------------------------ helpers for tests

    def create_namespace(self, name: str) -> None:
        self.put(("", "namespaces", "", name), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def namespace_exists(self, ns: str) -> bool:
        return ("", "namespaces", "", ns) in self.objects

    def freeze_cache(self) -> None:
        """From now on resourceVersion=0 reads see the objects as they are now (a lagging watch cache)."""
        with self.lock:
            self.cache = clone(self.objects)

    def list(self, group: str, plural: str, ns: str, name: str | None, cached: bool) -> list[Obj]:
        with self.lock:
            source = self.cache if (cached and self.cache is not None) else self.objects
            if name is not None:
                obj = source.get((group, plural, ns, name))  # cluster-scoped objects have namespace ""
                if obj is not None or ns:
                    return [clone(obj)] if obj is not None else []
            if name is not None:
                return [clone(o) for k, o in source.items() if k[:2] == (group, plural) and k[3] == name]
            return [clone(o) for k, o in sorted(source.items()) if k[:2] == (group, plural)
                    and (not ns or k[2] == ns) and (name is None or k[3] == name)]

    def watch(self, w: Watcher, rv: str) -> list[tuple[str, Obj]]:
        """Register `w`; the events it must see first (synthetic ADDED, or the history after `rv`)."""
        with self.lock:
            if rv in ("", "0"):
                initial = [("ADDED", o) for o in self.list(w.group, w.plural, w.namespace, w.name, cached=False)
                           if w.passes is None or w.passes(o)]
            else:
                start = int(rv)
                if start > self.rv:  # a resourceVersion from the future (another server, a restored etcd)
                    raise st.ApiStatus(504, "Timeout", f"Too large resource version: {start}, current: {self.rv}",
                                       {"retryAfterSeconds": 1, "causes": [{"reason": "ResourceVersionTooLarge"}]},
                                       {"Retry-After": "1"})
                if start < self.compacted:
                    raise st.expired(f"too old resource version: {start} ({self.compacted + 1})")
                seen = [w.event(kind, o, old) for r, kind, key, o, old in self.history if r > start and w.matches(key)]
                initial = [(ev[0], clone(ev[1])) for ev in seen if ev is not None]
            self.watchers.append(w)
            return initial

    def unwatch(self, w: Watcher) -> None:
        with self.lock:
            if w in self.watchers:
                self.watchers.remove(w)
        w.q.put(None)


def _same(old: Obj, new: Obj) -> bool:
    a = {k: v for k, v in old.items() if k != "metadata"}
    b = {k: v for k, v in new.items() if k != "metadata"}
    ma = {k: v for k, v in old.get("metadata", {}).items() if k != "resourceVersion"}
    mb = {k: v for k, v in new.get("metadata", {}).items() if k != "resourceVersion"}
    return a == b and ma == mb


def apply_patch(kind: str, current: Obj, req: Request) -> Obj:
    ctype = req.headers.get("content-type", "").split(";")[0].strip()
    flavour = PATCH_TYPES.get(ctype)
    if flavour is None:
        raise st.unsupported_media()
    body = req.json()
    try:
        if flavour == "json":
            return json_patch(current, body)  # type: ignore[no-any-return]
        if not isinstance(body, dict):
            raise st.bad_request("error decoding patch: the patch must be a JSON object")
        if flavour == "merge":
            return merge_patch(current, body)  # type: ignore[no-any-return]
        return strategic_merge(current, body)  # type: ignore[no-any-return]
    except PatchError as exc:
        if exc.code == 400:
            raise st.bad_request(exc.message) from None
        raise st.ApiStatus(422, "Invalid", exc.message) from None

