"""End to end: `agent run` with the fake NVML and a fake kubelet PodResources
server (real gRPC on a unix socket): the allocation join series appear for
allocated GPUs and vanish with their pods; NVML's processes are attributed to
their pod through a real cgroup; a hung kubelet is a finding, never a stall."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from agentproc import Agent
from cgroup_lab import process_in_cgroup
from fakekubelet import FakeKubelet
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

pytestmark = pytest.mark.slow

UID = "3f7c2a1e-9b4d-4c2e-8f6a-1d2e3f4a5b6c"
GPU0, GPU1 = h100(0)["uuid"], h100(1)["uuid"]


def alloc(gpu: str, device: str, ns: str, pod: str, container: str, resource: str = "nvidia.com/gpu") -> str:
    return (f'node_health_gpu_allocation{{container="{container}",device="{device}",gpu="{gpu}",'
            f'namespace="{ns}",pod="{pod}",resource="{resource}"}} 1.0')


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="nha-", dir="/tmp")  # short: a unix socket path has 108 bytes
    os.makedirs(os.path.join(path, "pods"))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def agent(tmp_path, host, scenario, fake_nvml_lib, kubelet_root) -> Iterator[Agent]:
    host.add_gpu("0000:18:00")
    host.add_gpu("0000:28:00")
    scenario.set([h100(0), h100(1)])
    extra = (f'xid_events = false\n[checks.gpu_pods]\ninterval = "1s"\ncall_timeout = "1s"\n'
             f'pod_resources_socket = "{kubelet_root}/kubelet.sock"\npod_logs_dir = "{kubelet_root}/pods"\n'
             '[checks.burn]\nenabled = false\n')
    toml = host.toml(str(tmp_path / "state"), extra, fake_nvml_lib).replace("[agent]\n", "[agent]\njitter = 0.0\n")
    a = Agent(tmp_path, toml)
    yield a
    a.stop()


def test_allocation_series_follow_the_kubelets_pods(agent: Agent, kubelet_root: str) -> None:
    text = agent.poll(lambda t: "node_health_pod_resources_up 0.0" in t and t, "no socket yet: up 0")
    assert 'reason="PodResourcesUnavailable"' not in text.replace('reason="PodResourcesUnavailable",severity="warning",subject="pod_resources"} 0.0', "")
    pods = [
        ("ml", "train-0", {"main": [("nvidia.com/gpu", [GPU0])]}),
        ("ml", "infer-1", {"srv": [("nvidia.com/gpu.shared", [f"{GPU1}::2"])], "log": []}),
        ("other", "nic-only", {"c": [("example.com/nic", ["nic0"])]}),
    ]
    with FakeKubelet(os.path.join(kubelet_root, "kubelet.sock"), pods) as kubelet:
        text = agent.poll(lambda t: alloc("0", GPU0, "ml", "train-0", "main") in t and t, "train-0 on gpu 0")
        assert alloc("1", f"{GPU1}::2", "ml", "infer-1", "srv", "nvidia.com/gpu.shared") in text
        assert "node_health_pod_resources_up 1.0" in text
        assert "nic-only" not in text and text.count("node_health_gpu_allocation{") == 2

        kubelet.set_pods(pods[1:])  # train-0 is gone
        text = agent.poll(lambda t: "train-0" not in t and t, "train-0's series gone")
        assert alloc("1", f"{GPU1}::2", "ml", "infer-1", "srv", "nvidia.com/gpu.shared") in text

        kubelet.hang()  # the kubelet accepts and never answers: a finding, and /metrics still serves
        agent.poll(lambda t: 'reason="PodResourcesUnavailable",severity="warning",subject="pod_resources"} 1.0' in t,
                   "PodResourcesUnavailable")
        assert agent.get("/healthz")[0] == 200
        assert agent.value("node_health_pod_resources_up") == 0.0
        kubelet.hang(False)
        agent.poll(lambda t: "node_health_pod_resources_up 1.0" in t, "the kubelet back")


@pytest.mark.privileged
def test_processes_on_a_gpu_are_attributed_to_their_pod(agent: Agent, scenario, host, kubelet_root: str) -> None:
    os.makedirs(os.path.join(kubelet_root, "pods", f"ml_privileged-0_{UID}"))
    rel = f"kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{'ab' * 32}.scope"
    with process_in_cgroup("cgroup2", rel) as pid:
        os.symlink(f"/proc/{pid}", os.path.join(host.proc, str(pid)))  # the fixture host's /proc shows the real process
        scenario.gpu(1, procs=f"{pid}:4294967296 999999:1024")  # 999999: a PID with no /proc entry
        labels = f'gpu="1",kind="pod",namespace="ml",owner="{UID}",pod="privileged-0"'
        text = agent.poll(lambda t: f"node_health_gpu_processes{{{labels}}} 1.0" in t and t, "the pod's process")
        assert f"node_health_gpu_process_memory_bytes{{{labels}}} 4.294967296e+09" in text
        assert 'node_health_gpu_processes{gpu="1",kind="unknown",namespace="",owner="",pod=""} 1.0' in text
    scenario.gpu(1, procs="")
    agent.poll(lambda t: "node_health_gpu_processes{" not in t, "the process gone")
