"""Who holds a GPU (agent.gpu.attribution): the fake NVML's process lists traced
through real cgroups, the fake kubelet's allocations, pod UIDs from the kubelet's
log directories; and never "nobody" when a source cannot tell."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from cgroup_lab import process_in_cgroup
from fakekubelet import FakeKubelet
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

from agent.gpu.attribution import AttributionError, Gpu, GpuAttribution, allocations, gpu_of
from agent.gpu import podresources as pr
from agent.hostpaths import HostPaths

UID_A = "3f7c2a1e-9b4d-4c2e-8f6a-1d2e3f4a5b6c"
UID_B = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
GPU0 = h100(0)["uuid"]
GPU1 = h100(1)["uuid"]


@pytest.fixture
def root() -> Iterator[str]:
    """A host root short enough for a unix socket path (108 bytes)."""
    path = tempfile.mkdtemp(prefix="nha-", dir="/tmp")
    os.makedirs(os.path.join(path, "var/log/pods"))
    yield path
    shutil.rmtree(path)


def pod_logs(root: str, *pods: tuple[str, str, str]) -> None:
    for ns, name, uid in pods:
        os.makedirs(os.path.join(root, "var/log/pods", f"{ns}_{name}_{uid}"), exist_ok=True)


def attribution(root: str, lib: str, **kw: object) -> GpuAttribution:
    return GpuAttribution(HostPaths(rootfs=root), library=lib, socket="/k.sock", **kw)  # type: ignore[arg-type]


GPUS = [Gpu(0, "GPU-aaaa", ("MIG-0001", "MIG-0002")), Gpu(1, "GPU-bbbb")]


@pytest.mark.parametrize(
    ("device", "gpu"),
    [
        pytest.param("GPU-bbbb", 1, id="uuid"),
        pytest.param("MIG-0002", 0, id="MIG device uuid"),
        pytest.param("MIG-GPU-bbbb/1/0", 1, id="MIG id before driver 470"),
        pytest.param("GPU-aaaa::3", 0, id="time-sliced replica"),
        pytest.param("1", 1, id="index strategy"),
        pytest.param("0:1", 0, id="index strategy, MIG"),
        pytest.param("nvidia1", 1, id="GKE"),
        pytest.param("nvidia0/gi2", 0, id="GKE MIG"),
        pytest.param("nvidia1/vgpu4", 1, id="GKE shared"),
        pytest.param("GPU-cccc", None, id="a GPU not on this node"),
        pytest.param("7", None, id="an index past the last GPU"),
        pytest.param("MIG-0003", None, id="an unknown MIG device"),
    ],
)
def test_device_id_to_gpu_index(device: str, gpu: int | None) -> None:
    assert gpu_of(device, GPUS) == gpu


def test_allocations_keep_gpu_resources_only() -> None:
    pods = [pr.Pod("ml", "p", (pr.Container("c", (
        pr.Devices("nvidia.com/gpu", ("GPU-aaaa",)), pr.Devices("nvidia.com/gpu.shared", ("GPU-bbbb::1",)),
        pr.Devices("nvidia.com/mig-1g.10gb", ("MIG-0001",)), pr.Devices("example.com/nic", ("nic0",)),
        pr.Devices("example.com/gpu", ("1",)),
    )),))]
    got = [(a.device, a.gpu) for a in allocations(pods, GPUS, ("example.com/gpu",))]
    assert got == [("GPU-aaaa", 0), ("GPU-bbbb::1", 1), ("MIG-0001", 0), ("1", 1)]


def test_processes_on_gpu_are_nvml_compute_and_graphics(scenario, fake_nvml_lib, root) -> None:
    scenario.set([h100(0, procs="4100:1048576 4200:2097152", gprocs="4200:2097152 4300:0"), h100(1)])
    a = attribution(root, fake_nvml_lib)
    assert a.processes_on_gpu(GPU0) == (4100, 4200, 4300)
    assert a.processes_on_gpu(GPU1) == ()


def test_graphics_list_not_supported_is_no_graphics_process(scenario, fake_nvml_lib, root) -> None:
    scenario.set([h100(0, procs="4100:1", gprocs="NS")])
    assert attribution(root, fake_nvml_lib).processes_on_gpu(GPU0) == (4100,)


@pytest.mark.parametrize("procs", ["LOST", "ERR 999", "NS"])
def test_processes_unknown_is_an_error_never_an_empty_answer(scenario, fake_nvml_lib, root, procs) -> None:
    scenario.set([h100(0, procs=procs)])
    with pytest.raises(AttributionError):
        attribution(root, fake_nvml_lib).processes_on_gpu(GPU0)


def test_a_hung_process_list_is_an_error(scenario, fake_nvml_lib, root) -> None:
    scenario.set([h100(0, procs="4100:1")], **{"hang.nvmlDeviceGetComputeRunningProcesses_v3": 3})
    with pytest.raises(AttributionError, match="has not answered"):
        attribution(root, fake_nvml_lib, call_timeout=0.3).processes_on_gpu(GPU0)


def test_an_unknown_gpu_is_an_error(scenario, fake_nvml_lib, root) -> None:
    scenario.set([h100(0)])
    with pytest.raises(AttributionError, match="no GPU"):
        attribution(root, fake_nvml_lib).processes_on_gpu("GPU-not-here")


@pytest.mark.privileged
def test_pods_on_gpu_joins_nvml_processes_through_cgroups_and_kubelet_allocations(scenario, fake_nvml_lib, root) -> None:
    """Pod A runs a process on GPU 0 (a privileged pod: nothing allocated to it);
    pod B was allocated GPU 0 by the kubelet. Both hold it; GPU 1 is free."""
    pod_logs(root, ("ml", "train-b", UID_B), ("ml", "other", "9" * 32))
    rel = f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_A.replace('-', '_')}.slice/cri-containerd-{'ef' * 32}.scope"
    with process_in_cgroup("cgroup2", rel) as pid, FakeKubelet(os.path.join(root, "k.sock"), [("ml", "train-b", {"c": [("nvidia.com/gpu", [GPU0])]})]):
        scenario.set([h100(0, procs=f"{pid}:1048576"), h100(1)])
        a = attribution(root, fake_nvml_lib)
        assert a.pods_on_gpu(GPU0) == frozenset({UID_A, UID_B})
        assert a.pods_on_gpu(GPU1) == frozenset()
        assert a.processes_on_gpu(GPU0) == (pid,)
        snap = a.snapshot()
        assert [(p.pid, p.gpu, p.owner.kind, p.owner.name) for p in snap.processes] == [(pid, 0, "pod", UID_A)]


def test_a_lost_gpu_is_answered_from_the_kubelet(scenario, fake_nvml_lib, root) -> None:
    pod_logs(root, ("ml", "train-b", UID_B))
    scenario.set([h100(0, procs="LOST")])
    with FakeKubelet(os.path.join(root, "k.sock"), [("ml", "train-b", {"c": [("nvidia.com/gpu", [GPU0])]})]):
        assert attribution(root, fake_nvml_lib).pods_on_gpu(GPU0) == frozenset({UID_B})


def test_mig_devices_count_for_their_gpu(scenario, fake_nvml_lib, root) -> None:
    pod_logs(root, ("ml", "infer", UID_A))
    scenario.set([h100(0, mig="MIG-11111111-2222-3333-4444-555555555555 MIG-66666666-2222-3333-4444-555555555555"), h100(1)])
    with FakeKubelet(os.path.join(root, "k.sock"), [("ml", "infer", {"c": [("nvidia.com/mig-1g.10gb", ["MIG-66666666-2222-3333-4444-555555555555"])]})]):
        a = attribution(root, fake_nvml_lib)
        assert a.gpus()[0].migs == ("MIG-11111111-2222-3333-4444-555555555555", "MIG-66666666-2222-3333-4444-555555555555")
        assert a.pods_on_gpu(GPU0) == frozenset({UID_A})
        assert a.pods_on_gpu(GPU1) == frozenset()


def test_neither_source_answering_is_an_error(scenario, fake_nvml_lib, root) -> None:
    scenario.set([h100(0, procs="ERR 999")])
    with pytest.raises(AttributionError, match="Unknown Error"):
        attribution(root, fake_nvml_lib).pods_on_gpu(GPU0)  # no kubelet socket here
    with FakeKubelet(os.path.join(root, "k.sock"), []) as kubelet:
        kubelet.fail("UNAVAILABLE", "down")
        with pytest.raises(AttributionError, match="PodResources: .*down"):
            attribution(root, fake_nvml_lib).pods_on_gpu(GPU0)


def test_gpu_users_says_none_when_it_cannot_tell(scenario, fake_nvml_lib, root, caplog) -> None:
    from agent.gpu.attribution import GpuUsers

    scenario.set([h100(0, procs="4100:1"), h100(1, procs="LOST")])
    users = GpuUsers(attribution(root, fake_nvml_lib))
    assert users.processes_on_gpu(GPU0) == (4100,)
    assert users.pods_on_gpu(GPU0) == frozenset()  # pid 4100 is no pod's (or gone)
    assert users.processes_on_gpu(GPU1) is None and users.pods_on_gpu(GPU1) is None
    assert users.processes_on_gpu(GPU1) is None
    assert sum("cannot be told" in r.message for r in caplog.records) == 2  # once per lookup while the cause stays


def test_a_hostile_kubelet_reaches_the_fallback(scenario, fake_nvml_lib, root) -> None:
    """Issue 25 item 4: a kubelet socket flooding CONTINUATION frames (h2 ProtocolError before, which escaped
    and failed the check and the ladder's tick) is an AttributionError naming the socket: GpuUsers then says
    "cannot tell" (None), which the ladder answers with the whole node."""
    from fakekubelet import continuation_flood, hostile

    from agent.gpu.attribution import GpuUsers

    scenario.set([h100(0, procs="LOST")])
    sock = os.path.join(root, "k.sock")
    t = hostile(sock, continuation_flood)
    with pytest.raises(AttributionError, match="PodResources: List on .*k.sock"):
        attribution(root, fake_nvml_lib).pods_on_gpu(GPU0)
    t.join(15)
    os.unlink(sock)
    t = hostile(sock, continuation_flood)
    assert GpuUsers(attribution(root, fake_nvml_lib)).pods_on_gpu(GPU0) is None
    t.join(15)
