"""The gpu_pods engine without an agent around it: what it exports when NVML or
the kubelet is missing, and the samples it builds from both."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from fakekubelet import FakeKubelet
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

from agent.findings import ObservationBuilder
from agent.gpu.catalog import CATALOG
from agent.gpu.pods import GpuPodsMonitor
from agent.gpu.settings import GpuConfig, GpuPodsConfig
from agent.hostpaths import HostPaths


@pytest.fixture
def root() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="nha-", dir="/tmp")
    yield path
    shutil.rmtree(path)


def run(monitor: GpuPodsMonitor):  # type: ignore[no-untyped-def]
    b = ObservationBuilder("gpu_pods", CATALOG)
    monitor.run(b)
    return b.build()


def samples(obs, name: str) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    return [dict(s.labels) | {"value": str(s.value)} for s in obs.samples if s.name == name]


def test_without_nvml_allocations_are_exported_without_their_gpu(root: str) -> None:
    cfg = GpuPodsConfig(pod_resources_socket="/k.sock")
    monitor = GpuPodsMonitor(HostPaths(rootfs=root), cfg, GpuConfig(nvml_library="/no/libnvidia-ml.so.1"))
    with FakeKubelet(os.path.join(root, "k.sock"), [("ml", "a", {"c": [("nvidia.com/gpu", ["GPU-x"])]})]):
        obs = run(monitor)
    assert samples(obs, "node_health_gpu_allocation") == [
        {"gpu": "", "device": "GPU-x", "resource": "nvidia.com/gpu", "namespace": "ml", "pod": "a", "container": "c", "value": "1.0"}
    ]
    assert samples(obs, "node_health_pod_resources_up") == [{"value": "1.0"}]
    assert list(obs.findings) == []
    assert "no GPU list from NVML" in dict(obs.subjects)["gpus"]


def test_no_socket_is_up_0_and_no_finding(root: str) -> None:
    monitor = GpuPodsMonitor(HostPaths(rootfs=root), GpuPodsConfig(pod_resources_socket="/k.sock"), GpuConfig(nvml_library="/no/lib"))
    obs = run(monitor)
    assert samples(obs, "node_health_pod_resources_up") == [{"value": "0.0"}]
    assert list(obs.findings) == []
    assert monitor.known_findings() == [("pod_resources", "PodResourcesUnavailable")]


def test_kubelet_off_asks_nothing(root: str) -> None:
    monitor = GpuPodsMonitor(HostPaths(rootfs=root), GpuPodsConfig(pod_resources_socket=""), GpuConfig(nvml_library="/no/lib"))
    obs = run(monitor)
    assert samples(obs, "node_health_pod_resources_up") == [] and monitor.known_findings() == []


def test_a_gpu_whose_processes_cannot_be_listed_is_a_finding(scenario, fake_nvml_lib, root: str) -> None:
    scenario.set([h100(0, procs="LOST"), h100(1, procs="77:5")])
    monitor = GpuPodsMonitor(HostPaths(procfs=root), GpuPodsConfig(pod_resources_socket=""), GpuConfig(nvml_library=fake_nvml_lib))
    obs = run(monitor)
    assert [(f.subject, f.reason) for f in obs.findings] == [("gpu0", "GpuProcessesUnknown")]
    assert samples(obs, "node_health_gpu_processes") == [
        {"gpu": "1", "kind": "unknown", "owner": "", "namespace": "", "pod": "", "value": "1.0"}
    ]
    assert samples(obs, "node_health_gpu_process_memory_bytes")[0]["value"] == "5.0"
