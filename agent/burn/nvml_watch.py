"""NVML through pynvml (nvidia-ml-py): the GPU inventory, and the watch that
samples each GPU during a burn and waits for Xid events.

NVML is opened through the GPU check's session (agent.gpu.nvml: the library
configured by checks.gpu.nvml_library or driver_root, initialised once per
process and kept), so the burn sees the GPUs wherever the GPU check does. Every
NVML call on a GPU that fell off the bus may block, so the
watch samples in its own daemon thread and remembers which GPU it is asking;
if that call has not returned when the burn ends, that GPU is reported lost.
NVML facts: ../../shared/reference/gpu.md §c.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .model import GpuInfo
from .verdict import WatchSummary
from .watch import Accumulator, Reading

log = logging.getLogger(__name__)


class _Lost(Exception):
    pass


def _nvml(library: str) -> Any | None:
    from ..gpu import nvml

    try:
        return nvml.init(library)
    except nvml.NvmlUnavailable as exc:
        log.debug("NVML unavailable: %s", exc)
        return None


def _not_applicable(exc: Exception) -> bool:
    from ..gpu import nvml

    return nvml.not_applicable(exc)


def _text(value: Any) -> str:
    # nvmlDeviceGetPciInfo is not wrapped with @convertStrBytes: busId is bytes (reference §c).
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


class NvmlInventory:
    def __init__(self, library: str = "") -> None:
        self.library = library  # "" for the normal lookup

    def gpus(self) -> list[GpuInfo] | None:
        nv = _nvml(self.library)
        if nv is None:
            return None
        try:
            return [self._describe(nv, i) for i in range(nv.nvmlDeviceGetCount())]
        except nv.NVMLError as exc:
            log.error("NVML could not count the GPUs: %s", exc)
            return None

    @staticmethod
    def _describe(nv: Any, index: int) -> GpuInfo:
        try:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            name, uuid = _text(nv.nvmlDeviceGetName(h)), _text(nv.nvmlDeviceGetUUID(h))
            pci = _text(nv.nvmlDeviceGetPciInfo(h).busId)
        except nv.NVMLError as exc:
            log.error("NVML cannot describe GPU %d: %s", index, exc)
            return GpuInfo(index)
        try:
            mig = nv.nvmlDeviceGetMigMode(h)[0] == nv.NVML_DEVICE_MIG_ENABLE
        except nv.NVMLError:
            mig = False  # NotSupported before Ampere
        return GpuInfo(index=index, uuid=uuid, name=name, pci_bus_id=pci, mig=mig)

    def processes(self) -> Mapping[int, tuple[int, ...]] | None:
        nv = _nvml(self.library)
        if nv is None:
            return None
        try:
            out = {}
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                pids = {p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)}
                try:
                    pids |= {p.pid for p in nv.nvmlDeviceGetGraphicsRunningProcesses(h)}
                except nv.NVMLError as exc:
                    if not _not_applicable(exc):
                        raise  # a GPU without a graphics process list just has none
                out[i] = tuple(sorted(pids))
            return out
        except nv.NVMLError as exc:
            log.warning("NVML cannot list the processes on the GPUs: %s", exc)
            return None


def read(nv: Any, h: Any, counters: bool) -> Reading:
    """One reading of one GPU; `counters` adds the ECC and row-remap counters."""

    def get(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(h, *args)
        except nv.NVMLError as exc:
            if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise _Lost() from None
            return None  # NotSupported and friends: not applicable to this GPU

    power = get(nv.nvmlDeviceGetPowerUsage)
    fields: dict[str, Any] = {
        "clocks_event_reasons": get(nv.nvmlDeviceGetCurrentClocksEventReasons),
        "power_watts": power / 1000.0 if power is not None else None,
        "sm_clock_mhz": get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
        "temperature_c": get(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
    }
    if counters:
        remap = get(nv.nvmlDeviceGetRemappedRows)
        pending = get(nv.nvmlDeviceGetRetiredPagesPendingStatus)
        fields.update(
            ecc_uncorrected=get(
                nv.nvmlDeviceGetTotalEccErrors, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            ),
            ecc_corrected=get(
                nv.nvmlDeviceGetTotalEccErrors, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC
            ),
            retired_pending=bool(pending) if pending is not None else None,
            remapped_uncorrectable=remap[1] if remap else None,
            remap_pending=bool(remap[2]) if remap else None,
            remap_failed=bool(remap[3]) if remap else None,
        )
    return Reading(**fields)


class NvmlWatch:
    def __init__(self, *, throttle_share: float, interval: float = 1.0, library: str = "") -> None:
        self.library = library
        self.throttle_share = throttle_share
        self.interval = interval
        self._stop = threading.Event()
        self._acc: dict[int, Accumulator] = {}
        self._asking: tuple[int, float] | None = None  # (GPU index, monotonic start) of the call in flight
        self._thread: threading.Thread | None = None
        self._notes: tuple[str, ...] = ()

    def start(self, gpus: Sequence[GpuInfo]) -> None:
        self._acc = {g.index: Accumulator(self.throttle_share) for g in gpus}
        self._thread = threading.Thread(target=self._run, args=(list(gpus),), name="burn-nvml-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> Mapping[int, WatchSummary]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            asking = self._asking
            if self._thread.is_alive() and asking is not None:
                self._acc[asking[0]].hung(time.monotonic() - asking[1])
        out = {}
        for i, acc in self._acc.items():
            s = acc.summary()
            out[i] = WatchSummary(s.problems, s.telemetry, s.notes + self._notes) if self._notes else s
        return out

    def _run(self, gpus: list[GpuInfo]) -> None:
        nv = _nvml(self.library)
        if nv is None:
            self._notes = ("not watched: NVML is not available",)
            return
        es = None
        try:
            handles = {g.index: self._handle(nv, g) for g in gpus}
            handles = {i: h for i, h in handles.items() if h is not None}
            es = self._register_xids(nv, handles)
            self._loop(nv, handles, es)
        except Exception:
            log.exception("the NVML watch failed")
            self._notes = ("the NVML watch failed; see the agent log",)
        finally:
            if es is not None:
                try:
                    nv.nvmlEventSetFree(es)
                except nv.NVMLError:
                    pass

    def _handle(self, nv: Any, g: GpuInfo) -> Any:
        lookups = [(nv.nvmlDeviceGetHandleByUUID, g.uuid)] if g.uuid else []
        for fn, key in [*lookups, (nv.nvmlDeviceGetHandleByIndex, g.index)]:
            try:
                return fn(key)
            except nv.NVMLError as exc:
                if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                    self._acc[g.index].add(Reading(lost=True))
                    return None
        return None

    def _register_xids(self, nv: Any, handles: Mapping[int, Any]) -> Any:
        try:
            es = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            self._notes += (f"Xid events not available from NVML ({exc})",)
            return None
        for i, h in handles.items():
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
            except nv.NVMLError as exc:
                self._notes += (f"GPU {i}: Xid events not available from NVML ({exc})",)
        return es

    def _loop(self, nv: Any, handles: Mapping[int, Any], es: Any) -> None:
        by_ptr = {ctypes.cast(h, ctypes.c_void_p).value: i for i, h in handles.items()}
        self._sample(nv, handles, counters=True)
        next_poll = time.monotonic() + self.interval
        while not self._stop.is_set():
            wait_ms = max(0, int((next_poll - time.monotonic()) * 1000))
            if es is None or not self._wait_xid(nv, es, wait_ms, by_ptr):
                self._stop.wait(wait_ms / 1000)
            if time.monotonic() >= next_poll:
                self._sample(nv, handles, counters=False)
                next_poll = time.monotonic() + self.interval
        self._sample(nv, handles, counters=True)

    def _wait_xid(self, nv: Any, es: Any, wait_ms: int, by_ptr: Mapping[int | None, int]) -> bool:
        """Wait up to `wait_ms` for an event; False when the wait itself failed (then sleep instead)."""
        try:
            ev = nv.nvmlEventSetWait_v2(es, wait_ms)  # raises NVMLError_Timeout when nothing came
        except nv.NVMLError as exc:
            return bool(exc.value == nv.NVML_ERROR_TIMEOUT)
        if ev.eventType == nv.nvmlEventTypeXidCriticalError:
            i = by_ptr.get(ctypes.cast(ev.device, ctypes.c_void_p).value)
            for acc in [self._acc[i]] if i is not None else self._acc.values():
                acc.xid(int(ev.eventData))
        return True

    def _sample(self, nv: Any, handles: Mapping[int, Any], counters: bool) -> None:
        for i, h in handles.items():
            if self._acc[i].lost:
                continue
            self._asking = (i, time.monotonic())
            try:
                self._acc[i].add(read(nv, h, counters))
            except _Lost:
                self._acc[i].add(Reading(lost=True))
            finally:
                self._asking = None
