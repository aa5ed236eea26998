"""The ladder's thread and its hook into the daemon.

The store listener runs on the scheduler's loop thread and only hands the
snapshot over (latest wins), as the Kubernetes actuator's does; the ladder's
own thread ticks when what it reads changed (the faults, `faults()` of the
snapshot, or the kill switch's state) and at least every ``interval``: a check
result that changes no fault (nearly all of them) wakes nothing. A
cluster call that raises `ApiError` or `Wait` is tried again on a later tick;
any other exception is logged and the thread goes on: the agent cannot crash
because a step failed. The ladder's findings (waiting for a slot, held,
failed, retired) go into the store as an event source's, and from there to
/metrics and to the Kubernetes side like any other finding.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from ..catalog import Catalog
from ..findings import Finding, Sample
from ..gpu.attribution import AttributionError, GpuAttribution
from ..gpu.settings import GpuConfig, GpuPodsConfig, nvml_library
from ..hostpaths import HostPaths
from ..kube.actuator import Actuator, FindingsSource
from ..kube.api import ApiError, Wait
from ..kube.drain import DrainProgress
from ..kube.nodes import taints_of
from ..kube.remediate import KubeRemediation
from ..statedir import StateDir
from ..store import Snapshot
from .catalog import CHECK
from .cluster import Cluster, NoCluster
from .faults import Fault, faults
from .host import Host, burn_argv
from .ladder import GpuUsers, Ladder
from .settings import RemediationSection

log = logging.getLogger(__name__)

API_RETRY = 30.0  # seconds before a tick after an API error (the kube client backs off on its own too)
MIN_GAP = 1.0  # seconds between ticks at least: a burst of snapshots (an Xid storm) is one tick


class LadderSource(FindingsSource):
    """The ladder's own findings, pushed like an event source's (as the taint actuator's are)."""

    name = CHECK

    def __init__(self, enforce: bool = True) -> None:
        super().__init__()
        self.enforce = enforce

    def known_findings(self) -> Iterable[tuple[str, str]]:
        # Exported at 0 (and so a condition on the Node) only where the ladder may act: in observe
        # mode 7,500 nodes would each write a "no remediation problem" condition for nothing.
        return (("slot", "DisruptionSlotWaiting"), ("node", "NodeRetired")) if self.enforce else ()


def go_ahead(paused: Callable[[], bool | None]) -> Callable[[], str | None]:
    """The ladder's last look before a host- or cluster-changing command: the kill switch read again."""

    def check() -> str | None:
        return None if paused() is False else "kill_switch"

    return check


class Runner:
    def __init__(
        self, ladder: Ladder, *, interval: float, publish_samples: Callable[[list[Sample]], None],
        paused: Callable[[], bool | None] = lambda: False,
    ) -> None:
        self.ladder, self.interval, self._publish_samples, self._paused = ladder, interval, publish_samples, paused
        self.source = LadderSource(enforce=ladder.cfg.mode == "enforce")
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._latest: Snapshot | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list[Sample] | None = None
        self._rate_limited = False
        self._offered: tuple[bool | None, list[Fault]] | None = None  # what the last wake-up was for
        self._findings: tuple[Finding, ...] | None = None  # the ladder's, as last published

    def offer(self, snap: Snapshot) -> None:
        """Store listener (scheduler loop thread): hand over, never block; wake the thread only when
        the faults or the kill switch's state differ from the last wake-up's (the next tick, at
        `interval` at the latest, takes the snapshot either way)."""
        seen = (self._paused(), faults(snap.findings(), snap.samples()))
        with self._lock:
            self._snap = snap
            if seen == self._offered:
                return
            self._offered = seen
        self._wake.set()

    def kick(self) -> None:
        """Tick now (the kill switch changed)."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="remediation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            with self._lock:
                if self._snap is not None:
                    self._latest, self._snap = self._snap, None
            wait = self.interval
            if self._latest is not None:
                wait = self.step(self._latest)
            if self._stop.wait(MIN_GAP):
                return
            self._wake.wait(timeout=max(0.0, wait - MIN_GAP))

    def step(self, snap: Snapshot) -> float:
        """One tick on `snap`; the seconds until the next one at the latest."""
        wait = self.interval
        ticked = False
        self.ladder.paused = self._paused()
        try:
            self.ladder.tick(faults(snap.findings(), snap.samples()))
            self._rate_limited = False
            ticked = True
        except Wait as exc:  # our own client-side rate limit or backoff: the API server said nothing
            left = max(0.0, exc.until - time.monotonic())
            (log.debug if self._rate_limited else log.info)(
                "remediation: waiting %.1fs for the client-side rate limit (no request sent); trying again then", left)
            self._rate_limited = True  # said once per stretch of waits
            wait = max(MIN_GAP, min(wait, left))
        except ApiError as exc:
            log.info("remediation: the API server said %s; trying again later", exc)
            wait = max(wait, API_RETRY)
        except Exception:  # the agent cannot crash; the step is tried again later
            log.exception("remediation tick failed")
            wait = max(wait, API_RETRY)
        cluster = self.ladder.cluster
        side_findings = cluster.findings() if isinstance(cluster, KubeSide) else ()
        findings = self.ladder.findings() + side_findings
        samples = self.ladder.samples() + (cluster.samples() if isinstance(cluster, KubeSide) else [])
        new_samples = samples != self._samples
        moved = new_samples or findings != self._findings
        self.source.publish(findings)
        self._findings = findings
        if new_samples:
            self._samples = samples
            self._publish_samples(samples)
        # A tick that moved the ladder (a step taken, a wait begun or ended) is followed by another soon,
        # as the store's next result used to bring one: an episode's steps follow each other in seconds.
        return MIN_GAP if moved and ticked else wait


class KubeSide:
    """`KubeRemediation` (agent/kube/remediate.py) once the Node's UID is known: the
    reconciler reads the Node at start (after its start-up jitter); until then a call
    raises `Wait` and the ladder tries again on its next tick."""

    present = True

    def __init__(self, kube: Actuator) -> None:
        self.kube = kube
        self.real: KubeRemediation | None = None

    def _get(self) -> KubeRemediation:
        if self.real is None:
            rec = self.kube.reconciler
            uid = rec.node.uid()
            if rec.api is None or not uid:
                raise Wait(time.monotonic() + 5)
            self.real = KubeRemediation(rec.api, rec.node_name, uid, rec.cfg, watched=self.kube.watched_pods)
        return self.real

    def plan_drain(self, only_pod_uids: frozenset[str] | None = None) -> list[str]:
        return self._get().plan_drain(only_pod_uids)

    def drain(self, now: float, only_pod_uids: frozenset[str] | None = None) -> DrainProgress:
        return self._get().drain(now, only_pod_uids)

    def claim_slot(self, now: float) -> bool:
        return self._get().claim_slot(now)

    def renew_slot(self, now: float) -> bool:
        return self._get().renew_slot(now)

    def slot_wait(self) -> str:
        return self.real.slot_wait() if self.real else ""

    def release_slot(self, now: float) -> None:
        self._get().release_slot(now)

    def breaker_check(self, now: float, step: str) -> str:
        return self._get().breaker_check(now, step)

    def taint_withheld(self) -> str:
        """"" when a taint of ours that keeps pods off (NoSchedule, NoExecute) is on the Node; else why not."""
        rec = self.kube.reconciler
        prefix = rec.cfg.taint_prefix
        ours = [t for t in taints_of(rec.node.obj) if str(t.get("key", "")).startswith(prefix)
                and t.get("effect") in ("NoSchedule", "NoExecute")]
        if ours:
            return ""
        if rec.node.obj is None:
            return "the Node has not been read yet"
        if rec.paused is not False:
            return "the kill switch withholds the node's taint (paused, or its state unknown)"
        withheld = rec.withheld
        if withheld:
            return (f"the taint budget withholds {', '.join(sorted(t.key for t in withheld))} (every slot is held): "
                    "the node is schedulable")
        return f"no taint of {prefix} with effect NoSchedule or NoExecute is on the Node: the node is schedulable"

    def set_retired(self, retired: bool, message: str) -> None:
        self._get().set_retired(retired, message)

    def node_retired(self) -> bool | None:
        """From the reconciler's copy of the Node (read at its start, kept by its watch): no extra request."""
        real = self._get()
        obj = self.kube.reconciler.node.obj
        if obj is None:
            return real.node_retired()
        return ((obj.get("metadata") or {}).get("labels") or {}).get(real.label) == "true"

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self._get().event(reason, message, warning)

    def findings(self) -> tuple[Finding, ...]:
        return self.real.findings() if self.real else ()

    def samples(self) -> list[Sample]:
        return self.real.samples() if self.real else []


def cluster_for(kube: Actuator | None) -> Cluster:
    """The Kubernetes side when a cluster is configured, else `NoCluster` (bare metal)."""
    if kube is None or kube.reconciler.api is None:
        return NoCluster()
    return KubeSide(kube)


def start(
    cfg: RemediationSection, state: StateDir, paths: HostPaths, *, kube: Actuator | None, dry_run: bool,
    config_path: str | None, publish_samples: Callable[[list[Sample]], None], catalog: Catalog,
    users: GpuUsers | None = None,
) -> Runner:
    """Build and start the ladder's thread (it runs in every mode: observe exports what it would do)."""
    cluster = cluster_for(kube)
    host = Host(cfg, paths, burn_argv=burn_argv(config_path))
    paused: Callable[[], bool | None] = lambda: False  # noqa: E731
    if kube is not None and kube.kill_switch is not None:
        rec = kube.reconciler
        paused = lambda: rec.paused  # noqa: E731
    ladder = Ladder(cfg, state, host, cluster, catalog=catalog, users=users, dry_run=dry_run, go_ahead=go_ahead(paused))
    where = "no cluster: nothing to drain, no disruption budget" if isinstance(cluster, NoCluster) else "Kubernetes"
    log.info("remediation: mode %s%s, actions %s (%s)", cfg.mode, " (dry run)" if dry_run else "",
             ", ".join(cfg.actions) or "none", where)
    runner = Runner(ladder, interval=cfg.interval, publish_samples=publish_samples, paused=paused)
    if kube is not None:
        kube.on_paused = runner.kick  # the kill switch's change is a tick now, whatever the store says
    runner.start()
    return runner


class Attribution:
    """`agent.gpu.attribution` for the ladder: "cannot tell" is None (drain the node, do not reset)."""

    def __init__(self, attribution: GpuAttribution, library: Callable[[], str]) -> None:
        self.attribution, self.library = attribution, library

    def pods_on_gpu(self, uuid: str) -> frozenset[str] | None:
        self.attribution.library = self.library()
        try:
            return self.attribution.pods_on_gpu(uuid)
        except AttributionError as exc:
            log.warning("remediation: which pods hold GPU %s is unknown: %s", uuid, exc)
            return None

    def processes_on_gpu(self, uuid: str) -> tuple[int, ...] | None:
        self.attribution.library = self.library()
        try:
            return self.attribution.processes_on_gpu(uuid)
        except AttributionError as exc:
            log.warning("remediation: the processes on GPU %s are unknown: %s", uuid, exc)
            return None


def attribution(paths: HostPaths, gpu: GpuConfig, pods: GpuPodsConfig) -> Attribution:
    """The same lookup as the gpu_pods check's (its socket, log dir, deadline, resources)."""
    found = GpuAttribution(paths, socket=pods.pod_resources_socket or None, logs_dir=pods.pod_logs_dir,
                           call_timeout=pods.call_timeout, extra_resources=pods.resource_names)
    return Attribution(found, lambda: nvml_library(paths, gpu))
