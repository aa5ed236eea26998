"""Fixtures for GPU tests: the compiled fake NVML, its scenario, a fixture host
tree (/proc boot id, /sys PCI devices) and a GPU check context.

Test modules import them with ``from fakenvml.fixtures import *``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pytest
from conftest import skip_or_fail

from agent.check import CheckContext
from agent.config import parse
from agent.hostpaths import HostPaths

from . import Scenario, build

__all__ = ["HostTree", "fake_nvml_lib", "scenario", "host", "gpu_context"]


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    try:
        return build(str(tmp_path_factory.mktemp("fakenvml")))
    except FileNotFoundError:
        skip_or_fail("needs gcc to build the fake libnvidia-ml.so.1")
        raise


@pytest.fixture
def scenario(tmp_path, monkeypatch: pytest.MonkeyPatch, fake_nvml_lib: str) -> Iterator[Scenario]:
    from agent.gpu import nvml

    path = str(tmp_path / "nvml-scenario.txt")
    monkeypatch.setenv("FAKE_NVML_SCENARIO", path)
    nvml.invalidate()  # each test starts NVML afresh, as a new agent process would
    yield Scenario(path).write()
    # ...and leaves none behind: a later test without the fake (`agent burn` on the fake CUDA driver) must
    # not find this one's session (or its failed init) ready. Not while an init this test left hung holds it.
    if nvml._session.lock.acquire(timeout=1):
        nvml._session.lock.release()
        nvml.invalidate()


class HostTree:
    """A fixture host: /proc/sys/kernel/random/boot_id and /sys/bus/pci/devices,
    plus this machine's own mountinfo and net/dev so the other checks can run."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.proc = os.path.join(root, "proc")
        self.sys = os.path.join(root, "sys")
        os.makedirs(os.path.join(self.proc, "sys/kernel/random"))
        for name in ("self/mountinfo", "net/dev"):
            os.makedirs(os.path.dirname(os.path.join(self.proc, name)), exist_ok=True)
            shutil.copyfile(os.path.join("/proc", name), os.path.join(self.proc, name))
        os.makedirs(os.path.join(self.sys, "bus/pci/devices"))
        os.makedirs(os.path.join(self.sys, "bus/pci/drivers/nvidia"))
        self.reboot()

    @property
    def paths(self) -> HostPaths:
        return HostPaths(procfs=self.proc, sysfs=self.sys)

    def reboot(self) -> str:
        self.boot_id = str(uuid.uuid4())
        with open(os.path.join(self.proc, "sys/kernel/random/boot_id"), "w") as fh:
            fh.write(self.boot_id + "\n")
        return self.boot_id

    def add_gpu(self, pci: str, driver: str | None = "nvidia", cls: str = "0x030200") -> None:
        dev = os.path.join(self.sys, "bus/pci/devices", f"{pci}.0")
        os.makedirs(dev)
        for name, value in (("vendor", "0x10de"), ("class", cls)):
            with open(os.path.join(dev, name), "w") as fh:
                fh.write(value + "\n")
        if driver:
            target = os.path.join(self.sys, "bus/pci/drivers", driver)
            os.makedirs(target, exist_ok=True)
            os.symlink(target, os.path.join(dev, "driver"))

    def toml(self, state_dir: str, extra: str = "", lib: str = "") -> str:
        return (
            f'[agent]\nstate_dir = "{state_dir}"\n[paths]\nprocfs = "{self.proc}"\nsysfs = "{self.sys}"\n'
            '[checks.traffic]\nenabled = false\n'  # the agent runs in the host's netns: off its firewall
            '[checks.kernel]\nlog_faults = false\nedac = false\n'  # nor the host's kernel log for faults
            f'[checks.gpu]\nnvml_library = "{lib}"\n{extra}'
        )


@pytest.fixture
def host(tmp_path) -> Iterator[HostTree]:
    yield HostTree(str(tmp_path / "host"))


@pytest.fixture
def gpu_context(tmp_path, host: HostTree, fake_nvml_lib: str):  # type: ignore[no-untyped-def]
    """make(extra_toml) → (CheckContext, GpuConfig) against the fake NVML and the fixture host."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)

    def make(extra: str = "", lib: str | None = None) -> tuple[CheckContext, object]:
        cfg = parse(host.toml(str(state), extra, fake_nvml_lib if lib is None else lib), "test.toml")
        return CheckContext(host.paths, str(state), cfg), cfg.checks["gpu"]

    return make
