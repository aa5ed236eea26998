"""The built-in backend's real process machinery, with a stand-in worker
(tests/support/fakeburn/worker.py) that speaks the worker protocol: one process per
GPU, a hung one killed at its deadline while the others finish, a crash or a
missing driver reported for what it is, and no worker outliving the agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agentproc import wait_for
from burnfakes import gpus

from agent.burn.backend import NoWatch
from agent.burn.builtin import BuiltinBackend
from agent.burn.model import BurnPlan, Fault
from agent.burn.orchestrator import run_burn
from agent.burn.verdict import Thresholds

FAKE = str(Path(__file__).parent.parent / "support" / "fakeburn" / "worker.py")
PLAN = BurnPlan(seconds=0.2, matrix_size=8192, hang_timeout=3.0)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead for our purpose
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def scenario(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("FAKE_BURN_PIDS", str(pids))

    def set_(by_gpu: dict[int, str], count: int = 0) -> Path:
        keys = {g.uuid: by_gpu[g.index] for g in gpus(8) if g.index in by_gpu}
        monkeypatch.setenv("FAKE_BURN", json.dumps(keys | {"count": count}))
        return pids

    return set_


def burn(n: int) -> object:
    backend = BuiltinBackend(command=[sys.executable, FAKE])
    return run_burn(backend, gpus(n), PLAN, NoWatch("test"), Thresholds())


def test_every_gpu_gets_its_own_worker_and_passes(scenario) -> None:
    pids = scenario({})
    report = burn(4)
    assert report.status == "pass", report
    assert len(set(pids.iterdir())) == 4
    g = report.gpus[0]
    assert (g.gemm_flops, g.memory_bandwidth) == (700e12, 2.9e12)
    assert "memory test: 60.0 GiB, 4 passes" in g.notes and "not watched by NVML: test" in g.notes


def test_a_hung_worker_is_killed_at_its_deadline_and_the_others_pass(scenario) -> None:
    pids = scenario({1: "hang"})
    report = burn(3)  # returns at all: the hung worker did not hold it up
    assert [g.status for g in report.gpus] == ["pass", "fail", "pass"]
    [p] = report.gpus[1].problems
    assert p.fault is Fault.TIMEOUT and "last seen: gemm" in p.message and p.message.startswith("no result ")
    hung = int((pids / "GPU-00000001.pid").read_text())
    wait_for(lambda: not alive(hung), timeout=5, what="the hung worker to die")


@pytest.mark.parametrize(
    ("what", "status", "fault", "text"),
    [
        pytest.param(
            "crash", "fail", Fault.CUDA_ERROR, "killed by SIGSEGV during gemm: Fatal Python error", id="crash"
        ),
        pytest.param("garbage", "fail", Fault.CUDA_ERROR, "exited with code 0 during gemm", id="no result"),
        pytest.param("mismatch", "fail", Fault.COMPUTE_MISMATCH, "3 of 100 GEMM iterations", id="compute mismatch"),
        pytest.param("memory", "fail", Fault.MEMORY_ERRORS, "17 words read back wrong", id="memory errors"),
        pytest.param("digest", "fail", Fault.COMPUTE_MISMATCH, "differs from GPU(s) 0, 1", id="different digest"),
        pytest.param("slow", "fail", Fault.SLOW_GEMM, "350.0 TFLOP/s is below 85%", id="straggler"),
        pytest.param("unavailable", "unknown", None, "libcuda.so.1", id="no driver"),
    ],
)
def test_what_a_worker_reports(scenario, what: str, status: str, fault: Fault | None, text: str) -> None:
    scenario({2: what})
    report = burn(3)
    g = report.gpus[2]
    assert g.status == status and [x.status for x in report.gpus[:2]] == ["pass", "pass"]
    said = " ".join([p.message for p in g.problems] + list(g.notes))
    assert text in said
    assert [p.fault for p in g.problems] == ([fault] if fault else [])


def test_discover_lists_gpus_through_the_worker(scenario) -> None:
    scenario({}, count=2)
    found = BuiltinBackend(command=[sys.executable, FAKE]).discover()
    assert [(g.index, g.pci_bus_id) for g in found] == [(0, "0000:18:00.0"), (1, "0000:19:00.0")]


@pytest.mark.slow
def test_workers_die_with_the_agent(scenario, tmp_path: Path) -> None:
    """SIGKILL the process running the burn: its workers must not keep burning."""
    pids = scenario({0: "hang", 1: "hang"})
    script = tmp_path / "agent_like.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent.parent / 'support')!r})
        from burnfakes import gpus
        from agent.burn.backend import NoWatch
        from agent.burn.builtin import BuiltinBackend
        from agent.burn.model import BurnPlan
        from agent.burn.orchestrator import run_burn
        from agent.burn.verdict import Thresholds
        run_burn(BuiltinBackend(command=[sys.executable, {FAKE!r}]), gpus(2), BurnPlan(seconds=600),
                 NoWatch("test"), Thresholds())
    """)
    )
    agent = subprocess.Popen([sys.executable, str(script)])
    try:
        files = wait_for(lambda: len(list(pids.iterdir())) == 2 and list(pids.iterdir()), what="two workers")
        workers = [int(f.read_text()) for f in files]
        assert all(alive(p) for p in workers)
        agent.send_signal(signal.SIGKILL)
        agent.wait(5)
        wait_for(lambda: not any(alive(p) for p in workers), timeout=10, what="the workers to die with the agent")
    finally:
        if agent.poll() is None:
            agent.kill()
