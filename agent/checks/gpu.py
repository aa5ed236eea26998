"""GPU check: NVML polled per GPU, plus the Xid event source (`agent.gpu.xidsource`).

See docs/gpu.md for what is judged and why. pynvml is imported only when the
check runs (`agent.gpu.nvml`), so a node without GPUs pays nothing for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..catalog import MetricSpec, Reason
from ..config import CheckConfig, opt
from ..findings import Observation, ObservationBuilder, Severity
from ..gpu import xids
from ..gpu.metrics import GPU_METRICS, XID_METRICS
from ..gpu.pci import bus_gpus
from ..probe import Prober
from ..state import StateDir
from . import CheckContext, CheckSpec

log = logging.getLogger(__name__)

F = "GPU"
REASONS: tuple[Reason, ...] = (
    Reason("NvmlUnavailable", Severity.INFO, "NVML cannot be used (no driver or library); GPUs are not polled.", family=F),
    Reason("GpuLost", Severity.CRITICAL, "NVML reports GPU_IS_LOST: the GPU fell off the bus.", family=F),
    Reason("GpuMissing", Severity.CRITICAL, "Fewer GPUs in NVML than expected, or a GPU on the PCI bus that NVML lacks.", family=F),
    Reason("NvmlCallHung", Severity.WARNING, "An NVML call for this GPU did not return in time.", unknown=True, family=F),
    Reason("NvmlError", Severity.WARNING, "NVML returned an unexpected error for this GPU.", unknown=True, family=F),
    Reason("EccUncorrectable", Severity.CRITICAL, "Uncorrectable ECC errors since the driver loaded (or new this boot).", family=F),
    Reason("EccCorrectedRate", Severity.WARNING, "Corrected ECC errors above checks.gpu.ecc_corrected_rate.", family=F),
    Reason("RowRemapFailure", Severity.CRITICAL, "Row remapping failed: the GPU is out of spare rows (RMA criterion).", family=F),
    Reason("RowRemapPending", Severity.WARNING, "A row remap is pending; it takes effect on a GPU reset.", family=F),
    Reason("RetiredPagesPending", Severity.WARNING, "Pages are pending retirement (pre-Ampere); reset or reboot.", family=F),
    Reason("GpuTemperatureSlowdown", Severity.WARNING, "At or above the GPU's own slowdown temperature.", family=F),
    Reason("GpuTemperatureShutdown", Severity.CRITICAL, "At or above the GPU's own shutdown temperature.", family=F),
    Reason("GpuHwSlowdown", Severity.WARNING, "Clocks cut by hardware slowdown, thermal slowdown or power brake.", family=F),
    Reason("NvLinkDown", Severity.WARNING, "An NVLink that was up earlier this boot is down.", family=F),
    Reason("NvLinkErrors", Severity.WARNING, "NVLink recovery errors, or CRC/replay errors above the configured rate.", family=F),
    Reason("PcieLinkDegraded", Severity.WARNING, "Under load, the PCIe link runs below its maximum generation or width.", family=F),
    Reason("GpuRecoveryAction", Severity.CRITICAL, "NVML's GPU recovery action (field 230) asks for a reset, reboot or drain.", family=F),
    Reason("XidOther", Severity.WARNING, "An Xid that is not in the catalog.", family=F),
    Reason("GpuInitFailed", Severity.CRITICAL, "RmInitAdapter failed: a GPU did not initialise.", family=F),
    Reason("NvSwitchSXid", Severity.WARNING, "An NVSwitch SXid error (critical when fatal).", family=F),
    Reason("KmsgCoverageLost", Severity.WARNING, "Kernel log records were lost before the agent read them; Xids may be missed.", unknown=True, family=F),
    Reason("KmsgUnavailable", Severity.WARNING, "The kernel log cannot be read; Xids come from NVML events only.", unknown=True, family=F),
    Reason("NvmlEventsUnsupported", Severity.INFO, "NVML cannot deliver Xid events for this GPU; the kernel log still does.", family=F),
    *(
        Reason(i.reason, i.severity, f"Xid {i.xid} {i.mnemonic}: {i.meaning} (action: {i.action}).".replace(" :", ":"), family=F)
        for i in xids.catalog().values()
    ),
)
METRICS: tuple[MetricSpec, ...] = GPU_METRICS + XID_METRICS

SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class GpuConfig(CheckConfig):
    interval: float = opt(30.0, "Time between NVML polls.", duration=True, min=1)
    timeout: float = opt(60.0, "A poll longer than this is reported as CheckTimeout.", duration=True, min=0.1)
    nvml_library: str = opt("", "Path of libnvidia-ml.so.1 (host path); empty: the normal library lookup.")
    driver_root: str = opt(
        "",
        'Host root of the driver whose libnvidia-ml.so.1 is used; several separated by ":" are tried in order '
        '(e.g. "/run/nvidia/driver:/": the GPU Operator\'s containerised driver, else the host\'s).',
    )
    call_timeout: float = opt(5.0, "NVML calls for one GPU longer than this are reported as NvmlCallHung.", duration=True, min=0.1)
    expected_count: int = opt(0, "GPUs this node must have; 0: the NVIDIA GPUs on the PCI bus (and those seen this boot).", min=0)
    ecc_corrected_rate: float = opt(1000.0, "Corrected ECC errors per hour above which EccCorrectedRate is raised; 0: never.", min=0)
    nvlink_error_rate: float = opt(100.0, "NVLink CRC + replay errors per second on one link above which NvLinkErrors is raised.", min=0)
    xid_events: bool = opt(True, "Follow Xid errors as they happen (NVML events and the kernel log).")
    kmsg_path: str = opt("/dev/kmsg", "Kernel log to follow (host path); also a file or FIFO of /dev/kmsg records.")
    dedupe_window: float = opt(10.0, "An Xid from NVML and from the kernel log for the same GPU within this window is one event.", duration=True, min=0.1, max=600)
    app_xid_hold: float = opt(300.0, "How long a finding for an Xid whose action is none or restart_app stays.", duration=True, min=0)
    coverage_lost_hold: float = opt(3600.0, "How long KmsgCoverageLost stays after the last lost record.", duration=True, min=0)
    xid_severity: Mapping[str, str] = opt(
        MappingProxyType({}), 'Severity per Xid, overriding the catalog: { "109" = "warning", "13" = "critical" }.'
    )

    def validate(self) -> tuple[str, str] | None:
        if self.nvml_library and self.driver_root:
            return "driver_root", "set either nvml_library or driver_root, not both"
        if any(not root.startswith("/") for root in self.driver_roots()):
            return "driver_root", f'expected absolute host paths separated by ":", got "{self.driver_root}"'
        for key, value in self.xid_severity.items():
            if not key.isdigit() or int(key) not in xids.catalog():
                return f"xid_severity.{key}", f'expected an Xid from the catalog (see "agent xid {key}"), got "{key}"'
            if value not in SEVERITIES:
                return f"xid_severity.{key}", f'expected one of "info", "warning", "critical", got "{value}"'
        return None

    def driver_roots(self) -> list[str]:
        return [root for root in self.driver_root.split(":") if root]

    def severity_overrides(self) -> dict[int, Severity]:
        return {int(k): Severity(v) for k, v in self.xid_severity.items()}


def nvml_library(ctx: CheckContext, cfg: GpuConfig) -> str:
    """The library to load ("" for the normal lookup), resolved under the host root."""
    from ..gpu import nvml

    if cfg.nvml_library:
        return ctx.paths.root(cfg.nvml_library)
    if cfg.driver_root:
        return nvml.find_library(*(ctx.paths.root(root) for root in cfg.driver_roots()))
    return ""


class GpuCheck:
    name = "gpu"

    def __init__(self, ctx: CheckContext, cfg: GpuConfig) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.prober = Prober("nvml")
        self.state = StateDir(ctx.state_dir)
        self.reader: Any = None  # agent.gpu.poll.Reader, made with the NVML session
        self._scanned = False

    def known_findings(self) -> Iterable[tuple[str, str]]:
        yield ("gpus", "GpuMissing")
        for i in range(len(bus_gpus(self.ctx.paths))):
            for reason in ("GpuLost", "EccUncorrectable", "RowRemapFailure", "GpuRecoveryAction", "GpuHwSlowdown"):
                yield (f"gpu{i}", reason)

    def run(self) -> Observation:
        from ..gpu import poller

        b = ObservationBuilder(self.name)
        seen = poller.poll(self, b, time.time())
        if not self._scanned:
            self._scanned = True
            from ..gpu import xidsource

            xidsource.scan_once_unless_live(self.ctx, self.cfg, b, seen)
        return b.build()


def _sources(ctx: CheckContext, cfg: GpuConfig) -> list[Any]:
    if not cfg.xid_events:
        return []
    from ..gpu.xidsource import XidSource

    return [XidSource(ctx, cfg)]


SPEC = CheckSpec(
    name="gpu",
    summary="NVIDIA GPUs through NVML (ECC, remapped rows, thermals, NVLink, PCIe, count) and Xid errors as they happen.",
    config=GpuConfig,
    build=GpuCheck,
    sources=_sources,
)
