"""A fixture /sys/class/infiniband for the InfiniBand check, built per test.

Laid out as the kernel lays it out: /sys/class/infiniband/<dev> is a symlink to
the device under /sys/devices/pci0000:00/<bdf>/infiniband/<dev>, which holds
fw_ver, board_id, hca_type and ports/<n>/ with state, phys_state, rate,
link_layer, counters/ and hw_counters/, each in the kernel's format
("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", decimal counters).
`IbTree(base).node(8)` is a healthy 8-port NDR node (one port per HCA, as on an
HGX H100/H200 compute fabric).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from agent.check import CheckContext
from agent.config import defaults
from agent.checks.infiniband import InfinibandCheck, InfinibandConfig
from agent.findings import Observation
from agent.hostpaths import HostPaths
from agent.infiniband.settings import DEFAULT_HW_COUNTERS
from agent.infiniband.sysfs import DATA_COUNTERS, ERROR_COUNTERS

ACTIVE, DOWN, INIT, ARMED = "4: ACTIVE", "1: DOWN", "2: INIT", "3: ARMED"
LINK_UP, POLLING, DISABLED, SLEEP = "5: LinkUp", "2: Polling", "3: Disabled", "1: Sleep"
NDR, HDR = "400 Gb/sec (4X NDR)", "200 Gb/sec (4X HDR)"
CX7 = ("MT_0000000838", "MT4129", "28.39.1002")  # ConnectX-7 NDR: board id (PSID), HCA type, firmware
CX6DX = ("MT_0000000359", "MT4125", "22.36.1010")  # ConnectX-6 Dx, a RoCE front-end NIC
BOOT = "0f6d5ad1-1a4e-4a3c-9a8e-2c1e2b3c4d5e"


class IbTree:
    def __init__(self, base: Path, sys: Path | None = None, proc: Path | None = None) -> None:
        """Under `base`, or in the `sys` and `proc` of another fixture host (its boot id kept)."""
        self.base = base
        self.sys, self.proc = sys or base / "sys", proc or base / "proc"
        self.cls = self.sys / "class" / "infiniband"
        self.cls.mkdir(parents=True)
        (self.proc / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
        if not (self.proc / "sys/kernel/random/boot_id").exists():
            self.boot(BOOT)
        self._bdf = 0x17

    @property
    def paths(self) -> HostPaths:
        return HostPaths(procfs=str(self.proc), sysfs=str(self.sys), rootfs=str(self.base))

    def boot(self, boot_id: str) -> None:
        (self.proc / "sys/kernel/random/boot_id").write_text(boot_id + "\n")

    # ------------------------------------------------------------ building

    def device(self, name: str, model: tuple[str, str, str] = CX7, ports: int = 1, **port: str) -> Path:
        """An HCA with `ports` ports, each made by `port` (its keyword arguments)."""
        bdf = f"0000:{self._bdf:02x}:00.0"
        self._bdf += 1
        real = self.sys / "devices/pci0000:00" / bdf / "infiniband" / name
        real.mkdir(parents=True)
        for attr, value in zip(("board_id", "hca_type", "fw_ver"), model):
            (real / attr).write_text(value + "\n")
        (self.cls / name).symlink_to(os.path.relpath(real, self.cls))
        for n in range(1, ports + 1):
            self.port(name, n, **port)
        return real

    def port(self, device: str, n: int, *, state: str = ACTIVE, phys: str = LINK_UP, rate: str = NDR,
             link_layer: str = "InfiniBand") -> None:
        d = self.cls / device / "ports" / str(n)
        (d / "counters").mkdir(parents=True)
        (d / "hw_counters").mkdir()
        self.set(device, n, state=state, phys_state=phys, rate=rate, link_layer=link_layer)
        self.counters(device, n, **{c: 0 for c in ERROR_COUNTERS}, **{c: 1000 * (i + 1) for i, c in enumerate(DATA_COUNTERS)})
        self.hw(device, n, **{c: 0 for c in DEFAULT_HW_COUNTERS})

    def node(self, ports: int = 8, model: tuple[str, str, str] = CX7, first: int = 0) -> list[str]:
        """`ports` single-port HCAs mlx5_<first>..; all ACTIVE at 400 Gb/s. Returns their names."""
        names = [f"mlx5_{i}" for i in range(first, first + ports)]
        for name in names:
            self.device(name, model)
        return names

    # ------------------------------------------------------------ changing

    def set(self, device: str, n: int, **attrs: str) -> None:
        """Port attributes: state, phys_state, rate, link_layer (as the kernel writes them)."""
        d = self.cls / device / "ports" / str(n)
        for attr, value in attrs.items():
            (d / attr).write_text(value + "\n")

    def counters(self, device: str, n: int, **values: int | str) -> None:
        d = self.cls / device / "ports" / str(n) / "counters"
        for name, value in values.items():
            (d / name).write_text(f"{value}\n")

    def bump(self, device: str, n: int, **by: int) -> None:
        d = self.cls / device / "ports" / str(n) / "counters"
        for name, step in by.items():
            (d / name).write_text(f"{int((d / name).read_text()) + step}\n")

    def hw(self, device: str, n: int, **values: int) -> None:
        d = self.cls / device / "ports" / str(n) / "hw_counters"
        for name, value in values.items():
            (d / name).write_text(f"{value}\n")

    def restrict(self, device: str, n: int) -> None:
        """Make the port's counters/ read as on a firmware-restricted mlx5 function: every read fails
        with EINVAL. Each file becomes a link to /proc/self/clear_refs, a real kernel file that a
        process with CAP_DAC_OVERRIDE opens for reading and whose read returns EINVAL (it has
        no read method); nothing is ever written to it."""
        d = self.cls / device / "ports" / str(n) / "counters"
        for f in d.iterdir():
            f.unlink()
            f.symlink_to("/proc/self/clear_refs")

    def remove(self, device: str) -> None:
        """The HCA is gone (fell off the bus, driver failed): its class link and device both."""
        real = (self.cls / device).resolve()
        (self.cls / device).unlink()
        shutil.rmtree(real)


class Clock:
    """Wall-clock time the test moves by hand."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def make_check(tree: IbTree, state_dir: Path, clock: Callable[[], float], **cfg: object) -> InfinibandCheck:
    state_dir.mkdir(exist_ok=True)
    ctx = CheckContext(paths=tree.paths, state_dir=str(state_dir), config=defaults())
    return InfinibandCheck(ctx, InfinibandConfig(**cfg), clock=clock)  # type: ignore[arg-type]


def reasons(obs: Observation) -> set[tuple[str, str]]:
    """(subject, reason) of every finding."""
    return {(f.subject, f.reason) for f in obs.findings}


def value(obs: Observation, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    found = [s.value for s in obs.samples if s.name == name and want <= set(s.labels)]
    return found[0] if found else None
