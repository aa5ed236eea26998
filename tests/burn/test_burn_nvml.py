"""The burn's NVML inventory and watch through the real pynvml, against the
fake libnvidia-ml.so.1 (tests/fakenvml, copied unchanged from the GPU work)
driven by a scenario file the test rewrites while the watch runs."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from agentproc import wait_for
from conftest import require_tool
from fakenvml import SOURCE, Scenario, h100

from agent.burn.model import Fault, GpuInfo
from agent.burn.nvml_watch import NvmlInventory, NvmlWatch


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> str:
    # Not the soname libnvidia-ml.so.1: once loaded, a library stays in the
    # process, and pynvml's own dlopen("libnvidia-ml.so.1") in later tests
    # would find it by that name and see a fake driver.
    out = str(tmp_path_factory.mktemp("fakenvml") / "libfakenvml-burn.so")
    cc = require_tool("gcc")
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wl,-soname,libfakenvml-burn.so", "-o", out, SOURCE, "-lpthread"]
    subprocess.run(cmd, check=True)
    return out


@dataclass
class FakeNvml:
    scenario: Scenario
    lib: str  # what checks.gpu.nvml_library would name


@pytest.fixture
def nvml(shim: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """The agent's NVML session on the fake library, for this test only:
    pynvml's module state and the session are reset after it."""
    import pynvml

    from agent.gpu import nvml as session

    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(tmp_path / "scenario"))
    monkeypatch.setattr(pynvml, "nvmlLib", pynvml.nvmlLib)  # restored after the test
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    session.invalidate()
    yield FakeNvml(Scenario(str(tmp_path / "scenario")).set([h100(0, power=690), h100(1)]), shim)
    session.invalidate()


def test_inventory_lists_the_gpus(nvml: FakeNvml) -> None:
    gpus = NvmlInventory(nvml.lib).gpus()
    assert gpus is not None and [(g.index, g.name, g.mig) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", False),
        (1, "NVIDIA H100 80GB HBM3", False),
    ]
    assert gpus[1].uuid.startswith("GPU-00000001-") and gpus[1].pci_bus_id == "00000000:28:00.0"


def test_inventory_with_no_gpu(nvml: FakeNvml) -> None:
    nvml.scenario.set([])
    assert NvmlInventory(nvml.lib).gpus() == []


def test_inventory_when_the_driver_is_not_loaded(nvml: FakeNvml) -> None:
    nvml.scenario.set(init=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    assert NvmlInventory(nvml.lib).gpus() is None


def watch_two(nvml: FakeNvml) -> tuple[NvmlWatch, list[GpuInfo]]:
    gpus = NvmlInventory(nvml.lib).gpus()
    assert gpus
    w = NvmlWatch(throttle_share=0.1, interval=0.05, library=nvml.lib)
    w.start(gpus)
    return w, gpus


def sampled(w: NvmlWatch, gpu: int, at_least: int) -> None:
    """Wait until the watch has taken `at_least` readings of `gpu` (events, not time)."""
    wait_for(lambda: w._acc[gpu].samples >= at_least, timeout=10, what=f"{at_least} readings of GPU {gpu}")


def test_quiet_burn_has_no_problems(nvml: FakeNvml) -> None:
    w, _ = watch_two(nvml)
    sampled(w, 0, 3)
    s = w.stop(timeout=5)
    assert [x.problems for x in s.values()] == [(), ()]
    assert s[0].telemetry.samples >= 4 and s[0].telemetry.temperature_max_c == 41  # + the closing reading


def test_faults_during_the_burn_land_on_the_right_gpu(nvml: FakeNvml) -> None:
    w, _ = watch_two(nvml)
    sampled(w, 1, 1)
    nvml.scenario.xid(0, 79)
    nvml.scenario.gpu(1, **{"ecc.unc.vol": 2, "remapped": "0 1 1 0", "clocks_event": 0x40})
    wait_for(lambda: w._acc[0].xids == [79], timeout=10, what="the Xid event")
    wait_for(lambda: w._acc[1].throttled >= 2, timeout=10, what="two throttled readings")
    s = w.stop(timeout=5)  # the closing reading takes the ECC and row-remap counters
    assert [p.fault for p in s[0].problems] == [Fault.XID] and "Xid 79" in s[0].problems[0].message
    assert [p.fault for p in s[1].problems] == [Fault.ECC, Fault.ROW_REMAP, Fault.ROW_REMAP, Fault.THROTTLE]


def test_a_gpu_lost_during_the_burn(nvml: FakeNvml) -> None:
    w, _ = watch_two(nvml)
    sampled(w, 1, 1)
    nvml.scenario.gpu(1, lost=1)
    wait_for(lambda: w._acc[1].lost, timeout=10, what="GPU 1 seen lost")
    sampled(w, 0, w._acc[0].samples + 1)  # and GPU 0 still read after it
    s = w.stop(timeout=5)
    assert [p.fault for p in s[1].problems] == [Fault.GPU_LOST] and s[0].problems == ()


def test_a_hung_nvml_call_is_reported_and_does_not_hold_up_the_burn(nvml: FakeNvml) -> None:
    w, _ = watch_two(nvml)
    sampled(w, 0, 1)
    nvml.scenario.set(**{"hang.nvmlDeviceGetTemperature": 2})
    # the sampler is inside the hung call (asking GPU 0 for more than one poll interval)
    wait_for(lambda: (a := w._asking) is not None and time.monotonic() - a[1] > 0.2, timeout=10, what="a hung call")
    s = w.stop(timeout=0.5)
    assert w._thread.is_alive(), "stop() returned while the NVML call still hangs: it did not wait for it"
    assert [p.fault for p in s[0].problems] == [Fault.GPU_LOST] and "has not returned" in s[0].problems[0].message
    nvml.scenario.unset("hang.nvmlDeviceGetTemperature")
    wait_for(lambda: not w._thread.is_alive(), timeout=10, what="the sampler to come back")


def test_xid_events_not_supported_is_a_note(nvml: FakeNvml) -> None:
    nvml.scenario.set(events=3)
    w, _ = watch_two(nvml)
    sampled(w, 0, 1)
    s = w.stop(timeout=5)
    assert s[0].problems == () and any("Xid events not available" in n for n in s[0].notes)


# ------------------------------------------------------------------ who uses the GPUs (the preflight's idleness)


def test_processes_are_listed_by_pid_compute_and_graphics_together(nvml: FakeNvml) -> None:
    nvml.scenario.gpu(1, procs="4242:1024 77:2048", gprocs="77:1").gpu(0, gprocs="NS")
    assert NvmlInventory(nvml.lib).processes() == {0: (), 1: (77, 4242)}


def test_processes_that_nvml_cannot_list_are_none(nvml: FakeNvml) -> None:
    nvml.scenario.gpu(0, procs="ERR 999")  # NVML_ERROR_UNKNOWN
    assert NvmlInventory(nvml.lib).processes() is None


def test_idleness_joins_nvml_and_the_kubelet_and_fails_closed(nvml: FakeNvml, tmp_path: Path) -> None:
    import tempfile

    from fakekubelet import FakeKubelet

    from agent.burn.idle import Idleness, pod_lookup

    inventory = NvmlInventory(nvml.lib)
    gpus = inventory.gpus()
    assert gpus is not None
    sock = tempfile.mkdtemp(prefix="nha-", dir="/tmp") + "/kubelet.sock"  # a unix socket path has 108 bytes
    idle = Idleness(inventory, pod_lookup(sock, call_timeout=1.0))
    assert idle.occupancy(gpus).idle, "no socket: not asked; no process: idle"
    nvml.scenario.gpu(0, procs="4242:1024")
    assert idle.occupancy(gpus).describe() == "GPU 0: pid 4242"
    nvml.scenario.gpu(0, procs="")
    uuid1 = str(nvml.scenario.gpus[1]["uuid"])
    pods = [("ml", "train-0", {"main": [("nvidia.com/gpu", [f"{uuid1}::2"])]}), ("x", "nic", {"c": [("example.com/nic", ["n0"])]})]
    with FakeKubelet(sock, pods) as kubelet:
        occ = idle.occupancy(gpus)
        assert not occ.idle and occ.describe() == "GPU 1: pod ml/train-0"
        kubelet.set_pods(pods[1:])
        assert idle.occupancy(gpus).idle, "a pod without a GPU does not make the node busy"
        kubelet.fail("UNAVAILABLE", "shutting down")
        occ = idle.occupancy(gpus)
        assert not occ.idle and "PodResources" in occ.unknown and "shutting down" in occ.unknown
        kubelet.fail(None)
        kubelet.hang()
        occ = idle.occupancy(gpus)
        kubelet.hang(False)
        assert not occ.idle and "did not answer in time" in occ.unknown
