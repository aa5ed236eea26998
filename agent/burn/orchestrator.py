"""One burn: start the backend's jobs for every GPU at once, watch NVML,
enforce the deadline, and turn it all into a report."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence

from .backend import Backend, BackendError, Job, Watch
from .model import BurnPlan, BurnReport, Fault, GpuInfo, GpuOutcome, Problem
from .verdict import Thresholds, decide

log = logging.getLogger(__name__)

POLL = 0.2  # seconds between polls of the jobs


class Cancelled(Exception):
    """The burn was cancelled (agent stopping); nothing is reported."""


def run_burn(
    backend: Backend,
    gpus: Sequence[GpuInfo],
    plan: BurnPlan,
    watch: Watch,
    thresholds: Thresholds,
    cancel: threading.Event | None = None,
) -> BurnReport:
    cancel = cancel or threading.Event()
    if cancel.is_set():
        raise Cancelled()
    started = time.time()
    testable = [g for g in gpus if not g.mig]
    outcomes: dict[int, GpuOutcome] = {
        g.index: GpuOutcome(g.index, ran=False, notes=("MIG mode is on: CUDA sees its instances, not the GPU",))
        for g in gpus
        if g.mig
    }
    watch.start(testable)
    jobs: list[Job] = []
    try:
        jobs = list(backend.start(testable, plan)) if testable else []
    except BackendError as exc:
        log.error("burn backend %s could not start: %s", backend.name, exc)
        outcomes.update({g.index: GpuOutcome(g.index, ran=False, notes=(f"{backend.name}: {exc}",)) for g in testable})
    try:
        outcomes.update(_wait(jobs, backend.time_limit(plan), cancel))
    finally:
        watched = watch.stop(timeout=5.0)
    verdicts = decide(gpus, outcomes, watched, thresholds)
    return BurnReport(backend=backend.name, started=started, finished=time.time(), gpus=tuple(verdicts))


def _wait(jobs: list[Job], limit: float, cancel: threading.Event) -> Mapping[int, GpuOutcome]:
    deadline = time.monotonic() + limit
    outcomes: dict[int, GpuOutcome] = {}
    pending = list(jobs)
    while pending:
        for job in list(pending):
            result = job.poll()
            if result is not None:
                outcomes.update({i: o for i, o in result.items() if i in job.gpus})
                pending.remove(job)
        if not pending:
            break
        if cancel.is_set():
            for job in pending:
                job.kill()
            raise Cancelled()
        if time.monotonic() >= deadline:
            for job in pending:
                outcomes.update(_timed_out(job, limit))
            break
        cancel.wait(POLL)
    return outcomes


def _timed_out(job: Job, limit: float) -> dict[int, GpuOutcome]:
    phase = job.phase()
    job.kill()
    log.error("burn job for GPU(s) %s passed its deadline of %.0fs in phase %s; killed", job.gpus, limit, phase)
    msg = f"no result {limit:.0f}s after the start (last seen: {phase}); the GPU or its driver may be hung"
    return {i: GpuOutcome(i, problems=(Problem(Fault.TIMEOUT, msg),)) for i in job.gpus}
