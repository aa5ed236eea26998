"""`/proc/diskstats` parser (twin of `native/src/diskstats.rs`).

Kernels before 4.18 print 11 statistics per device, 4.18 adds four for
discards, 5.5 two for flushes (Documentation/admin-guide/iostats.rst);
``nfields`` says how many were present, absent ones are 0.
"""

from __future__ import annotations

from typing import NamedTuple

from .text import decode, u64


class DiskStats(NamedTuple):
    name: str
    major: int
    minor: int
    nfields: int
    reads_completed: int
    reads_merged: int
    sectors_read: int
    read_time_ms: int
    writes_completed: int
    writes_merged: int
    sectors_written: int
    write_time_ms: int
    ios_in_progress: int
    io_time_ms: int
    weighted_io_time_ms: int
    discards_completed: int
    discards_merged: int
    sectors_discarded: int
    discard_time_ms: int
    flushes_completed: int
    flush_time_ms: int


STATS = 17
MIN_STATS = 11


def parse(data: bytes) -> list[DiskStats]:
    out: list[DiskStats] = []
    for line in data.split(b"\n"):
        f = line.split()
        if len(f) < 3:
            continue
        major, minor = u64(f[0]), u64(f[1])
        stats = [u64(x) for x in f[3 : 3 + STATS]]
        if major is None or minor is None or len(stats) < MIN_STATS or None in stats:
            continue
        n = len(stats)
        stats += [0] * (STATS - n)
        out.append(DiskStats(decode(f[2]), major, minor, n, *stats))  # type: ignore[arg-type]
    return out
