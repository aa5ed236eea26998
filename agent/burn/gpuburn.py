"""The built-in burn of one GPU, run inside its worker process.

1. GEMM on the tensor cores (BF16 in, FP32 accumulate and out) on the same
   inputs again and again. After each GEMM a kernel folds C into a 64-bit
   digest and another compares it with the first iteration's on the device,
   so nothing but two counters crosses the bus while it runs. At the end a few
   elements of C are checked against the host (agent.burn.reference).
2. A pattern test over a share of the free memory: address-dependent 64-bit
   words written by a kernel, verified by another that counts mismatches;
   every other pass writes the complement, so each bit is tested both ways.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import kernels, reference
from .cuda import CudaError, Device, ptr, u64

Emit = Callable[[dict[str, Any]], None]
THREADS = 256
SEED_A, SEED_B = 0xA11CE, 0xB0B
SAMPLES = 8  # elements of C checked on the host
CHUNK = 1 << 30  # the memory test allocates in chunks: one huge allocation fails on fragmentation
BATCH_SECONDS = 0.5  # host syncs (and reports progress) about this often


@dataclass
class Result:
    gemm_flops: float | None = None
    memory_bandwidth: float | None = None
    iterations: int = 0
    compute_errors: int = 0
    nonfinite: int = 0
    memory_errors: int = 0
    first_bad_word: int | None = None
    digest: str = ""
    reference_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Burn:
    def __init__(self, dev: Device, blas: Any, emit: Emit) -> None:
        self.dev, self.blas, self.emit = dev, blas, emit
        self.phase = "setup"
        self.fn = dev.load(kernels.compile_module(*dev.capability()), kernels.NAMES)
        self.blocks = dev.attribute("MULTIPROCESSOR_COUNT") * 8
        self.result = Result()

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.emit({"event": "phase", "phase": phase})

    def _launch(self, name: str, *args: tuple[type, int], blocks: int | None = None) -> None:
        self.dev.launch(self.fn[name], blocks or self.blocks, THREADS, args)

    # ------------------------------------------------------------ GEMM

    def gemm(self, n: int, seconds: float) -> None:
        self._enter("gemm")
        dev = self.dev
        a, b, c = dev.alloc(2 * n * n), dev.alloc(2 * n * n), dev.alloc(4 * n * n)
        counters = dev.alloc(8 * 4)  # reference digest, current digest, mismatches, non-finite
        try:
            dev.fill_u32(counters, 0, 8)
            self._launch("nha_fill_bf16", ptr(a), u64(n * n), u64(SEED_A))
            self._launch("nha_fill_bf16", ptr(b), u64(n * n), u64(SEED_B))
            t0 = time.monotonic()
            self.blas.gemm_bf16(n, a, b, c)
            self._launch("nha_digest_f32", ptr(c), u64(n * n), ptr(counters), ptr(counters + 24))
            iterations = 1 + self._gemm_loop(n, a, b, c, counters, t0 + seconds)
            dev.sync()
            elapsed = time.monotonic() - t0
            ref, _, mismatches, nonfinite = dev.read_u64(counters, 4)
            self.result.reference_errors = self._check_samples(n, c)
        finally:
            for p in (a, b, c, counters):
                dev.free(p)
        r = self.result
        r.iterations, r.compute_errors, r.nonfinite = iterations, mismatches, nonfinite
        r.digest, r.gemm_flops = f"{ref:016x}", 2.0 * n**3 * iterations / elapsed

    def _gemm_loop(self, n: int, a: int, b: int, c: int, counters: int, deadline: float) -> int:
        # At least one iteration is compared with the first one, however short
        # the time or slow the machine: a burn that compared nothing tested nothing.
        done, batch = 0, 1
        while done == 0 or time.monotonic() < deadline:
            t = time.monotonic()
            for _ in range(batch):
                self.blas.gemm_bf16(n, a, b, c)
                self._launch("nha_digest_f32", ptr(c), u64(n * n), ptr(counters + 8), ptr(counters + 24))
                self._launch("nha_digest_compare", ptr(counters), ptr(counters + 8), ptr(counters + 16), blocks=1)
            self.dev.sync()
            done += batch
            took = time.monotonic() - t
            self.emit({"event": "progress", "phase": "gemm", "iterations": done + 1})
            batch = max(1, min(batch * 4, int(batch * BATCH_SECONDS / max(took, 1e-6))))
        return done

    def _check_samples(self, n: int, c: int) -> list[str]:
        samples = []
        for row, col in reference.sample_positions(n, SAMPLES, SEED_A ^ SEED_B):
            raw = self.dev.read(c + 4 * (row + col * n), 4)
            samples.append((row, col, _f32(raw)))
        return reference.check_samples(n, SEED_A, SEED_B, samples)

    # ------------------------------------------------------------ memory

    def memory(self, fraction: float, seconds: float) -> None:
        self._enter("memory")
        dev = self.dev
        counters = dev.alloc(16)  # errors, first bad word
        chunks = self._alloc_chunks(int(dev.mem_info()[0] * fraction))
        try:
            dev.fill_u32(counters, 0, 2)
            dev.fill_u32(counters + 8, 0xFFFFFFFF, 2)
            total = sum(size for _, size in chunks)
            t0, passes = time.monotonic(), 0
            while passes == 0 or time.monotonic() < t0 + seconds:
                self._pattern_pass(chunks, counters, passes)
                dev.sync()
                passes += 1
                self.emit({"event": "progress", "phase": "memory", "passes": passes})
            elapsed = time.monotonic() - t0
            errors, first_bad = dev.read_u64(counters, 2)
        finally:
            for p, _ in chunks:
                dev.free(p)
            dev.free(counters)
        self.result.memory_errors = errors
        self.result.first_bad_word = first_bad if errors else None
        self.result.memory_bandwidth = 2.0 * total * passes / elapsed
        self.result.notes.append(f"memory test: {_size(total)}, {passes} passes")

    def _alloc_chunks(self, target: int) -> list[tuple[int, int]]:
        chunks: list[tuple[int, int]] = []
        left = target - target % 8
        while left >= 8:
            size = min(CHUNK, left)
            try:
                chunks.append((self.dev.alloc(size), size))
            except CudaError as exc:
                if exc.code != "CUDA_ERROR_OUT_OF_MEMORY" or not chunks:
                    raise
                self.result.notes.append(f"memory test: allocation stopped at {sum(s for _, s in chunks)} bytes")
                break
            left -= size
        return chunks

    def _pattern_pass(self, chunks: list[tuple[int, int]], counters: int, number: int) -> None:
        seed = reference.mix(number // 2 + 1)
        invert = (1 << 64) - 1 if number % 2 else 0
        base = 0
        for p, size in chunks:
            self._launch("nha_mem_write", ptr(p), u64(size // 8), u64(base), u64(seed), u64(invert))
            base += size // 8
        base = 0
        for p, size in chunks:
            self._launch(
                "nha_mem_verify",
                ptr(p),
                u64(size // 8),
                u64(base),
                u64(seed),
                u64(invert),
                ptr(counters),
                ptr(counters + 8),
            )
            base += size // 8


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _f32(raw: bytes) -> float:
    return float(struct.unpack("<f", raw)[0])
