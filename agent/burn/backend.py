"""The seam between the orchestration and what actually stresses a GPU.

A backend starts jobs; a job covers one or more GPUs (the built-in backend
runs one worker process per GPU, DCGM one `dcgmi diag` for all of them) and
is polled, never waited on: a job whose GPU hangs is killed at its deadline
and abandoned, so a hung GPU cannot hang the others or the agent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from .model import BurnPlan, GpuInfo, GpuOutcome
from .verdict import WatchSummary


class BackendError(Exception):
    """The backend could not start at all (the message says why)."""


class Job(Protocol):
    gpus: tuple[int, ...]

    def poll(self) -> Mapping[int, GpuOutcome] | None:
        """The outcomes once the job has finished, None while it runs. Never blocks."""
        ...

    def phase(self) -> str:
        """Where the job is (for the message when it times out)."""
        ...

    def kill(self) -> None:
        """Stop it now; must not block (a process stuck in the driver is abandoned)."""
        ...


class Backend(Protocol):
    name: str

    def unavailable(self) -> str | None:
        """Why this backend cannot run here, or None when it can. Cheap: no CUDA init."""
        ...

    def discover(self) -> list[GpuInfo]:
        """The GPUs, when NVML cannot list them. Raises BackendError."""
        ...

    def time_limit(self, plan: BurnPlan) -> float:
        """Seconds after the start by which every job must have finished."""
        ...

    def start(self, gpus: Sequence[GpuInfo], plan: BurnPlan) -> Sequence[Job]:
        """Start jobs covering `gpus` and return at once. Raises BackendError."""
        ...


class Inventory(Protocol):
    """The GPUs as NVML sees them, and who is using them."""

    def gpus(self) -> list[GpuInfo] | None:
        """None when NVML cannot be used here (no driver, no library)."""
        ...

    def processes(self) -> Mapping[int, tuple[int, ...]] | None:
        """GPU index → PIDs of the processes using it (compute and graphics); None when NVML cannot tell."""
        ...


class Watch(Protocol):
    """NVML watched during a burn."""

    def start(self, gpus: Sequence[GpuInfo]) -> None: ...

    def stop(self, timeout: float) -> Mapping[int, WatchSummary]:
        """Stop watching; a GPU whose NVML call hung gets a GPU_LOST problem."""
        ...


class NoWatch:
    """When NVML is not available: nothing is watched, and the report says so."""

    def __init__(self, why: str) -> None:
        self.why = why
        self._gpus: Sequence[GpuInfo] = ()

    def start(self, gpus: Sequence[GpuInfo]) -> None:
        self._gpus = gpus

    def stop(self, timeout: float) -> Mapping[int, WatchSummary]:
        return {g.index: WatchSummary(notes=(f"not watched by NVML: {self.why}",)) for g in self._gpus}
