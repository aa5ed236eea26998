"""Timing helpers shared by the benchmarks: repeated batches, medians, minimums.

This kind of machine is shared and noisy, so every figure is a batch of calls
repeated many times, reported as the median and the minimum per call. CPU
time of the calling thread (`time.thread_time`) is the default clock: time
spent waiting for a CPU does not count, which keeps figures steady under
load; `--timer wall` measures elapsed time instead.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}


@dataclass(frozen=True)
class Figure:
    median: float  # seconds per call
    minimum: float

    def us(self) -> str:
        return f"{self.median * 1e6:9.1f} {self.minimum * 1e6:9.1f}"

    def ms(self) -> str:
        return f"{self.median * 1e3:8.3f} {self.minimum * 1e3:8.3f}"


def calibrate(fn: Callable[[], object], clock: Callable[[], float], target: float = 0.02) -> int:
    """Calls per batch so that one batch takes about `target` seconds."""
    number = 1
    while True:
        start = clock()
        for _ in range(number):
            fn()
        if clock() - start >= target or number >= 1 << 20:
            return number
        number *= 2


def measure(fns: dict[str, Callable[[], object]], repeat: int, clock_name: str = "cpu") -> dict[str, Figure]:
    """Times each function in batches, interleaved (a, b, a, b, ...) so that
    they share the machine's slow and fast moments; GC is off while timing,
    as in `timeit`."""
    clock = CLOCKS[clock_name]
    numbers = {name: calibrate(fn, clock) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for name, fn in fns.items():
                number = numbers[name]
                start = clock()
                for _ in range(number):
                    fn()
                samples[name].append((clock() - start) / number)
    finally:
        if enabled:
            gc.enable()
    return {name: Figure(statistics.median(s), min(s)) for name, s in samples.items()}
