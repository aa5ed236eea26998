"""Every request the agent makes to the API server, through one door.

`KubeApi.call` passes the `Gate` (token bucket + backoff), calls the real
``kubernetes`` client with ``_preload_content=False`` (raw JSON: no pydantic
models to build, and every status code is seen here), counts the request by
verb, resource and code, and turns failures into `ApiError`. urllib3's own
retries are switched off where the client is built (`connect.py`): with its
default ``Retry(3)`` it would silently repeat a GET/PUT/DELETE that got a 429
with Retry-After and not a PATCH/POST, so the agent's behaviour would depend
on the verb (kubernetes-client 37.x ``rest.py`` passes ``retries`` to the
PoolManager only when it is set).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from ..findings import Sample
from .ratelimit import Gate

log = logging.getLogger(__name__)

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
# Bookmarks arrive about every minute (apiserver cacher defaultBookmarkFrequency),
# so a watch that is silent for much longer than that is dead.
WATCH_READ_TIMEOUT = 150.0


def interrupt_stream(resp: Any) -> None:
    """Unblock a thread reading a watch stream `resp` (None: none open), as kubernetes' Watch.stop does."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, *, reason: str = "", retry_after: float | None = None, body: Any = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status, self.message, self.reason = status, message, reason
        self.retry_after, self.body = retry_after, body

    @property
    def retryable(self) -> bool:
        return self.status in (0, 401, 429) or self.status >= 500

    @property
    def budget_refusal(self) -> bool:
        """An eviction refused by a PodDisruptionBudget (429 with the DisruptionBudget cause, or the 500
        "more than one PodDisruptionBudget"): an answer about that pod, not an overloaded server, so
        it does not hold back the agent's other requests (kube-apiserver eviction.go)."""
        if self.status == 500:
            return "more than one PodDisruptionBudget" in self.message
        causes = ((self.body or {}).get("details") or {}).get("causes") or [] if isinstance(self.body, dict) else []
        return self.status == 429 and any(c.get("reason") == "DisruptionBudget" for c in causes)


class Wait(Exception):
    """Not now: the rate limit or a backoff allows the next request at `until` (monotonic)."""

    def __init__(self, until: float) -> None:
        super().__init__(until)
        self.until = until


class Stats:
    """Counters for /metrics; updated from the actuator and kill-switch threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self.retries: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.conflicts = 0
        self.throttled = 0

    def request(self, verb: str, resource: str, code: str) -> None:
        with self._lock:
            self.requests[(verb, resource, code)] += 1
            if code == "429" and resource != "pods/eviction":  # a budget's 429 is not throttling
                self.throttled += 1

    def retry(self, reason: str) -> None:
        with self._lock:
            self.retries[reason] += 1
            if reason == "conflict":
                self.conflicts += 1

    def event(self, result: str) -> None:
        with self._lock:
            self.events[result] += 1

    def samples(self) -> list[Sample]:
        with self._lock:
            out = [
                Sample("node_health_kube_requests_total", n, (("verb", v), ("resource", r), ("code", c)))
                for (v, r, c), n in sorted(self.requests.items())
            ]
            out += [Sample("node_health_kube_retries_total", n, (("reason", k),)) for k, n in sorted(self.retries.items())]
            out += [Sample("node_health_kube_events_total", n, (("result", k),)) for k, n in sorted(self.events.items())]
            out.append(Sample("node_health_kube_conflicts_total", self.conflicts))
            out.append(Sample("node_health_kube_throttled_total", self.throttled))
            return out


def _retry_after(headers: Any, body: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    if value is not None:
        try:
            return max(0.0, float(int(str(value).strip())))
        except ValueError:
            pass  # an HTTP-date: the API server only sends seconds
    if isinstance(body, dict):
        seconds = (body.get("details") or {}).get("retryAfterSeconds")
        if isinstance(seconds, int) and seconds > 0:
            return float(seconds)
    return None


def _error_from(exc: Any) -> ApiError:
    status = int(getattr(exc, "status", 0) or 0)
    raw = getattr(exc, "body", None)
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, TypeError):
        body = None  # APF answers 429 in plain text
    if isinstance(body, dict) and body.get("kind") == "Status":
        message, reason = str(body.get("message", "")), str(body.get("reason", ""))
    else:
        message, reason = (str(raw or getattr(exc, "reason", "")).strip()[:200]), ""
    return ApiError(status, message, reason=reason, retry_after=_retry_after(exc.headers, body), body=body)


class KubeApi:
    def __init__(
        self,
        api_client: Any,
        *,
        gate: Gate,
        clock: Callable[[], float],
        stats: Stats,
        timeout: float,
        reauth: Callable[[], None] | None = None,
    ) -> None:
        from kubernetes import client

        self.client = api_client
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.events = client.EventsV1Api(api_client)
        self.gate, self.clock, self.stats, self.timeout = gate, clock, stats, timeout
        self._reauth = reauth

    def with_gate(self, gate: Gate) -> KubeApi:
        """The same client, credentials and counters behind another rate limit (the drain's own)."""
        api = KubeApi.__new__(KubeApi)
        api.__dict__.update(self.__dict__)
        api.gate = gate
        return api

    # ------------------------------------------------------------ the door

    def call(
        self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, block: Callable[[float], bool] | None = None,
        **kwargs: Any,
    ) -> Any:
        """One request; the parsed JSON body. Raises `Wait` (or, with `block`, waits) when the gate says not yet."""
        resp = self._send(verb, resource, fn, args, kwargs, block)
        try:
            data = resp.data
        finally:
            resp.release_conn()
        return json.loads(data) if data else {}

    def _send(
        self, verb: str, resource: str, fn: Callable[..., Any], args: Any, kwargs: Any, block: Callable[[float], bool] | None,
    ) -> Any:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        self._admit(block)
        kwargs.setdefault("_request_timeout", self.timeout)
        try:
            resp = fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            err = _error_from(exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            err = ApiError(0, f"{type(exc).__name__}: {exc}"[:300], reason="ConnectionError")
        else:
            self.stats.request(verb, resource, str(resp.status))
            self.gate.succeeded()
            return resp
        self.stats.request(verb, resource, str(err.status) if err.status else "error")
        if err.status == 401 and self._reauth is not None:
            self._reauth()  # a rotated service-account token: read it again now
        if err.retryable and not err.budget_refusal:
            self.gate.failed(self.clock(), err.retry_after)
        raise err

    def _admit(self, block: Callable[[float], bool] | None) -> None:
        while True:
            until = self.gate.admit(self.clock())
            if until == 0:
                return
            if block is None:
                raise Wait(until)
            if not block(until):
                raise Wait(until)  # stopping

    # ------------------------------------------------------------ nodes

    def list_node(self, name: str) -> tuple[dict[str, Any] | None, str]:
        """The Node from the watch cache (resourceVersion=0: cheap, maybe stale) and the list's resourceVersion."""
        body = self.call(
            "list", "nodes", self.core.list_node, field_selector=f"metadata.name={name}", resource_version="0"
        )
        items = body.get("items") or []
        return (items[0] if items else None), str((body.get("metadata") or {}).get("resourceVersion", ""))

    def read_node(self, name: str) -> dict[str, Any]:
        return self.call("get", "nodes", self.core.read_node, name)  # type: ignore[no-any-return]

    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call("patch", "nodes", self.core.patch_node, name, body, _content_type=SMP)  # type: ignore[no-any-return]

    def patch_node_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call(  # type: ignore[no-any-return]
            "patch", "nodes/status", self.core.patch_node_status, name, body, _content_type=SMP
        )

    # ------------------------------------------------------------ pods (the drain)

    def list_pods_on(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to `node`, all namespaces: the field selector is the whole of what the agent reads."""
        body = self.call("list", "pods", self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
        return list(body.get("items") or [])

    def evict_pod(self, ns: str, name: str, uid: str) -> None:
        """POST pods/{name}/eviction (policy/v1): the server checks the PodDisruptionBudget; the pod's own
        grace period; the UID precondition keeps a same-named replacement safe."""
        body = {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        self.call("create", "pods/eviction", self.core.create_namespaced_pod_eviction, name, ns, body)

    def delete_pod(self, ns: str, name: str, uid: str, grace: int | None) -> None:
        body: dict[str, Any] = {"preconditions": {"uid": uid}}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        self.call("delete", "pods", self.core.delete_namespaced_pod, name, ns, body=body)

    # ------------------------------------------------------------ leases, quota

    def create_lease(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call("create", "leases", self.coordination.create_namespaced_lease, ns, body)  # type: ignore[no-any-return]

    def read_lease(self, ns: str, name: str) -> dict[str, Any]:
        return self.call("get", "leases", self.coordination.read_namespaced_lease, name, ns)  # type: ignore[no-any-return]

    def delete_lease(self, ns: str, name: str, resource_version: str = "") -> None:
        """DELETE; with `resource_version`, only that version (a Lease renewed since is kept: 409)."""
        if resource_version:
            body = {"preconditions": {"resourceVersion": resource_version}}
            self.call("delete", "leases", self.coordination.delete_namespaced_lease, name, ns, body=body)
        else:
            self.call("delete", "leases", self.coordination.delete_namespaced_lease, name, ns)

    def list_leases(self, ns: str) -> list[dict[str, Any]]:
        """From the watch cache (resourceVersion=0: no quorum read of etcd for each waiting agent); a stale
        entry is harmless to the one caller, whose DELETE carries the resourceVersion it saw (409 if renewed)."""
        body = self.call("list", "leases", self.coordination.list_namespaced_lease, ns, resource_version="0")
        return list(body.get("items") or [])

    def patch_lease(self, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call(  # type: ignore[no-any-return]
            "patch", "leases", self.coordination.patch_namespaced_lease, name, ns, body, _content_type=MERGE
        )

    def read_quota(self, ns: str, name: str) -> dict[str, Any]:
        return self.call("get", "resourcequotas", self.core.read_namespaced_resource_quota, name, ns)  # type: ignore[no-any-return]

    def count_nodes(self) -> int | None:
        """How many Nodes the cluster has: a paged LIST of one item from etcd (``limit=1``: a range read
        of one key plus its count), 1 + ``remainingItemCount``; None when the server gives no count."""
        body = self.call("list", "nodes", self.core.list_node, limit=1)
        items, meta = body.get("items") or [], body.get("metadata") or {}
        remaining = meta.get("remainingItemCount")
        if isinstance(remaining, int) and remaining >= 0:
            return len(items) + remaining
        return len(items) if not meta.get("continue") else None

    def read_configmap(self, ns: str, name: str, cached: bool = False) -> dict[str, Any]:
        """A GET (a quorum read); `cached`: a LIST of that one name from the watch cache (resourceVersion=0:
        cheap, maybe a little behind). A missing ConfigMap is a 404 either way."""
        if not cached:
            return self.call("get", "configmaps", self.core.read_namespaced_config_map, name, ns)  # type: ignore[no-any-return]
        body = self.call("list", "configmaps", self.core.list_namespaced_config_map, ns,
                         field_selector=f"metadata.name={name}", resource_version="0")
        items = body.get("items") or []
        if not items:
            raise ApiError(404, f'configmaps "{name}" not found', reason="NotFound")
        return items[0]  # type: ignore[no-any-return]

    def patch_configmap(self, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call(  # type: ignore[no-any-return]
            "patch", "configmaps", self.core.patch_namespaced_config_map, name, ns, body, _content_type=MERGE
        )

    # ------------------------------------------------------------ events

    def create_event(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call("create", "events", self.events.create_namespaced_event, ns, body)  # type: ignore[no-any-return]

    def patch_event(self, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call(  # type: ignore[no-any-return]
            "patch", "events", self.events.patch_namespaced_event, name, ns, body, _content_type=MERGE
        )

    # ------------------------------------------------------------ configmaps

    def list_configmap(self, ns: str, name: str, block: Callable[[float], bool]) -> tuple[dict[str, Any] | None, str]:
        body = self.call(
            "list", "configmaps", self.core.list_namespaced_config_map, ns, field_selector=f"metadata.name={name}", block=block
        )
        items = body.get("items") or []
        return (items[0] if items else None), str((body.get("metadata") or {}).get("resourceVersion", ""))

    def watch_configmap(
        self, ns: str, name: str, rv: str, timeout: int, block: Callable[[float], bool], on_open: Callable[[Any], None]
    ) -> Iterator[dict[str, Any]]:
        """Events of one ConfigMap after `rv` (BOOKMARKs included) until the server ends the watch."""
        return self._watch("configmaps", self.core.list_namespaced_config_map, (ns,), f"metadata.name={name}",
                           rv, timeout, block, on_open)

    # ------------------------------------------------------------ pods (the node's, for agent.pods)

    def list_pods(self, node: str, resource_version: str, block: Callable[[float], bool]) -> tuple[list[dict[str, Any]], str]:
        """The pods bound to `node` and the list's resourceVersion (to watch from). resource_version "0": from the
        watch cache (cheap, maybe a little behind, which the watch then catches up on); "": a consistent read."""
        kwargs: dict[str, Any] = {"field_selector": f"spec.nodeName={node}", "block": block}
        if resource_version:
            kwargs["resource_version"] = resource_version
        body = self.call("list", "pods", self.core.list_pod_for_all_namespaces, **kwargs)
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion", ""))

    def watch_pods(
        self, node: str, rv: str, timeout: int, block: Callable[[float], bool], on_open: Callable[[Any], None]
    ) -> Iterator[dict[str, Any]]:
        """Events of the pods bound to `node` after `rv` (BOOKMARKs included) until the server ends the watch."""
        return self._watch("pods", self.core.list_pod_for_all_namespaces, (), f"spec.nodeName={node}",
                           rv, timeout, block, on_open)

    def _watch(
        self, resource: str, fn: Callable[..., Any], args: tuple[Any, ...], selector: str, rv: str, timeout: int,
        block: Callable[[float], bool], on_open: Callable[[Any], None],
    ) -> Iterator[dict[str, Any]]:
        from kubernetes.watch.watch import iter_resp_lines

        resp = self._send(
            "watch", resource, fn, args,
            {
                "field_selector": selector, "watch": True, "allow_watch_bookmarks": True,
                "resource_version": rv, "timeout_seconds": timeout,
                "_request_timeout": (self.timeout, WATCH_READ_TIMEOUT),
            },
            block,
        )
        on_open(resp)
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.release_conn()
