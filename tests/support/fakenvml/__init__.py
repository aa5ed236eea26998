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
    }
    fields.update(extra)
    return fields


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
