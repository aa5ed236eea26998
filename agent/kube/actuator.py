"""The threads: the reconciler's, the kill switch's, and the hook into the daemon.

The store listener runs on the scheduler's loop thread and only hands the
snapshot over (latest wins) and wakes the actuator thread: the loop never
waits on the API server. The actuator thread runs `Reconciler.step` whenever
it is woken or a timer it asked for is due, so a critical finding goes to
the API server at once, without waiting for a tick. It is woken only by a
snapshot that differs from the last step's in what the step reads
(`hysteresis.wake_key`: the findings, and a check's run count only while a
count of it is pending); a check result that changes none of that (nearly all
of them on a healthy node) wakes nothing.

The kill switch is one ConfigMap, read with a list and then a watch
(field selector on its name, bookmarks, resumed from the last
resourceVersion, a 410 answered by listing again), so flipping it reaches
every agent within a second and costs one long request per agent per
30-60 minutes. Until its state is known, taint changes wait.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..catalog import Catalog
from ..findings import Finding, Sample
from ..pods import PodView, excerpt
from ..statedir import StateDir, StateFile, flag, obj, text
from ..store import Snapshot
from . import SOURCE
from .api import ApiError, KubeApi, Stats, Wait, interrupt_stream
from .catalog import CATALOG
from .hysteresis import wake_key
from .podwatch import PodWatch, list_once
from .reconciler import Reconciler
from .settings import KillSwitchSection, KubernetesSection

log = logging.getLogger(__name__)

WATCH_MIN, WATCH_MAX = 1800, 3600  # seconds a kill-switch watch lasts (jittered)
KILL_SWITCH_STATE = "kill-switch.json"


def _parse_kept(raw: Any) -> tuple[str, bool]:
    d = obj(raw)
    return text(d["switch"], "switch"), flag(d["paused"], "paused")


KILL_SWITCH_FILE = StateFile(KILL_SWITCH_STATE, _parse_kept)
IDLE_WAKE = 3600.0  # the actuator wakes at least this often even with nothing to do


class FindingsSource:
    """The actuator's own findings (budget, API errors), pushed like an event source."""

    name = SOURCE

    def __init__(self) -> None:
        self._emit: Callable[[Sequence[Finding], Sequence[Sample]], None] | None = None
        self._findings: tuple[Finding, ...] = ()
        self.watching_pods = False  # PodsUnknown is known (exported at 0) only while the pod watch runs

    def start(self, emit: Callable[[Sequence[Finding], Sequence[Sample]], None]) -> None:
        self._emit = emit
        emit(self._findings, ())

    def stop(self) -> None:
        self._emit = None

    def known_findings(self) -> Iterable[tuple[str, str]]:
        pods = (("pods", "PodsUnknown"),) if self.watching_pods else ()
        return (("budget", "TaintBudgetExhausted"), ("budget", "TaintBudgetMissing"), ("api", "KubeApiError"), *pods)

    def publish(self, findings: tuple[Finding, ...]) -> None:
        if findings != self._findings:
            self._findings = findings
            if self._emit is not None:
                self._emit(findings, ())


class KillSwitch:
    """The cluster's kill switch, failing closed: its key absent or exactly "false" lets taint changes go;
    any other value ("true", "yes", "1", "True ", a typo, not a string) pauses them, logged once per value.
    A ConfigMap deleted keeps the last known state (logged, `KillSwitchDeleted`, the
    ``node_health_kube_kill_switch_missing`` gauge), across restarts too: the last state read from it is kept
    in ``kill-switch.json`` in the state dir. One that never existed (no state kept) is active, as a key
    absent, and the gauge says it is missing."""

    def __init__(
        self, api: KubeApi, cfg: KillSwitchSection, on_change: Callable[[bool | None], None], stop: threading.Event,
        statedir: StateDir | None = None,
    ) -> None:
        self.api, self.cfg, self.on_change, self.stop = api, cfg, on_change, stop
        self.state: bool | None = None
        self.missing = False  # the ConfigMap does not exist (the last state it had, if any, is kept)
        self.statedir = statedir
        kept = statedir.load(KILL_SWITCH_FILE) if statedir is not None else None
        self.kept: bool | None = kept[1] if kept is not None and kept[0] == self._where() else None
        self.seen = self.kept is not None  # it existed (since start, or before a restart: kill-switch.json)
        self._resp: Any = None
        self._rng = random.Random()
        self._error: str | None = None
        self._odd: str | None = None  # the last value that paused without being "true" (logged once)

    def run(self) -> None:
        rv = ""
        while not self.stop.is_set():
            try:
                if not rv:
                    obj, rv = self.api.list_configmap(self.cfg.namespace, self.cfg.name, block=self._sleep_until)
                    self._found(obj)
                rv = self._watch(rv)
                self._error = None
            except Wait:
                return  # stopping
            except ApiError as exc:
                rv = self._failed(exc, rv)
            except Exception as exc:  # a watch stream that broke (read timeout, reset): reconnect
                log.debug("kill-switch watch ended: %s", exc)
                self._sleep_until(time.monotonic() + self._rng.uniform(1, 5))

    def _watch(self, rv: str) -> str:
        timeout = self._rng.randint(WATCH_MIN, WATCH_MAX)
        events = self.api.watch_configmap(self.cfg.namespace, self.cfg.name, rv, timeout, self._sleep_until, self._opened)
        for ev in events:
            obj = ev.get("object") or {}
            if ev.get("type") == "ERROR":  # 410 Expired: the resourceVersion left the watch cache's window
                log.info("kill-switch watch: %s; listing again", obj.get("message"))
                return ""
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if ev.get("type") in ("ADDED", "MODIFIED"):
                self._found(obj)
            elif ev.get("type") == "DELETED":
                self._found(None)
            if self.stop.is_set():
                break
        return rv

    def _failed(self, exc: ApiError, rv: str) -> str:
        if exc.status == 410:
            return ""
        if self._error != str(exc):
            log.error("kill switch %s/%s unreadable: %s", self.cfg.namespace, self.cfg.name, exc)
            self._error = str(exc)
        if not rv:
            self._set(None)  # cannot tell: taint changes wait
        if not exc.retryable:
            self._sleep_until(time.monotonic() + self._rng.uniform(30, 90))
        return ""

    def _found(self, obj: dict[str, Any] | None) -> None:
        """The ConfigMap as listed or watched (None: it does not exist)."""
        where = f"kill switch {self.cfg.namespace}/{self.cfg.name}"
        if obj is None:
            if not self.missing:
                self.missing = True
                if self.seen and self.state is not None:
                    log.warning("%s: the ConfigMap was deleted; keeping its last known state (%s) until it is back",
                                where, "paused" if self.state else "active")
                else:
                    log.warning("%s: no such ConfigMap; taint changes allowed as with data.%s absent (create it "
                                "to be able to pause)", where, self.cfg.key)
            if self.state is None:
                self._set(self.kept if self.kept is not None else False)
            else:
                self.on_change(self.state)  # the state is kept; its findings and metrics change
            return
        if self.missing:
            log.warning("%s: the ConfigMap exists again", where)
        self.missing, self.seen = False, True
        self._set(self._paused(obj))
        self._keep()

    def _where(self) -> str:
        return f"{self.cfg.namespace}/{self.cfg.name}/{self.cfg.key}"

    def _keep(self) -> None:
        """The state read from the ConfigMap, kept for a restart that finds it deleted."""
        if self.statedir is None or self.state is None or self.state == self.kept:
            return
        try:
            self.statedir.write_json(KILL_SWITCH_STATE, {"switch": self._where(), "paused": self.state})
            self.kept = self.state
        except OSError as exc:
            log.warning("kill switch: cannot keep its state in %s: %s", KILL_SWITCH_STATE, exc)

    def _paused(self, obj: dict[str, Any]) -> bool:
        data = obj.get("data")
        if data is not None and not isinstance(data, dict):
            return self._odd_value(data)
        if data is None or self.cfg.key not in data:
            return False
        value = data[self.cfg.key]
        if value == "false":
            return False
        if value != "true":
            return self._odd_value(value)
        return True

    def _odd_value(self, value: object) -> bool:
        shown = excerpt(value)
        if shown != self._odd:
            self._odd = shown
            log.warning("kill switch %s/%s: data.%s = %s is neither \"true\" nor \"false\": taint changes paused "
                        "(fail closed)", self.cfg.namespace, self.cfg.name, self.cfg.key, shown)
        return True

    def findings(self) -> tuple[Finding, ...]:
        if not (self.missing and self.seen):
            return ()
        kept = {True: "paused", False: "active", None: "unknown"}[self.state]
        return (CATALOG.finding(SOURCE, "kill_switch", "KillSwitchDeleted",
                                f"the kill switch ConfigMap {self.cfg.namespace}/{self.cfg.name} was deleted; its "
                                f"last known state ({kept}) is kept until it is back"),)

    def _set(self, state: bool | None) -> None:
        if state != self.state:
            log.warning("kill switch %s/%s: %s", self.cfg.namespace, self.cfg.name,
                        {True: "taint changes PAUSED", False: "taint changes allowed", None: "state unknown, taint changes wait"}[state])
            self.state = state
            self.on_change(state)

    def _sleep_until(self, until: float) -> bool:
        return not self.stop.wait(max(0.0, until - time.monotonic()))

    def _opened(self, resp: Any) -> None:
        self._resp = resp

    def interrupt(self) -> None:
        interrupt_stream(self._resp)


class Actuator:
    def __init__(
        self, reconciler: Reconciler, *, kill_switch: KillSwitchSection | None,
        publish_samples: Callable[[list[Sample]], None],
    ) -> None:
        self.reconciler = reconciler
        self.source = FindingsSource()
        self._publish_samples = publish_samples
        self._samples: list[Sample] | None = None
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._key: tuple[object, ...] | None = None  # wake_key of the snapshot the thread steps on next or last
        self._counted: frozenset[str] | None = None  # the reconciler's counted(), as of its last step
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.on_paused: Callable[[], None] | None = None  # told when the kill switch's state changes (the ladder)
        self.kill_switch: KillSwitch | None = None
        self.pod_watch: PodWatch | None = None
        api = reconciler.api
        if api is not None and kill_switch is not None and kill_switch.name:
            self.kill_switch = KillSwitch(api, kill_switch, self._paused, self._stop, reconciler.statedir)

    def offer(self, snap: Snapshot) -> None:
        """Store listener (scheduler loop thread): hand over, never block; wake the thread only
        when `snap` differs from what it last stepped on in what a step reads."""
        with self._lock:
            self._snap = snap
            key = wake_key(snap, (SOURCE,), self._counted)
            if key == self._key:
                return
            self._key = key
        self._wake.set()

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._run, name="kube-actuator", daemon=True)]
        if self.kill_switch is not None:
            self._threads.append(threading.Thread(target=self.kill_switch.run, name="kube-kill-switch", daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self.kill_switch is not None:
            self.kill_switch.interrupt()
        self.stop_pod_watch()
        for t in self._threads:
            t.join(timeout=5)

    # ------------------------------------------------------------ the node's pods (agent.pods)

    def start_pod_watch(self, annotations: Iterable[str] = ()) -> PodWatch | None:
        """The one watch on this node's pods, through this actuator's client and gate (None without a cluster);
        of the pods' annotations it keeps only `annotations` (the keys the checks read)."""
        rec = self.reconciler
        if rec.api is None:
            return None
        keep = frozenset(annotations)
        if self.pod_watch is not None and self.pod_watch.annotations != keep:
            self.stop_pod_watch()
        if self.pod_watch is None:
            self.pod_watch = PodWatch(rec.api, rec.node_name, rec.cfg.pods, startup_jitter=rec.cfg.startup_jitter,
                                      on_change=self._wake.set, annotations=keep)
            self.pod_watch.start()
            self.source.watching_pods = True
        return self.pod_watch

    def stop_pod_watch(self) -> None:
        pw, self.pod_watch = self.pod_watch, None
        self.source.watching_pods = False
        if pw is not None:
            pw.stop()
            self._wake.set()

    def watched_pods(self) -> list[dict[str, Any]] | None:
        """The node's pods for the drain while the pod watch is open; None: list them."""
        pw = self.pod_watch
        return pw.drain_pods() if pw is not None else None

    def _paused(self, state: bool | None) -> None:
        self.reconciler.paused = state
        self._wake.set()
        if self.on_paused is not None:
            self.on_paused()

    def _run(self) -> None:
        while not self._stop.is_set():
            wake = self._once(time.monotonic())
            self._wake.wait(timeout=min(IDLE_WAKE, max(0.0, wake - time.monotonic())))

    def _once(self, now: float) -> float:
        """One step of the thread on the latest snapshot; the monotonic time of the next one at the latest."""
        self._wake.clear()
        with self._lock:
            snap = self._snap
        try:
            wake = self.reconciler.step(now, snap)
        except Exception:  # the agent cannot crash; try again later
            log.exception("kubernetes actuator step failed")
            wake = now + 30
        self._publish()
        self._stepped(snap)
        return wake

    def _stepped(self, snap: Snapshot | None) -> None:
        """After a step: the counts it left pending say whose runs wake the thread now. A snapshot
        offered during the step was judged by the counts before it: judged again here."""
        counted = self.reconciler.counted()
        with self._lock:
            self._counted = counted
            if snap is None:
                return
            self._key = wake_key(snap, (SOURCE,), counted)
            if self._snap is not snap and self._snap is not None and wake_key(self._snap, (SOURCE,), counted) != self._key:
                self._wake.set()

    def _publish(self) -> None:
        rec, pw = self.reconciler, self.pod_watch
        ksw = self.kill_switch
        self.source.publish(rec.findings() + (pw.findings() if pw is not None else ())
                            + (ksw.findings() if ksw is not None else ()))
        if ksw is None:
            ks = "disabled"
        else:
            ks = {True: "paused", False: "active", None: "unknown"}[rec.paused]
        samples = rec.samples(ks) + (pw.samples() if pw is not None else [])
        if ksw is not None:
            samples.append(Sample("node_health_kube_kill_switch_missing", 1.0 if ksw.missing else 0.0))
        if samples != self._samples:
            self._samples = samples
            self._publish_samples(samples)


def connect(k: KubernetesSection, kubeconfig: str | None, stats: Stats) -> tuple[KubeApi, str] | None:
    """A client for the cluster behind its gate, and where it came from (None: no cluster found).
    Raises ConfigError for bad credentials."""
    from .connect import build_client, find_cluster

    cluster = find_cluster(kubeconfig, k.kubeconfig)
    if cluster is None:
        return None
    from .ratelimit import Gate

    client, reauth = build_client(cluster)
    gate = Gate(qps=k.qps, burst=k.burst, backoff_max=k.backoff_max, now=time.monotonic())
    api = KubeApi(client, gate=gate, clock=time.monotonic, stats=stats, timeout=k.request_timeout, reauth=reauth)
    return api, cluster.describe()


def start(
    k: KubernetesSection, catalog: Catalog, node: str, state: StateDir, *, kubeconfig: str | None, dry_run: bool,
    publish_samples: Callable[[list[Sample]], None],
) -> Actuator | None:
    """Build and start the actuator (None when the feature is off). Raises ConfigError for bad credentials."""
    if not k.enabled:
        return None
    stats = Stats()
    now = time.monotonic()
    found = connect(k, kubeconfig, stats)
    api = found[0] if found is not None else None
    if found is None:
        log.warning("no cluster configured (no --kubeconfig, $KUBECONFIG or service account): dry run, nothing is written")
    else:
        log.info("kubernetes: node %s via %s%s", node, found[1], " (dry run)" if dry_run or k.dry_run else "")
    rec = Reconciler(k, node, state, catalog=catalog, api=api, dry_run=dry_run or k.dry_run, now=now, stats=stats)
    act = Actuator(rec, kill_switch=k.kill_switch, publish_samples=publish_samples)
    act.start()
    return act


def pods_once(k: KubernetesSection, node: str, kubeconfig: str | None, annotations: Iterable[str] = ()) -> PodView | None:
    """The node's pods from one LIST, for a single pass (`agent run --once`, `agent selftest`): no watch is
    worth starting for one run. None without a cluster; a view whose pods() is None when the LIST failed."""
    if not k.enabled:
        return None
    found = connect(k, kubeconfig, Stats())
    return list_once(found[0], node, frozenset(annotations)) if found is not None else None
