"""`agent run`: the long-running process.

Start: config, state dir (locked), checks, scheduler, /metrics, READY=1.
Loop: the scheduler's, which also pings the systemd watchdog, so a stalled
loop stops the pings. SIGHUP reloads the config (a bad file keeps the running
one and logs one error), and so does a change of the config or web config
file on disk (a ConfigMap edit); SIGTERM and SIGINT stop within seconds with
code 0. The /metrics address is bound right after the state dir is locked, so
an address that cannot be served ends the start-up before anything else runs.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from . import __version__, native
from .check import CheckContext
from .config import Config
from .filewatch import FileWatcher, stamp
from .findings import Finding, Sample, Severity
from .metrics import RenderOptions, build_registry
from .registry import catalog_for, configured_reasons
from .runtime import (
    Overrides,
    build_checks,
    build_sources,
    host_paths,
    load_config,
    needs_pods,
    node_name,
    pod_annotations,
    pods_once,
    state_dir,
)
from .scheduler import Scheduler
from .schema import ConfigError
from .sdnotify import Notifier
from .sources import EventSource
from .statedir import StateDir
from .store import Snapshot, Store
from .web.server import MetricsServer, WebCounters
from .web.settings import WebSettings
from .web.tls import resolve

if TYPE_CHECKING:
    from .kube.actuator import Actuator
    from .pods import PodView
    from .remediation.runner import Runner

SWITCH_INTERVAL = 0.001  # seconds; see Agent.run
LOOP_IDLE_WAKE = 5.0  # seconds: the longest the main loop sleeps with nothing due (issue 29; was 1 s)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunOptions:
    once: bool = False
    dry_run: bool = False
    kubeconfig: str | None = None


def release_free_memory() -> bool:
    """Give the C allocator's free pages back to the kernel (glibc's ``malloc_trim(0)``), once after the
    first pass of the checks (and after a reload's): what start-up built and dropped (the parsed config,
    the argument parser, the modules' import-time garbage, the first runs' buffers) otherwise stays in
    RSS, ~2 MB (issue 29, docs/cost.md). False where the C library has none (musl): nothing is done."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


def vm_rss_kb() -> int:
    try:
        with open("/proc/self/status", "rb") as f:
            return next((int(line.split()[1]) for line in f if line.startswith(b"VmRSS:")), 0)
    except (OSError, ValueError):
        return 0


def summary(snap: Snapshot) -> str:
    """One line for systemd's STATUS= and the logs."""
    findings = [f for f in snap.findings() if f.severity is not Severity.INFO]
    if not findings:
        return f"healthy ({len(snap.checks)} checks)"
    worst = max(findings, key=lambda f: (f.severity.rank, not f.unknown))
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return f"{worst.severity.value}: {worst.check} {worst.subject} {worst.reason}{more}"


class Daemon:
    def __init__(self, cfg: Config, overrides: Overrides, opts: RunOptions) -> None:
        self.cfg = cfg
        self.overrides = overrides
        self.opts = opts
        self.store = Store()
        # every reason and metric, with the reasons the config names (an operator's kernel patterns)
        self.catalog = catalog_for(cfg.checks)
        self.scheduler = Scheduler(self.store, self.catalog, jitter=cfg.agent.jitter)
        self.notifier = Notifier()
        self.stop = threading.Event()
        self.metrics: MetricsServer | None = None
        self.web: WebSettings = resolve(cfg.metrics, cfg.source)
        self.watcher: FileWatcher | None = None
        self._reload_stamp: tuple[tuple[str, object], ...] = ()
        self.web_counters = WebCounters(
            lambda samples: self.scheduler.call_soon(lambda: self.store.set_extra("web", samples()))
        )
        self.sources: list[EventSource] = []
        self.kube: Actuator | None = None
        self.pods: PodView | None = None  # the one pod watch (the actuator's), while a check needs pods
        self.remedy: Runner | None = None
        self.state = StateDir(state_dir(cfg, explicit=bool(overrides.state_dir)))
        self._reloads = {"success": 0, "failure": 0}
        self._last_reload_ok = True
        self._publish_reloads()
        self._trim_pending = True  # at start and after each reload: see release_free_memory

    # ------------------------------------------------------------ lifecycle

    def run(self) -> int:
        # A thread that wants the GIL waits up to the switch interval for it, at
        # every turn. Python's 5 ms made a scrape during an Xid storm (the kernel-log
        # follower busy) take 60 ms; 1 ms keeps it near its idle time. Nothing is
        # paid while one thread alone runs (benches/README.md, the kmsg storm).
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.state.ensure()
        self.state.lock()
        log.info(
            "node-health-agent %s starting: node %s, parsers %s, config %s, state %s",
            __version__, node_name(self.cfg), native.describe(), self.cfg.source, self.state.path,
        )
        if self.opts.once:
            pods = pods_once(self.cfg, self.opts.kubeconfig)
            self.scheduler.configure(
                # One pass installs nothing it would leave behind (the traffic chains): it looks, as selftest does.
                build_checks(self.cfg, self.state.path, dry_run=True, pods=pods, single_pass=True),
                immediate=True,
            )
            return self._once()
        self._bind_metrics()
        self._start_kube()
        self._start_pods()
        self.scheduler.configure(build_checks(self.cfg, self.state.path, dry_run=self.opts.dry_run, pods=self.pods))
        self._start_remediation()
        self._start_sources()
        self.store.subscribe(lambda snap: self.notifier.status(summary(snap)))
        self.store.subscribe(lambda snap: self.kube.offer(snap) if self.kube else None)
        self.store.subscribe(lambda snap: self.remedy.offer(snap) if self.remedy else None)
        if self.kube is not None:
            self.kube.offer(self.store.snapshot())
        if self.remedy is not None:
            self.remedy.offer(self.store.snapshot())
        # Signals first: the address is bound since start-up, so a client may be
        # answered (and send SIGHUP) the moment serving starts.
        self._install_signals()
        self._serve_metrics()
        self._reload_stamp = stamp(self._watched())
        self.watcher = FileWatcher(self._watched, lambda: self.scheduler.call_soon(self._files_changed))
        self.watcher.start()
        self.notifier.ready(summary(self.store.snapshot()))
        try:
            # The loop wakes for a due check, a call_soon (results, signals, reloads) or at the latest this
            # often: the systemd watchdog's ping, and /healthz's last tick (stalled after 30 s) (issue 29).
            idle = min(LOOP_IDLE_WAKE, self.notifier.watchdog_interval or LOOP_IDLE_WAKE)
            self.scheduler.run(self.stop, on_tick=self._tick, max_sleep=idle)
        finally:
            self.watcher.stop()
            self.notifier.stopping()
            self.scheduler.close()
            self._stop_sources()
            self._stop_remediation()
            self._stop_kube()
            if self.metrics:
                self.metrics.stop()
            log.info("stopped")
        return 0

    def _tick(self) -> None:
        self.notifier.watchdog()
        if self._trim_pending and self.scheduler.first_pass_done():
            self._trim_pending = False
            said = log.isEnabledFor(logging.DEBUG)  # /proc/self/status read only for the debug line
            before = vm_rss_kb() if said else 0
            if release_free_memory() and said:
                log.debug("gave the allocator's free memory back after the first pass: VmRSS %d -> %d kB",
                          before, vm_rss_kb())

    def _once(self) -> int:
        self.scheduler.run_once()
        self.scheduler.close()
        snap = self.store.snapshot()
        for f in snap.findings():
            log.warning("%s %s %s: %s", f.check, f.subject, f.reason, f.message)
        log.info("one cycle done: %s", summary(snap))
        worst = snap.worst
        return 1 if worst is not None and worst.rank >= Severity.WARNING.rank else 0

    def _start_sources(self) -> None:
        self.sources = build_sources(
            CheckContext(host_paths(self.cfg), self.state.path, self.cfg, self.opts.dry_run, pods=self.pods)
        )
        if self.kube is not None:
            self.sources.append(self.kube.source)
        if self.remedy is not None:
            self.sources.append(self.remedy.source)
        known = {}
        for src in self.sources:
            check = src.name
            known[src.name] = tuple((check, subject, reason) for subject, reason in src.known_findings())
        self.store.set_sources(known)
        for src in self.sources:
            name = src.name

            def emit(findings: Sequence[Finding], samples: Sequence[Sample], name: str = name) -> None:
                self.scheduler.call_soon(lambda: self.store.set_events(name, findings, samples))

            src.start(emit)

    def _stop_sources(self) -> None:
        for src in self.sources:
            try:
                src.stop()
            except Exception:
                log.exception("stopping event source %s", src.name)
        self.sources = []

    def _start_kube(self) -> None:
        from .kube.actuator import start

        def publish(samples: list[Sample]) -> None:
            self.scheduler.call_soon(lambda: self.store.set_extra("kubernetes", samples))

        self.kube = start(
            self.cfg.kubernetes, self.catalog, node_name(self.cfg), self.state, kubeconfig=self.opts.kubeconfig, dry_run=self.opts.dry_run,
            publish_samples=publish,
        )

    def _start_pods(self) -> None:
        """The pod watch runs while kubernetes is on and an enabled check reads pods (CheckSpec.needs_pods)."""
        if self.kube is not None and needs_pods(self.cfg):
            self.pods = self.kube.start_pod_watch(pod_annotations(self.cfg))
        else:
            if self.kube is not None:
                self.kube.stop_pod_watch()
            self.pods = None

    def _start_remediation(self) -> None:
        from .remediation.runner import attribution, start

        def publish(samples: list[Sample]) -> None:
            self.scheduler.call_soon(lambda: self.store.set_extra("remediation", samples))

        self.remedy = start(
            self.cfg.remediation, self.state, host_paths(self.cfg), kube=self.kube,
            dry_run=self.opts.dry_run or self.cfg.kubernetes.dry_run, config_path=self.overrides.config_path,
            publish_samples=publish, catalog=self.catalog,
            users=attribution(host_paths(self.cfg), self.cfg.check("gpu"), self.cfg.check("gpu_pods")),
        )

    def _stop_remediation(self) -> None:
        if self.remedy is not None:
            self.remedy.stop()
            self.remedy = None

    def _stop_kube(self) -> None:
        if self.kube is not None:
            self.kube.stop()  # and its pod watch
            self.kube = None
        self.pods = None

    def _bind_metrics(self) -> None:
        key = "--listen" if self.overrides.listen else f"{self.cfg.source}: metrics.listen"
        self.metrics = MetricsServer(
            self.cfg.metrics, build_registry(self.store, self.catalog, RenderOptions.of(self.cfg.metrics)), self.store,
            web=self.web, counters=self.web_counters, key=key
        )

    def _serve_metrics(self) -> None:
        assert self.metrics is not None
        self.metrics.start()
        scheme = "https" if self.metrics.serving.tls else "http"
        log.info("serving %s on %s (%s, web config from %s)", self.cfg.metrics.telemetry_path, self.cfg.metrics.listen,
                 scheme, self.web.source)

    def _watched(self) -> tuple[str, ...]:
        """The files whose change on disk reloads the config."""
        files = (self.overrides.config_path, self.cfg.metrics.web_config_file)
        return tuple(f for f in files if f)

    def _restart_metrics(self, old: Config, old_web: WebSettings) -> None:
        """New settings for /metrics: the old server goes first (the address may be the same)."""
        from .web.listen import ListenError

        if self.metrics:
            self.metrics.stop()
        try:
            self._bind_metrics()
        except ListenError as exc:
            log.error("%s; serving the previous /metrics address and web config", exc)
            self.cfg, self.web = dataclasses.replace(self.cfg, metrics=old.metrics), old_web
            try:
                self._bind_metrics()
            except (ListenError, ConfigError) as again:
                log.error("%s; /metrics is not served until the next good reload", again)
                self.metrics = None
                return
        self._serve_metrics()

    def _install_signals(self) -> None:
        def stop(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s, stopping", signal.Signals(signum).name)
            self.stop.set()
            self.scheduler.call_soon(lambda: None)  # wake the loop

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, lambda *_: self.scheduler.call_soon(self.reload))

    # ------------------------------------------------------------ reload

    def _reload_result(self, ok: bool) -> None:
        self._reloads["success" if ok else "failure"] += 1
        self._last_reload_ok = ok
        self._publish_reloads()

    def _publish_reloads(self) -> None:
        samples = [
            Sample("node_health_config_reloads_total", n, (("result", result),)) for result, n in self._reloads.items()
        ]
        samples.append(Sample("node_health_config_last_reload_successful", 1.0 if self._last_reload_ok else 0.0))
        self.store.set_extra("config", samples)

    def _files_changed(self) -> None:
        """The watcher saw a change; a SIGHUP may have reloaded these very files already."""
        if stamp(self._watched()) != self._reload_stamp:
            self.reload()

    def reload(self) -> None:
        """Runs on the loop thread. A bad config keeps the running one."""
        self._reload_stamp = stamp(self._watched())
        self.notifier.reloading()
        log.info("reloading the configuration")
        try:
            new = load_config(self.overrides)
            new_web = resolve(new.metrics, new.source)
        except ConfigError as exc:
            log.error("reload failed, keeping the running config: %s", exc)
            self._reload_result(ok=False)
            self.notifier.ready(summary(self.store.snapshot()))
            return
        old, self.cfg = self.cfg, new
        old_web, self.web = self.web, new_web
        self.catalog.configure(r for _, _, r in configured_reasons(new.checks))  # before a source emits one
        logging.getLogger().setLevel(new.agent.log_level.upper())
        # Event sources are restarted only when what they are built from changed:
        # a SIGHUP must not cancel a preflight burn or re-open the kernel log.
        restart = (new.checks, new.paths, new.kubernetes, new.remediation) != (
            old.checks, old.paths, old.kubernetes, old.remediation
        )
        if restart:
            self._stop_sources()
        ladder = (new.kubernetes, new.remediation, new.paths) != (old.kubernetes, old.remediation, old.paths)
        if ladder:
            self._stop_remediation()
        if new.kubernetes != old.kubernetes:
            self._stop_kube()
            try:
                self._start_kube()
            except ConfigError as exc:
                log.error("kubernetes: %s; node state is not synced until the next good reload", exc)
        if (new.kubernetes != old.kubernetes or needs_pods(new) != needs_pods(old)
                or pod_annotations(new) != pod_annotations(old)):
            self._start_pods()  # a new watch with a new actuator; started or stopped as the checks now need
        self.scheduler.configure(build_checks(new, self.state.path, dry_run=self.opts.dry_run, pods=self.pods))
        if ladder:
            self._start_remediation()
            if self.remedy is not None:
                self.remedy.offer(self.store.snapshot())
        if restart:
            self._start_sources()
        if new.metrics != old.metrics or new_web != old_web:
            self._restart_metrics(old, old_web)
        self._trim_pending = True  # the old checks' objects are garbage after the new ones' first pass
        self._reload_result(ok=True)
        log.info("configuration reloaded from %s", new.source)
        self.notifier.ready(summary(self.store.snapshot()))


