"""One answer to "what is a GPU": the GPU check, the Xid source and the burn
count the same NVIDIA display functions of the PCI bus (classes 0x0300,
0x0302 and 0x0380), and nothing else (NVSwitches, the GPUs' HDMI audio,
another vendor's VGA)."""

from __future__ import annotations

from pathlib import Path

import pytest
from burnfakes import sysfs

from agent.burn.runner import Runner, pci_gpu_count
from agent.burn.settings import known as burn_known
from agent.burn.settings import settings
from agent.check import CheckContext
from agent.config import parse
from agent.gpu.pci import bus_gpus, is_gpu
from agent.hostpaths import HostPaths
from agent.registry import CHECKS

# Every class that is a GPU, and each near-miss beside it.
BUS = {
    "0000:18:00.0": ("0x10de", "0x030200"),  # H100: 3D controller
    "0000:03:00.0": ("0x10de", "0x030000"),  # VGA-class NVIDIA GPU
    "0000:3b:00.0": ("0x10de", "0x038000"),  # "other display controller" (some data-centre boards)
    "0000:3b:00.1": ("0x10de", "0x040300"),  # the GPU's HDMI audio function
    "0000:05:00.0": ("0x10de", "0x068000"),  # NVSwitch: a bridge
    "0000:00:02.0": ("0x8086", "0x030000"),  # an Intel VGA controller
    "0000:00:1f.0": ("0x8086", "0x060100"),
}


@pytest.mark.parametrize(
    ("vendor", "cls", "gpu"),
    [
        pytest.param("0x10de", "0x030200", True, id="3D controller"),
        pytest.param("0x10de", "0x030000", True, id="VGA"),
        pytest.param("0x10de", "0x038000", True, id="other display"),
        pytest.param("0x10DE\n", "0x030200\n", True, id="as sysfs spells it"),
        pytest.param("0x10de", "0x030100", False, id="XGA"),
        pytest.param("0x10de", "0x040300", False, id="HDMI audio"),
        pytest.param("0x10de", "0x068000", False, id="NVSwitch"),
        pytest.param("0x1002", "0x030200", False, id="another vendor"),
        pytest.param("", "", False, id="unreadable"),
    ],
)
def test_is_gpu(vendor: str, cls: str, gpu: bool) -> None:
    assert is_gpu(vendor, cls) is gpu


def test_the_burn_and_the_gpu_check_count_the_same_gpus(tmp_path: Path) -> None:
    paths = HostPaths(sysfs=str(sysfs(tmp_path, BUS)))
    cfg = parse('[checks.gpu]\nnvml_library = "/no-driver/libnvidia-ml.so.1"\n', "test")
    ctx = CheckContext(paths, str(tmp_path / "state"), cfg)
    (tmp_path / "state").mkdir()

    assert list(bus_gpus(paths)) == ["0000:03:00", "0000:18:00", "0000:3b:00"]
    gpu_check = CHECKS["gpu"].build(ctx, cfg.checks["gpu"])
    check_gpus = {s for s, _ in gpu_check.known_findings() if s[3:].isdigit()}  # type: ignore[attr-defined]
    burn_gpus = {s for s, _ in burn_known(paths) if s[3:].isdigit()}
    assert check_gpus == burn_gpus == {"gpu0", "gpu1", "gpu2"}
    assert pci_gpu_count(paths) == 3
    # With no NVML here, the burn finds the GPUs it would test on the bus: the same three.
    runner = Runner(settings(cfg.checks["burn"], "/no-driver/libnvidia-ml.so.1"), paths, backends=())
    assert runner.discover().unavailable.startswith("3 NVIDIA GPU(s) on the PCI bus")
