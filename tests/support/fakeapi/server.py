"""The fake API server: HTTP on loopback (or in-process), auth, faults, a request log.

Order of the real filter chain that matters here: authentication (401),
priority and fairness (429), authorization (403), then the handler. Faults
injected by a test stand in for APF or a sick server and are answered after
authentication, like APF.
"""

from __future__ import annotations

import io
import json
import queue
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import status as st
from .cluster import Cluster, Obj, Request
from .handlers import Handlers, Stream, route, verb_of
from .workloads import ReplicaSet, Workloads, make_pod

USER = "system:serviceaccount:node-health:node-health-agent"


@dataclass
class Record:
    t: float  # clock() when the request arrived
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    status: int
    user: str
    verb: str
    body: Any = None


@dataclass
class Fault:
    status: int
    method: str | None = None
    path: str | None = None  # regex searched in the path
    retry_after: int | None = None
    form: str = "json"  # json (a Status), text (APF's plain text), none (a Status without Retry-After)
    times: int = 1

    def matches(self, req: Request) -> bool:
        return (self.method is None or self.method == req.method) and (self.path is None or re.search(self.path, req.path) is not None)

    def answer(self) -> st.ApiStatus:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None and self.form != "none" else {}
        if self.status == 429:
            details = {"retryAfterSeconds": self.retry_after} if self.retry_after and self.form == "json" else None
            err = st.ApiStatus(429, "TooManyRequests", "Too many requests, please try again later.", details, headers)
            if self.form == "text":
                headers.update({"X-Kubernetes-PF-FlowSchema-UID": "fs-uid", "X-Kubernetes-PF-PriorityLevel-UID": "pl-uid"})
            return err
        if self.status == 409:  # as quota admission answers a create that raced another one (kubernetes#67761)
            return st.ApiStatus(409, "Conflict", f'Operation cannot be fulfilled on resourcequotas "injected": {st.CONFLICT_MSG}',
                                {"name": "injected", "kind": "resourcequotas"}, headers)
        reason = {500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}.get(self.status, "InternalError")
        return st.ApiStatus(self.status, reason, f"injected {self.status}", None, headers)


class Apf:
    """A server-side capacity for the fleet simulation: a token bucket; over it, APF's 429."""

    def __init__(self, rate: float, burst: float, retry_after: int = 1) -> None:
        self.rate, self.burst, self.retry_after = rate, burst, retry_after
        self._tokens, self._at = burst, 0.0

    def admit(self, now: float) -> bool:
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = max(self._at, now)
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


@dataclass
class Hook:
    predicate: Callable[[Request], bool]
    action: Callable[[], None]
    times: int = 1


@dataclass
class FakeApiServer:
    token: str = "test-token"
    user: str = USER
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time  # timestamps written into objects (deletionTimestamp, disruptedPods)
    bookmark_interval: float = 60.0
    history: int = 1000
    cluster: Cluster = field(init=False)
    requests: list[Record] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    forbidden: set[tuple[str, str]] = field(default_factory=set)  # (verb, plural) denied by RBAC
    faults: list[Fault] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)
    apf: Apf | None = None

    def __post_init__(self) -> None:
        self.cluster = Cluster(history=self.history)
        self.cluster.wall = self.wall
        self.workloads = self.cluster.workloads = Workloads(self.cluster, self.clock, self.wall)
        self.handlers = Handlers(self.cluster)
        self.tokens.setdefault(self.token, self.user)
        self._lock = threading.Lock()
        self._http: _HttpServer | None = None
        self.port = 0

    # ------------------------------------------------------------ the request path

    def dispatch(self, req: Request) -> tuple[int, dict[str, str], bytes] | tuple[int, dict[str, str], Stream]:
        r = route(req.path)
        verb = verb_of(req, r) if r else req.method.lower()
        rec = Record(self.clock(), req.method, req.path, req.query, req.headers.get("content-type", ""), 0, "", verb)
        with self._lock:
            self.requests.append(rec)
        try:
            rec.body = json.loads(req.body) if req.body else None
        except ValueError:
            rec.body = req.body
        try:
            req.user = rec.user = self._authenticate(req)
            self._throttle(req)
            if r is None:
                raise st.ApiStatus(404, "NotFound", "the server could not find the requested resource")
            if (verb, r.plural) in self.forbidden or (r.sub and (verb, f"{r.plural}/{r.sub}") in self.forbidden):
                raise st.rbac_denied(req.user, verb, r.group, r.plural, r.name, r.namespace)
            self._run_hooks(req)
            self.workloads.reap()
            out = self.handlers.handle(req, r, verb)
        except st.ApiStatus as err:
            rec.status = err.code
            if err.code == 429 and "X-Kubernetes-PF-FlowSchema-UID" in err.headers:
                return err.code, {"Content-Type": "text/plain; charset=utf-8", **err.headers}, st.APF_BODY.encode()
            return err.code, {"Content-Type": "application/json", **err.headers}, json.dumps(err.body()).encode()
        if isinstance(out, Stream):
            rec.status = 200
            return 200, {"Content-Type": "application/json"}, out
        rec.status, body = out
        return rec.status, {"Content-Type": "application/json"}, json.dumps(body).encode()

    def _authenticate(self, req: Request) -> str:
        auth = req.headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        user = self.tokens.get(token)
        if user is None:
            raise st.unauthorized()
        return user

    def _throttle(self, req: Request) -> None:
        with self._lock:
            for fault in self.faults:
                if fault.times > 0 and fault.matches(req):
                    fault.times -= 1
                    raise fault.answer()
            if self.apf is not None and not self.apf.admit(self.clock()):
                raise st.ApiStatus(429, "TooManyRequests", "", None, {
                    "Retry-After": str(self.apf.retry_after), "X-Kubernetes-PF-FlowSchema-UID": "fs-uid",
                    "X-Kubernetes-PF-PriorityLevel-UID": "pl-uid"})

    def _run_hooks(self, req: Request) -> None:
        with self._lock:
            due = [h for h in self.hooks if h.times > 0 and h.predicate(req)]
            for h in due:
                h.times -= 1
        for h in due:
            h.action()

    # ------------------------------------------------------------ test helpers

    def inject(self, status: int, **kw: Any) -> Fault:
        fault = Fault(status, **kw)
        with self._lock:
            self.faults.append(fault)
        return fault

    def before(self, predicate: Callable[[Request], bool], action: Callable[[], None], times: int = 1) -> None:
        with self._lock:
            self.hooks.append(Hook(predicate, action, times))

    def log(self, *, verbs: tuple[str, ...] | None = None, since: float | None = None) -> list[Record]:
        with self._lock:
            return [r for r in self.requests if (verbs is None or r.verb in verbs) and (since is None or r.t >= since)]

    def writes(self, since: float | None = None) -> list[Record]:
        return self.log(verbs=("create", "update", "patch", "delete"), since=since)

    def add_node(self, name: str, taints: list[Obj] | None = None, conditions: list[Obj] | None = None) -> Obj:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": {"taints": list(taints or [])}, "status": {"conditions": list(conditions or [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                     "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}])}}
        if not node["spec"]["taints"]:
            del node["spec"]["taints"]
        return self.cluster.put(("", "nodes", "", name), node)

    def node(self, name: str) -> Obj:
        obj = self.cluster.get(("", "nodes", "", name))
        assert obj is not None, name
        return obj

    def edit_node(self, name: str, fn: Callable[[Obj], None]) -> Obj:
        """Another writer changes the node (a full update, as cluster-autoscaler does)."""
        with self.cluster.lock:
            node = self.node(name)
            fn(node)
            return self.cluster.put(("", "nodes", "", name), node)

    def set_configmap(self, ns: str, name: str, data: dict[str, str]) -> Obj:
        if not self.cluster.namespace_exists(ns):
            self.cluster.create_namespace(ns)
        obj = self.cluster.get(("", "configmaps", ns, name)) or {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}}
        obj["data"] = dict(data)
        return self.cluster.put(("", "configmaps", ns, name), obj)

    def set_quota(self, ns: str, name: str, leases: int) -> None:
        if not self.cluster.namespace_exists(ns):
            self.cluster.create_namespace(ns)
        quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": ns},
                 "spec": {"hard": {"count/leases.coordination.k8s.io": str(leases)}}}
        self.cluster.put(("", "resourcequotas", ns, name), quota)
        with self.cluster.lock:
            self.cluster._refresh_quotas(ns)

    # ------------------------------------------------------------ pods, budgets, workloads

    def add_pod(self, ns: str, name: str, node: str, *, labels: dict[str, str] | None = None,
                owner: tuple[str, str] | None = None, mirror: bool = False, phase: str = "Running",
                ready: bool = True, grace: int = 30, stuck: bool = False, stop_after: float = 0.0) -> Obj:
        """A pod bound to `node`; owner = (kind, name), e.g. ("DaemonSet", "agent"). `stuck`: the kubelet
        never stops it (it stays, terminating, past its grace period); `stop_after`: seconds it takes to exit."""
        if not self.cluster.namespace_exists(ns):
            self.cluster.create_namespace(ns)
        ref = (owner[0], owner[1], f"uid-{owner[0].lower()}-{ns}-{owner[1]}") if owner else None
        pod = make_pod(ns, name, node, labels=labels, owner=ref, mirror=mirror, phase=phase, ready=ready, grace=grace)
        if stuck:
            self.workloads.stuck.add((ns, name))
        if stop_after:
            self.workloads.stop_after[(ns, name)] = stop_after
        return self.cluster.put(("", "pods", ns, name), pod)

    def edit_pod(self, ns: str, name: str, fn: Callable[[Obj], None]) -> Obj:
        """The kubelet or a controller changes the pod (status.podIPs once the CNI gave it an address, ...)."""
        with self.cluster.lock:
            pod = self.cluster.get(("", "pods", ns, name))
            assert pod is not None, f"{ns}/{name}"
            fn(pod)
            return self.cluster.put(("", "pods", ns, name), pod)

    def add_replicaset(self, ns: str, name: str, replicas: int, node: str, *, labels: dict[str, str],
                       spare: str = "spare-node", ready_after: float = 0.0, grace: int = 30) -> list[Obj]:
        """`replicas` pods on `node`; a terminating one is replaced on `spare`, Ready after `ready_after`."""
        rs = ReplicaSet(ns, name, replicas, dict(labels), spare, ready_after, uid=f"uid-replicaset-{ns}-{name}")
        self.workloads.replicasets[(ns, name)] = rs
        return [self.add_pod(ns, f"{name}-{i}", node, labels=labels, owner=("ReplicaSet", name), grace=grace)
                for i in range(replicas)]

    def add_pdb(self, ns: str, name: str, match_labels: dict[str, str], *, min_available: int | str | None = None,
                max_unavailable: int | str | None = None) -> Obj:
        if not self.cluster.namespace_exists(ns):
            self.cluster.create_namespace(ns)
        spec: Obj = {"selector": {"matchLabels": dict(match_labels)}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": name, "namespace": ns, "generation": 1}, "spec": spec}
        self.cluster.put(("policy", "poddisruptionbudgets", ns, name), pdb)
        return self.pdb(ns, name)

    def pdb(self, ns: str, name: str) -> Obj:
        obj = self.cluster.get(("policy", "poddisruptionbudgets", ns, name))
        assert obj is not None, name
        return obj

    def pods(self, node: str | None = None) -> list[Obj]:
        return [p for p in self.objects("", "pods") if node is None or p["spec"].get("nodeName") == node]

    def leases_held_peak(self, ns: str | None = None) -> int:
        """From the request log: the most Leases (budget slots) held at once, in `ns` or anywhere."""
        held = peak = 0
        where = f"/namespaces/{ns}/leases" if ns else "/leases"
        for r in self.log(verbs=("create", "delete")):
            if where in r.path and r.status < 300:
                held += 1 if r.verb == "create" else -1
                peak = max(peak, held)
        return peak

    def tick(self) -> None:
        """Let the kubelets and controllers act at the current clock (requests do this too)."""
        self.workloads.reap()

    def objects(self, group: str, plural: str, ns: str = "") -> list[Obj]:
        return self.cluster.list(group, plural, ns, None, cached=False)

    def events(self) -> list[Obj]:
        return self.objects("events.k8s.io", "events") + self.objects("", "events")

    # ------------------------------------------------------------ HTTP

    @property
    def url(self) -> str:
        return f"{'https' if getattr(self, '_tls', None) else 'http'}://127.0.0.1:{self.port}"

    def start(self, tls: tuple[str, str] | None = None) -> str:
        """Serve on loopback (HTTPS with `tls` = (cert, key)); after stop(), on the same port again."""
        self._tls = tls if tls is not None else getattr(self, "_tls", None)
        self._http = _HttpServer(self, self.port)
        if self._tls is not None:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self._tls)
            self._http.socket = ctx.wrap_socket(self._http.socket, server_side=True)
        self.port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, args=(0.05,), name="fakeapi", daemon=True).start()
        return self.url

    def stop(self) -> None:
        """The API server goes away: listener closed, open connections cut (a later start() reuses the port)."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http.cut_connections()
            self._http = None
        for w in list(self.cluster.watchers):
            self.cluster.unwatch(w)

    def kubeconfig(self, path: str, token: str | None = None) -> str:
        import yaml

        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "agent", "user": {"token": token or self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}],
        }
        with open(path, "w") as fh:
            yaml.safe_dump(doc, fh)
        return path

    # ------------------------------------------------------------ in-process (fleet simulation)

    def pool(self) -> InProcessPool:
        return InProcessPool(self)


class InProcessPool:
    """Stands in for urllib3's PoolManager inside the kubernetes client: same requests, no sockets."""

    def __init__(self, fake: FakeApiServer) -> None:
        self.fake = fake

    def request(self, method: str, url: str, body: Any = None, headers: Any = None, **_: Any) -> Any:
        import urllib3

        target = url.split("://", 1)[-1]
        target = target[target.index("/"):] if "/" in target else "/"
        data = body.encode() if isinstance(body, str) else (body or b"")
        code, hdrs, out = self.fake.dispatch(Request.parse(method, target, dict(headers or {}), data))
        assert not isinstance(out, Stream), "watches need the HTTP server"
        return urllib3.HTTPResponse(body=io.BytesIO(out), headers=hdrs, status=code, preload_content=False,
                                    decode_content=False, request_method=method)

    def clear(self) -> None:
        pass


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, fake: FakeApiServer, port: int) -> None:
        self.fake = fake
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Go's net package (kube-apiserver) sets TCP_NODELAY on every connection; without it the
        # headers-then-body writes of http.server meet delayed ACKs and every answer waits ~40 ms.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.conns_lock:
            self.conns.add(request)
        super().process_request(request, client_address)

    def cut_connections(self) -> None:
        with self.conns_lock:
            for s in self.conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns.clear()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        req = Request.parse(self.command, self.path, dict(self.headers.items()), body)
        code, headers, out = self.server.fake.dispatch(req)
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        if isinstance(out, Stream):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(out)
            return
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, kind: str, obj: Obj) -> None:
        self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    def _bookmark(self, s: Stream) -> None:
        rv = str(self.server.fake.cluster.rv)
        self._event("BOOKMARK", {"kind": s.kind, "apiVersion": s.api_version, "metadata": {"resourceVersion": rv}})

    def _stream(self, s: Stream) -> None:
        fake = self.server.fake
        start = time.monotonic()
        deadline = start + s.timeout if s.timeout else start + 1800
        next_bookmark = start + fake.bookmark_interval
        try:
            for kind, obj in s.initial:
                self._event(kind, obj)
            while not s.ended:
                now = time.monotonic()
                if now >= deadline:
                    if s.bookmarks:
                        self._bookmark(s)
                    break
                if s.bookmarks and now >= next_bookmark:
                    self._bookmark(s)
                    next_bookmark = now + fake.bookmark_interval
                try:
                    item = s.watcher.q.get(timeout=max(0.01, min(deadline, next_bookmark if s.bookmarks else deadline) - now))
                except queue.Empty:
                    continue
                if item is None:
                    return  # server going down
                self._event(*item)
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            fake.cluster.unwatch(s.watcher)
