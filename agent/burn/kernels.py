"""CUDA C for the built-in burn, compiled at run time with NVRTC.

The kernels are compiled to a cubin for the GPU's own architecture
(`sm_XY`), not to PTX (except for a GPU newer than the NVRTC: see
`compile_module`): a cubin from a newer CUDA 12 toolkit loads on any
CUDA 12 driver (minor version compatibility), whereas PTX from NVRTC 12.9
needs a driver that can JIT PTX 8.8 (CUDA_ERROR_UNSUPPORTED_PTX_VERSION on
older ones). https://docs.nvidia.com/deploy/cuda-compatibility/#minor-version-compatibility

`HELPERS` is plain C shared by host and device: the tests compile it with the
host C compiler and hold it equal to the Python twins in `agent.burn.reference`
(which the worker uses to check sampled GEMM results on the host).
"""

from __future__ import annotations

from typing import Any

HELPERS = r"""
typedef unsigned long long nha_u64;
typedef unsigned int nha_u32;
typedef unsigned short nha_u16;

#ifdef NHA_HOST
#include <string.h>
#define NHA_FN static inline
static inline nha_u32 nha_float_bits(float f) { nha_u32 u; memcpy(&u, &f, sizeof u); return u; }
#else
#define NHA_FN __device__ __forceinline__
#define nha_float_bits(f) __float_as_uint(f)
#endif

#define NHA_GOLDEN 0x9E3779B97F4A7C15ull

/* splitmix64's finaliser: a bijective 64-bit mix */
NHA_FN nha_u64 nha_mix(nha_u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* GEMM input element `idx` of stream `seed` as bf16 bits: a uniform value in
   [-1, 1) with 24 random bits (exact in float32), truncated to bf16 (the top
   16 bits of the float32: round toward zero, the same on host and device). */
NHA_FN nha_u16 nha_input_bf16(nha_u64 seed, nha_u64 idx) {
    nha_u64 h = nha_mix(idx + seed * NHA_GOLDEN);
    int k = (int)(h >> 40) - (1 << 23);
    float f = (float)k * (1.0f / 8388608.0f);
    return (nha_u16)(nha_float_bits(f) >> 16);
}

/* The memory test's word at global word index `word` for pass seed `seed`:
   address-dependent, so a write that lands at the wrong address is caught. */
NHA_FN nha_u64 nha_pattern(nha_u64 seed, nha_u64 word) {
    return nha_mix(word ^ (seed * NHA_GOLDEN));
}

/* One element's contribution to a matrix digest: position-dependent. */
NHA_FN nha_u64 nha_digest_term(nha_u64 idx, nha_u32 bits) {
    return nha_mix(idx * NHA_GOLDEN + bits);
}
"""

KERNELS = r"""
#define NHA_GRID_STRIDE(i, n) \
    for (nha_u64 i = blockIdx.x * (nha_u64)blockDim.x + threadIdx.x; i < (n); i += (nha_u64)gridDim.x * blockDim.x)

__device__ __forceinline__ nha_u64 nha_warp_sum(nha_u64 v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

extern "C" __global__ void nha_fill_bf16(nha_u16* out, nha_u64 n, nha_u64 seed) {
    NHA_GRID_STRIDE(i, n) out[i] = nha_input_bf16(seed, i);
}

/* digest = sum of nha_digest_term over all elements, mod 2^64: order-independent,
   so it does not depend on the launch configuration; also counts NaN/Inf. */
extern "C" __global__ void nha_digest_f32(const nha_u32* c, nha_u64 n, nha_u64* digest, nha_u64* nonfinite) {
    nha_u64 acc = 0, bad = 0;
    NHA_GRID_STRIDE(i, n) {
        nha_u32 b = c[i];
        acc += nha_digest_term(i, b);
        bad += (b & 0x7F800000u) == 0x7F800000u;
    }
    acc = nha_warp_sum(acc);
    bad = nha_warp_sum(bad);
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(digest, acc);
        if (bad) atomicAdd(nonfinite, bad);
    }
}

/* Counts a digest that differs from the reference, then clears it for the next iteration. */
extern "C" __global__ void nha_digest_compare(const nha_u64* reference, nha_u64* current, nha_u64* mismatches) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        if (*current != *reference) atomicAdd(mismatches, 1ull);
        *current = 0;
    }
}

extern "C" __global__ void nha_mem_write(nha_u64* p, nha_u64 n, nha_u64 base, nha_u64 seed, nha_u64 invert) {
    NHA_GRID_STRIDE(i, n) p[i] = nha_pattern(seed, base + i) ^ invert;
}

extern "C" __global__ void nha_mem_verify(const nha_u64* p, nha_u64 n, nha_u64 base, nha_u64 seed, nha_u64 invert,
                                          nha_u64* errors, nha_u64* first_bad) {
    nha_u64 bad = 0;
    NHA_GRID_STRIDE(i, n) {
        if (p[i] != (nha_pattern(seed, base + i) ^ invert)) {
            bad++;
            atomicMin(first_bad, base + i);
        }
    }
    bad = nha_warp_sum(bad);
    if ((threadIdx.x & 31) == 0 && bad) atomicAdd(errors, bad);
}
"""

SOURCE = HELPERS + KERNELS
NAMES = ("nha_fill_bf16", "nha_digest_f32", "nha_digest_compare", "nha_mem_write", "nha_mem_verify")


class CompileError(Exception):
    pass


def compile_module(major: int, minor: int) -> bytes:
    """An image cuModuleLoadData takes for compute capability `major.minor`:
    a cubin where this NVRTC knows the architecture, else PTX for the newest
    one it knows below it, which the driver compiles for the GPU (a GPU newer
    than the NVRTC wheel; its driver is new enough for that PTX). Raises
    CompileError, also for a GPU older than every architecture NVRTC knows."""
    from cuda.bindings import nvrtc  # type: ignore[import-untyped]

    err, archs = nvrtc.nvrtcGetSupportedArchs()
    want = 10 * major + minor
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or want in archs:
        return compile_cubin(major, minor)
    older = [a for a in archs if a <= want]
    if not older:
        raise CompileError(
            f"this NVRTC cannot compile for sm_{want} (it knows sm_{min(archs)} to sm_{max(archs)}); "
            "install an NVRTC that supports this GPU"
        )
    ptx = _compile(f"compute_{max(older)}", nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
    return ptx if ptx.endswith(b"\0") else ptx + b"\0"


def compile_cubin(major: int, minor: int) -> bytes:
    """The kernels as a cubin for compute capability `major.minor`. Raises CompileError."""
    from cuda.bindings import nvrtc

    return _compile(f"sm_{major}{minor}", nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)


def _compile(arch: str, get_size: Any, get: Any) -> bytes:
    from cuda.bindings import nvrtc

    def check(result: tuple[object, ...], what: str) -> tuple[object, ...]:
        if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{what}: {result[0]}")
        return result

    _, prog = check(nvrtc.nvrtcCreateProgram(SOURCE.encode(), b"nha_burn.cu", 0, [], []), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CompileError(
                f"NVRTC could not compile the burn kernels for {arch}: {log.decode(errors='replace').strip()}"
            )
        _, size = check(get_size(prog), get_size.__name__)
        image = b" " * size  # type: ignore[operator]
        check(get(prog, image), get.__name__)
        return image
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
