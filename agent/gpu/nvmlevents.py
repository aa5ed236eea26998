"""NVML Xid events: ``nvmlDeviceRegisterEvents`` with XidCriticalError on every
GPU, then ``nvmlEventSetWait`` in a loop, in its own thread.

nvml.h: events that happened before registration are not recorded (the kernel
log backlog covers those); a GPU that answers NOT_SUPPORTED registers nothing
but the set stays usable for the others; ``nvmlEventSetWait`` returns
NVML_ERROR_TIMEOUT when nothing came, and may return GPU_IS_LOST; after
UNKNOWN the set is freed and made again. A wait that never returns only holds
this thread (a daemon thread): the poll and the kernel log go on.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import TYPE_CHECKING, Any

from .. import catalog
from ..parsers.xid import KIND_XID
from . import nvml
from .pci import normalize
from .xidstream import CHECK, Event

if TYPE_CHECKING:
    from .xidsource import XidSource

log = logging.getLogger(__name__)

XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
WAIT_MS = 1000
RETRY = 30.0


def _addr(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class NvmlEvents:
    def __init__(self, source: XidSource) -> None:
        self.src = source
        self.gpus: dict[int, tuple[int, str]] = {}  # handle address → (index, pci)

    def run(self) -> None:
        from ..checks.gpu import nvml_library

        stop = self.src.stop_event
        while not stop.is_set():
            try:
                nv = nvml.init(nvml_library(self.src.ctx, self.src.cfg))
                es = self._register(nv)
            except nvml.NvmlUnavailable as exc:
                log.debug("NVML events: %s", exc)
                self.src.set_status("nvml", None, up=0.0)
                stop.wait(RETRY)
                continue
            except Exception as exc:  # noqa: BLE001 - an NVML error while registering: try again later
                log.warning("NVML events: registering failed: %s", exc)
                stop.wait(RETRY)
                continue
            if es is None:
                stop.wait(RETRY * 4)  # no GPU can deliver events now; GPUs may come back after a reset
                continue
            self.src.set_status("nvml", None, up=1.0)
            self._wait_loop(nv, es)
            self.src.set_status("nvml", None, up=0.0)
            try:
                nv.nvmlEventSetFree(es)
            except Exception:  # noqa: BLE001 - freeing a broken set
                pass

    def _register(self, nv: Any) -> Any:
        es = nv.nvmlEventSetCreate()
        self.gpus.clear()
        unsupported = []
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                pci = normalize(nvml.text(nv.nvmlDeviceGetPciInfo(h).busId))
                nv.nvmlDeviceRegisterEvents(h, XID_CRITICAL_ERROR, es)
            except Exception as exc:
                if nvml.code(exc) is None:
                    raise
                if nvml.not_applicable(exc):
                    unsupported.append(f"gpu{i}")
                else:
                    log.warning("NVML events: gpu%d: %s", i, exc)
                continue
            self.gpus[_addr(h)] = (i, pci)
        msg = None
        if unsupported:
            msg = catalog.finding(CHECK, "nvml-events", "NvmlEventsUnsupported",
                                  f"NVML cannot deliver Xid events for {', '.join(unsupported)}; the kernel log still does")
        self.src.set_status("nvml-events", msg)
        if not self.gpus:
            nv.nvmlEventSetFree(es)
            return None
        log.info("NVML Xid events registered for %d GPUs", len(self.gpus))
        return es

    def _wait_loop(self, nv: Any, es: Any) -> None:
        stop = self.src.stop_event
        while not stop.is_set():
            try:
                data = nv.nvmlEventSetWait(es, WAIT_MS)
            except Exception as exc:
                c = nvml.code(exc)
                if c == nvml.TIMEOUT:
                    continue
                if c == nvml.GPU_IS_LOST:  # one GPU is gone; the poll says which: keep waiting for the others
                    log.warning("NVML events: a GPU is lost")
                    stop.wait(1.0)
                    continue
                log.warning("NVML events: wait failed (%s); registering again", exc)
                stop.wait(5.0)
                return
            if not data.eventType & XID_CRITICAL_ERROR:
                continue
            index, pci = self.gpus.get(_addr(data.device), (-1, ""))
            gi = f", GPU instance {data.gpuInstanceId}" if data.gpuInstanceId != 0xFFFFFFFF else ""
            msg = f"reported by NVML (gpu{index}{gi})"
            self.src.add([Event("nvml", KIND_XID, int(data.eventData), pci, msg, time.monotonic())])
