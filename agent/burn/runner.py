"""Everything one burn needs, from the config: which backend, which GPUs,
the NVML watch, and the verdict thresholds. Shared by `agent burn`, `agent
selftest --burn` and the preflight source."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..gpu.pci import bus_gpus
from ..hostpaths import HostPaths
from ..probe import Prober
from .backend import Backend, BackendError, Inventory, NoWatch, Watch
from .builtin import BuiltinBackend
from .dcgm import DcgmBackend
from .model import BurnPlan, BurnReport, GpuInfo, GpuVerdict
from .orchestrator import run_burn
from .verdict import Thresholds

log = logging.getLogger(__name__)

NVML_TIMEOUT = 30.0  # listing the GPUs through NVML; longer means a GPU is hanging the driver


def pci_gpu_count(paths: HostPaths) -> int:
    """NVIDIA GPUs on the PCI bus, whatever the driver says: the GPUs the GPU check counts."""
    return len(bus_gpus(paths))


@dataclass(frozen=True, slots=True)
class Settings:
    backend: str = "auto"  # auto | builtin | dcgm
    plan: BurnPlan = field(default_factory=BurnPlan)
    thresholds: Thresholds = field(default_factory=Thresholds)
    throttle_share: float = 0.1
    watch_interval: float = 1.0
    dcgm_level: int = 2
    dcgm_timeout: float = 1200.0
    nvml_library: str = ""  # as the GPU check resolves it; "" for the normal lookup


@dataclass(frozen=True, slots=True)
class Discovery:
    gpus: tuple[GpuInfo, ...] = ()
    nvml: bool = False  # listed by NVML (so NVML can watch them)
    no_gpu: bool = False
    error: str = ""  # listing failed in a way that is a fault (NVML hung)
    unavailable: str = ""  # listing was not possible here
    note: str = ""


class Runner:
    def __init__(
        self,
        settings: Settings,
        paths: HostPaths,
        *,
        inventory: Inventory | None = None,
        backends: Sequence[Backend] | None = None,
        watch: Callable[[], Watch] | None = None,
    ) -> None:
        from .nvml import NvmlInventory, NvmlWatch

        self.settings, self.paths = settings, paths
        self.inventory: Inventory = inventory or NvmlInventory(settings.nvml_library)
        self.backends: list[Backend] = (
            list(backends)
            if backends is not None
            else [
                BuiltinBackend(),
                DcgmBackend(level=settings.dcgm_level, timeout=settings.dcgm_timeout),
            ]
        )
        self._watch = watch or (
            lambda: NvmlWatch(
                throttle_share=settings.throttle_share, interval=settings.watch_interval, library=settings.nvml_library
            )
        )
        self._prober = Prober("burn")

    def backend(self) -> tuple[Backend | None, str]:
        """The backend to use, or None and why none can run."""
        wanted = self.settings.backend
        reasons = []
        for b in self.backends:
            if wanted not in ("auto", b.name):
                continue
            why = b.unavailable()
            if why is None:
                return b, ""
            reasons.append(f"{b.name}: {why}")
        return None, "; ".join(reasons) or f"no backend named {wanted}"

    def discover(self) -> Discovery:
        res = self._prober.call("nvml-inventory", self.inventory.gpus, NVML_TIMEOUT)
        if res.hung_for is not None:
            return Discovery(error=f"NVML has not answered for {res.hung_for:.0f}s while listing the GPUs")
        if res.ok and res.value:
            return Discovery(gpus=tuple(res.value), nvml=True)
        if res.error is not None:
            log.error("listing the GPUs through NVML failed: %s", res.error)
        pci = pci_gpu_count(self.paths)
        if res.ok and res.value == []:
            return Discovery(no_gpu=True, note=f"NVML lists no GPU ({pci} NVIDIA GPU(s) on the PCI bus)")
        if pci == 0:
            return Discovery(no_gpu=True, note="no NVIDIA GPU on the PCI bus")
        backend, why = self.backend()
        if backend is None:
            return Discovery(unavailable=f"{pci} NVIDIA GPU(s) on the PCI bus but NVML is not available and {why}")
        try:
            gpus = backend.discover()
        except BackendError as exc:
            return Discovery(unavailable=f"{pci} NVIDIA GPU(s) on the PCI bus; NVML is not available and {exc}")
        return Discovery(gpus=tuple(gpus), note="NVML is not available: GPUs listed by CUDA, not watched")

    def burn(
        self,
        found: Discovery,
        only: Sequence[int] | None = None,
        cancel: threading.Event | None = None,
        seconds: float | None = None,
    ) -> BurnReport:
        now = time.time()
        backend, why = self.backend()
        gpus = [g for g in found.gpus if only is None or g.index in only]
        base = BurnReport(backend=backend.name if backend else "none", started=now, finished=now, note=found.note)
        if found.no_gpu or found.error or found.unavailable:
            return replace(base, no_gpu=found.no_gpu, error=found.error, unavailable=found.unavailable)
        if backend is None:
            verdicts = tuple(GpuVerdict(g.index, "unknown", name=g.name, uuid=g.uuid, notes=(why,)) for g in gpus)
            return replace(base, gpus=verdicts, unavailable=why)
        plan = self.settings.plan if seconds is None else replace(self.settings.plan, seconds=seconds)
        watch = self._watch() if found.nvml else NoWatch("NVML is not available")
        log.info("burning %d GPU(s) for %.0fs with the %s backend", len(gpus), plan.seconds, backend.name)
        report = run_burn(backend, gpus, plan, watch, self.settings.thresholds, cancel)
        return replace(report, note=found.note)
