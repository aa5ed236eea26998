"""A thin, checked layer over the CUDA driver API (`cuda.bindings.driver`),
for the burn worker process only: the agent itself never initialises CUDA.

The worker sees exactly one device (the parent sets CUDA_VISIBLE_DEVICES to
the GPU's UUID), uses its primary context (the one cuBLAS uses too), set to
block rather than spin while it waits, and one non-blocking stream, so every
GEMM and kernel runs in order on that stream.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

Arg = tuple[type, int]  # (ctypes type, value) of one kernel parameter


class CudaError(Exception):
    def __init__(self, call: str, code: str) -> None:
        super().__init__(f"{call}: {code}")
        self.call, self.code = call, code


class Device:
    def __init__(self, ordinal: int = 0) -> None:
        from cuda.bindings import driver as cu  # type: ignore[import-untyped]

        self.cu = cu
        self._allocs: set[int] = set()
        self.failed: CudaError | None = None  # the first error: after it, the context may be unusable
        self.check(cu.cuInit(0), "cuInit")
        self.dev = self.check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        # Block on an interrupt in cuStreamSynchronize instead of spinning: a
        # worker per GPU would otherwise keep a CPU core busy for the whole
        # burn, on a node that has just booted (and, in the DaemonSet, under
        # a CPU limit whose throttling would leave the GPU waiting for work).
        # Best effort: the default (spin or yield) only costs CPU.
        cu.cuDevicePrimaryCtxSetFlags(self.dev, cu.CUctx_flags.CU_CTX_SCHED_BLOCKING_SYNC)
        self.ctx = self.check(cu.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        self.check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.stream = self.check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")

    def check(self, result: Any, call: str) -> Any:
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            _, name = self.cu.cuGetErrorName(err)
            exc = CudaError(call, name.decode() if isinstance(name, bytes) else str(err))
            self.failed = self.failed or exc
            raise exc
        return values[0] if len(values) == 1 else tuple(values)

    # ------------------------------------------------------------ facts

    def attribute(self, name: str) -> int:
        attr = getattr(self.cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(self.check(self.cu.cuDeviceGetAttribute(attr, self.dev), f"cuDeviceGetAttribute({name})"))

    def capability(self) -> tuple[int, int]:
        return self.attribute("COMPUTE_CAPABILITY_MAJOR"), self.attribute("COMPUTE_CAPABILITY_MINOR")

    def name(self) -> str:
        raw = self.check(self.cu.cuDeviceGetName(256, self.dev), "cuDeviceGetName")
        return bytes(raw).split(b"\0", 1)[0].decode("ascii", "replace")

    def pci_bus_id(self) -> str:
        raw = self.check(self.cu.cuDeviceGetPCIBusId(32, self.dev), "cuDeviceGetPCIBusId")
        return (raw if isinstance(raw, str) else bytes(raw).split(b"\0", 1)[0].decode()).strip()

    def mem_info(self) -> tuple[int, int]:
        free, total = self.check(self.cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    # ------------------------------------------------------------ memory

    def alloc(self, nbytes: int) -> int:
        ptr = int(self.check(self.cu.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"))
        self._allocs.add(ptr)
        return ptr

    def free(self, ptr: int) -> None:
        """Free `ptr`; after an earlier error (a sticky one fails every call)
        a failure here is not news, and must not hide the first one."""
        self._allocs.discard(ptr)
        result = self.cu.cuMemFree(ptr)
        if self.failed is None:
            self.check(result, "cuMemFree")

    def fill_u32(self, ptr: int, value: int, count: int) -> None:
        self.check(self.cu.cuMemsetD32Async(ptr, value, count, self.stream), "cuMemsetD32Async")

    def read(self, ptr: int, nbytes: int) -> bytes:
        """Copy `nbytes` back to the host after everything queued so far."""
        self.sync()
        buf = bytearray(nbytes)
        self.check(self.cu.cuMemcpyDtoH(buf, ptr, nbytes), "cuMemcpyDtoH")
        return bytes(buf)

    def read_u64(self, ptr: int, count: int = 1) -> list[int]:
        raw = self.read(ptr, 8 * count)
        return [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw), 8)]

    # ------------------------------------------------------------ code

    def load(self, cubin: bytes, names: Sequence[str]) -> dict[str, Any]:
        module = self.check(self.cu.cuModuleLoadData(cubin), "cuModuleLoadData")
        return {
            n: self.check(self.cu.cuModuleGetFunction(module, n.encode()), f"cuModuleGetFunction({n})") for n in names
        }

    def launch(self, fn: Any, blocks: int, threads: int, args: Sequence[Arg]) -> None:
        # cuLaunchKernel copies the parameter values at the call, so these
        # ctypes objects only need to live until it returns.
        values = [tp(v) for tp, v in args]
        ptrs = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self.check(
            self.cu.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, self.stream, ctypes.addressof(ptrs), 0),
            "cuLaunchKernel",
        )

    def sync(self) -> None:
        self.check(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def stream_handle(self) -> int:
        return int(self.stream)

    def close(self) -> None:
        for ptr in list(self._allocs):
            self.free(ptr)
        self.check(self.cu.cuStreamDestroy(self.stream), "cuStreamDestroy")
        self.check(self.cu.cuDevicePrimaryCtxRelease(self.dev), "cuDevicePrimaryCtxRelease")


def u64(value: int) -> Arg:
    return (ctypes.c_uint64, value & ((1 << 64) - 1))


def ptr(value: int) -> Arg:
    return (ctypes.c_uint64, value)
