"""`/proc/net/dev` parser (twin of `native/src/netdev.rs`)."""

from __future__ import annotations

from typing import NamedTuple

from .text import decode, u64


class NetDevStats(NamedTuple):
    name: str
    rx_bytes: int
    rx_packets: int
    rx_errs: int
    rx_drop: int
    rx_fifo: int
    rx_frame: int
    rx_compressed: int
    rx_multicast: int
    tx_bytes: int
    tx_packets: int
    tx_errs: int
    tx_drop: int
    tx_fifo: int
    tx_colls: int
    tx_carrier: int
    tx_compressed: int


NUMS = 16


def parse(data: bytes) -> list[NetDevStats]:
    out: list[NetDevStats] = []
    for line in data.split(b"\n"):
        name, sep, rest = line.partition(b":")
        name = name.strip()
        if not sep or not name:
            continue
        values = [u64(f) for f in rest.split()[:NUMS]]
        if len(values) < NUMS or None in values:
            continue
        out.append(NetDevStats(decode(name), *values))  # type: ignore[arg-type]
    return out
