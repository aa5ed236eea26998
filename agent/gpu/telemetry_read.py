"""Reading one GPU's telemetry through NVML into flat samples (no judgement).

Most quantities come from one ``nvmlDeviceGetFieldValues`` call per GPU (the
field ids of nvml.h, `FIELDS`). Each value carries its own ``nvmlReturn``: a
field the GPU or the driver lacks (``NOT_SUPPORTED``; ``INVALID_ARGUMENT``
from a driver older than the field id) falls back to the older call that gives
the same quantity (`LEGACY`), and when that one is missing as well the sample
is absent: never 0. A driver without ``nvmlDeviceGetFieldValues`` at all
(``FUNCTION_NOT_FOUND``) is read through the older calls alone. What NVML
offers only as a call (clocks, utilisation, framebuffer, performance state)
is read by that call. Raw units are converted to base units: mW → W, mJ → J,
ns → s, KiB → bytes, MHz → Hz, % → ratio.

An older call that answered NOT_SUPPORTED is not asked again for that GPU
while the NVML session lasts; fields are always asked (one call for all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..findings import Sample
from . import nvml

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Field:
    fid: int  # NVML_FI_DEV_* (nvml.h)
    metric: str
    scale: float  # raw NVML unit → base unit
    labels: Labels = ()


def _violation(policy: int) -> Callable[[Any, Any], float]:
    return lambda nv, h: float(nv.nvmlDeviceGetViolationStatus(h, policy).violationTime)


CLOCK_EVENT_SECONDS = "node_health_gpu_clock_event_seconds_total"
# Violation counters (NVML_PERF_POLICY_* via field values; ns). 74/76 are
# NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP/_SYNC_BOOST by their newer names.
_CLOCK_EVENTS = (
    (74, "sw_power_cap", 0),
    (75, "thermal", 1),
    (76, "sync_boost", 2),
    (77, "board_limit", 3),
    (78, "low_utilization", 4),
    (79, "reliability", 5),
    (269, "sw_thermal_slowdown", None),
    (270, "hw_thermal_slowdown", None),
    (271, "hw_power_brake_slowdown", None),
)

FIELDS: tuple[Field, ...] = (
    Field(186, "node_health_gpu_power_watts", 1e-3),  # NVML_FI_DEV_POWER_INSTANT, mW
    Field(190, "node_health_gpu_power_limit_watts", 1e-3),  # NVML_FI_DEV_POWER_CURRENT_LIMIT, mW
    Field(83, "node_health_gpu_energy_joules_total", 1e-3),  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ
    Field(82, "node_health_gpu_memory_temperature_celsius", 1.0),  # NVML_FI_DEV_MEMORY_TEMP
    Field(94, "node_health_gpu_pcie_replay_total", 1.0),  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
    Field(197, "node_health_gpu_pcie_bytes_total", 1.0, (("direction", "tx"),)),  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    Field(198, "node_health_gpu_pcie_bytes_total", 1.0, (("direction", "rx"),)),  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    *(Field(fid, CLOCK_EVENT_SECONDS, 1e-9, (("reason", reason),)) for fid, reason, _ in _CLOCK_EVENTS),
)

# The older call for a field, in the field's raw unit.
LEGACY: dict[int, tuple[str, Callable[[Any, Any], float]]] = {
    186: ("nvmlDeviceGetPowerUsage", lambda nv, h: float(nv.nvmlDeviceGetPowerUsage(h))),
    190: ("nvmlDeviceGetEnforcedPowerLimit", lambda nv, h: float(nv.nvmlDeviceGetEnforcedPowerLimit(h))),
    83: ("nvmlDeviceGetTotalEnergyConsumption", lambda nv, h: float(nv.nvmlDeviceGetTotalEnergyConsumption(h))),
    94: ("nvmlDeviceGetPcieReplayCounter", lambda nv, h: float(nv.nvmlDeviceGetPcieReplayCounter(h))),
    **{fid: (f"nvmlDeviceGetViolationStatus({p})", _violation(p)) for fid, _, p in _CLOCK_EVENTS if p is not None},
}

FIELD_NVLINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, KiB, scopeId = the link.
NVLINK_BYTES = (("tx", 138), ("rx", 139))
NVLINK_DIRECTION = {fid: ("direction", d) for d, fid in NVLINK_BYTES}
PSTATE_UNKNOWN = 32  # NVML_PSTATE_UNKNOWN
MEMORY_V2 = 0x02000028  # nvmlMemory_v2
CLOCK_SM, CLOCK_MEM = 1, 2  # NVML_CLOCK_*
PCIE_TX, PCIE_RX = 0, 1  # NVML_PCIE_UTIL_*_BYTES
NOT_THERE = (nvml.NOT_SUPPORTED, nvml.INVALID_ARGUMENT)


class GpuLost(Exception):
    pass


@dataclass
class Telemetry:
    """One GPU's telemetry: its samples, and what was absent or failed."""

    index: int
    uuid: str = ""
    samples: list[Sample] = field(default_factory=list)  # labelled gpu first
    unsupported: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lost: bool = False

    def __post_init__(self) -> None:
        self._gpu = (("gpu", str(self.index)),)

    def add(self, metric: str, value: float, *labels: tuple[str, str]) -> None:
        self.samples.append(Sample(metric, float(value), self._gpu + labels))

    def value(self, metric: str) -> float | None:
        """The value of an unlabelled (but for `gpu`) metric, if read."""
        return next((s.value for s in self.samples if s.name == metric and len(s.labels) == 1), None)


class TelemetryReader:
    """Reads GPUs; remembers per GPU (by UUID) its field request (with its NVLinks) and the older calls it lacks."""

    def __init__(self, pynvml: Any) -> None:
        self.nv = pynvml
        self._requests: dict[str, nvml.FieldRequest] = {}  # by UUID
        self._absent: set[tuple[str, str]] = set()  # (uuid, call) answered NOT_SUPPORTED
        self._no_field_values = False  # the driver lacks nvmlDeviceGetFieldValues

    def handle(self, t: Telemetry) -> Any:
        """The GPU's handle and UUID, or None (then `t` says why)."""
        h = self._call(t, "handle", lambda: self.nv.nvmlDeviceGetHandleByIndex(t.index), cache=False)
        if h is not None:
            t.uuid = nvml.text(self._call(t, "uuid", lambda: self.nv.nvmlDeviceGetUUID(h), cache=False) or "")
        return h

    def read(self, t: Telemetry, h: Any) -> None:
        """Everything but GPM; raises GpuLost."""
        self._fields(t, h)
        self._clocks(t, h)
        self._utilization(t, h)
        self._memory(t, h)
        pstate = self._call(t, "pstate", lambda: self.nv.nvmlDeviceGetPerformanceState(h))
        if pstate is not None and int(pstate) != PSTATE_UNKNOWN:
            t.add("node_health_gpu_performance_state", float(pstate))

    # ------------------------------------------------------------ field values

    def _fields(self, t: Telemetry, h: Any) -> None:
        request = self._request(t, h)
        values = self._field_values(t, h, request) if request is not None else None
        for i, f in enumerate(FIELDS):
            raw = self._value(t, values[i], f.fid) if values is not None else None
            if raw is None:
                raw = self._legacy(t, h, f.fid)
            if raw is not None:
                t.add(f.metric, raw * f.scale, *f.labels)
        if values is not None and request is not None:
            for (fid, link), answer in zip(request.fields[len(FIELDS):], values[len(FIELDS):]):
                raw = self._value(t, answer, fid)
                if raw is not None:
                    t.add("node_health_gpu_nvlink_bytes_total", raw * 1024, ("link", str(link)), NVLINK_DIRECTION[fid])
        if values is None or not any(s.name == "node_health_gpu_pcie_bytes_total" for s in t.samples):
            self._pcie_throughput(t, h)

    def _request(self, t: Telemetry, h: Any) -> nvml.FieldRequest | None:
        """The GPU's field request (its NVLinks counted once), None without field values."""
        if self._no_field_values:
            return None
        request = self._requests.get(t.uuid)
        if request is None:
            count = self._field_values(t, h, nvml.FieldRequest(self.nv, [(FIELD_NVLINK_COUNT, 0)]))
            links = int(self._value(t, count[0], FIELD_NVLINK_COUNT) or 0) if count is not None else 0
            fields = [(f.fid, 0) for f in FIELDS] + [(fid, link) for link in range(links) for _, fid in NVLINK_BYTES]
            request = self._requests[t.uuid] = nvml.FieldRequest(self.nv, fields)
        return request

    def _field_values(self, t: Telemetry, h: Any, request: nvml.FieldRequest) -> list[tuple[int, float]] | None:
        if self._no_field_values:
            return None
        try:
            return request.get(h)
        except Exception as exc:
            if nvml.is_lost(exc):
                raise GpuLost() from None
            if nvml.code(exc) == nvml.FUNCTION_NOT_FOUND:
                self._no_field_values = True
            elif nvml.code(exc) is None:
                raise
            else:
                t.errors.append(f"nvmlDeviceGetFieldValues: {exc}")
            return None

    def _value(self, t: Telemetry, answer: tuple[int, float], fid: int) -> float | None:
        rc, value = answer
        if rc == 0:
            return value
        if rc == nvml.GPU_IS_LOST:
            raise GpuLost()
        if rc not in NOT_THERE:
            t.errors.append(f"field {fid}: NVML error {rc}")
        return None

    def _legacy(self, t: Telemetry, h: Any, fid: int) -> float | None:
        legacy = LEGACY.get(fid)
        if legacy is None:
            t.unsupported.append(f"field{fid}")
            return None
        name, fn = legacy
        value = self._call(t, name, lambda: fn(self.nv, h))
        return None if value is None else float(value)

    def _pcie_throughput(self, t: Telemetry, h: Any) -> None:
        """Drivers without the PCIe byte counters: NVML's 20 ms throughput sample, KB/s."""
        for direction, counter in (("tx", PCIE_TX), ("rx", PCIE_RX)):
            v = self._call(t, f"nvmlDeviceGetPcieThroughput({direction})", partial(self.nv.nvmlDeviceGetPcieThroughput, h, counter))
            if v is not None:
                t.add("node_health_gpu_pcie_throughput_bytes_per_second", float(v) * 1024, ("direction", direction))

    # ------------------------------------------------------------ calls

    def _clocks(self, t: Telemetry, h: Any) -> None:
        for clock, kind in (("sm", CLOCK_SM), ("memory", CLOCK_MEM)):
            mhz = self._call(t, f"clock_{clock}", partial(self.nv.nvmlDeviceGetClockInfo, h, kind))
            if mhz is not None:
                t.add("node_health_gpu_clock_hertz", float(mhz) * 1e6, ("clock", clock))

    def _utilization(self, t: Telemetry, h: Any) -> None:
        nv = self.nv
        rates = self._call(t, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if rates is not None:
            t.add("node_health_gpu_utilization_ratio", rates.gpu / 100)
            t.add("node_health_gpu_memory_utilization_ratio", rates.memory / 100)
        for engine, fn in (("encoder", nv.nvmlDeviceGetEncoderUtilization), ("decoder", nv.nvmlDeviceGetDecoderUtilization)):
            util = self._call(t, f"{engine}_utilization", partial(fn, h))
            if util is not None:
                t.add("node_health_gpu_codec_utilization_ratio", util[0] / 100, ("engine", engine))

    def _memory(self, t: Telemetry, h: Any) -> None:
        nv = self.nv
        mem = self._call(t, "memory_v2", lambda: nv.nvmlDeviceGetMemoryInfo(h, version=MEMORY_V2))
        if mem is not None:
            t.add("node_health_gpu_memory_reserved_bytes", float(mem.reserved))
        else:  # before driver 510: no reserved figure, and "used" includes it
            mem = self._call(t, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            t.add("node_health_gpu_memory_total_bytes", float(mem.total))
            t.add("node_health_gpu_memory_used_bytes", float(mem.used))
            t.add("node_health_gpu_memory_free_bytes", float(mem.free))

    def call(self, t: Telemetry, what: str, fn: Callable[[], Any]) -> Any:
        """`fn()`, or None when NVML says it is not there (remembered) or fails (in `t.errors`); raises GpuLost."""
        return self._call(t, what, fn)

    def _call(self, t: Telemetry, what: str, fn: Callable[[], Any], cache: bool = True) -> Any:
        if cache and (t.uuid, what) in self._absent:
            t.unsupported.append(what)
            return None
        try:
            return fn()
        except Exception as exc:
            if nvml.is_lost(exc):
                raise GpuLost() from None
            if nvml.not_applicable(exc):
                t.unsupported.append(what)
                if cache:
                    self._absent.add((t.uuid, what))
            elif nvml.code(exc) is not None:
                t.errors.append(f"{what}: {exc}")
            else:
                raise
            return None
