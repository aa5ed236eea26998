"""Values of the burn test: what a backend reports per GPU, what the
verdict says per GPU, and the report of one whole burn.

`Fault` is a bounded set (it is a metric label and a stable word in
messages); everything free-form goes into a problem's message.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "unknown"]


class Fault(enum.StrEnum):
    COMPUTE_MISMATCH = "compute_mismatch"  # GEMM digests differ across iterations, GPUs or from the host reference
    MEMORY_ERRORS = "memory_errors"  # the pattern test read back something it did not write
    SLOW_GEMM = "slow_gemm"  # below the node median share or the expected figure for the model
    SLOW_MEMORY = "slow_memory"
    XID = "xid"  # an Xid reported by NVML during the burn
    ECC = "ecc"  # new uncorrectable ECC errors or pages pending retirement
    ROW_REMAP = "row_remap"  # new uncorrectable remapped rows, remap pending or failed
    THROTTLE = "throttle"  # hardware slowdown, thermal slowdown or power brake under load
    GPU_LOST = "gpu_lost"  # NVML says the GPU is gone, or an NVML call on it hung
    TIMEOUT = "timeout"  # the worker did not finish within its deadline (a hung GPU)
    CUDA_ERROR = "cuda_error"  # a CUDA/cuBLAS call failed, or the worker died
    DIAG_FAILED = "diag_failed"  # a DCGM diagnostic test failed


@dataclass(frozen=True, slots=True)
class Problem:
    fault: Fault
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"fault": self.fault.value, "message": self.message}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Problem:
        return Problem(Fault(d["fault"]), str(d["message"]))


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int  # NVML / nvidia-smi index (PCI bus order)
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    mig: bool = False  # MIG mode on: CUDA sees MIG instances, not this GPU

    @property
    def subject(self) -> str:
        return f"gpu{self.index}"


@dataclass(frozen=True, slots=True)
class BurnPlan:
    seconds: float = 60.0
    matrix_size: int = 16384
    memory_fraction: float = 0.85  # share of free device memory the pattern test covers
    memory_time_share: float = 0.25  # share of `seconds` spent on the pattern test
    hang_timeout: float = 60.0  # beyond `seconds`, before a worker counts as hung


@dataclass(frozen=True, slots=True)
class GpuOutcome:
    """What a backend measured on one GPU. Problems here are the backend's own
    findings (mismatches, CUDA errors); the verdict adds cross-GPU ones."""

    index: int
    gemm_flops: float | None = None  # achieved FLOP/s over the GEMM phase
    memory_bandwidth: float | None = None  # bytes/s written + read by the pattern test
    iterations: int = 0
    compute_errors: int = 0  # iterations whose digest differed from the first one
    memory_errors: int = 0  # 64-bit words that read back wrong
    digest: str = ""  # hex digest of C from the first iteration ("" when unknown)
    group: str = ""  # digests are comparable only within one group (model, SMs, size)
    duration: float = 0.0
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()  # what was skipped or not supported, for people
    ran: bool = True  # False: the GPU was not tested at all (result unknown)


@dataclass(frozen=True, slots=True)
class Telemetry:
    """NVML readings over the burn, per GPU."""

    power_watts_mean: float | None = None
    sm_clock_hz_mean: float | None = None
    temperature_max_c: float | None = None
    samples: int = 0


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    index: int
    status: Status
    name: str = ""
    uuid: str = ""
    gemm_flops: float | None = None
    memory_bandwidth: float | None = None
    compute_errors: int = 0
    memory_errors: int = 0
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()
    telemetry: Telemetry = field(default_factory=Telemetry)

    @property
    def subject(self) -> str:
        return f"gpu{self.index}"

    def summary(self) -> str:
        """One line for a finding: which GPU, and why it failed."""
        head = f"GPU {self.index}" + (
            f" ({self.name}" + (f", {self.uuid}" if self.uuid else "") + ")" if self.name else ""
        )
        if not self.problems:
            return f"{head}: {self.status}"
        return f"{head}: " + "; ".join(f"{p.fault.value}: {p.message}" for p in self.problems)


@dataclass(frozen=True, slots=True)
class BurnReport:
    backend: str
    started: float  # unix time
    finished: float
    gpus: tuple[GpuVerdict, ...] = ()
    no_gpu: bool = False  # nothing to test: passes
    unavailable: str = ""  # why the burn could not run at all (unknown)
    error: str = ""  # a failure not tied to one GPU (NVML hung listing them): fails
    note: str = ""  # for people (how the GPUs were found)

    @property
    def status(self) -> Status:
        if self.error or any(g.status == "fail" for g in self.gpus):
            return "fail"
        if self.no_gpu:
            return "pass"
        if self.unavailable or not self.gpus or any(g.status == "unknown" for g in self.gpus):
            return "unknown"
        return "pass"

    @property
    def duration(self) -> float:
        return max(0.0, self.finished - self.started)

    def failed(self) -> list[GpuVerdict]:
        return [g for g in self.gpus if g.status == "fail"]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> BurnReport:
        gpus = []
        for g in d.get("gpus", ()):
            g = dict(g)
            g["problems"] = tuple(Problem.from_dict(p) for p in g.get("problems", ()))
            g["notes"] = tuple(g.get("notes", ()))
            g["telemetry"] = Telemetry(**g.get("telemetry", {}))
            gpus.append(GpuVerdict(**g))
        return BurnReport(
            backend=str(d["backend"]),
            started=float(d["started"]),
            finished=float(d["finished"]),
            gpus=tuple(gpus),
            no_gpu=bool(d.get("no_gpu")),
            unavailable=str(d.get("unavailable", "")),
            error=str(d.get("error", "")),
            note=str(d.get("note", "")),
        )


def by_index(items: Sequence[Any]) -> dict[int, Any]:
    return {item.index: item for item in items}
