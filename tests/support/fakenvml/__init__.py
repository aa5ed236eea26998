"""The fake libnvidia-ml.so.1 (fakenvml.c) and its scenario file, for tests and benches.

`build(dir)` compiles the shim with gcc; `Scenario` writes the file the shim
re-reads on every call (atomically, so the shim never sees half a file).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping

SOURCE = os.path.join(os.path.dirname(__file__), "fakenvml.c")


def build(directory: str) -> str:
    """Compile the shim into `directory`; returns the library's path."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise FileNotFoundError("gcc")
    out = os.path.join(directory, "libnvidia-ml.so.1")
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wl,-soname,libnvidia-ml.so.1", "-o", out, SOURCE, "-lpthread"],
        check=True,
        capture_output=True,
    )
    return out


def h100(index: int, **extra: object) -> dict[str, object]:
    """The fields of a healthy H100 SXM (ECC on, row remapping, 18 NVLinks)."""
    fields: dict[str, object] = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{index:08x}-1111-2222-3333-444455556666",
        "serial": f"165232{index:07d}",
        "pci": f"0000:{0x18 + 0x10 * index:02x}:00",
        "ecc.cor.vol": 0,
        "ecc.cor.agg": 0,
        "ecc.unc.vol": 0,
        "ecc.unc.agg": 0,
        "remapped": "0 0 0 0",
        "temp": 41,
        "temp.slowdown": 87,
        "temp.shutdown": 92,
        "clocks_event": 0x1,
        "pcie.gen": 1,
        "pcie.gen_max": 5,
        "pcie.width": 16,
        "pcie.width_max": 16,
        "nvlink.links": 18,
        "field.230": 0,
        "persistence": 1,
        "pcie.replay": 0,
        **H100_TELEMETRY,
    }
    fields.update(extra)
    return fields


# What an H100 SXM answers for telemetry (driver 570+): field values, the
# calls without a field, and GPM. Raw NVML units: mW, mJ, ns, KiB, MHz, %.
H100_TELEMETRY: dict[str, object] = {
    "field.186": 312_000,  # NVML_FI_DEV_POWER_INSTANT, mW
    "field.190": 700_000,  # NVML_FI_DEV_POWER_CURRENT_LIMIT, mW
    "field.83": 1_234_567_000,  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ
    "field.82": 48,  # NVML_FI_DEV_MEMORY_TEMP, C
    "field.94": 0,  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
    "field.197": 9_000_000,  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    "field.198": 5_000_000,  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    **{f"field.{fid}": 0 for fid in (74, 75, 76, 77, 78, 79, 269, 270, 271)},  # clock event (violation) time, ns
    "field.91": 18,  # NVML_FI_DEV_NVLINK_LINK_COUNT
    "field.138": 2048,  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB, every link
    "field.139": 1024,  # ..._DATA_RX
    "clock.sm": 1980,
    "clock.mem": 2619,
    "util": "87 41",  # gpu %, memory %
    "util.enc": 0,
    "util.dec": 0,
    "memory": f"{81559 << 20} {527 << 20} {60000 << 20} {21032 << 20}",  # total reserved free used
    "pstate": 0,
    "gpm": 1,
    "gpm.1": 90.0,  # NVML_GPM_METRIC_GRAPHICS_UTIL
    "gpm.2": 71.5,  # NVML_GPM_METRIC_SM_UTIL
    "gpm.3": 33.0,  # NVML_GPM_METRIC_SM_OCCUPANCY
    "gpm.5": 52.25,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "gpm.10": 64.0,  # NVML_GPM_METRIC_DRAM_BW_UTIL
}


def consumer(index: int, **extra: object) -> dict[str, object]:
    """A GeForce-class GPU: no ECC, no NVLink, no row remapping (all NOT_SUPPORTED)."""
    fields: dict[str, object] = {
        "name": "NVIDIA GeForce RTX 4090",
        "uuid": f"GPU-{index:08x}-aaaa-bbbb-cccc-ddddeeeeffff",
        "pci": f"0000:{0x01 + index:02x}:00",
        "temp": 35,
        "temp.slowdown": 90,
        "temp.shutdown": 95,
        "clocks_event": 0x1,
        "pcie.gen": 1,
        "pcie.gen_max": 4,
        "pcie.width": 16,
        "pcie.width_max": 16,
    }
    fields.update(extra)
    return fields


class Scenario:
    """The scenario file: GPUs (index → fields), global keys, and events."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.gpus: list[dict[str, object]] = []
        self.globals: dict[str, object] = {}
        self.events: list[tuple[int, int, int]] = []  # (gpu, type, data)

    def set(self, gpus: list[Mapping[str, object]] | None = None, **globals_: object) -> Scenario:
        if gpus is not None:
            self.gpus = [dict(g) for g in gpus]
        self.globals.update(globals_)
        return self.write()

    def unset(self, key: str) -> Scenario:
        self.globals.pop(key, None)
        return self.write()

    def gpu(self, index: int, **fields: object) -> Scenario:
        self.gpus[index].update(fields)
        return self.write()

    def xid(self, gpu: int, xid: int) -> Scenario:
        self.events.append((gpu, 0x8, xid))
        return self.write()

    def write(self) -> Scenario:
        lines = [f"count {len(self.gpus)}"]
        lines += [f"{k} {v}" for k, v in self.globals.items()]
        for i, g in enumerate(self.gpus):
            lines += [f"{i}.{k} {v}" for k, v in g.items()]
        lines += [f"event.{n + 1} {g} {t} {d}" for n, (g, t, d) in enumerate(self.events)]
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path))
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.replace(tmp, self.path)
        return self
