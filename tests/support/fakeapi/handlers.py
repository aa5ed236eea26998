"""Routing and the per-verb behaviour of the fake API server."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from . import status as st
from .cluster import RESOURCES, Cluster, Key, Obj, Request, Route, Watcher, apply_patch, clone
from .workloads import check_preconditions

POD_FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
              "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName")
_PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))/(?P<rest>.+)$")


@dataclass
class Stream:
    """A watch: initial events, then live ones from the watcher's queue."""

    watcher: Watcher
    initial: list[tuple[str, Obj]]
    timeout: float | None
    bookmarks: bool
    kind: str
    api_version: str
    ended: bool = False  # nothing follows the initial events (the in-stream 410)


def pod_field(pod: Obj, name: str) -> str:
    value: Any = pod
    for part in name.split("."):
        value = (value or {}).get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def route(path: str) -> Route | None:
    m = _PATH.match(path)
    if not m:
        return None
    group = m["group"] or ""
    parts = m["rest"].strip("/").split("/")
    ns = ""
    if parts[0] == "namespaces" and len(parts) >= 3:
        ns, parts = parts[1], parts[2:]
    plural, name, sub = parts[0], (parts[1] if len(parts) > 1 else ""), (parts[2] if len(parts) > 2 else "")
    res = RESOURCES.get((group, plural))
    if res is None or len(parts) > 3:
        return None
    kind, api_version, namespaced = res
    if namespaced != bool(ns) and not (namespaced and not name):
        return None
    return Route(group, plural, ns, name, sub, kind, api_version)


def verb_of(req: Request, r: Route) -> str:
    if req.method == "GET":
        if r.name:
            return "get"
        return "watch" if req.query.get("watch") in ("1", "true") else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(req.method, req.method.lower())


class Handlers:
    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster

    def handle(self, req: Request, r: Route, verb: str) -> tuple[int, Any] | Stream:
        key: Key = (r.group, r.plural, r.namespace, r.name)
        if r.namespace and r.plural != "namespaces" and not self.c.namespace_exists(r.namespace) and verb == "create":
            raise st.not_found("", "namespaces", r.namespace)
        if verb == "get":
            obj = self.c.get(key)
            if obj is None:
                raise st.not_found(r.group, r.plural, r.name)
            return 200, obj
        if verb == "list":
            return 200, self._list(req, r)
        if verb == "watch":
            return self._watch(req, r)
        if verb == "create" and (r.plural, r.sub) == ("pods", "eviction"):
            return self.c.workloads.evict(r.namespace, r.name, req.json())  # type: ignore[no-any-return]
        if verb == "create":
            return self._create(req, r)
        if verb == "update":
            return self._update(req, r, key)
        if verb == "patch":
            return self._patch(req, r, key)
        if verb == "delete" and r.plural == "pods":
            options = req.json() or {}
            if req.query.get("gracePeriodSeconds"):
                options["gracePeriodSeconds"] = int(req.query["gracePeriodSeconds"])
            return 200, self.c.workloads.delete_pod(r.namespace, r.name, options)
        if verb == "delete":
            with self.c.lock:  # DeleteOptions.preconditions (uid, resourceVersion): 409 when they do not hold
                cur = self.c.get(key)
                if cur is not None:
                    check_preconditions(cur, (req.json() or {}).get("preconditions") or {}, r.group, r.plural)
                obj = self.c.delete(key)
            if obj is None:
                raise st.not_found(r.group, r.plural, r.name)
            return 200, obj
        raise st.ApiStatus(405, "MethodNotAllowed", f"{req.method} is not supported")

    # ------------------------------------------------------------ reads

    def _selected_name(self, req: Request) -> str | None:
        sel = req.query.get("fieldSelector", "")
        if not sel:
            return None
        m = re.fullmatch(r"metadata\.name=(.+)", sel)
        if not m:
            raise st.bad_request(f'"{sel}" is not a known field selector: only "metadata.name"')
        return m[1]

    def _list(self, req: Request, r: Route) -> Obj:
        if r.plural == "pods":
            items = self._list_pods(req, r)
        else:
            items = self.c.list(r.group, r.plural, r.namespace, self._selected_name(req), cached=req.query.get("resourceVersion") == "0")
        meta: Obj = {"resourceVersion": str(self.c.rv)}
        limit = int(req.query.get("limit") or 0)
        if limit and len(items) > limit and req.query.get("resourceVersion") != "0":  # a paged read from etcd
            meta["remainingItemCount"], meta["continue"] = len(items) - limit, "fake-continue"
            items = items[:limit]
        return {"kind": f"{r.kind}List", "apiVersion": r.api_version, "metadata": meta, "items": items}

    def _pod_terms(self, req: Request) -> list[tuple[str, bool, str]]:
        """A pod field selector (registry/core/pod/strategy.go PodToSelectableFields: metadata.name,
        metadata.namespace, spec.nodeName, status.phase, ...; "=", "==" and "!=") as (field, equal, value) terms."""
        terms = []
        for term in filter(None, req.query.get("fieldSelector", "").split(",")):
            m = re.fullmatch(r"([a-zA-Z.]+)(!=|==|=)(.*)", term)
            if not m or m[1] not in POD_FIELDS:
                raise st.bad_request(f'"{term}" is not a known field selector: field label not supported: {m[1] if m else term}')
            terms.append((m[1], m[2] != "!=", m[3]))
        return terms

    def _list_pods(self, req: Request, r: Route) -> list[Obj]:
        """Pods by field selector, spec.nodeName from an index."""
        terms = self._pod_terms(req)
        with self.c.lock:
            node = next((v for f, eq, v in terms if f == "spec.nodeName" and eq), None)
            if node is not None:
                keys = sorted(self.c.pods_by_node.get(node, ()))
                pods = [self.c.objects[("", "pods", ns, n)] for ns, n in keys if not r.namespace or ns == r.namespace]
            else:
                pods = [o for k, o in sorted(self.c.objects.items()) if k[:2] == ("", "pods") and (not r.namespace or k[2] == r.namespace)]
            return [clone(p) for p in pods if all((pod_field(p, f) == v) == eq for f, eq, v in terms)]

    def _watch(self, req: Request, r: Route) -> Stream:
        if r.plural == "pods":  # any pod field selector; the cacher sends only the pods that pass it
            terms = self._pod_terms(req)
            w = Watcher(r.group, r.plural, r.namespace, None,
                        passes=lambda p: all((pod_field(p, f) == v) == eq for f, eq, v in terms))
        else:
            w = Watcher(r.group, r.plural, r.namespace, self._selected_name(req))
        timeout = float(req.query["timeoutSeconds"]) if req.query.get("timeoutSeconds") else None
        bookmarks = req.query.get("allowWatchBookmarks") in ("1", "true")
        try:
            initial = self.c.watch(w, req.query.get("resourceVersion", ""))
        except st.ApiStatus as err:
            # A watch learns of a compacted resourceVersion from an ERROR event
            # in the stream, not from the HTTP status (cacher watch_cache.go).
            return Stream(w, [("ERROR", err.body())], timeout, bookmarks, r.kind, r.api_version, ended=True)
        return Stream(w, initial, timeout, bookmarks, r.kind, r.api_version)

    # ------------------------------------------------------------ writes

    def _create(self, req: Request, r: Route) -> tuple[int, Obj]:
        obj = req.json()
        if not isinstance(obj, dict):
            raise st.bad_request("the body of the request was in an unknown format")
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + format(self.c.rv, "x")
        if not meta.get("name"):
            raise st.invalid(r.kind, r.group, "", [("metadata.name", "Required value: name or generateName is required")])
        if r.namespace:
            meta["namespace"] = r.namespace
        if r.plural == "poddisruptionbudgets":
            meta["generation"] = 1
        obj["apiVersion"], obj["kind"] = r.api_version, r.kind
        key: Key = (r.group, r.plural, r.namespace, meta["name"])
        self._validate(r, obj)
        with self.c.lock:
            if r.plural == "leases":
                self.c.admit_quota(key)  # admission runs before the store sees the name
            if self.c.get(key) is not None:
                raise st.already_exists(r.group, r.plural, meta["name"])
            return 201, self.c.put(key, obj, create=True)

    def _update(self, req: Request, r: Route, key: Key) -> tuple[int, Obj]:
        obj = req.json()
        with self.c.lock:
            cur = self.c.get(key)
            if cur is None:
                raise st.not_found(r.group, r.plural, r.name)
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            # Nodes allow an unconditional update (node strategy AllowUnconditionalUpdate).
            if rv and rv != cur["metadata"]["resourceVersion"]:
                raise st.conflict(r.group, r.plural, r.name)
            return 200, self._store(r, key, cur, obj)

    def _patch(self, req: Request, r: Route, key: Key) -> tuple[int, Obj]:
        with self.c.lock:
            cur = self.c.get(key)
            if cur is None:
                raise st.not_found(r.group, r.plural, r.name)
            new = apply_patch(r.kind, cur, req)
            # A resourceVersion in the patch is a precondition (apiserver store.go: RV mismatch → 409).
            if (new.get("metadata") or {}).get("resourceVersion") != cur["metadata"]["resourceVersion"]:
                raise st.conflict(r.group, r.plural, r.name)
            return 200, self._store(r, key, cur, new)

    def _store(self, r: Route, key: Key, cur: Obj, new: Obj) -> Obj:
        new = clone(new)
        if r.sub == "status":  # the status subresource changes only status
            new = {**cur, "status": new.get("status", {})}
        elif r.plural == "nodes":  # and the main resource never changes status
            new["status"] = cur.get("status", {})
        new.setdefault("metadata", {})
        for f in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            if f in cur["metadata"]:
                new["metadata"][f] = cur["metadata"][f]
        if r.plural == "poddisruptionbudgets" and r.sub != "status" and new.get("spec") != cur.get("spec"):
            new["metadata"]["generation"] = cur["metadata"].get("generation", 1) + 1
        self._validate(r, new)
        return self.c.put(key, new)

    def _validate(self, r: Route, obj: Obj) -> None:
        name = obj.get("metadata", {}).get("name", "")
        if r.plural == "nodes":
            causes = st.node_causes(obj)
        elif r.plural == "events":
            causes = st.event_causes(obj, r.namespace, new_api=bool(r.group))
        elif r.plural == "leases":
            spec = obj.get("spec") or {}
            for f in ("acquireTime", "renewTime"):
                st.check_time(spec.get(f), f"spec.{f}", micro=True)
            causes = []
        else:
            causes = []
        if causes:
            raise st.invalid(r.kind, r.group, name, causes)
