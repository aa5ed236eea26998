"""One pass over a batch of kernel-log records (twin of `native/src/kbatch.rs`):
each record's header fields and where its message is, the records whose
message names the NVIDIA driver, and those the fault table's screen accepts.

Input: the screen (as `agent.parsers.kscreen` takes it; may be empty), a NUL
byte, then the records' text: lines separated by ``\\n``, as a file of
``/dev/kmsg`` records holds them. An empty line and a line that starts with
a space (a record's `` KEY=value`` continuation) is no record. Without a NUL
byte there is no text and no record. A record is parsed as
`agent.kmsg.parse_record` does: ``prio,seq,usec[,…];message`` (prio and seq
u64 digits, usec too or absent); any other line is a record without a header
whose message is the whole line.

Output: `KmsgScan`. `fields` holds 6 numbers per record: ``flags`` (`HEADER`:
prio and seq; `USEC`: and a usec), ``prio``, ``seq``, ``usec`` (0 when
absent), ``start``, ``end`` (the message is ``data[start:end]``, offsets into
the whole input). `nvidia`: the indices of the records whose message contains
``NVRM`` or ``SXid``; `screened`: for each record the screen accepts, its
index and the index of the first entry (in screen order) that accepts it.
`sequential`: 1 when every record has a header and each sequence number is
the previous one plus one (and there is at least one record); `first`,
`last`: the first and the last sequence number then, else 0. `complete`: 1
when every record has a header and a usec (and there is at least one).
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

from .kscreen import entry, screen
from .text import u64

HEADER, USEC = 1, 2
FIELDS = 6  # numbers per record in `KmsgScan.fields`


class KmsgScan(NamedTuple):
    records: int
    sequential: int
    complete: int
    first: int
    last: int
    fields: array[int]  # typecode "Q"
    nvidia: array[int]
    screened: array[int]  # pairs: record, entry


def _record(line: bytes, at: int) -> tuple[int, int, int, int, int, int]:
    head, sep, _ = line.partition(b";")
    if sep:
        f = head.split(b",", 3)
        if len(f) >= 3:
            prio, seq, usec = u64(f[0]), u64(f[1]), u64(f[2])
            if prio is not None and seq is not None:
                start = at + len(head) + 1
                if usec is None:
                    return HEADER, prio, seq, 0, start, at + len(line)
                return HEADER | USEC, prio, seq, usec, start, at + len(line)
    return 0, 0, 0, 0, at, at + len(line)


def parse(data: bytes) -> KmsgScan:
    spec, sep, text = data.partition(b"\0")
    fields, nvidia, screened = array("Q"), array("Q"), array("Q")
    if not sep:
        return KmsgScan(0, 0, 0, 0, 0, fields, nvidia, screened)
    by_first = screen(spec)
    records, sequential, complete, first, last = 0, True, True, 0, 0
    at = len(spec) + 1
    for line in text.split(b"\n"):
        if line and line[0] != 0x20:
            r = _record(line, at)
            fields.extend(r)
            msg = data[r[4] : r[5]]
            if b"NVRM" in msg or b"SXid" in msg:
                nvidia.append(records)
            k = entry(by_first, msg)
            if k is not None:
                screened.extend((records, k))
            complete = complete and r[0] == HEADER | USEC
            if not r[0] & HEADER or (records and r[2] != last + 1):
                sequential = False
            if not records:
                first = r[2]
            last = r[2]
            records += 1
        at += len(line) + 1
    complete = complete and records > 0
    if not (sequential and records):
        return KmsgScan(records, 0, int(complete), 0, 0, fields, nvidia, screened)
    return KmsgScan(records, 1, int(complete), first, last, fields, nvidia, screened)
