"""The one typed surface over the parsers: native (Rust, `agent._native`) or Python twins.

The native library is used when it loads and its ABI matches; otherwise the
pure-Python twins in `agent.parsers` give the same records. Which one is in use
is logged at start, printed by `agent version` and exported as the `native`
label of `node_health_build_info`. ``NODE_HEALTH_AGENT_PARSERS=python`` forces
the twins, ``=native`` makes a missing native library an error (a `ConfigError`:
one line, exit 2), ``=auto`` (the default) takes native when it loads.

A native call whose output cannot be split into its records (a NUL byte inside
a string: never in a kernel file) is answered by the Python twin; each such
fallback is counted per parser (`fallbacks()`, exported as
`node_health_native_fallback_total{parser}`) and logged once per parser.

Nothing else in the agent touches `lib` or `ffi`.
"""

from __future__ import annotations

import logging
import os
import threading
from array import array
from collections.abc import Callable
from itertools import repeat
from typing import Any, Final, TypeVar

from .parsers import diskstats as _diskstats
from .parsers import iptsave as _iptsave
from .parsers import kbatch as _kbatch
from .parsers import kscreen as _kscreen
from .parsers import mountinfo as _mountinfo
from .parsers import netdev as _netdev
from .parsers import xid as _xid
from .parsers.diskstats import DiskStats
from .parsers.iptsave import IptRecord
from .parsers.kbatch import KmsgScan
from .parsers.kscreen import ScreenHit
from .parsers.mountinfo import MountInfo
from .parsers.netdev import NetDevStats
from .parsers.xid import XidRecord
from .schema import ConfigError

__all__ = [
    "ENV",
    "IMPLEMENTATION",
    "PYTHON_TWINS",
    "DiskStats",
    "IptRecord",
    "KmsgScan",
    "MountInfo",
    "NativeError",
    "NetDevStats",
    "XidRecord",
    "describe",
    "fallbacks",
    "parse_diskstats",
    "parse_iptables_save",
    "parse_kbatch",
    "parse_mountinfo",
    "parse_net_dev",
    "parse_xid",
]

ABI_VERSION: Final = 5  # 5: a screen entry without a prefix (a needle anywhere): an older library would miss it
ENV: Final = "NODE_HEALTH_AGENT_PARSERS"
_CHOICES: Final = ("auto", "native", "python")
_OK, _ERR_BUFFER, _ERR_ARGS, _ERR_PANIC = 0, 1, 2, -1

R = TypeVar("R", bound=tuple[Any, ...])

log = logging.getLogger(__name__)


class NativeError(RuntimeError):
    """The native library reported an error (a caught panic, bad arguments)."""


def _load() -> tuple[Any, Any, str]:
    choice = os.environ.get(ENV, "auto")
    if choice not in _CHOICES:
        raise ConfigError("environment", ENV, f'expected one of "auto", "native", "python", got "{choice}"')
    if choice == "python":
        return None, None, f"forced by {ENV}=python"
    try:
        from ._native import ffi, lib  # type: ignore[import-not-found,attr-defined,unused-ignore]

        if lib.nha_abi_version() != ABI_VERSION:
            raise ImportError(f"ABI {lib.nha_abi_version()} != {ABI_VERSION}")
    except (ImportError, OSError, AttributeError) as exc:
        why = " ".join(str(exc).split())
        if choice == "native":
            problem = f"native parsers required, but agent._native cannot be loaded: {why}"
            raise ConfigError("environment", ENV, problem) from exc
        return None, None, f"native library unavailable: {why}"
    return ffi, lib, "agent._native"


_ffi, _lib, _WHY = _load()
IMPLEMENTATION: Final[str] = "native" if _lib is not None else "python"


def describe() -> str:
    """One line for logs and `agent version`: which parsers and why."""
    return f"{IMPLEMENTATION} ({_WHY})"


# Fallbacks to the Python twin, per parser (the key after "nha_parse_"): rare, so
# one lock is cheap; the first of each parser is logged.
_fallbacks: dict[str, int] = {}
_fallbacks_lock = threading.Lock()


def fallbacks() -> dict[str, int]:
    """How many calls of each native parser the Python twin answered (0 for every
    parser when the twins are in use: nothing falls back)."""
    with _fallbacks_lock:
        return {name: _fallbacks.get(name, 0) for name in PYTHON_TWINS}


def _fell_back(name: str) -> None:
    with _fallbacks_lock:
        first = name not in _fallbacks
        _fallbacks[name] = _fallbacks.get(name, 0) + 1
    if first:
        log.warning(
            "native parser %s: a string holds a NUL byte, so the Python twin answered; "
            "further fallbacks are counted in node_health_native_fallback_total{parser=\"%s\"}, not logged",
            name,
            name,
        )


def _last_error() -> str:
    size = _lib.nha_last_error(_ffi.NULL, 0)
    buf = _ffi.new("uint8_t[]", size)
    _lib.nha_last_error(buf, size)
    return bytes(_ffi.buffer(buf, size)).decode("utf-8", "replace")


# Output buffers are kept per thread and grown on demand, so that a parse costs
# no allocation; one that would need more than this is served by buffers
# allocated for that call alone, so one odd input cannot pin memory for good.
_KEEP_BYTES: Final = 1 << 20


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.buffers = _buffers(_ffi.NULL, 0, _ffi.NULL, 0, _ffi.new("uintptr_t[3]"))


Buffers = tuple[tuple[Any, ...], memoryview, memoryview]


def _buffers(nums: Any, nums_cap: int, strs: Any, strs_cap: int, counts: Any) -> Buffers:
    """The arguments a parser writes into after its input, and views of them as
    u64 numbers and as bytes (made once per buffer, sliced per call)."""
    numbers = memoryview(_ffi.buffer(nums, nums_cap * 8)).cast("Q") if nums_cap else memoryview(b"").cast("Q")
    strings = memoryview(_ffi.buffer(strs, strs_cap)) if strs_cap else memoryview(b"")
    return (nums, nums_cap, strs, strs_cap, counts), numbers, strings


def _call(fn: Any, data: bytes) -> tuple[int, memoryview, str]:
    """Run one native parser; returns (records, the numbers as u64s, the strings, NUL-separated)."""
    args, numbers, strings = buffers = _scratch.buffers
    rc = fn(data, len(data), *args)
    counts = args[4]
    if rc == _ERR_BUFFER:  # first call on this thread, or a larger input than before
        nums_cap, strs_cap = counts[1] + counts[1] // 4, counts[2] + counts[2] // 4
        nums, strs = _new("uint64_t[]", max(nums_cap, 1)), _new("uint8_t[]", max(strs_cap, 1))
        args, numbers, strings = buffers = _buffers(nums, nums_cap, strs, strs_cap, counts)
        if nums_cap * 8 + strs_cap <= _KEEP_BYTES:
            _scratch.buffers = buffers
        rc = fn(data, len(data), *args)
    if rc != _OK:
        raise NativeError(f"{_last_error()} (code {rc})")
    records, n_nums, n_strs = counts
    return records, numbers[:n_nums], str(strings[:n_strs], "utf-8", "surrogateescape")


def _native_parser(cfn: str, cls: type[R], nnums: int, nstrs: int, strings_first: bool) -> Callable[[bytes], list[R]]:
    """Wrap `nha_parse_<name>`. Records are rebuilt in C code paths only: one
    `zip` over the numbers and the strings yields each record's fields in
    order, `tuple.__new__` makes it a `cls`; nothing runs per field in Python."""
    fn = getattr(_lib, cfn)
    name = cfn.removeprefix("nha_parse_")  # its twin's key in PYTHON_TWINS
    new = tuple.__new__

    def parse(data: bytes) -> list[R]:
        records, numbers, text = _call(fn, data)
        strings = text.split("\0")  # every string ends with a NUL: one more item than strings
        if len(strings) != records * nstrs + 1:
            # A NUL inside a string (never in a kernel file: it prints C strings)
            # would shift every later field; the twin gives the exact answer.
            if name not in PYTHON_TWINS:
                raise NativeError(f"{cfn}: a string holds a NUL byte")
            _fell_back(name)
            return PYTHON_TWINS[name](data)  # type: ignore[return-value]
        fields = [iter(strings)] * nstrs + [iter(numbers)] * nnums
        if not strings_first:
            fields.reverse()
        return list(map(new, repeat(cls, records), zip(*fields)))

    parse.__name__ = cfn
    return parse


def _native_kbatch(data: bytes) -> KmsgScan:
    """Wrap `nha_parse_kbatch`: its numbers copied out in three slices, nothing per record."""
    _, numbers, _ = _call(_lib.nha_parse_kbatch, data)
    records, sequential, complete, first, last, nvidia, screened = numbers[-7:].tolist()
    at = _kbatch.FIELDS * records
    out = []
    for lo, hi in ((0, at), (at, at + nvidia), (at + nvidia, at + nvidia + 2 * screened)):
        a = array("Q")
        a.frombytes(numbers[lo:hi].cast("B"))
        out.append(a)
    return KmsgScan(records, sequential, complete, first, last, *out)


if _lib is not None:
    _new = _ffi.new_allocator(should_clear_after_alloc=False)
    _scratch = _Scratch()
    parse_net_dev: Callable[[bytes], list[NetDevStats]] = _native_parser(
        "nha_parse_net_dev", NetDevStats, 16, 1, strings_first=True
    )
    parse_diskstats: Callable[[bytes], list[DiskStats]] = _native_parser(
        "nha_parse_diskstats", DiskStats, 20, 1, strings_first=True
    )
    parse_mountinfo: Callable[[bytes], list[MountInfo]] = _native_parser(
        "nha_parse_mountinfo", MountInfo, 4, 7, strings_first=False
    )
    parse_xid: Callable[[bytes], list[XidRecord]] = _native_parser("nha_parse_xid", XidRecord, 5, 6, strings_first=False)
    parse_iptables_save: Callable[[bytes], list[IptRecord]] = _native_parser(
        "nha_parse_iptables_save", IptRecord, 4, 4, strings_first=False
    )
    parse_kscreen: Callable[[bytes], list[ScreenHit]] = _native_parser("nha_parse_kscreen", ScreenHit, 2, 0, strings_first=False)
    parse_kbatch: Callable[[bytes], KmsgScan] = _native_kbatch
else:
    parse_net_dev = _netdev.parse
    parse_diskstats = _diskstats.parse
    parse_mountinfo = _mountinfo.parse
    parse_xid = _xid.parse
    parse_iptables_save = _iptsave.parse
    parse_kscreen = _kscreen.parse
    parse_kbatch = _kbatch.parse

PYTHON_TWINS: Final = {  # keyed by the name after "nha_parse_"
    "net_dev": _netdev.parse,
    "diskstats": _diskstats.parse,
    "mountinfo": _mountinfo.parse,
    "xid": _xid.parse,
    "iptables_save": _iptsave.parse,
    "kscreen": _kscreen.parse,
}
# Not in PYTHON_TWINS: its output has no strings, so it never falls back. Its twin is `agent.parsers.kbatch.parse`.


def selftest_panic() -> None:
    """Trigger a panic inside the library (tests prove it comes back as NativeError)."""
    if _lib is None:
        raise NativeError("native library not loaded")
    rc = _lib.nha_selftest_panic()
    if rc != _OK:
        raise NativeError(f"{_last_error()} (code {rc})")
