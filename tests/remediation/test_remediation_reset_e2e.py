"""`agent run` on a Kubernetes node with two GPUs: a reset_gpu Xid on GPU X, the
whole way through the real lookups and back to a released node, no reboot.

- who holds X comes from the real attribution (`agent.gpu.attribution` over
  the PodResources client) against a fake kubelet (real gRPC on a unix
  socket) and the kubelet's pod log directories; NVML is the fake library;
- the pods go through the Eviction API of the fake API server: only X's pod,
  never Y's nor the DaemonSet's;
- the reset runs the fake nvidia-smi with X's UUID, persistence toggled;
- the verified reset is told to the Xid stream (agent.gpu.resets), which drops
  X's reset_gpu finding: the taint goes, the disruption slot is freed."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentproc import Agent, wait_for
from fakebins import FakeBins
from fakekubelet import FakeKubelet
from fakenvml import h100
from fakenvml.fixtures import HostTree, fake_nvml_lib, scenario  # noqa: F401 - fixtures

from fakeapi import FakeApiServer
from kube_support import AGENT_KUBE_CONFIG, NODE, PREFIX, fake  # noqa: F401 - fixture

pytestmark = pytest.mark.slow

DISRUPTION_NS, DISRUPTION_QUOTA = "node-health-disruption", "node-health-disruption-budget"
GPU_X, GPU_Y = h100(0)["uuid"], h100(1)["uuid"]
PCI_X, PCI_Y = "0000:18:00", "0000:28:00"
XID119_X = (f"4,1000,{{usec}},-;NVRM: Xid (PCI:{PCI_X}): 119, pid=2231, name=python3, "
            "Timeout after 6s of waiting for RPC response from GPU0 GSP!\n")


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="nha-", dir="/tmp")  # short: a unix socket path has 108 bytes
    os.makedirs(os.path.join(path, "pods"))
    yield path
    shutil.rmtree(path)


def our_taints(fake: FakeApiServer) -> list[str]:
    return [t["key"] for t in fake.node(NODE)["spec"].get("taints", []) if t["key"].startswith(PREFIX)]


def evicted(fake: FakeApiServer) -> list[str]:
    return sorted(r.path.split("/pods/")[1].split("/")[0] for r in fake.log() if r.path.endswith("/eviction") and r.status == 201)


def test_a_reset_xid_on_one_gpu_evicts_only_its_pod_resets_it_and_releases_the_node(
        fake: FakeApiServer, tmp_path: Path, scenario, fake_nvml_lib, kubelet_root: str) -> None:  # noqa: F811
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
    fake.set_quota("node-health-disrupted", "node-health-disrupted", 30)  # the fleet breaker's records
    x = fake.add_pod("ml", "train-x", NODE, grace=1)
    y = fake.add_pod("ml", "train-y", NODE, grace=1)
    fake.add_pod("monitoring", "exporter", NODE, owner=("DaemonSet", "exporter"))
    for pod in (x, y):  # the kubelet's log directories name each pod's UID
        os.makedirs(os.path.join(kubelet_root, "pods", f"ml_{pod['metadata']['name']}_{pod['metadata']['uid']}"))
    host = HostTree(str(tmp_path / "host"))
    host.add_gpu(PCI_X)
    host.add_gpu(PCI_Y)
    scenario.set([h100(0), h100(1)])  # no process on either GPU: the kubelet's allocations say who holds them
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(XID119_X.format(usec=int(time.monotonic() * 1e6)))
    bins = FakeBins(tmp_path / "bins")
    extra = f"""interval = "1s"
kmsg_path = "{kmsg}"
[checks.gpu_pods]
call_timeout = "2s"
pod_resources_socket = "{kubelet_root}/kubelet.sock"
pod_logs_dir = "{kubelet_root}/pods"
[checks.burn]
enabled = false
[checks.disk]
enabled = false
[checks.network]
enabled = false
[kubernetes.hysteresis]
clear_cycles = 1
clear_after = "1s"
[kubernetes.drain]
poll_interval = "1s"
retry_interval = "1s"
retry_max = "2s"
qps = 50.0
burst = 50
[remediation]
mode = "enforce"
actions = ["drain", "reset_gpu", "reboot"]
interval = "1s"
reset_gpu_after = "0s"
[remediation.gpu_reset]
nvidia_smi = "{bins.path('nvidia-smi')}"
verify_burn = "0s"
"""
    toml = host.toml(str(tmp_path / "state"), extra, fake_nvml_lib) + AGENT_KUBE_CONFIG
    allocated = [("ml", "train-x", {"main": [("nvidia.com/gpu", [GPU_X])]}),
                 ("ml", "train-y", {"main": [("nvidia.com/gpu", [GPU_Y])]})]
    with FakeKubelet(os.path.join(kubelet_root, "kubelet.sock"), allocated):
        a = Agent(tmp_path, toml, ("--kubeconfig", fake.kubeconfig(str(tmp_path / "kubeconfig"))),
                  env={"PATH": bins.env_path(), "NODE_NAME": NODE})
        try:
            a.wait_ready()
            wait_for(lambda: our_taints(fake), timeout=60, what="the node tainted for the Xid")
            wait_for(lambda: ["-i", GPU_X, "-pm", "1"] in bins.calls("nvidia-smi"), timeout=90, what="the reset of X, done")
            assert evicted(fake) == ["train-x"], "only the pod that holds X"
            names = sorted(p["metadata"]["name"] for p in fake.pods(NODE))
            assert names == ["exporter", "train-y"]
            acts = [c for c in bins.calls("nvidia-smi") if not any(v.startswith("--query") for v in c)]
            assert acts[:3] == [["-i", GPU_X, "-pm", "0"], ["--gpu-reset", "-i", GPU_X], ["-i", GPU_X, "-pm", "1"]]
            assert not any(GPU_Y in c for c in bins.calls("nvidia-smi")), "Y is never touched"
            a.poll(lambda _: a.value("node_health_finding", check="xid", subject="gpu0", reason="Xid119") in (None, 0),
                   timeout=60, what="the Xid finding gone after the verified reset")
            wait_for(lambda: not our_taints(fake), timeout=60, what="the taint removed")
            wait_for(lambda: not fake.objects("coordination.k8s.io", "leases", DISRUPTION_NS), timeout=60,
                     what="the disruption slot freed")
            a.poll(lambda _: a.value("node_health_remediation_step", step="idle") == 1, what="released")
            assert bins.calls("systemctl") == [], "no reboot"
            assert a.value("node_health_remediation_actions_total", action="reset_gpu", result="ok") == 1
            assert evicted(fake) == ["train-x"]
        finally:
            assert a.stop() == 0, a.logs()
