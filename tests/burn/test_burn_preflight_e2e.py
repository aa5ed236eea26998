"""The preflight as a node lives it: `agent run` starts on a fresh boot with
two GPUs (fake NVML), the real burn workers run through the real
cuda-bindings on the CPU fake driver (tests/support/fakelibcuda), and the fake API
server sees the node held with `<prefix>preflight` until the burn passes, or
kept held with an event naming the GPU that failed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakelibcuda
import fakenvml
import pytest
from agentproc import Agent, wait_for

from fakeapi import FakeApiServer
from kube_support import AGENT_KUBE_CONFIG, NODE, PREFIX, fake, our_taints  # noqa: F401 - fixture

PREFLIGHT = PREFIX + "preflight"


@pytest.fixture
def node(fake_gpu_libs: str, fake: FakeApiServer, tmp_path: Path) -> Iterator[Any]:
    agents: list[Agent] = []
    scenario = fakenvml.Scenario(str(tmp_path / "nvml-scenario")).set([fakenvml.h100(0), fakenvml.h100(1)])
    kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))

    def start(faults: dict[int, str] | None = None) -> Agent:
        by_uuid = {str(scenario.gpus[i]["uuid"]): f for i, f in (faults or {}).items()}
        env = fakelibcuda.env(fake_gpu_libs, by_uuid) | {"FAKE_NVML_SCENARIO": scenario.path, "NODE_NAME": NODE}
        config = AGENT_KUBE_CONFIG + f"""
[checks.disk]
enabled = false
[checks.network]
enabled = false
[checks.gpu]
nvml_library = "{fake_gpu_libs}/libnvidia-ml.so.1"
xid_events = false
""" + fakelibcuda.QUICK_BURN_CONFIG
        agent = Agent(tmp_path, config, args=["--kubeconfig", kubeconfig], env=env)
        agents.append(agent)
        agent.wait_ready()
        return agent

    yield start
    for a in agents:
        a.stop()


def test_the_node_is_held_until_the_burn_passes_then_released(node: Any, fake: FakeApiServer) -> None:
    agent = node()
    wait_for(lambda: our_taints(fake) == [(PREFLIGHT, "PreflightPending", "NoSchedule")], timeout=30,
             what="the preflight taint while the burn runs")  # fmt: skip
    wait_for(lambda: our_taints(fake) == [], timeout=90, what="the preflight taint removed after a pass")
    wait_for(lambda: agent.value("node_health_burn_preflight_state", state="passed") == 1, what="state passed")
    for gpu in ("0", "1"):
        assert agent.value("node_health_burn_gpu_pass", gpu=gpu) == 1, agent.logs()
        assert (agent.value("node_health_burn_gpu_gemm_flops_per_second", gpu=gpu) or 0) > 0
        assert (agent.value("node_health_burn_gpu_memory_bandwidth_bytes_per_second", gpu=gpu) or 0) > 0


def test_a_gpu_that_computes_wrong_keeps_the_node_held_and_is_named(node: Any, fake: FakeApiServer) -> None:
    """GPU 1 adds 1.0 to every result: its host check fails, so GPU 0 (the
    only other GPU: a tie of digests) is not blamed with it."""
    agent = node({1: "wrong"})
    wait_for(lambda: our_taints(fake) == [(PREFLIGHT, "PreflightFailed", "NoSchedule")], timeout=90,
             what="PreflightFailed")  # fmt: skip
    assert agent.value("node_health_burn_gpu_pass", gpu="0") == 1 and agent.value("node_health_burn_gpu_pass", gpu="1") == 0

    def failed_events() -> list[dict[str, Any]]:
        events = fake.objects("events.k8s.io", "events", "default")
        return [e for e in events if e["reason"] == "PreflightFailed"]

    # events wait their turn behind the taint and condition writes (qps 0.2 after the burst)
    (event,) = wait_for(failed_events, timeout=60, what="the PreflightFailed event")
    assert event["type"] == "Warning" and event["regarding"]["name"] == NODE
    assert "GPU 1" in event["note"] and "compute_mismatch" in event["note"] and "the host computes" in event["note"]
