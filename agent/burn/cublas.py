"""cuBLAS through ctypes, from the nvidia-cublas wheel (CUDA 12's
nvidia/cublas/lib or CUDA 13's nvidia/cu13/lib, found by cuda.pathfinder,
which also loads its libcublasLt dependency), else a CUDA toolkit on the
system: only the few calls the burn makes, no PyTorch.
NODE_HEALTH_AGENT_CUBLAS names the library file instead.

The GEMM is BF16 × BF16 with FP32 accumulation and FP32 output: the tensor
cores at full rate, and an output whose every bit is checked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

CUBLAS_OP_N = 0
CUDA_R_32F = 0
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
PROPERTIES = {"major": 0, "minor": 1, "patch": 2}  # libraryPropertyType


ENV = "NODE_HEALTH_AGENT_CUBLAS"
# where the wheels put it, below a site-packages directory (cuda.pathfinder's list)
WHEEL_DIRS = ("nvidia/cu13/lib", "nvidia/cublas/lib")
SONAMES = ("libcublas.so.13", "libcublas.so.12")


class CublasError(Exception):
    pass


def installed() -> bool:
    """Whether a cuBLAS can be found, without loading it (the agent itself
    never maps CUDA libraries; the burn worker loads it)."""
    import site
    import sysconfig

    if os.environ.get(ENV):
        return os.path.isfile(os.environ[ENV])
    roots = [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"]]
    cuda_home = os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    candidates = [os.path.join(r, d, so) for r in roots for d in WHEEL_DIRS for so in SONAMES]
    candidates += [os.path.join(cuda_home, d, so) for d in ("lib64", "lib") for so in SONAMES]
    return any(os.path.isfile(c) for c in candidates) or ctypes.util.find_library("cublas") is not None


def load_library() -> ctypes.CDLL:
    """libcublas from NODE_HEALTH_AGENT_CUBLAS, the wheel or a CUDA install. Raises CublasError."""
    if os.environ.get(ENV):
        try:
            return ctypes.CDLL(os.environ[ENV])
        except OSError as exc:
            raise CublasError(f"cannot load cuBLAS from {ENV}={os.environ[ENV]}: {exc}") from None
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # type: ignore[import-untyped]

        return ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception as exc:  # noqa: BLE001 - ImportError or pathfinder's DynamicLibNotFoundError
        raise CublasError(f"cannot load cuBLAS ({exc}); install node-health-agent[gpu]") from None


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    c_int, vp = ctypes.c_int, ctypes.c_void_p
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasDestroy_v2.argtypes = [vp]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasGetProperty.argtypes = [c_int, ctypes.POINTER(c_int)]
    lib.cublasGemmEx.argtypes = [
        vp,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,  # handle, transa, transb, m, n, k
        vp,
        vp,
        c_int,
        c_int,  # alpha, A, Atype, lda
        vp,
        c_int,
        c_int,  # B, Btype, ldb
        vp,
        vp,
        c_int,
        c_int,  # beta, C, Ctype, ldc
        c_int,
        c_int,  # computeType, algo
    ]
    for fn in (
        lib.cublasCreate_v2,
        lib.cublasDestroy_v2,
        lib.cublasSetStream_v2,
        lib.cublasGetProperty,
        lib.cublasGemmEx,
    ):
        fn.restype = c_int
    return lib


def version(lib: ctypes.CDLL) -> str:
    parts = []
    for key in ("major", "minor", "patch"):
        out = ctypes.c_int()
        _check(lib.cublasGetProperty(PROPERTIES[key], ctypes.byref(out)), "cublasGetProperty")
        parts.append(str(out.value))
    return ".".join(parts)


def _check(status: int, call: str) -> None:
    if status != 0:
        raise CublasError(f"{call}: cuBLAS status {status}")


class Cublas:
    def __init__(self, stream: int, lib: ctypes.CDLL | None = None) -> None:
        self.lib = declare(lib or load_library())
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)), "cublasSetStream")
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def gemm_bf16(self, n: int, a: int, b: int, c: int) -> None:
        """C = A·B for column-major n×n matrices, queued on the stream."""
        s = self.lib.cublasGemmEx(
            self.handle,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            n,
            n,
            n,
            ctypes.byref(self._one),
            a,
            CUDA_R_16BF,
            n,
            b,
            CUDA_R_16BF,
            n,
            ctypes.byref(self._zero),
            c,
            CUDA_R_32F,
            n,
            CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT,
        )
        _check(s, "cublasGemmEx")

    def close(self) -> None:
        _check(self.lib.cublasDestroy_v2(self.handle), "cublasDestroy")
