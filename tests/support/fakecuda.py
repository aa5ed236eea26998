"""A CPU stand-in for the burn worker's `Device` and `Cublas`: device memory
is Python bytes, and each kernel of agent/burn/kernels.py runs as its Python
twin (agent.burn.reference), so `agent.burn.gpuburn` can be exercised end to
end without a GPU, with faults injected where a sick GPU would have them."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from agent.burn import reference

MASK = (1 << 64) - 1


class FakeDevice:
    def __init__(self, *, free: int = 1 << 16, sms: int = 2, flip: int | None = None) -> None:
        self.mem: dict[int, bytearray] = {}
        self._next = 1 << 20
        self.free_bytes, self.sms = free, sms
        self.flip = flip  # a global word index whose bit 5 the "DRAM" flips after every write
        self.syncs = 0

    # where a pointer points
    def _at(self, p: int) -> tuple[bytearray, int]:
        for base, buf in self.mem.items():
            if base <= p < base + len(buf):
                return buf, p - base
        raise AssertionError(f"wild pointer {p:#x}")

    def u64(self, p: int) -> int:
        buf, off = self._at(p)
        return int.from_bytes(buf[off : off + 8], "little")

    def set_u64(self, p: int, v: int) -> None:
        buf, off = self._at(p)
        buf[off : off + 8] = (v & MASK).to_bytes(8, "little")

    # the Device interface used by gpuburn.Burn
    def attribute(self, name: str) -> int:
        assert name == "MULTIPROCESSOR_COUNT"
        return self.sms

    def capability(self) -> tuple[int, int]:
        return 9, 0

    def mem_info(self) -> tuple[int, int]:
        return self.free_bytes, self.free_bytes * 2

    def alloc(self, nbytes: int) -> int:
        p = self._next
        self.mem[p] = bytearray(nbytes)
        self._next += nbytes + 4096
        return p

    def free(self, p: int) -> None:
        del self.mem[p]

    def fill_u32(self, p: int, value: int, count: int) -> None:
        buf, off = self._at(p)
        buf[off : off + 4 * count] = struct.pack(f"<{count}I", *([value] * count))

    def read(self, p: int, nbytes: int) -> bytes:
        buf, off = self._at(p)
        return bytes(buf[off : off + nbytes])

    def read_u64(self, p: int, count: int = 1) -> list[int]:
        return [self.u64(p + 8 * i) for i in range(count)]

    def sync(self) -> None:
        self.syncs += 1

    def load(self, cubin: bytes, names: Sequence[str]) -> dict[str, Callable[..., None]]:
        assert cubin[:4] == b"\x7fELF"
        return {n: getattr(self, n) for n in names}

    def launch(self, fn: Callable[..., None], blocks: int, threads: int, args: Sequence[tuple[type, int]]) -> None:
        fn(*[v for _, v in args])

    # the kernels, as their Python twins
    def nha_fill_bf16(self, out: int, n: int, seed: int) -> None:
        buf, off = self._at(out)
        buf[off : off + 2 * n] = struct.pack(f"<{n}H", *(reference.input_bf16(seed, i) for i in range(n)))

    def nha_digest_f32(self, c: int, n: int, digest: int, nonfinite: int) -> None:
        buf, off = self._at(c)
        bits = struct.unpack_from(f"<{n}I", buf, off)
        self.set_u64(digest, self.u64(digest) + sum(reference.digest_term(i, b) for i, b in enumerate(bits)))
        self.set_u64(nonfinite, self.u64(nonfinite) + sum((b & 0x7F800000) == 0x7F800000 for b in bits))

    def nha_digest_compare(self, ref: int, cur: int, mismatches: int) -> None:
        if self.u64(cur) != self.u64(ref):
            self.set_u64(mismatches, self.u64(mismatches) + 1)
        self.set_u64(cur, 0)

    def nha_mem_write(self, p: int, n: int, base: int, seed: int, invert: int) -> None:
        for i in range(n):
            self.set_u64(p + 8 * i, reference.pattern(seed, base + i) ^ invert)
            if self.flip == base + i:
                self.set_u64(p + 8 * i, self.u64(p + 8 * i) ^ (1 << 5))

    def nha_mem_verify(self, p: int, n: int, base: int, seed: int, invert: int, errors: int, first: int) -> None:
        for i in range(n):
            if self.u64(p + 8 * i) != reference.pattern(seed, base + i) ^ invert:
                self.set_u64(errors, self.u64(errors) + 1)
                self.set_u64(first, min(self.u64(first), base + i))


Fault = Callable[[int, list[float]], None]  # (call number from 0, C as a flat list) → changes C in place


class FakeCublas:
    """C = A·B (column-major, BF16 in, float32 out); `fault` plays a sick GPU."""

    def __init__(self, dev: FakeDevice, fault: Fault | None = None) -> None:
        self.dev, self.fault, self.calls = dev, fault, 0

    def gemm_bf16(self, n: int, a: int, b: int, c: int) -> None:
        A = [reference.bf16_value(x) for x in struct.unpack_from(f"<{n * n}H", *self.dev._at(a))]
        B = [reference.bf16_value(x) for x in struct.unpack_from(f"<{n * n}H", *self.dev._at(b))]
        out = [sum(A[r + k * n] * B[k + col * n] for k in range(n)) for col in range(n) for r in range(n)]
        if self.fault is not None:
            self.fault(self.calls, out)
        self.calls += 1
        buf, off = self.dev._at(c)
        struct.pack_into(f"<{n * n}f", buf, off, *out)


def burn(dev: FakeDevice, blas: Any, events: list[dict[str, Any]] | None = None) -> Any:
    from agent.burn.gpuburn import Burn

    return Burn(dev, blas, (events if events is not None else []).append)  # type: ignore[arg-type]
