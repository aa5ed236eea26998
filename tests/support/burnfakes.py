"""Fakes at the burn's own interfaces (backend, job, inventory, watch), for
tests that exercise the orchestration without a GPU."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.burn.backend import BackendError
from agent.burn.model import BurnPlan, GpuInfo, GpuOutcome, Problem
from agent.burn.verdict import WatchSummary

H100 = "NVIDIA H100 80GB HBM3"


def gpus(n: int, name: str = H100) -> list[GpuInfo]:
    return [GpuInfo(i, uuid=f"GPU-{i:08x}", name=name, pci_bus_id=f"00000000:{0x18 + i:02X}:00.0") for i in range(n)]


def good(i: int, flops: float = 700e12, digest: str = "5eed") -> GpuOutcome:
    return GpuOutcome(i, gemm_flops=flops, memory_bandwidth=2900e9, iterations=40, digest=digest, group="h100")


@dataclass
class FakeJob:
    """Finishes with `outcome` after `delay` seconds, and only once `gate()` says
    so; `hang` never finishes (and ignores kill). `polls` counts the polls,
    `on_poll(job)` runs at each (a test's hook for events during the burn)."""

    gpus: tuple[int, ...]
    outcome: Callable[[], Mapping[int, GpuOutcome]]
    delay: float = 0.0
    hang: bool = False
    started: float = field(default_factory=time.monotonic)
    killed: bool = False
    gate: Callable[[], bool] = lambda: True
    on_poll: Callable[[FakeJob], None] = lambda job: None
    polls: int = 0

    def poll(self) -> Mapping[int, GpuOutcome] | None:
        self.polls += 1
        self.on_poll(self)
        if self.hang or time.monotonic() - self.started < self.delay or not self.gate():
            return None
        return self.outcome()

    def phase(self) -> str:
        return "gemm"

    def kill(self) -> None:
        self.killed = True


class FakeBackend:
    name = "fake"

    def __init__(
        self,
        outcomes: Mapping[int, GpuOutcome] | None = None,
        *,
        hang: Sequence[int] = (),
        delay: float = 0.0,
        limit: float = 30.0,
        why_not: str | None = None,
        start_error: str | None = None,
        listed: Sequence[GpuInfo] | None = None,
    ) -> None:
        self.outcomes = dict(outcomes or {})
        self.hang, self.delay, self.limit = set(hang), delay, limit
        self.why_not, self.start_error, self.listed = why_not, start_error, listed
        self.jobs: list[FakeJob] = []
        self.plans: list[BurnPlan] = []
        self.started = 0

    def unavailable(self) -> str | None:
        return self.why_not

    def discover(self) -> list[GpuInfo]:
        if self.listed is None:
            raise BackendError("cannot list GPUs")
        return list(self.listed)

    def time_limit(self, plan: BurnPlan) -> float:
        return self.limit

    def start(self, gpus: Sequence[GpuInfo], plan: BurnPlan) -> list[FakeJob]:
        if self.start_error:
            raise BackendError(self.start_error)
        self.started += 1
        self.plans.append(plan)
        for g in gpus:
            out = self.outcomes.get(g.index) or good(g.index)
            self.jobs.append(FakeJob((g.index,), lambda o=out: {o.index: o}, self.delay, g.index in self.hang))
        return list(self.jobs[-len(gpus) :])


class FakeWatch:
    def __init__(self, problems: Mapping[int, Sequence[Problem]] | None = None) -> None:
        self.problems = problems or {}
        self.watched: list[int] = []
        self.stopped = threading.Event()

    def start(self, gpus: Sequence[GpuInfo]) -> None:
        self.watched = [g.index for g in gpus]

    def stop(self, timeout: float) -> Mapping[int, WatchSummary]:
        self.stopped.set()
        return {i: WatchSummary(problems=tuple(self.problems.get(i, ()))) for i in self.watched}


class FakeInventory:
    def __init__(self, listed: Sequence[GpuInfo] | None, busy: Mapping[int, int] | None = None) -> None:
        self.listed = None if listed is None else list(listed)
        self.busy = dict(busy or {})
        self.process_polls = 0  # calls of processes(): proof that a busy check ran

    def gpus(self) -> list[GpuInfo] | None:
        return None if self.listed is None else list(self.listed)

    def processes(self) -> Mapping[int, tuple[int, ...]] | None:
        """`busy` counts processes per GPU; their PIDs are 4242, 4243, …"""
        self.process_polls += 1
        if self.listed is None:
            return None
        return {g.index: tuple(range(4242, 4242 + self.busy.get(g.index, 0))) for g in self.listed}


def sysfs(tmp: Path, devices: dict[str, tuple[str, str]]) -> Path:
    """A /sys with these PCI devices (address → (vendor, class))."""
    root = tmp / "sys"
    for addr, (vendor, cls) in devices.items():
        d = root / "bus" / "pci" / "devices" / addr
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
    (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    return root


NODE = {
    "0000:18:00.0": ("0x10de", "0x030200"),  # H100: 3D controller
    "0000:2a:00.0": ("0x10de", "0x030200"),
    "0000:05:00.0": ("0x10de", "0x068000"),  # NVSwitch: a bridge, not a GPU
    "0000:00:1f.0": ("0x8086", "0x060100"),
    "0000:03:00.0": ("0x10de", "0x030000"),  # a VGA-class NVIDIA GPU
}
