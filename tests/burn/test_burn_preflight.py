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
from hypothesis import given, settings
from hypothesis import strategies as st
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
        opts = {"settle": 0.05, "retry": 0.1, **opts}
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
    _, rec = host.start(retest_interval=0.3)
    host.settle(rec, 2)
    wait_for(lambda: host.backend.started == 1, what="the preflight")
    host.inventory.busy = {1: 1}
    polls = host.inventory.process_polls
    # Positive proof that re-tests came due and were postponed: three busy checks (0.3 s interval, 0.2 s retry).
    wait_for(lambda: host.inventory.process_polls >= polls + 3, timeout=10, what="three busy checks")
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
    # two looks at the GPUs by the preflight (before PreflightPending and just before the burn), none by a re-test
    assert host.backend.started == 1 and host.inventory.process_polls == 2


# ------------------------------------------------------------------ never under live work (issue 24 item 2)


class Pods:
    """A stand-in for the kubelet's PodResources: what `lookup` answers, and how often it was asked."""

    def __init__(self, answer: list[tuple[int | None, str]] | None | Exception = None) -> None:
        self.answer = answer
        self.calls = 0
        self.after: list[tuple[int | None, str]] | None = None  # the answer from the second call on

    def __call__(self, gpus: Sequence[object]) -> list[tuple[int | None, str]] | None:
        self.calls += 1
        answer = self.after if self.after is not None and self.calls > 1 else self.answer
        if isinstance(answer, Exception):
            raise answer
        return answer


def start_with(host: Host, pods: Pods | None = None, **opts: object) -> tuple[PreflightSource, Recorder]:
    from agent.burn.idle import Idleness

    src, rec = host.start(**opts)
    src.idle = Idleness(host.inventory, pods)
    return src, rec


def deferred_message(rec: Recorder) -> str:
    wait_for(lambda: any(f.reason == "PreflightDeferred" for c in rec.calls for f in c[0]), timeout=60,
             what="PreflightDeferred")  # a loaded CI machine: the source's thread may start late
    [f] = [f for c in rec.calls for f in c[0] if f.reason == "PreflightDeferred"][-1:]
    assert f.severity is Severity.INFO and f.subject == "preflight"
    return f.message


def test_a_process_on_one_gpu_defers_the_whole_node_until_it_is_gone(host: Host) -> None:
    host.inventory.busy = {1: 2}
    _, rec = host.start()
    msg = deferred_message(rec)
    assert "GPU 1: pid 4242, pid 4243" in msg and "GPU 0" not in msg
    wait_for(lambda: host.inventory.process_polls >= 4, what="the GPUs looked at again")
    assert host.backend.started == 0, "burned beside a live process"
    # hold_while_deferred is off: the node is not held while it waits (no PreflightPending, state deferred)
    assert all(f.reason != "PreflightPending" for c in rec.calls for f in c[0]) and rec.state() == "deferred"
    host.inventory.busy = {}
    wait_for(lambda: host.backend.started == 1, what="the burn once the GPUs are idle")
    wait_for(lambda: rec.state() == "passed", what="passed")
    assert rec.reasons() == []
    saved = host.state.load(BURN_FILE)
    assert saved is not None and saved.preflight is not None and saved.preflight.status == "pass"


def test_hold_while_deferred_keeps_the_node_held(host: Host) -> None:
    host.inventory.busy = {0: 1}
    _, rec = host.start(hold_while_deferred=True)
    deferred_message(rec)
    wait_for(lambda: ("preflight", "PreflightPending") in rec.reasons(), what="PreflightPending beside PreflightDeferred")
    assert ("preflight", "PreflightDeferred") in rec.reasons() and host.backend.started == 0
    assert rec.reasons(0) == [("preflight", "PreflightPending")], "held from the start"
    host.inventory.busy = {}
    wait_for(lambda: rec.state() == "passed", what="passed")
    assert rec.reasons() == [] and host.backend.started == 1


def test_an_allocated_pod_defers_even_without_a_process(host: Host) -> None:
    pods = Pods([(0, "ml/train-0"), (None, "ml/odd-device")])
    _, rec = start_with(host, pods)
    msg = deferred_message(rec)
    assert "GPU 0: pod ml/train-0" in msg and "a GPU not listed here: pod ml/odd-device" in msg
    assert host.backend.started == 0
    pods.answer = []
    wait_for(lambda: host.backend.started == 1, what="the burn once no pod holds a GPU")


def test_a_kubelet_that_cannot_answer_counts_as_busy(host: Host) -> None:
    from agent.gpu.podresources import PodResourcesError

    pods = Pods(PodResourcesError("the kubelet did not answer in time"))
    _, rec = start_with(host, pods)
    msg = deferred_message(rec)
    assert "cannot tell whether the GPUs are in use" in msg and "did not answer in time" in msg
    wait_for(lambda: pods.calls >= 3, what="asked again")
    assert host.backend.started == 0
    pods.answer = None  # the socket is gone: not a Kubernetes node any more, NVML alone decides
    wait_for(lambda: host.backend.started == 1, what="the burn")


def test_nvml_that_cannot_list_processes_counts_as_busy(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host.inventory, "processes", lambda: None)
    _, rec = host.start()
    assert "NVML is not available to list the GPUs' processes" in deferred_message(rec)
    wait_for(lambda: rec.state() == "deferred", what="state deferred")
    assert host.backend.started == 0


def test_a_pod_that_lands_after_pending_is_seen_just_before_the_burn(host: Host) -> None:
    pods = Pods([])
    pods.after = [(1, "ml/late")]  # idle at the first look, busy at the look just before the burn
    _, rec = start_with(host, pods)
    msg = deferred_message(rec)
    assert "GPU 1: pod ml/late" in msg and host.backend.started == 0
    assert rec.reasons(0) == [("preflight", "PreflightPending")]  # held while it settled
    wait_for(lambda: rec.state() == "deferred", what="back to deferred")
    assert ("preflight", "PreflightPending") not in rec.reasons()


def test_dry_run_never_burns_and_says_what_it_would_do(host: Host) -> None:
    src, rec = host.start(dry_run=True, retest_interval=0.1)
    msg = deferred_message(rec)
    assert msg.startswith("dry run: the boot-time GPU burn is not started") and "would burn 2 GPU(s) now" in msg
    assert rec.state() == "deferred"
    wait_for(lambda: not src._thread.is_alive(), what="the source's thread to end (no re-test in a dry run)")
    assert host.backend.started == 0 and host.state.load(BURN_FILE) is None
    host.inventory.busy = {0: 1}
    _, rec2 = host.start(dry_run=True)
    assert "would wait: GPU 0: pid 4242" in deferred_message(rec2) and host.backend.started == 0


def test_dry_run_shows_a_result_this_boot_already_has(host: Host) -> None:
    first, rec = host.start()
    host.settle(rec, 2)
    first.stop()
    _, rec2 = host.start(dry_run=True)
    host.settle(rec2, 1)
    assert rec2.reasons(0) == [] and rec2.state(0) == "passed" and host.backend.started == 1


class Script:
    """An idleness probe answering from a script: True idle, False busy; it records each answer."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers, self.given = list(answers), []  # type: list[bool]

    def occupancy(self, gpus: Sequence[object]) -> object:
        from agent.burn.idle import Occupancy

        idle = self.answers.pop(0) if self.answers else True
        self.given.append(idle)
        return Occupancy() if idle else Occupancy({0: ("pid 1",)})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), max_size=12))
def test_the_burn_starts_only_after_two_idle_looks_in_a_row(tmp_path_factory: pytest.TempPathFactory, answers: list[bool]) -> None:
    """Whatever the GPUs do between looks, `_wait_idle` returns (and the burn starts) only
    right after an idle look that followed an idle look (the one before PreflightPending and the
    one just before the burn), and it reports PreflightPending only after an idle look."""
    host = Host(tmp_path_factory.mktemp("p"))
    runner = Runner(Settings(plan=BurnPlan(seconds=0.1)), HostPaths(), inventory=host.inventory,
                    backends=[host.backend], watch=lambda: host.watch)  # fmt: skip
    src = PreflightSource(runner, host.state, lambda: "b", Options(settle=0, retry=0), list)  # type: ignore[arg-type]
    probe = Script(answers)
    src.idle = probe  # type: ignore[assignment]
    rec = Recorder()
    from agent.burn.preflight import BurnState

    found = src._wait_idle(rec, BurnState("b"))
    assert len(found.gpus) == 2 and host.backend.started == 0  # _wait_idle itself never burns
    # The model: an idle look reports PreflightPending and is followed by the look just before the
    # burn; only an idle one there starts it; a busy look at either place waits and starts again.
    looks, pendings, i, script = 0, 0, 0, answers + [True] * 2
    while True:
        looks += 1
        if not script[i]:
            i += 1
            continue
        pendings += 1
        looks += 1
        if script[i + 1]:
            break
        i += 2
    assert probe.given == script[:looks] and probe.given[-2:] == [True, True]
    reported = sum(1 for c in rec.calls if ("preflight", "PreflightPending") in [(f.subject, f.reason) for f in c[0]])
    assert reported == pendings
