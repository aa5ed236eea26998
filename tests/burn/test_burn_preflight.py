"""The preflight as an event source: once per boot, persisted per boot id,
PreflightPending while it runs, PreflightFailed (critical, per GPU) when it
fails, nothing when it passes; forced re-runs; the periodic re-test only on
idle GPUs."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from agentproc import wait_for
from burnfakes import FakeBackend, FakeInventory, FakeWatch, good, gpus

from agent.burn.model import BurnPlan, Fault, GpuOutcome, Problem
from agent.burn.preflight import BURN_FILE, STATE_FILE, Options, PreflightSource
from agent.burn.runner import Runner, Settings
from agent.findings import Finding, Sample, Severity
from agent.hostpaths import HostPaths
from agent.statedir import StateDir


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[list[Finding], list[Sample]]] = []
        self.lock = threading.Lock()

    def __call__(self, findings: Sequence[Finding], samples: Sequence[Sample]) -> None:
        with self.lock:
            self.calls.append((list(findings), list(samples)))

    def reasons(self, i: int = -1) -> list[tuple[str, str]]:
        return [(f.subject, f.reason) for f in self.calls[i][0]]

    def state(self, i: int = -1) -> str:
        [st] = [
            s.labels[0][1] for s in self.calls[i][1] if s.name == "node_health_burn_preflight_state" and s.value == 1
        ]
        return st


class Host:
    """A node: its boot id, state dir, GPUs, and the backend that burns them."""

    def __init__(self, tmp: Path, n: int = 2) -> None:
        self.boot = "boot-1"
        self.state = StateDir(str(tmp / "state"))
        self.state.ensure()
        self.inventory = FakeInventory(gpus(n))
        self.backend = FakeBackend()
        self.watch = FakeWatch()
        self.sources: list[PreflightSource] = []

    def start(self, **opts: object) -> tuple[PreflightSource, Recorder]:
        runner = Runner(
            Settings(plan=BurnPlan(seconds=0.1)),
            HostPaths(),
            inventory=self.inventory,
            backends=[self.backend],
            watch=lambda: self.watch,
        )
        src = PreflightSource(runner, self.state, lambda: self.boot, Options(**opts), list)  # type: ignore[arg-type]
        rec = Recorder()
        src.start(rec)
        self.sources.append(src)
        return src, rec

    def settle(self, rec: Recorder, calls: int) -> None:
        wait_for(lambda: len(rec.calls) >= calls, timeout=10, what=f"{calls} emits")

    def stop(self) -> None:
        for s in self.sources:
            s.stop()


@pytest.fixture
def host(tmp_path: Path):
    h = Host(tmp_path)
    yield h
    h.stop()


def test_first_start_in_a_boot_burns_pending_then_clear(host: Host) -> None:
    _, rec = host.start()
    host.settle(rec, 2)
    assert rec.reasons(0) == [("preflight", "PreflightPending")] and rec.state(0) == "pending"
    [pend] = rec.calls[0][0]
    assert pend.severity is Severity.WARNING and not pend.unknown
    assert rec.reasons(1) == [] and rec.state(1) == "passed"
    assert host.backend.started == 1
    saved = json.loads(Path(host.state.file(STATE_FILE)).read_text())
    assert saved["boot_id"] == "boot-1" and saved["preflight"]["status"] == "pass"


def test_restart_in_the_same_boot_does_not_burn_again(host: Host) -> None:
    first, rec = host.start()
    host.settle(rec, 2)
    first.stop()
    _, rec2 = host.start()
    host.settle(rec2, 1)
    assert host.backend.started == 1
    assert rec2.reasons(0) == [] and rec2.state(0) == "passed"


def test_a_reboot_burns_again(host: Host) -> None:
    first, rec = host.start()
    host.settle(rec, 2)
    first.stop()
    host.boot = "boot-2"
    _, rec2 = host.start()
    host.settle(rec2, 2)
    assert host.backend.started == 2 and rec2.reasons(0) == [("preflight", "PreflightPending")]


def test_forced_burns_again_in_the_same_boot(host: Host) -> None:
    first, rec = host.start()
    host.settle(rec, 2)
    first.stop()
    _, rec2 = host.start(force=True)
    host.settle(rec2, 2)
    assert host.backend.started == 2


def test_failure_is_critical_names_the_gpu_and_why_and_survives_a_restart(host: Host) -> None:
    host.backend.outcomes = {1: GpuOutcome(1, problems=(Problem(Fault.MEMORY_ERRORS, "17 words read back wrong"),))}
    first, rec = host.start()
    host.settle(rec, 2)
    [f] = rec.calls[1][0]
    assert (f.subject, f.reason, f.severity) == ("gpu1", "PreflightFailed", Severity.CRITICAL)
    assert (
        f.message.startswith("GPU 1 (NVIDIA H100 80GB HBM3") and "memory_errors: 17 words read back wrong" in f.message
    )
    assert rec.state(1) == "failed"
    first.stop()
    host.backend.outcomes = {}
    _, rec2 = host.start()
    host.settle(rec2, 1)
    assert rec2.reasons(0) == [("gpu1", "PreflightFailed")] and host.backend.started == 1


def test_no_gpu_passes_with_an_info_finding(host: Host) -> None:
    host.inventory.listed = []
    _, rec = host.start()
    host.settle(rec, 2)
    [f] = rec.calls[1][0]
    assert (f.reason, f.severity) == ("NotApplicable", Severity.INFO) and rec.state(1) == "no_gpu"
    assert host.backend.started == 0


def test_no_backend_is_unknown_and_runs_again_next_start(host: Host) -> None:
    host.backend.why_not = "cuda-bindings is not installed"
    first, rec = host.start()
    host.settle(rec, 2)
    [f] = rec.calls[1][0]
    assert f.reason == "BurnUnavailable" and f.unknown and "cuda-bindings is not installed" in f.message
    assert rec.state(1) == "unavailable"
    first.stop()
    host.backend.why_not = None
    _, rec2 = host.start()
    host.settle(rec2, 2)
    assert host.backend.started == 1 and rec2.reasons(1) == []


def test_a_hung_gpu_fails_the_preflight_and_the_source_stays_responsive(host: Host) -> None:
    host.backend.hang, host.backend.limit = {0}, 0.5
    _, rec = host.start()
    host.settle(rec, 2)
    assert rec.reasons(1) == [("gpu0", "PreflightFailed")] and "timeout" in rec.calls[1][0][0].message


def test_stop_during_the_burn_returns_promptly_and_leaves_no_result(host: Host) -> None:
    host.backend.hang, host.backend.limit = {0, 1}, 600
    src, rec = host.start()
    host.settle(rec, 1)
    wait_for(lambda: len(host.backend.jobs) == 2, what="both GPUs' burn jobs")
    src.stop()
    assert not src._thread.is_alive()
    assert all(j.killed for j in host.backend.jobs)
    saved = host.state.load(BURN_FILE)
    assert saved is None or saved.preflight is None


def test_corrupt_state_file_burns_again(host: Host) -> None:
    Path(host.state.file(STATE_FILE)).write_text("{not json")
    _, rec = host.start()
    host.settle(rec, 2)
    assert host.backend.started == 1


def test_disabled_preflight_does_not_burn(host: Host) -> None:
    _, rec = host.start(preflight=False)
    host.settle(rec, 1)
    assert host.backend.started == 0 and rec.reasons(0) == [] and rec.state(0) == "disabled"


def test_periodic_retest_waits_for_idle_gpus(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.burn.preflight.BUSY_RETRY", 0.2)
    host.inventory.busy = {1: 1}
    _, rec = host.start(retest_interval=0.3)
    host.settle(rec, 2)
    wait_for(lambda: host.backend.started == 1, what="the preflight")
    # Positive proof that re-tests came due and were postponed: three busy checks (0.3 s interval, 0.2 s retry).
    wait_for(lambda: host.inventory.process_polls >= 3, timeout=10, what="three busy checks")
    assert host.backend.started == 1, "re-tested while a process used GPU 1"
    host.backend.outcomes = {0: good(0, flops=200e12), 1: good(1), 2: good(2)}
    host.inventory.busy = {}
    wait_for(lambda: host.backend.started >= 2, timeout=10, what="the periodic re-test")
    host.settle(rec, 3)
    assert ("gpu0", "BurnFailed") in rec.reasons(2)
    assert all(f.severity is Severity.CRITICAL for f in rec.calls[2][0])


def test_no_retest_after_a_failed_preflight(host: Host) -> None:
    host.backend.outcomes = {0: GpuOutcome(0, problems=(Problem(Fault.XID, "Xid 79"),))}
    src, rec = host.start(retest_interval=0.2)
    host.settle(rec, 2)
    # The re-test loop decides once its first interval is due, and returns for good: its thread ends.
    wait_for(lambda: not src._thread.is_alive(), timeout=10, what="the re-test loop to give up")
    assert host.backend.started == 1 and host.inventory.process_polls == 0
