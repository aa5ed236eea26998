"""Reading one GPU through NVML into a `GpuReading` (no judgement here).

A field the GPU or driver does not have (``NOT_SUPPORTED``, or
``FUNCTION_NOT_FOUND`` from an older driver) is left as None and listed in
``unsupported``: not applicable, never a failure. ``GPU_IS_LOST`` on any call
ends the reading with ``lost=True``. Any other NVML error is kept in
``errors`` (shown as an unknown finding) and the rest of the GPU is still read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import nvml
from .pci import normalize

T = TypeVar("T")

ECC_KINDS = (("corrected", 0), ("uncorrected", 1))  # NVML_MEMORY_ERROR_TYPE_*
ECC_SCOPES = (("volatile", 0), ("aggregate", 1))  # NVML_VOLATILE_ECC / NVML_AGGREGATE_ECC
NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))  # NVML_NVLINK_ERROR_DL_*
FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
FIELD_SLOWDOWN_TLIMIT, FIELD_SHUTDOWN_TLIMIT = 194, 193  # the preferred interface on Ada and later (nvml.h)
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN = 0, 1  # NVML_TEMPERATURE_THRESHOLD_*


class GpuLost(Exception):
    pass


@dataclass
class NvLink:
    up: bool
    counters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Fabric:
    """nvmlDeviceGetGpuFabricInfo(V): where the GPU's NVLink fabric (NVSwitch,
    Fabric Manager) stands. `health` is the v3 healthSummary, None before v3."""

    state: int  # FABRIC_* below
    status: int  # an nvmlReturn_t: the result of training once COMPLETED
    health: int | None = None


FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED = 0, 1, 2, 3
HEALTH_HEALTHY, HEALTH_UNHEALTHY, HEALTH_LIMITED = 1, 2, 3  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*


@dataclass
class GpuReading:
    index: int
    pci: str = ""  # normalised, "0000:3b:00"
    bus_id: str = ""  # as NVML prints it
    uuid: str = ""
    name: str = ""
    serial: str = ""
    lost: bool = False
    ecc: dict[tuple[str, str], int] = field(default_factory=dict)  # (corrected|uncorrected, volatile|aggregate)
    remapped: tuple[int, int, int, int] | None = None  # correctable, uncorrectable, pending, failure
    retired: dict[str, int] = field(default_factory=dict)  # sbe, dbe
    retired_pending: int | None = None
    temperature: int | None = None
    slowdown: int | None = None
    shutdown: int | None = None
    clocks_event: int | None = None
    pcie: dict[str, int] = field(default_factory=dict)  # gen, gen_max, width, width_max
    nvlink: dict[int, NvLink] = field(default_factory=dict)
    recovery_action: int | None = None
    persistence: int | None = None  # 1 enabled, 0 disabled; None: not applicable (not Linux, or MIG-only handles)
    pcie_replay: int | None = None
    fabric: Fabric | None = None  # None: the GPU is on no NVLink fabric (or the driver cannot say)
    unsupported: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Reader:
    """Reads GPUs; remembers per GPU what never changes (thresholds, which NVLinks exist)."""

    def __init__(self, pynvml: Any) -> None:
        self.nv = pynvml
        self._links: dict[str, list[int]] = {}
        self._thresholds: dict[str, tuple[int | None, int | None]] = {}

    def read(self, index: int) -> GpuReading:
        r = GpuReading(index)
        try:
            self._read(r)
        except GpuLost:
            r.lost = True
        return r

    def _get(self, r: GpuReading, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except Exception as exc:
            if nvml.is_lost(exc):
                raise GpuLost() from None
            if nvml.not_applicable(exc):
                r.unsupported.append(what)
            elif nvml.code(exc) is not None:
                r.errors.append(f"{what}: {exc}")
            else:
                raise
            return None

    def _read(self, r: GpuReading) -> None:
        nv = self.nv
        h = self._get(r, "handle", nv.nvmlDeviceGetHandleByIndex, r.index)
        if h is None:
            return
        pci = self._get(r, "pci", nv.nvmlDeviceGetPciInfo, h)
        if pci is not None:
            r.bus_id = nvml.text(pci.busId)
            r.pci = normalize(r.bus_id)
        r.uuid = nvml.text(self._get(r, "uuid", nv.nvmlDeviceGetUUID, h) or "")
        r.name = nvml.text(self._get(r, "name", nv.nvmlDeviceGetName, h) or "")
        r.serial = nvml.text(self._get(r, "serial", nv.nvmlDeviceGetSerial, h) or "")
        self._memory(r, h)
        self._thermal(r, h)
        self._pcie(r, h)
        self._nvlink(r, h)
        self._recovery(r, h)
        self._stack(r, h)

    def _memory(self, r: GpuReading, h: Any) -> None:
        nv = self.nv
        for kind, et in ECC_KINDS:
            for scope, ct in ECC_SCOPES:
                v = self._get(r, f"ecc_{kind}_{scope}", nv.nvmlDeviceGetTotalEccErrors, h, et, ct)
                if v is not None:
                    r.ecc[(kind, scope)] = int(v)
        r.remapped = self._get(r, "remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
        for cause, c in (("sbe", 0), ("dbe", 1)):
            pages = self._get(r, f"retired_pages_{cause}", nv.nvmlDeviceGetRetiredPages, h, c)
            if pages is not None:
                r.retired[cause] = len(pages)
        r.retired_pending = self._get(r, "retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)

    def _thermal(self, r: GpuReading, h: Any) -> None:
        nv = self.nv
        r.temperature = self._get(r, "temperature", nv.nvmlDeviceGetTemperature, h, 0)
        key = r.uuid or r.pci or f"#{r.index}"
        if key not in self._thresholds:
            slow = self._get(r, "slowdown_threshold", nv.nvmlDeviceGetTemperatureThreshold, h, THRESHOLD_SLOWDOWN)
            shut = self._get(r, "shutdown_threshold", nv.nvmlDeviceGetTemperatureThreshold, h, THRESHOLD_SHUTDOWN)
            if slow is None and shut is None:
                slow, shut = self._fields(r, h, FIELD_SLOWDOWN_TLIMIT), self._fields(r, h, FIELD_SHUTDOWN_TLIMIT)
            self._thresholds[key] = (slow, shut)
        r.slowdown, r.shutdown = self._thresholds[key]
        r.clocks_event = self._get(r, "clocks_event_reasons", self._clock_reasons, h)

    def _clock_reasons(self, h: Any) -> int:
        try:
            return int(self.nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        except Exception as exc:
            if nvml.code(exc) != nvml.FUNCTION_NOT_FOUND:
                raise
            # Drivers before the "clocks event" rename only have the throttle-reasons name.
            return int(self.nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))

    def _pcie(self, r: GpuReading, h: Any) -> None:
        nv = self.nv
        for key, fn in (
            ("gen", nv.nvmlDeviceGetCurrPcieLinkGeneration),
            ("gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration),
            ("width", nv.nvmlDeviceGetCurrPcieLinkWidth),
            ("width_max", nv.nvmlDeviceGetMaxPcieLinkWidth),
        ):
            v = self._get(r, f"pcie_{key}", fn, h)
            if v is not None:
                r.pcie[key] = int(v)

    def _nvlink(self, r: GpuReading, h: Any) -> None:
        nv = self.nv
        key = r.uuid or r.pci or f"#{r.index}"
        links = self._links.get(key)
        if links is None:
            links = self._links[key] = self._discover_links(h)
        for link in links:
            up = self._get(r, f"nvlink{link}_state", nv.nvmlDeviceGetNvLinkState, h, link)
            if up is None:
                continue
            state = r.nvlink[link] = NvLink(bool(up))
            for name, counter in NVLINK_COUNTERS:
                v = self._get(r, f"nvlink{link}_{name}", nv.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                if v is not None:
                    state.counters[name] = int(v)

    def _discover_links(self, h: Any) -> list[int]:
        """Links that exist: NVML answers INVALID_ARGUMENT past the last one and
        NOT_SUPPORTED on boards without NVLink."""
        out = []
        for link in range(self.nv.NVML_NVLINK_MAX_LINKS):
            try:
                self.nv.nvmlDeviceGetNvLinkState(h, link)
            except Exception as exc:
                if nvml.is_lost(exc):
                    raise GpuLost() from None
                if nvml.code(exc) is None:
                    raise
                continue
            out.append(link)
        return out

    def _stack(self, r: GpuReading, h: Any) -> None:
        nv = self.nv
        r.persistence = self._get(r, "persistence_mode", nv.nvmlDeviceGetPersistenceMode, h)
        r.pcie_replay = self._get(r, "pcie_replay", nv.nvmlDeviceGetPcieReplayCounter, h)
        r.fabric = self._get(r, "fabric", self._fabric, h)

    def _fabric(self, h: Any) -> Fabric | None:
        """The v3 struct (health summary) where the driver has nvmlDeviceGetGpuFabricInfoV,
        else the first one (R535 and later on NVSwitch systems)."""
        from ctypes import byref

        nv = self.nv
        try:
            info = nv.c_nvmlGpuFabricInfo_v3_t()
            nv.nvmlDeviceGetGpuFabricInfoV(h, byref(info))
            health: int | None = int(info.healthSummary)
        except Exception as exc:
            if nvml.code(exc) not in (nvml.FUNCTION_NOT_FOUND, nvml.ARGUMENT_VERSION_MISMATCH):
                raise
            info = nv.c_nvmlGpuFabricInfo_t()
            nv.nvmlDeviceGetGpuFabricInfo(h, byref(info))
            health = None
        if int(info.state) == FABRIC_NOT_SUPPORTED:
            return None
        return Fabric(int(info.state), int(info.status), health or None)

    def _recovery(self, r: GpuReading, h: Any) -> None:
        r.recovery_action = self._fields(r, h, FIELD_RECOVERY_ACTION)

    def _fields(self, r: GpuReading, h: Any, field_id: int) -> int | None:
        values = self._get(r, f"field{field_id}", self.nv.nvmlDeviceGetFieldValues, h, [field_id])
        if values is None:
            return None
        v = values[0]
        if v.nvmlReturn == nvml.GPU_IS_LOST:
            raise GpuLost()
        if v.nvmlReturn != 0:
            if v.nvmlReturn not in (nvml.NOT_SUPPORTED, nvml.INVALID_ARGUMENT):
                r.errors.append(f"field {field_id}: NVML error {v.nvmlReturn}")
            else:
                r.unsupported.append(f"field{field_id}")
            return None
        return int(nvml.field_value(v))
