"""Loading NVML through pynvml (nvidia-ml-py), once per process.

pynvml opens ``libnvidia-ml.so.1`` through the normal library lookup. A driver
installed by the GPU Operator lives under a driver root (``/run/nvidia/driver``)
that the lookup does not search, so the agent can name the library or the root;
it then opens that file itself and hands it to pynvml (its module-level
``nvmlLib``, which ``nvmlInit`` keeps when already set).

pynvml raises one exception class per NVML return code (``NVMLError_GpuIsLost``
…); these helpers compare ``.value`` so that they do not depend on the
generated class names.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import threading
import time
from types import ModuleType
from typing import Any

from ..probe import Prober, ProbeResult

log = logging.getLogger(__name__)

# NVML return codes (nvml.h).
UNINITIALIZED = 1
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INVALID_ARGUMENT = 2
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

# Where a containerised driver keeps the library, relative to its root.
LIBRARY_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib", "lib64", "lib")
LIBRARY_NAME = "libnvidia-ml.so.1"


class NvmlUnavailable(Exception):
    """NVML cannot be used here (no library, no driver, no permission)."""


def code(exc: BaseException) -> int | None:
    """The NVML return code of a pynvml exception, None for anything else."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) and type(exc).__name__.startswith("NVMLError") else None


def not_applicable(exc: BaseException) -> bool:
    """NOT_SUPPORTED (the GPU lacks it) and FUNCTION_NOT_FOUND (an older driver lacks it)."""
    return code(exc) in (NOT_SUPPORTED, FUNCTION_NOT_FOUND)


def is_lost(exc: BaseException) -> bool:
    return code(exc) == GPU_IS_LOST


def find_library(*driver_roots: str) -> str:
    """``libnvidia-ml.so.1`` under the first driver root that has one; raises NvmlUnavailable."""
    for root in driver_roots:
        for sub in LIBRARY_DIRS:
            path = os.path.join(root, sub, LIBRARY_NAME)
            if os.path.exists(path):
                return path
    raise NvmlUnavailable(
        f"no {LIBRARY_NAME} under driver root {' or '.join(driver_roots)} (looked in {', '.join(LIBRARY_DIRS)})"
    )


# A failed nvmlInit is not tried again, by any caller, for this long: every check that reads NVML (gpu,
# gpu_telemetry, gpu_pods, the Xid event thread) on a node without a driver would otherwise load and fail
# it several times a minute. A driver loaded later is found within this time.
RETRY_AFTER = 30.0


class _Session:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.library: str | None = None  # "" for the normal lookup
        self.ready = False
        self.failed: tuple[str, float, str] | None = None  # (library, monotonic time, why) of the last failed init


_session = _Session()


def init(library: str = "") -> ModuleType:
    """pynvml, initialised with `library` ("" for the normal lookup). Raises
    NvmlUnavailable; a failed init is tried again by the first call `RETRY_AFTER`
    after it (the driver may be loaded later); until then each call raises its error."""
    with _session.lock:
        if _session.ready and _session.library == library:
            return _pynvml()
        why = _recent(library)
        if why is not None:
            raise NvmlUnavailable(why)
        pynvml = _pynvml()
        try:
            if library:
                _use_library(pynvml, library)
            try:
                pynvml.nvmlInit()
            except Exception as exc:
                raise NvmlUnavailable(_describe_init_error(exc)) from None
        except NvmlUnavailable as exc:
            _session.failed = (library, time.monotonic(), str(exc))
            raise
        _session.library, _session.ready, _session.failed = library, True, None
        log.info("NVML initialised (%s), driver %s", library or LIBRARY_NAME, driver_version(pynvml))
        return pynvml


def init_probed(prober: Prober, library: str, timeout: float) -> ProbeResult[ModuleType]:
    """`init(library)` in a probe thread of `prober` (key "init": nvmlInit can hang); an init that failed
    less than `RETRY_AFTER` ago is answered with its error at once, without a thread."""
    # Not under the session's lock: an nvmlInit that hangs holds it, and this must not wait on it.
    why = None if _session.ready and _session.library == library else _recent(library)
    if why is not None:
        return ProbeResult(error=NvmlUnavailable(why))
    return prober.call("init", lambda: init(library), timeout)


def _recent(library: str) -> str | None:
    failed = _session.failed
    if failed is None or failed[0] != library or time.monotonic() - failed[1] >= RETRY_AFTER:
        return None
    return failed[2]


def invalidate() -> None:
    """Forget the session: the next `init` calls nvmlInit again (after the
    driver was unloaded or reloaded, old handles are no longer valid)."""
    with _session.lock:
        _session.ready = False
        _session.failed = None


def _pynvml() -> ModuleType:
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise NvmlUnavailable(f"pynvml (nvidia-ml-py) is not installed: {exc}") from None
    mod: ModuleType = pynvml
    return mod


def _use_library(pynvml: Any, path: str) -> None:
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise NvmlUnavailable(f"cannot load {path}: {exc}") from None
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is None or pynvml.nvmlLib._handle != lib._handle:
            pynvml.nvmlLib = lib
            pynvml._nvmlGetFunctionPointer_cache.clear()


def _describe_init_error(exc: Exception) -> str:
    c = code(exc)
    if c == LIBRARY_NOT_FOUND:
        return f"{LIBRARY_NAME} not found (no NVIDIA driver installed, or set checks.gpu.driver_root)"
    if c == DRIVER_NOT_LOADED:
        return "the NVIDIA kernel driver is not loaded"
    if c == NO_PERMISSION:
        return "no permission to use NVML (/dev/nvidia* not accessible)"
    return f"nvmlInit failed: {exc}"


def driver_version(pynvml: Any) -> str:
    try:
        v = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"
    return v.decode() if isinstance(v, bytes) else str(v)


VALUE_KINDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # nvmlValueType_t order


def field_value(v: Any) -> float:
    """The value of one ``nvmlFieldValue_t`` (its ``nvmlReturn`` already checked), by its ``valueType``."""
    return float(getattr(v.value, VALUE_KINDS[min(int(v.valueType), len(VALUE_KINDS) - 1)]))


_FIELD_VALUE = struct.Struct("=IIqqII8s")  # nvmlFieldValue_t (nvml.h): 40 bytes
# The value union by nvmlValueType_t (double, uint, ulong, ulonglong, slonglong, sint, ushort); ulong is 64-bit on Linux.
_VALUE = tuple(struct.Struct(f) for f in ("=d", "=I", "=Q", "=Q", "=q", "=i", "=H"))


class FieldRequest:
    """One prepared ``nvmlDeviceGetFieldValues`` request: the C array is built
    once and reused, and the answers are decoded in one pass (the wrapper in
    pynvml builds the array and reads every value through Python attribute
    hooks, ~5x the cost for the 50 fields of a telemetry poll)."""

    def __init__(self, pynvml: Any, fields: list[tuple[int, int]]) -> None:
        self.fields = fields
        self._array = (pynvml.c_nvmlFieldValue_t * len(fields))()
        for i, (fid, scope) in enumerate(fields):
            self._array[i].fieldId, self._array[i].scopeId = fid, scope
        self._template = bytes(self._array)
        fn = getattr(pynvml, "_nvmlGetFunctionPointer", None)
        self._fn = fn("nvmlDeviceGetFieldValues") if fn is not None else None
        self._check = pynvml._nvmlCheckReturn if fn is not None else None
        self._nv = pynvml

    def get(self, handle: Any) -> list[tuple[int, float]]:
        """(nvmlReturn, value) per field, in request order; raises the pynvml error of the call itself."""
        if self._fn is None or self._check is None:  # a pynvml without the private helpers
            values = self._nv.nvmlDeviceGetFieldValues(handle, self.fields)
            return [(int(v.nvmlReturn), field_value(v) if v.nvmlReturn == 0 else 0.0) for v in values]
        ctypes.memmove(self._array, self._template, len(self._template))
        self._check(self._fn(handle, ctypes.c_int32(len(self.fields)), ctypes.byref(self._array)))
        return [
            (rc, float(_VALUE[min(kind, 6)].unpack_from(raw)[0]) if rc == 0 else 0.0)
            for _, _, _, _, kind, rc, raw in _FIELD_VALUE.iter_unpack(bytes(self._array))
        ]


def text(value: str | bytes) -> str:
    """pynvml returns str from most calls but bytes from some (``nvmlPciInfo_t.busId``)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
