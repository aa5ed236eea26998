"""The preflight: burn every GPU once per boot, before the node takes work,
and re-burn periodically when no process uses the GPUs (if configured).

Keyed by the kernel's boot id and persisted in the state dir (atomically):
a restart of the agent within the same boot reuses the result — a failure
stays a failure, so a crash loop cannot release a node that failed — and a
reboot always burns again. Only a pass, a fail or "no GPU" is final for the
boot; a burn that could not run (no backend, cancelled by a stop) runs again
at the next start.

A burn never starts under live work (`agent.burn.idle`): while any GPU has a
process or is allocated to a pod, or that cannot be told, the preflight is
deferred (PreflightDeferred, state "deferred") and looked at again every
`retry` seconds; once every GPU is idle it reports PreflightPending (which
holds the node), waits `settle` seconds for the hold to land, looks once more
and only then burns. A dry run never burns: it reports what it would do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..sources import Emit
from ..statedir import Damaged, StateDir, StateFile, integer, number, obj, seq, text
from .idle import Idleness, Occupancy
from .model import BurnReport
from .orchestrator import Cancelled
from .publish import deferred, findings, pending, samples, state_of
from .runner import Discovery, Runner

log = logging.getLogger(__name__)

STATE_FILE = "burn.json"
BUSY_RETRY = 60.0  # seconds before looking again when a process uses a GPU


FINAL = ("pass", "fail")  # a preflight with another status runs again at the next start


@dataclass
class BurnState:
    boot_id: str
    preflight: BurnReport | None = None
    retest: BurnReport | None = None  # the last periodic re-test

    def preflight_done(self) -> bool:
        return self.preflight is not None and self.preflight.status in FINAL

    @staticmethod
    def load(state: StateDir, boot_id: str) -> BurnState:
        saved = state.load(BURN_FILE)
        if saved is None or saved.boot_id != boot_id or not boot_id:
            return BurnState(boot_id)
        return saved

    def save(self, state: StateDir) -> None:
        state.write_json(
            STATE_FILE,
            {
                "boot_id": self.boot_id,
                "preflight": self.preflight.as_dict() if self.preflight else None,
                "retest": self.retest.as_dict() if self.retest else None,
            },
        )


def _report(raw: Any, where: str) -> BurnReport | None:
    if raw is None:
        return None
    d = obj(raw, where)
    text(d["backend"], f"{where}.backend")
    number(d["started"], f"{where}.started")
    number(d["finished"], f"{where}.finished")
    for i, g in enumerate(seq(d.get("gpus", []), f"{where}.gpus")):
        g = obj(g, f"{where}.gpus[{i}]")
        integer(g["index"], f"{where}.gpus[{i}].index")
        if g["status"] not in ("pass", "fail", "unknown"):
            raise Damaged(f"{where}.gpus[{i}].status: expected pass, fail or unknown, got {g['status']!r}")
        for j, p in enumerate(seq(g.get("problems", []), f"{where}.gpus[{i}].problems")):
            obj(p, f"{where}.gpus[{i}].problems[{j}]")
        obj(g.get("telemetry", {}), f"{where}.gpus[{i}].telemetry")
    return BurnReport.from_dict(d)


def _parse(raw: Any) -> BurnState:
    d = obj(raw)
    return BurnState(text(d["boot_id"], "boot_id"), _report(d.get("preflight"), "preflight"), _report(d.get("retest"), "retest"))


BURN_FILE = StateFile(STATE_FILE, _parse)


@dataclass
class Options:
    preflight: bool = True
    force: bool = False
    retest_interval: float = 0.0  # 0: no periodic re-test
    dry_run: bool = False  # never burn; say what would be done
    hold_while_deferred: bool = False  # a deferred preflight also reports PreflightPending (holds the node)
    retry: float = 60.0  # seconds between looks at busy GPUs
    settle: float = 5.0  # seconds between PreflightPending and the last look before the burn


@dataclass
class _Run:
    runs: dict[tuple[str, str], int] = field(default_factory=dict)
    last: dict[str, str] = field(default_factory=dict)  # kind → last status, to log once per change
    running: bool = False
    deferred: Occupancy | None = None  # why the preflight waits (None: it does not)
    said: str = ""  # the last deferral logged, to log once per change


class PreflightSource:
    name = "burn"

    def __init__(
        self,
        runner: Runner,
        state: StateDir,
        boot_id: Callable[[], str],
        options: Options,
        known: Callable[[], Iterable[tuple[str, str]]],
        idle: Idleness | None = None,
    ) -> None:
        self.runner, self.state, self.boot_id, self.options = runner, state, boot_id, options
        self._known = known
        self.idle = idle or Idleness(runner.inventory)
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._run = _Run()
        self._burn: BurnState | None = None
        self._found: Discovery | None = None  # the GPUs the preflight listed

    def known_findings(self) -> Iterable[tuple[str, str]]:
        return self._known()

    def start(self, emit: Emit) -> None:
        self._cancel.clear()
        self._thread = threading.Thread(target=self._main, args=(emit,), name="burn-preflight", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._cancel.set()  # the orchestrator kills the workers and returns within a poll
        if self._thread is not None:
            self._thread.join(timeout=3.0)

    # ------------------------------------------------------------ the thread

    def _main(self, emit: Emit) -> None:
        try:
            st = BurnState.load(self.state, self.boot_id())
            self._burn = st
            if self.options.preflight and (not st.preflight_done() or self.options.force):
                if self.options.dry_run:
                    self._dry_run(emit, st)
                    return
                self._preflight(emit, st)
            self._publish(emit, st)
            if self.options.retest_interval > 0 and not self.options.dry_run:
                self._periodic(emit, st)
        except Cancelled:
            log.info("burn cancelled: the agent is stopping")
        except Exception as exc:
            log.exception("the burn preflight failed")
            if self.options.preflight and (self._burn is None or not self._burn.preflight_done()):
                emit(pending(f"the preflight could not complete ({type(exc).__name__}: {exc}); see the agent log"), [])

    def _preflight(self, emit: Emit, st: BurnState) -> None:
        found = self._wait_idle(emit, st)
        if not self._run.running:  # nothing to burn: reported as pending until the (empty) burn's result
            self._run.running = True
            emit(pending("the boot-time GPU burn test is running"), self._samples(st))
        st.preflight = self._burn_once("preflight", found)
        self._run.running = False
        st.save(self.state)

    def _wait_idle(self, emit: Emit, st: BurnState) -> Discovery:
        """The GPUs to burn, once none has a process or a pod (looked at twice:
        before PreflightPending and `settle` seconds after, just before the burn)."""
        opts = self.options
        if opts.hold_while_deferred:
            emit(pending("the boot-time GPU burn test is about to run"), self._samples(st))
        found = self._found = self.runner.discover()
        if not self._burnable(found):
            return found  # nothing to burn (no GPU, no backend, NVML hung): the burn reports it, burning nothing
        while True:
            occ = self.idle.occupancy(found.gpus)
            if occ.idle:
                self._run.running = True
                emit(pending("the boot-time GPU burn test is about to run (the GPUs are idle)"), self._samples(st))
                if self._cancel.wait(opts.settle):
                    raise Cancelled()
                occ = self.idle.occupancy(found.gpus)  # just before the burn: a pod may have landed meanwhile
                if occ.idle:
                    self._run.deferred = None
                    return found
                self._run.running = False
            self._defer(emit, st, occ, f"looks again every {opts.retry:.0f}s")
            if self._cancel.wait(opts.retry):
                raise Cancelled()

    def _burnable(self, found: Discovery) -> bool:
        backend, _ = self.runner.backend()
        return backend is not None and bool(found.gpus) and not (found.no_gpu or found.error or found.unavailable)

    def _defer(self, emit: Emit, st: BurnState, occ: Occupancy, then: str) -> None:
        self._run.deferred = occ
        why = occ.describe()
        if why != self._run.said:
            self._run.said = why
            log.warning("the preflight burn is deferred: %s", why)
        out = deferred(f"the boot-time GPU burn waits for idle GPUs: {why}; {then}")
        if self.options.hold_while_deferred:
            out += pending(f"deferred: {why} (checks.burn.hold_while_deferred holds the node)")
        emit(out, self._samples(st))

    def _dry_run(self, emit: Emit, st: BurnState) -> None:
        """Never burns: says what a real run would do now."""
        found = self._found = self.runner.discover()
        if self._burnable(found):
            occ = self.idle.occupancy(found.gpus)
            would = f"would burn {len(found.gpus)} GPU(s) now" if occ.idle else f"would wait: {occ.describe()}"
        else:
            would = "would burn nothing: " + (found.note or found.error or found.unavailable or self.runner.backend()[1])
        self._run.deferred = Occupancy(unknown="dry run")
        message = f"dry run: the boot-time GPU burn is not started; a real run {would}"
        log.info("%s", message)
        out = deferred(message)
        if self.options.hold_while_deferred:
            out += pending(message)
        emit(out, self._samples(st))

    def _burn_once(self, kind: str, found: Discovery | None = None) -> BurnReport:
        report = self.runner.burn(found or self.runner.discover(), cancel=self._cancel)
        key = (kind, report.status)
        self._run.runs[key] = self._run.runs.get(key, 0) + 1
        changed = report.status != self._run.last.get(kind)
        self._run.last[kind] = report.status
        level = logging.ERROR if report.status == "fail" and changed else logging.INFO if changed else logging.DEBUG
        log.log(
            level,
            "%s burn: %s (%s)",
            kind,
            report.status,
            "; ".join(g.summary() for g in report.gpus) or report.note,
        )
        return report

    def _periodic(self, emit: Emit, st: BurnState) -> None:
        interval = self.options.retest_interval
        while True:
            last = st.retest or st.preflight
            due = (last.finished if last else time.time()) + interval
            if self._cancel.wait(max(0.0, due - time.time())):
                return
            if self.options.preflight and not (st.preflight and st.preflight.status == "pass"):
                return  # a node that failed (or could not run) its preflight is not re-tested
            occ = self.idle.occupancy(self._found.gpus if self._found else ())
            if not occ.idle:
                log.debug("periodic burn postponed: %s", occ.describe())
                if self._cancel.wait(BUSY_RETRY):
                    return
                continue
            st.retest = self._burn_once("periodic")
            st.save(self.state)
            self._publish(emit, st)

    def _publish(self, emit: Emit, st: BurnState) -> None:
        out = []
        if st.preflight is not None:
            out += findings(st.preflight, "preflight")
        if st.retest is not None:
            out += findings(st.retest, "periodic")
        emit(out, self._samples(st))

    def _samples(self, st: BurnState) -> list[Any]:
        last = max((r for r in (st.preflight, st.retest) if r), key=lambda r: r.finished, default=None)
        if not self.options.preflight:
            state = "disabled"
        elif self._run.deferred is not None and not self._run.running:
            state = "deferred"
        else:
            state = state_of(st.preflight, self._run.running)
        return samples(last, state, self._run.runs)
