"""The GPU stack around the GPU (issue 13, item 3): persistence mode, Fabric
Manager / the NVLink fabric, nvidia_peermem beside InfiniBand, PCIe replays.
Each finding's severity comes from the catalog; near-misses must stay quiet."""

from __future__ import annotations

import os

import pytest
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

from agent.checks.gpu import GpuCheck
from agent.findings import Observation, ObservationBuilder, Severity
from agent.gpu.catalog import CATALOG
from agent.gpu.judge import Limits, judge
from agent.gpu.reading import Fabric, GpuReading

C, W = Severity.CRITICAL, Severity.WARNING


def found(obs: Observation) -> dict[tuple[str, str], Severity]:
    return {(f.subject, f.reason): f.severity for f in obs.findings}


def sample(obs: Observation, name: str, **labels: str) -> float | None:
    for s in obs.samples:
        if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items()):
            return s.value
    return None


def poll(gpu_context, extra: str = "") -> Observation:
    ctx, cfg = gpu_context("xid_events = false\n" + extra)
    return GpuCheck(ctx, cfg).run()


@pytest.mark.parametrize(
    ("fields", "extra", "expected"),
    [
        pytest.param({"persistence": 0}, "", {"GpuPersistenceModeOff": W}, id="persistence off"),
        pytest.param({"persistence": 1}, "", {}, id="persistence on"),
        pytest.param({"persistence": "NS"}, "", {}, id="near miss: persistence not applicable"),
        pytest.param({"fabric": "3 0 0 1"}, "", {}, id="fabric completed, healthy"),
        pytest.param({"fabric": "3 0"}, "", {}, id="fabric completed, no health summary"),
        pytest.param({"fabric": "3 0 0 2"}, "", {"GpuFabricUnhealthy": C}, id="fabric unhealthy"),
        pytest.param({"fabric": "3 0 0 3"}, "", {"GpuFabricUnhealthy": W}, id="fabric limited capacity"),
        pytest.param({"fabric": "3 999 0 1"}, "", {"GpuFabricUnhealthy": C}, id="fabric training failed"),
        pytest.param({"fabric": "1 0"}, 'fabric_manager_grace = "0s"\n', {"FabricManagerNotRunning": C}, id="fabric not started"),
        pytest.param({"fabric": "2 0"}, 'fabric_manager_grace = "0s"\n', {"FabricManagerNotRunning": C}, id="fabric training stuck"),
        pytest.param({"fabric": "1 0"}, "", {}, id="near miss: not started, within the grace"),
        pytest.param({"fabric": "0 0"}, 'fabric_manager_grace = "0s"\n', {}, id="near miss: fabric not supported"),
        pytest.param({"pcie.replay": "NS"}, "", {}, id="near miss: replay counter not applicable"),
    ],
)
def test_stack_findings_per_gpu(gpu_context, scenario, fields, extra, expected) -> None:
    scenario.set([h100(0, **fields)])
    obs = poll(gpu_context, extra)
    assert {r: s for (_, r), s in found(obs).items()} == expected


@pytest.mark.parametrize(
    ("fields", "reason", "action"),
    [
        pytest.param({"persistence": 0}, "GpuPersistenceModeOff", "none", id="persistence off: a setting, none"),
        pytest.param({"fabric": "3 0 0 2"}, "GpuFabricUnhealthy", "reboot", id="fabric unhealthy: reboot"),
        pytest.param({"fabric": "3 0 0 3"}, "GpuFabricUnhealthy", "drain_and_diagnose", id="limited capacity: diagnose"),
        pytest.param({"fabric": "1 0"}, "FabricManagerNotRunning", "drain_and_diagnose", id="FM not running: diagnose"),
    ],
)
def test_actions_come_from_the_catalog(gpu_context, scenario, fields, reason: str, action: str) -> None:
    scenario.set([h100(0, **fields)])
    obs = poll(gpu_context, 'fabric_manager_grace = "0s"\n')
    assert [(f.reason, f.action) for f in obs.findings] == [(reason, action)]


def test_old_driver_without_fabric_info_v_falls_back_to_the_first_struct(gpu_context, scenario) -> None:
    scenario.set([h100(0, fabric="1 0")], fabric_v=0)
    obs = poll(gpu_context, 'fabric_manager_grace = "0s"\n')
    assert found(obs) == {("gpu0", "FabricManagerNotRunning"): C}
    assert sample(obs, "node_health_gpu_fabric_state", gpu="0") == 1


def test_metrics_of_the_stack(gpu_context, scenario) -> None:
    scenario.set([h100(0, **{"pcie.replay": 17, "fabric": "3 0 0 1"})])
    obs = poll(gpu_context)
    assert sample(obs, "node_health_gpu_pcie_replay_total", gpu="0") is None, "the telemetry check's series, not this one's"
    assert sample(obs, "node_health_gpu_persistence_mode", gpu="0") == 1
    assert sample(obs, "node_health_gpu_fabric_state", gpu="0") == 3


def judged(r: GpuReading, prev: dict, now: float, limits: Limits) -> tuple[dict[str, Severity], dict]:
    b = ObservationBuilder("gpu", CATALOG)
    state = judge(r, prev, limits, now, b)
    return {f.reason: f.severity for f in b.build().findings}, state


@pytest.mark.parametrize(
    ("before", "after", "seconds", "expected"),
    [
        pytest.param(100, 109, 60, {"PcieReplayRate": W}, id="9 per minute"),
        pytest.param(100, 108, 60, {}, id="near miss: 8 per minute is the limit"),
        pytest.param(100, 100, 60, {}, id="no replays"),
        pytest.param(100, 5, 60, {}, id="counter restarted with the driver: 5 new"),
        pytest.param(100, 120, 60, {"PcieReplayRate": W}, id="20 per minute"),
        pytest.param(100, 120, 600, {}, id="near miss: 20 in 10 minutes"),
    ],
)
def test_replay_rate(before: int, after: int, seconds: float, expected: dict[str, Severity]) -> None:
    limits = Limits(1000.0, 100.0, pcie_replays_per_minute=8.0)
    _, state = judged(GpuReading(0, pcie_replay=before), {}, 1000.0, limits)
    got, _ = judged(GpuReading(0, pcie_replay=after), state, 1000.0 + seconds, limits)
    assert got == expected


def test_replay_rate_zero_turns_it_off() -> None:
    limits = Limits(1000.0, 100.0, pcie_replays_per_minute=0.0)
    _, state = judged(GpuReading(0, pcie_replay=0), {}, 0.0, limits)
    assert judged(GpuReading(0, pcie_replay=10_000), state, 60.0, limits)[0] == {}


def test_fabric_grace_counts_from_the_first_sighting_and_ends_when_trained() -> None:
    limits = Limits(1000.0, 100.0, fabric_grace=300.0)
    got, state = judged(GpuReading(0, fabric=Fabric(1, 0)), {}, 1000.0, limits)
    assert got == {}
    got, state = judged(GpuReading(0, fabric=Fabric(2, 0)), state, 1299.0, limits)
    assert got == {}, "299 s: still within the grace"
    got, state = judged(GpuReading(0, fabric=Fabric(2, 0)), state, 1300.0, limits)
    assert got == {"FabricManagerNotRunning": C}
    got, state = judged(GpuReading(0, fabric=Fabric(3, 0, 1)), state, 1330.0, limits)
    assert got == {} and "fabric_since" not in state
    got, _ = judged(GpuReading(0, fabric=Fabric(1, 0)), state, 1360.0, limits)
    assert got == {}, "not trained again: a new grace"


# ---------------------------------------------------------------- the host around the GPUs


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def nvswitch(host, n: int = 4) -> None:
    for i in range(n):
        d = os.path.join(host.sys, "bus/pci/devices", f"0000:{0x05 + i:02x}:00.0")
        write(os.path.join(d, "vendor"), "0x10de\n")
        write(os.path.join(d, "class"), "0x068000\n")


FM_CG2 = "fs/cgroup/system.slice/nvidia-fabricmanager.service"
FM_CG1 = "fs/cgroup/systemd/system.slice/nvidia-fabricmanager.service"


@pytest.mark.parametrize(
    ("switches", "setup", "fabric", "expected"),
    [
        pytest.param(4, {}, "NS", {("gpus", "FabricManagerNotRunning"): C}, id="NVSwitch system, FM not running"),
        pytest.param(4, {f"sys/{FM_CG2}/cgroup.events": "populated 1\nfrozen 0\n"}, "NS", {}, id="FM running (cgroup v2)"),
        pytest.param(4, {f"sys/{FM_CG2}/cgroup.events": "populated 0\nfrozen 0\n"}, "NS",
                     {("gpus", "FabricManagerNotRunning"): C}, id="FM unit stopped (empty cgroup v2)"),
        pytest.param(4, {f"sys/{FM_CG1}/cgroup.procs": "2345\n"}, "NS", {}, id="FM running (cgroup v1)"),
        pytest.param(4, {f"sys/{FM_CG1}/cgroup.procs": ""}, "NS",
                     {("gpus", "FabricManagerNotRunning"): C}, id="FM stopped (empty cgroup v1)"),
        pytest.param(4, {"proc/2345/comm": "nv-fabricmanage\n"}, "NS", {}, id="FM process outside systemd"),
        pytest.param(4, {"proc/2345/comm": "nv-hostengine\n"}, "NS",
                     {("gpus", "FabricManagerNotRunning"): C}, id="near miss: another NVIDIA daemon"),
        pytest.param(0, {}, "NS", {}, id="near miss: no NVSwitch, no FM needed"),
        pytest.param(4, {}, "3 0 0 1", {}, id="near miss: NVML reports the fabric trained"),
    ],
)
def test_fabric_manager_service(gpu_context, scenario, host, switches, setup, fabric, expected) -> None:
    nvswitch(host, switches)
    for rel, text in setup.items():
        write(os.path.join(host.root, rel), text)
    scenario.set([h100(0, fabric=fabric)])
    obs = poll(gpu_context, 'fabric_manager_grace = "0s"\n')
    assert found(obs) == expected
    if switches and fabric == "NS":
        assert sample(obs, "node_health_fabric_manager_running") == (0 if expected else 1)


def test_fabric_manager_grace_on_the_service(gpu_context, scenario, host) -> None:
    nvswitch(host)
    scenario.set([h100(0)])
    ctx, cfg = gpu_context('xid_events = false\nfabric_manager_grace = "1h"\n')
    check = GpuCheck(ctx, cfg)
    assert found(check.run()) == {}, "just booted: FM may still be starting"
    assert found(check.run()) == {}


@pytest.mark.parametrize(
    ("ib", "modules", "extra", "gpus", "expected"),
    [
        pytest.param(["mlx5_0", "mlx5_1"], [], "", 1, {("gpus", "NvidiaPeermemNotLoaded"): W}, id="GPUs and IB, no peermem"),
        pytest.param(["mlx5_0"], ["nvidia_peermem"], "", 1, {}, id="nvidia_peermem loaded"),
        pytest.param(["mlx5_0"], ["nv_peer_mem"], "", 1, {}, id="the older nv_peer_mem loaded"),
        pytest.param([], [], "", 1, {}, id="near miss: no InfiniBand"),
        pytest.param(["mlx5_0"], ["nvidia"], "", 0, {}, id="near miss: no GPUs"),
        pytest.param(["mlx5_0"], [], "peermem = false\n", 1, {}, id="near miss: DMA-BUF node, check off"),
    ],
)
def test_peermem(gpu_context, scenario, host, ib, modules, extra, gpus, expected) -> None:
    for dev in ib:
        os.makedirs(os.path.join(host.sys, "class/infiniband", dev))
    for m in modules:
        os.makedirs(os.path.join(host.sys, "module", m, "parameters"))
    scenario.set([h100(i) for i in range(gpus)])
    obs = poll(gpu_context, extra)
    assert found(obs) == expected
