"""The one typed surface over the parsers: native (Rust, `agent._native`) or Python twins.

The native library is used when it loads and its ABI matches; otherwise the
pure-Python twins in `agent.parsers` give the same records. Which one is in use
is logged at start, printed by `agent version` and exported as the `native`
label of `node_health_build_info`. ``NODE_HEALTH_AGENT_PARSERS=python`` forces
the twins, ``=native`` makes a missing native library an error.

Nothing else in the agent touches `lib` or `ffi`.
"""

from __future__ import annotations

import operator
import os
import struct
from collections.abc import Callable
from functools import partial
from typing import Any, Final, TypeVar

from .parsers import diskstats as _diskstats
from .parsers import iptsave as _iptsave
from .parsers import mountinfo as _mountinfo
from .parsers import netdev as _netdev
from .parsers import xid as _xid
from .parsers.diskstats import DiskStats
from .parsers.iptsave import IptRecord
from .parsers.mountinfo import MountInfo
from .parsers.netdev import NetDevStats
from .parsers.xid import XidRecord

__all__ = [
    "DiskStats",
    "IptRecord",
    "MountInfo",
    "NativeError",
    "NetDevStats",
    "IMPLEMENTATION",
    "describe",
    "parse_diskstats",
    "parse_iptables_save",
    "parse_mountinfo",
    "parse_net_dev",
    "parse_xid",
    "XidRecord",
]

ABI_VERSION: Final = 1
_OK, _ERR_BUFFER, _ERR_ARGS, _ERR_PANIC = 0, 1, 2, -1

R = TypeVar("R", bound=tuple[Any, ...])


class NativeError(RuntimeError):
    """The native library reported an error (a caught panic, bad arguments)."""


def _load() -> tuple[Any, Any, str]:
    choice = os.environ.get("NODE_HEALTH_AGENT_PARSERS", "auto")
    if choice == "python":
        return None, None, "forced by NODE_HEALTH_AGENT_PARSERS=python"
    try:
        from ._native import ffi, lib  # type: ignore[import-not-found,attr-defined]

        if lib.nha_abi_version() != ABI_VERSION:
            raise ImportError(f"ABI {lib.nha_abi_version()} != {ABI_VERSION}")
    except (ImportError, OSError, AttributeError) as exc:
        if choice == "native":
            raise
        return None, None, f"native library unavailable: {exc}"
    return ffi, lib, "agent._native"


_ffi, _lib, _WHY = _load()
IMPLEMENTATION: Final[str] = "native" if _lib is not None else "python"


def describe() -> str:
    """One line for logs and `agent version`: which parsers and why."""
    return f"{IMPLEMENTATION} ({_WHY})"


def _last_error() -> str:
    size = _lib.nha_last_error(_ffi.NULL, 0)
    buf = _ffi.new("uint8_t[]", size)
    _lib.nha_last_error(buf, size)
    return bytes(_ffi.buffer(buf, size)).decode("utf-8", "replace")


def _alloc() -> Callable[[str, int], Any]:
    return _ffi.new_allocator(should_clear_after_alloc=False) if _ffi is not None else None  # type: ignore[no-any-return]


_new = _alloc()


def _call(fn: Any, data: bytes, nums_per_line: int, strs_per_line: int) -> tuple[int, Any, list[str]]:
    """Run one native parser; returns (records, the numbers' buffer, strings)."""
    lines = data.count(b"\n") + 1
    nums_cap = lines * nums_per_line
    strs_cap = len(data) + lines * strs_per_line + 1
    counts = _new("uintptr_t[3]")
    for _ in range(2):
        nums = _new("uint64_t[]", max(nums_cap, 1))
        strs = _new("uint8_t[]", max(strs_cap, 1))
        rc = fn(data, len(data), nums, nums_cap, strs, strs_cap, counts)
        if rc == _ERR_BUFFER:  # sized from the input this cannot happen; stay correct anyway
            nums_cap, strs_cap = counts[1], counts[2]
            continue
        if rc != _OK:
            raise NativeError(f"{_last_error()} (code {rc})")
        text = _ffi.buffer(strs, counts[2])[:].decode("utf-8", "surrogateescape")
        return counts[0], _ffi.buffer(nums, counts[1] * 8), text.split("\0")[:-1]
    raise NativeError("native parser kept asking for larger buffers")


def _native_parser(cfn: str, cls: type[R], nnums: int, nstrs: int, strings_first: bool) -> Callable[[bytes], list[R]]:
    """Wrap `nha_parse_<name>`; records are rebuilt from the flat buffers in C
    (struct unpacking, zip grouping, tuple concatenation), never field by field."""
    fn = getattr(_lib, cfn)
    unpack = struct.Struct(f"={nnums}Q").iter_unpack
    make = partial(tuple.__new__, cls)

    def parse(data: bytes) -> list[R]:
        records, nums, strs = _call(fn, data, nnums, nstrs)
        if not records:
            return []
        numbers = unpack(nums)
        strings = zip(*[iter(strs)] * nstrs)
        pairs = (strings, numbers) if strings_first else (numbers, strings)
        return list(map(make, map(operator.add, *pairs)))

    parse.__name__ = cfn
    return parse


if _lib is not None:
    parse_net_dev: Callable[[bytes], list[NetDevStats]] = _native_parser(
        "nha_parse_net_dev", NetDevStats, 16, 1, strings_first=True
    )
    parse_diskstats: Callable[[bytes], list[DiskStats]] = _native_parser(
        "nha_parse_diskstats", DiskStats, 20, 1, strings_first=True
    )
    parse_mountinfo: Callable[[bytes], list[MountInfo]] = _native_parser(
        "nha_parse_mountinfo", MountInfo, 4, 7, strings_first=False
    )
    parse_xid: Callable[[bytes], list[XidRecord]] = _native_parser("nha_parse_xid", XidRecord, 4, 6, strings_first=False)
    parse_iptables_save: Callable[[bytes], list[IptRecord]] = _native_parser(
        "nha_parse_iptables_save", IptRecord, 4, 4, strings_first=False
    )
else:
    parse_net_dev = _netdev.parse
    parse_diskstats = _diskstats.parse
    parse_mountinfo = _mountinfo.parse
    parse_xid = _xid.parse
    parse_iptables_save = _iptsave.parse

PYTHON_TWINS: Final = {
    "net_dev": _netdev.parse,
    "diskstats": _diskstats.parse,
    "mountinfo": _mountinfo.parse,
    "xid": _xid.parse,
    "iptables_save": _iptsave.parse,
}


def selftest_panic() -> None:
    """Trigger a panic inside the library (tests prove it comes back as NativeError)."""
    if _lib is None:
        raise NativeError("native library not loaded")
    rc = _lib.nha_selftest_panic()
    if rc != _OK:
        raise NativeError(f"{_last_error()} (code {rc})")
