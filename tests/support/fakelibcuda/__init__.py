"""A fake CUDA driver (libcuda.so.1) and cuBLAS (libcublas.so.12) on the CPU,
for running the real burn worker, through the real cuda-bindings and the
real NVRTC, on a machine without a GPU (fakecuda.c says what it models and
which faults it can inject).

`build(dir)` compiles both with gcc into `dir`; `env(dir, ...)` is the
environment a worker needs to find them: LD_LIBRARY_PATH for the driver
(cuda-bindings finds libcuda.so.1 by the system search, as on a real host)
and NODE_HEALTH_AGENT_CUBLAS for cuBLAS.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from agent.burn.kernels import HELPERS

HERE = os.path.dirname(os.path.abspath(__file__))

# A burn the CPU fake driver finishes in seconds: small matrices, little memory, no straggler test.
QUICK_BURN_CONFIG = """
[checks.burn]
duration = "2s"
matrix_size = 1024
memory_fraction = 0.25
straggler_fraction = 0.0
interval = "1s"
"""


def build(directory: str) -> str:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise FileNotFoundError("gcc")
    with open(os.path.join(directory, "nha_helpers.h"), "w") as fh:
        fh.write(HELPERS)
    common = [gcc, "-shared", "-fPIC", "-O3", "-Wall", "-Werror", f"-I{directory}", f"-I{HERE}"]
    cuda = os.path.join(directory, "libcuda.so.1")
    subprocess.run(
        [*common, "-Wl,-soname,libcuda.so.1", "-o", cuda, os.path.join(HERE, "fakecuda.c")],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [*common, "-Wl,-soname,libcublas.so.12", "-Wl,-rpath,$ORIGIN", "-o", os.path.join(directory, "libcublas.so.12"),
         os.path.join(HERE, "fakecublas.c"), cuda],
        check=True,
        capture_output=True,
    )
    return directory


def env(directory: str, faults: Mapping[str, str] | None = None, **settings: object) -> dict[str, str]:
    """Variables for a worker: `faults` maps a CUDA_VISIBLE_DEVICES value (or
    "*") to a fault; settings are FAKECUDA_<NAME> values (memory=, gemm_ms=)."""
    out = {
        "LD_LIBRARY_PATH": directory,
        "NODE_HEALTH_AGENT_CUBLAS": os.path.join(directory, "libcublas.so.12"),
        "FAKECUDA_FAULTS": ",".join(f"{k}={v}" for k, v in (faults or {}).items()),
    }
    out.update({f"FAKECUDA_{k.upper()}": str(v) for k, v in settings.items()})
    return out
