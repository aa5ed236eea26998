"""One burn against a fake backend: all GPUs at once, a hung GPU fails with a
timeout while the others finish, NVML problems land on the right GPU, and a
stop cancels the burn without waiting for it."""

from __future__ import annotations

import threading

import pytest
from burnfakes import FakeBackend, FakeJob, FakeWatch, good, gpus

from agent.burn.model import BurnPlan, Fault, GpuInfo, GpuOutcome, Problem
from agent.burn.orchestrator import Cancelled, run_burn
from agent.burn.verdict import Thresholds

PLAN = BurnPlan(seconds=1.0)


def test_all_gpus_burn_at_once_and_pass() -> None:
    """No job can finish before every job has been polled while running (their run
    intervals must overlap): an orchestrator that waits for one GPU's job before
    it looks at the next never sees the first one finish, and times it out."""
    backend = FakeBackend(limit=5.0)
    real_start = backend.start

    def start(g: list[GpuInfo], plan: BurnPlan) -> list[FakeJob]:
        jobs = real_start(g, plan)
        for job in jobs:
            job.gate = lambda: all(j.polls > 0 for j in jobs)
        return jobs

    backend.start = start  # type: ignore[method-assign]
    report = run_burn(backend, gpus(8), PLAN, FakeWatch(), Thresholds())
    assert report.status == "pass" and len(report.gpus) == 8, [g.problems for g in report.gpus]
    assert len(backend.jobs) == 8 and backend.started == 1


def test_a_hung_gpu_times_out_and_the_others_finish() -> None:
    backend = FakeBackend(hang=[2], limit=1.0)
    watch = FakeWatch()
    report = run_burn(backend, gpus(4), PLAN, watch, Thresholds())
    assert [g.status for g in report.gpus] == ["pass", "pass", "fail", "pass"]
    [p] = report.gpus[2].problems
    assert p.fault is Fault.TIMEOUT and "last seen: gemm" in p.message
    assert backend.jobs[2].killed and not backend.jobs[0].killed
    assert watch.stopped.is_set()
    assert report.duration >= 1.0, "the hung GPU was not given its time limit"


def test_nvml_problem_fails_the_right_gpu() -> None:
    watch = FakeWatch({1: [Problem(Fault.ECC, "1 new uncorrectable ECC error(s) during the burn")]})
    report = run_burn(FakeBackend(), gpus(3), PLAN, watch, Thresholds())
    assert [g.status for g in report.gpus] == ["pass", "fail", "pass"]
    assert report.failed()[0].problems[0].fault is Fault.ECC


def test_backend_problems_and_cross_gpu_checks_combine() -> None:
    outcomes = {
        0: good(0),
        1: good(1, digest="bad1"),
        2: good(2),
        3: good(3, flops=300e12),
        4: GpuOutcome(4, problems=(Problem(Fault.MEMORY_ERRORS, "12 words read back wrong"),)),
    }
    report = run_burn(FakeBackend(outcomes), gpus(5), PLAN, FakeWatch(), Thresholds())
    faults = {g.index: [p.fault for p in g.problems] for g in report.gpus}
    assert faults == {0: [], 1: [Fault.COMPUTE_MISMATCH], 2: [], 3: [Fault.SLOW_GEMM], 4: [Fault.MEMORY_ERRORS]}


def test_cancel_returns_promptly_and_kills_the_jobs() -> None:
    """The cancel comes at job 0's third poll; the burn stops within that round of
    polls (a burn that waited for its 60 s limit would poll each job ~300 times)."""
    backend = FakeBackend(hang=[0, 1], limit=60.0)
    cancel = threading.Event()
    real_start = backend.start

    def start(g: list[GpuInfo], plan: BurnPlan) -> list[FakeJob]:
        jobs = real_start(g, plan)
        jobs[0].on_poll = lambda job: cancel.set() if job.polls == 3 else None
        return jobs

    backend.start = start  # type: ignore[method-assign]
    with pytest.raises(Cancelled):
        run_burn(backend, gpus(2), PLAN, FakeWatch(), Thresholds(), cancel)
    assert [j.polls for j in backend.jobs] == [3, 3]
    assert all(j.killed for j in backend.jobs)


def test_backend_that_cannot_start_leaves_gpus_unknown() -> None:
    report = run_burn(FakeBackend(start_error="cannot exec python"), gpus(2), PLAN, FakeWatch(), Thresholds())
    assert report.status == "unknown"
    assert all(g.status == "unknown" and "cannot exec python" in g.notes[0] for g in report.gpus)


def test_mig_gpu_is_not_burned_and_says_why() -> None:
    listed = gpus(2)
    listed[1] = GpuInfo(1, uuid="GPU-1", name="NVIDIA A100-SXM4-80GB", mig=True)
    backend = FakeBackend()
    report = run_burn(backend, listed, PLAN, FakeWatch(), Thresholds())
    assert [g.status for g in report.gpus] == ["pass", "unknown"]
    assert "MIG" in report.gpus[1].notes[0] and len(backend.jobs) == 1


def test_a_gpu_no_job_reports_on_is_unknown() -> None:
    empty = FakeBackend()
    empty.start = lambda g, p: []  # type: ignore[method-assign]
    report = run_burn(empty, gpus(1), PLAN, FakeWatch(), Thresholds())
    assert report.gpus[0].status == "unknown" and report.gpus[0].notes == ("no result from the backend",)
