"""The node's pods, learnt once for every feature that reads them (`agent.pods.PodView`).

One LIST of pods with ``fieldSelector=spec.nodeName=<node>`` (the first from
the API server's watch cache, ``resourceVersion=0``), then one WATCH from the
list's resourceVersion with ``allowWatchBookmarks=true``, resumed from the
last resourceVersion seen (events and bookmarks move it on) whenever the
server ends the watch at its jittered ``timeoutSeconds``. What client-go's
reflector does, kept to one node's pods:

- **410 Gone** (the in-stream ERROR event ``Expired``, or an HTTP 410): the
  resourceVersion left the watch cache's window; list again (a consistent
  read) and watch from there. The new list replaces the old set in one step,
  so no pod is lost or counted twice.
- **Errors and broken streams**: reconnect after a jittered, doubling wait
  (`reconnect_delay`), resuming from the last resourceVersion; every request
  passes the actuator's gate (its token bucket and backoff).
- **Staleness**: while the watch is open the set is current. Once it is down
  the last set is served for ``stale_after``; after that `pods()` is None
  (unknown, never "no pods") and the finding ``PodsUnknown`` says so, until a
  watch is open again. A stream that goes silent is ended by the client's
  read timeout (``WATCH_READ_TIMEOUT``), so at worst the set is served
  ``WATCH_READ_TIMEOUT + stale_after`` after the server was lost.

A pod is on the node from when it is listed (or ADDED) until DELETED or its
phase is Succeeded/Failed. `generation()` moves only when a `PodAddr` a
feature sees changes (a pod comes or goes, its IPs, hostNetwork or kept
annotations change) or when the set turns unknown or known again; status
churn (conditions, restarts) does not move it.

Memory is bounded by what is kept per pod: its `PodAddr` (of its annotations
only the keys the enabled checks read, `agent.runtime.pod_annotations`, each of
at most ``MAX_ANNOTATION`` characters; at most ``MAX_IPS`` addresses) and the
few fields the drain reads (`drain_record`), not the pod objects: 110 pods with
250 annotations each hold what 110 pods with none hold (test_kube_podwatch.py,
test_only_the_annotations_read_are_kept).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from types import MappingProxyType
from typing import Any

from ..findings import Finding, Sample
from ..pods import PodAddr
from . import SOURCE
from .api import ApiError, KubeApi, Wait, interrupt_stream
from .catalog import CATALOG
from .settings import PodWatchSection

log = logging.getLogger(__name__)

FINISHED = ("Succeeded", "Failed")
MAX_ANNOTATION = 1024  # characters of an annotation value kept in a PodAddr (longer: not kept)
MAX_IPS, MAX_IP = 8, 64  # addresses of a pod kept (Kubernetes gives one per family), characters of each
RECONNECT_BASE, RECONNECT_MAX = 1.0, 60.0  # seconds: first wait after a failure, and the longest
SHORT_WATCH = 1.0  # seconds: a watch that ends sooner than this counts as a failure (no tight reconnect loop)
RELIST_REASONS = ("initial", "expired", "too_large")


def addr_of(obj: dict[str, Any], keep: Collection[str] = ()) -> PodAddr:
    """What features see of a pod: status.podIPs (else status.podIP), spec.hostNetwork, and of its annotations
    only the keys in `keep` (those the checks read), each of at most MAX_ANNOTATION characters."""
    meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
    listed = status.get("podIPs")
    ips = tuple(str(p["ip"])[:MAX_IP] for p in (listed if isinstance(listed, list) else [])[:MAX_IPS]
                if isinstance(p, dict) and p.get("ip"))
    if not ips and status.get("podIP"):
        ips = (str(status["podIP"])[:MAX_IP],)
    given = _dict(meta.get("annotations"))
    annotations = {k: v for k in keep if isinstance(v := given.get(k), str) and len(v) <= MAX_ANNOTATION}
    return PodAddr(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")), ips,
                   bool(spec.get("hostNetwork")), MappingProxyType(annotations))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def drain_record(obj: dict[str, Any], addr: PodAddr) -> dict[str, Any]:
    """The part of a pod the drain reads (drain.Pod.of, drain.skip_reason), in the pod's own shape."""
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    keep = ("deletionTimestamp", "deletionGracePeriodSeconds")
    m: dict[str, Any] = {"namespace": addr.namespace, "name": addr.name, "uid": addr.uid}
    m.update({k: meta[k] for k in keep if meta.get(k) is not None})
    refs = meta.get("ownerReferences")
    owners = [{"kind": o.get("kind"), "controller": bool(o.get("controller"))}
              for o in (refs if isinstance(refs, list) else []) if isinstance(o, dict)]
    if owners:
        m["ownerReferences"] = owners
    mirror = _dict(meta.get("annotations")).get("kubernetes.io/config.mirror")
    if mirror is not None:
        m["annotations"] = {"kubernetes.io/config.mirror": str(mirror)[:MAX_ANNOTATION]}
    s = {} if spec.get("terminationGracePeriodSeconds") is None else {
        "terminationGracePeriodSeconds": spec["terminationGracePeriodSeconds"]}
    return {"metadata": m, "spec": s, "status": {"phase": _dict(obj.get("status")).get("phase")}}


def reconnect_delay(failures: int, rng: random.Random, base: float = RECONNECT_BASE, cap: float = RECONNECT_MAX) -> float:
    """Seconds before the next try after `failures` failures in a row: doubling from `base` up to `cap`,
    then jittered to between half and all of it, so a fleet that lost the server does not come back in step."""
    return rng.uniform(0.5, 1.0) * min(cap, base * 2.0 ** max(0, failures - 1))


def watch_timeout(cfg: PodWatchSection, rng: random.Random) -> int:
    """timeoutSeconds of one watch: between watch_timeout and twice it (client-go reflector: minWatchTimeout × [1, 2))."""
    return rng.randint(int(cfg.watch_timeout), int(2 * cfg.watch_timeout))


class PodWatch:
    """`PodView` from one list+watch; its own thread (`start`, `stop`)."""

    def __init__(
        self, api: KubeApi, node: str, cfg: PodWatchSection, *, startup_jitter: float = 0.0,
        clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
        on_change: Callable[[], None] | None = None, reconnect: tuple[float, float] = (RECONNECT_BASE, RECONNECT_MAX),
        annotations: Collection[str] = (),
    ) -> None:
        self.api, self.node, self.cfg, self.clock, self.reconnect = api, node, cfg, clock, reconnect
        self.annotations = frozenset(annotations)  # the only annotation keys kept (those the checks read)
        self.rng = rng or random.Random()
        self.on_change = on_change or (lambda: None)
        self.relists: Counter[str] = Counter()
        self._startup = self.rng.uniform(0, startup_jitter) if startup_jitter > 0 else 0.0
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[PodAddr, dict[str, Any]]] = {}  # uid → what features and the drain see
        self._listed = False
        self._up = False
        self._heard_at = float("-inf")  # the last moment the set was known current (list, watch open or ended)
        self._fresh = False
        self._generation = 0
        self._rv = ""
        self._failures = 0
        self._error: str | None = None
        self._resp: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ PodView

    def pods(self) -> Sequence[PodAddr] | None:
        with self._lock:
            if not self._freshness(self.clock()):
                return None
            return tuple(sorted((a for a, _ in self._pods.values()), key=lambda a: (a.namespace, a.name, a.uid)))

    def generation(self) -> int:
        with self._lock:
            self._freshness(self.clock())
            return self._generation

    # ------------------------------------------------------------ the drain, metrics

    def drain_pods(self) -> list[dict[str, Any]] | None:
        """The node's pods as the drain reads them, only while the watch is open (else the drain lists)."""
        with self._lock:
            if not (self._listed and self._up):
                return None
            return [dict(rec) for _, rec in self._pods.values()]

    @property
    def up(self) -> bool:
        return self._up

    def findings(self) -> tuple[Finding, ...]:
        with self._lock:
            if self._thread is None or self._freshness(self.clock()):
                return ()
            why = "not listed yet" if not self._listed else f"the watch is down ({self._error or 'reconnecting'})"
        return (CATALOG.finding(SOURCE, "pods", "PodsUnknown", f"the pods of node {self.node} are unknown: {why}"),)

    def samples(self) -> list[Sample]:
        with self._lock:
            fresh = self._freshness(self.clock())
            out = [Sample("node_health_kube_pod_watch_up", 1.0 if self._up else 0.0)]
            if fresh:
                out.append(Sample("node_health_kube_pod_watch_pods", float(len(self._pods))))
            out += [Sample("node_health_kube_pod_watch_relists_total", float(self.relists[r]), (("reason", r),))
                    for r in RELIST_REASONS]
            return out

    # ------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kube-pod-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        interrupt_stream(self._resp)
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._up = False  # stopped: no longer current (the drain lists again)

    def _run(self) -> None:
        if self._startup and not self._sleep_until(self.clock() + self._startup):
            return
        while not self._stop.is_set():
            try:
                if not self._rv:
                    self._list()
                self._watch()
            except Wait:
                return  # stopping
            except ApiError as exc:
                self._ended(str(exc))
                if exc.status == 410:  # HTTP 410 to the watch request: the same as the in-stream Expired
                    self._rv = ""
                    continue
                if exc.status == 504 and "Too large resource version" in exc.message:
                    self._rv, self._relist_reason = "", "too_large"  # a server behind the one we listed from
                self._backoff(exc)
            except Exception as exc:  # a stream that broke (read timeout, reset, server gone)
                if self._stop.is_set():
                    return
                self._ended(f"{type(exc).__name__}: {exc}"[:200])
                self._backoff(exc)

    _relist_reason = "expired"

    def _list(self) -> None:
        reason = "initial" if not self._listed else self._relist_reason
        items, rv = self.api.list_pods(self.node, "0" if not self._listed else "", block=self._sleep_until)
        pods = {}
        for obj in items:
            if (obj.get("status") or {}).get("phase") not in FINISHED:
                addr = addr_of(obj, self.annotations)
                pods[addr.uid] = (addr, drain_record(obj, addr))
        with self._lock:
            changed = {u: a for u, (a, _) in pods.items()} != {u: a for u, (a, _) in self._pods.items()}
            self._pods, self._rv, self._listed, self._heard_at = pods, rv, True, self.clock()
            self._generation += 1 if changed else 0
            self._freshness(self.clock())
            self.relists[reason] += 1
        self._relist_reason = "expired"
        if reason != "initial":
            log.info("pods of node %s listed again (%s): %d pods", self.node, reason, len(pods))
        self.on_change()

    def _watch(self) -> None:
        opened = self.clock()
        events = self.api.watch_pods(self.node, self._rv, watch_timeout(self.cfg, self.rng), self._sleep_until, self._opened)
        for ev in events:
            kind, obj = ev.get("type"), ev.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 500)
                if code == 410:  # Expired: the resourceVersion left the watch cache's window
                    log.info("pod watch of node %s: %s; listing again", self.node, obj.get("message"))
                    self._rv = ""
                    break
                raise ApiError(code, str(obj.get("message", "")), reason=str(obj.get("reason", "")))
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or self._rv)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(str(kind), obj)
            self._rv = rv
            if self._stop.is_set():
                return
        if self.clock() - opened >= SHORT_WATCH or not self._rv:
            self._failures = 0
            self._ended(None)
        else:
            self._ended("the server ended the watch at once")
            self._backoff(None)

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        addr = addr_of(obj, self.annotations)
        gone = kind == "DELETED" or (obj.get("status") or {}).get("phase") in FINISHED
        with self._lock:
            old = self._pods.get(addr.uid)
            if gone:
                self._pods.pop(addr.uid, None)
                changed = old is not None
            else:
                self._pods[addr.uid] = (addr, drain_record(obj, addr))
                changed = old is None or old[0] != addr
            self._heard_at = self.clock()
            self._generation += 1 if changed else 0
        if changed:
            self.on_change()

    def _opened(self, resp: Any) -> None:
        self._resp = resp
        with self._lock:
            self._up, self._heard_at, self._error = True, self.clock(), None
            self._freshness(self.clock())
        self.on_change()

    def _ended(self, error: str | None) -> None:
        with self._lock:
            if self._up:
                self._heard_at = self.clock()
            self._up = False
            if error is not None and error != self._error:
                log.warning("pod watch of node %s: %s", self.node, error)
            self._error = error
        self.on_change()

    def _backoff(self, exc: BaseException | None) -> None:
        self._failures += 1
        if exc is not None:
            log.debug("pod watch of node %s failed (%d in a row): %s", self.node, self._failures, exc)
        self._sleep_until(self.clock() + reconnect_delay(self._failures, self.rng, *self.reconnect))

    def _freshness(self, now: float) -> bool:
        """Whether the set is current (caller holds the lock); a change of it moves the generation."""
        fresh = self._listed and (self._up or now - self._heard_at < self.cfg.stale_after)
        if fresh != self._fresh:
            self._fresh = fresh
            self._generation += 1
        return fresh

    def _sleep_until(self, until: float) -> bool:
        """Wait (False: stopping). Wakes at the staleness limit on the way, so the finding is published on time."""
        while not self._stop.is_set():
            now = self.clock()
            if now >= until:
                return True
            with self._lock:
                was = self._fresh
                fresh = self._freshness(now)
                stale_at = self._heard_at + self.cfg.stale_after if fresh and not self._up else until
            if fresh != was:
                self.on_change()
            self._stop.wait(max(0.0, min(until, stale_at + 0.01) - now))
        return False


class PodSnapshot:
    """`PodView` of one LIST (``agent selftest``, ``agent run --once``): no watch, no thread; None if it failed."""

    def __init__(self, pods: Iterable[PodAddr] | None) -> None:
        self._pods = None if pods is None else tuple(pods)

    def pods(self) -> Sequence[PodAddr] | None:
        return self._pods

    def generation(self) -> int:
        return 0


def list_once(api: KubeApi, node: str, annotations: Collection[str] = ()) -> PodSnapshot:
    """One consistent LIST of the node's pods, as a view; unknown (None) when the API server did not answer."""
    try:
        items, _ = api.list_pods(node, "", block=lambda until: False)
    except (ApiError, Wait) as exc:
        log.warning("pods of node %s unknown: %s", node, exc)
        return PodSnapshot(None)
    return PodSnapshot(addr_of(o, annotations) for o in items if (o.get("status") or {}).get("phase") not in FINISHED)
