"""The preflight as a node lives it: `agent run` starts on a fresh boot with
two GPUs (fake NVML), the real burn workers run through the real
cuda-bindings on the CPU fake driver (tests/support/fakelibcuda), and the fake API
server sees the node held with `<prefix>preflight` until the burn passes, or
kept held with an event naming the GPU that failed; a node whose GPUs have
a process or an allocated pod (fake kubelet) is not burned, and neither is
one in a dry run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakelibcuda
import fakenvml
import pytest
from agentproc import Agent, wait_for

from fakeapi import FakeApiServer
from kube_support import AGENT_KUBE_CONFIG, NODE, PREFIX, conditions, fake, our_taints  # noqa: F401 - fixture

PREFLIGHT = PREFIX + "preflight"


@pytest.fixture
def node(fake_gpu_libs: str, fake: FakeApiServer, tmp_path: Path) -> Iterator[Any]:
    agents: list[Agent] = []
    scenario = fakenvml.Scenario(str(tmp_path / "nvml-scenario")).set([fakenvml.h100(0), fakenvml.h100(1)])
    kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))

    def start(faults: dict[int, str] | None = None, args: tuple[str, ...] = (), extra: str = "") -> Agent:
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
""" + fakelibcuda.QUICK_BURN_CONFIG + extra
        agent = Agent(tmp_path, config, args=["--kubeconfig", kubeconfig, *args], env=env)
        agents.append(agent)
        agent.wait_ready()
        return agent

    start.scenario = scenario  # type: ignore[attr-defined]
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


def burn_workers_started(agent: Agent) -> bool:
    return "burning 2 GPU(s)" in agent.logs()


def test_a_process_on_a_gpu_defers_the_burn_and_does_not_hold_the_node(node: Any, fake: FakeApiServer) -> None:
    node.scenario.gpu(1, procs="4242:1073741824")  # a job on GPU 1
    agent = node()
    wait_for(lambda: agent.value("node_health_burn_preflight_state", state="deferred") == 1, timeout=30,
             what="the preflight deferred")  # fmt: skip
    assert agent.value("node_health_finding", check="burn", subject="preflight", reason="PreflightDeferred",
                       severity="info") == 1  # fmt: skip
    # not pending: a warning not active is absent (metrics.findings_at_zero = "critical"), never 1
    assert not agent.value("node_health_finding", check="burn", subject="preflight", reason="PreflightPending",
                           severity="warning")  # fmt: skip
    # Positive proof the kube side acted on the deferral: it wrote the Preflight condition (False: an info
    # finding holds nothing) — and still no preflight taint and no burn.
    def preflight_condition() -> list[dict[str, Any]]:
        return [c for t, c in conditions(fake).items() if t.endswith("PreflightProblem")]

    (cond,) = wait_for(preflight_condition, what="the Preflight condition")
    assert cond["status"] == "False" and our_taints(fake) == [] and not burn_workers_started(agent), agent.logs()
    node.scenario.gpu(1, procs="")
    wait_for(lambda: agent.value("node_health_burn_preflight_state", state="passed") == 1, timeout=90,
             what="the burn once GPU 1 is idle")  # fmt: skip
    assert agent.value("node_health_burn_gpu_pass", gpu="1") == 1 and burn_workers_started(agent)
    wait_for(lambda: our_taints(fake) == [], what="no preflight taint after the pass")


def test_a_pod_allocated_a_gpu_defers_the_burn(node: Any, fake: FakeApiServer) -> None:
    import os
    import shutil
    import tempfile

    from fakekubelet import FakeKubelet

    root = tempfile.mkdtemp(prefix="nha-", dir="/tmp")  # a unix socket path has 108 bytes
    sock = os.path.join(root, "kubelet.sock")
    uuid0 = str(node.scenario.gpus[0]["uuid"])
    try:
        with FakeKubelet(sock, [("ml", "train-0", {"main": [("nvidia.com/gpu", [uuid0])]})]) as kubelet:
            extra = f'[checks.gpu_pods]\npod_resources_socket = "{sock}"\ncall_timeout = "1s"\n'
            agent = node(extra=extra)
            wait_for(lambda: agent.value("node_health_burn_preflight_state", state="deferred") == 1, timeout=30,
                     what="the preflight deferred by the pod")  # fmt: skip
            assert "GPU 0: pod ml/train-0" in agent.logs() and not burn_workers_started(agent)
            kubelet.set_pods([])
            wait_for(lambda: agent.value("node_health_burn_preflight_state", state="passed") == 1, timeout=90,
                     what="the burn once the pod is gone")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_dry_run_never_starts_the_burn(node: Any, fake: FakeApiServer, tmp_path: Path) -> None:
    agent = node(args=("--dry-run",))
    wait_for(lambda: agent.value("node_health_burn_preflight_state", state="deferred") == 1, timeout=30,
             what="the dry run's deferred preflight")  # fmt: skip
    wait_for(lambda: "dry run: the boot-time GPU burn is not started" in agent.logs(), what="the log line")
    assert "a real run would burn 2 GPU(s) now" in agent.logs()
    assert not burn_workers_started(agent) and agent.value("node_health_burn_gpu_pass", gpu="0") is None
    assert not (tmp_path / "state" / "burn.json").exists(), "a dry run wrote the burn state"


def test_hold_while_deferred_keeps_the_preflight_taint_until_the_burn_passes(node: Any, fake: FakeApiServer) -> None:
    node.scenario.gpu(0, procs="4242:1073741824")
    agent = node(extra="hold_while_deferred = true\n")  # appended to [checks.burn]
    wait_for(lambda: agent.value("node_health_burn_preflight_state", state="deferred") == 1, timeout=30,
             what="the preflight deferred")  # fmt: skip
    wait_for(lambda: our_taints(fake) == [(PREFLIGHT, "PreflightPending", "NoSchedule")], timeout=30,
             what="the node held while the burn waits")  # fmt: skip
    assert not burn_workers_started(agent)
    node.scenario.gpu(0, procs="")
    wait_for(lambda: agent.value("node_health_burn_preflight_state", state="passed") == 1, timeout=90, what="passed")
    wait_for(lambda: our_taints(fake) == [], what="released after the pass")
