"""Reading the kernel log record by record, with sequence numbers.

``/dev/kmsg`` (Documentation/ABI/testing/dev-kmsg): every ``read()`` returns
one record, ``prio,seq,usec,flags[,…];message\\n`` followed by optional
`` KEY=value`` lines; ``open()`` starts at the oldest record still in the ring
buffer, so one pass from open to ``EAGAIN`` is the whole current boot that the
buffer still holds. A read that fails with ``EPIPE`` means the records the
reader was about to get were overwritten; the next read returns the oldest one
left, and the jump in ``seq`` says how many were lost. Non-printable bytes in a
message are escaped as ``\\xNN``. Reading needs CAP_SYSLOG when
``kernel.dmesg_restrict=1``.

The first field is the syslog priority, ``facility << 3 | level``: facility 0
is the kernel's own (``printk``), so kernel records read ``0,…`` to ``7,…``.
A process may write a record too (systemd, a test tool, or anyone forging an
Xid), and the kernel gives it a facility other than 0: ``devkmsg_write()`` in
kernel/printk/printk.c starts from ``facility = 1; /* LOG_USER */`` and takes
the facility of a ``<N>`` prefix only ``if (LOG_FACILITY(u) != 0)``, where
``LOG_FACILITY(v)`` is ``((v) >> 3 & 0xff)`` ("If no prefix or no userspace
facility is specified, we enforce LOG_USER, to be able to reliably
distinguish kernel-generated messages from userspace-injected ones"). So a
plain write reads back as ``12,…`` (user.warning), ``<0>`` or ``<2048>`` as
``8,…``, ``<30>`` as ``30,…`` (daemon.info): never facility 0 (checked on
Linux 6.18 by `tests/gpu/test_gpu_kmsg.py`).

Any other path (a regular file, a FIFO) is read as lines in the same format,
which is how the tests feed records; lines without the kmsg prefix are
records without a sequence number or facility.

A batch of records (`RecordBatch`) is parsed in one native pass
(`native/src/kbatch.rs`, twin `agent/parsers/kbatch.py`) that also says which
records name the NVIDIA driver and which ones the fault table's screen
accepts; a `Record` is made only for a record someone asks for, so a storm of
ordinary lines costs its subscribers no Python work per record.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple, Protocol, overload

from . import native
from .parsers.kbatch import FIELDS, HEADER, USEC
from .parsers.text import u64

FILE_POLL = 0.02
READ_SIZE = 8192  # the kernel's record limit (CONSOLE_EXT_LOG_MAX) is 8 KiB
CHUNK = 1 << 16  # bytes per read() of a file or FIFO
BATCH = 4096  # records per `read_batch` (bounds the memory of a storm's backlog)
KERNEL = 0  # the kernel's syslog facility (LOG_KERN)
FACILITIES = {0: "kern", 1: "user", 2: "mail", 3: "daemon", 4: "auth", 5: "syslog", 6: "lpr", 7: "news"}


class Record(NamedTuple):
    seq: int | None
    usec: int | None
    message: bytes
    prio: int | None = None  # the syslog priority of the prefix; None: a line without it

    @property
    def facility(self) -> int | None:
        return None if self.prio is None else self.prio >> 3

    @property
    def from_kernel(self) -> bool:
        """Not written by a process: facility 0, or a line that states none (dmesg text)."""
        return self.prio is None or self.prio >> 3 == KERNEL


def facility_name(facility: int) -> str:
    return FACILITIES.get(facility, f"facility {facility}")


class KmsgError(Exception):
    def __init__(self, message: str, privilege: bool = False) -> None:
        super().__init__(message)
        self.privilege = privilege


def parse_record(raw: bytes) -> Record:
    """One record (``prio,seq,usec,flags;message``, continuation lines dropped)."""
    first = raw.split(b"\n", 1)[0] if b"\n" in raw else raw
    head, sep, msg = first.partition(b";")
    if sep:
        f = head.split(b",", 3)
        if len(f) >= 3:
            p, q, u = f[0], f[1], f[2]
            if len(p) < 20 and len(q) < 20 and len(u) < 20 and p.isdigit() and q.isdigit():  # the common case, fast
                return Record(int(q), int(u) if u.isdigit() else None, msg, int(p))
            prio, seq = u64(p), u64(q)
            if prio is not None and seq is not None:
                return Record(seq, u64(u), msg, prio)
    return Record(None, None, first)


class RecordBatch(Sequence[Record]):
    """The records of one read, parsed in one native pass over their text
    (`native.parse_kbatch`): a `Record` is made only when asked for. Beside the
    records: `nvidia_from`, the indices of those whose message names the NVIDIA
    driver (``NVRM``, ``SXid``); `screened`, of those the fault table's screen
    accepts; `sequential` with `first` and `last`, when every record has a
    sequence number one above the one before. `at` makes the records at given
    indices in bulk."""

    __slots__ = ("_data", "_scan", "_spec", "_fields")

    def __init__(self, spec: bytes, text: bytes) -> None:
        self._spec = spec
        self._data = b"".join((spec, b"\0", text))
        self._scan = native.parse_kbatch(self._data)
        self._fields = self._scan.fields

    def __len__(self) -> int:
        return self._scan.records

    @overload
    def __getitem__(self, i: int) -> Record: ...
    @overload
    def __getitem__(self, i: slice) -> list[Record]: ...
    def __getitem__(self, i: int | slice) -> Record | list[Record]:
        if isinstance(i, slice):
            return [self._record(k) for k in range(*i.indices(self._scan.records))]
        n = self._scan.records
        if not -n <= i < n:
            raise IndexError("record index out of range")
        return self._record(i % n)

    def __iter__(self) -> Iterator[Record]:
        return map(self._record, range(self._scan.records))

    def _record(self, i: int) -> Record:
        flags, prio, seq, usec, start, end = self._fields[FIELDS * i : FIELDS * i + FIELDS]
        if flags & HEADER:
            return tuple.__new__(Record, (seq, usec if flags & USEC else None, self._data[start:end], prio))
        return tuple.__new__(Record, (None, None, self._data[start:end], None))

    def at(self, indices: list[int]) -> list[Record]:
        """The records at `indices`; made in C loops only (no Python code per
        record) when there are many and every record has a header and a usec."""
        if len(indices) < 16 or not self._scan.complete:
            return [self._record(i) for i in indices]
        f, pick = self._fields, itemgetter(*indices)
        prios, seqs, usecs, starts, ends = (pick(f[c::FIELDS]) for c in range(1, FIELDS))
        messages = map(self._data.__getitem__, map(slice, starts, ends))
        return list(map(tuple.__new__, repeat(Record), zip(seqs, usecs, messages, prios)))

    @property
    def sequential(self) -> bool:
        return bool(self._scan.sequential)

    @property
    def first(self) -> int:
        return self._scan.first

    @property
    def last(self) -> int:
        return self._scan.last

    def nvidia_from(self, start: int) -> list[int]:
        """The indices (from `start` on) of the records whose message names the NVIDIA driver."""
        nvidia = self._scan.nvidia
        return nvidia[bisect_left(nvidia, start) :].tolist()

    def screened(self, spec: bytes, start: int = 0) -> tuple[list[int], list[int]]:
        """The indices (from `start` on) of the records whose message the screen
        `spec` accepts, and the index of the first entry that accepts each;
        found in the same pass when `spec` is the one the batch was read with."""
        pairs = self._scan.screened if spec == self._spec else native.parse_kbatch(spec + self._data[len(self._spec) :]).screened
        indices = pairs[0::2]
        cut = bisect_left(indices, start)
        return indices[cut:].tolist(), pairs[1::2][cut:].tolist()


class Cursor(Protocol):
    """What a subscriber keeps of the records it processed: the last sequence number."""

    cursor: int | None

    def record_seq(self, seq: int) -> bool: ...


def unseen(records: Sequence[Record], tracker: Cursor) -> tuple[Sequence[Record], int]:
    """The records `tracker` has not processed before, each accounted with
    `tracker.record_seq` (a record without a sequence number is always new):
    (the records, the index of the first new one). A `RecordBatch` of
    consecutive sequence numbers costs one call whatever its size (the same
    accounting: a gap can only come before its first record) and comes back
    whole, with the index; anything else comes back as a list of the new
    records, from index 0."""
    if isinstance(records, RecordBatch) and records.sequential:
        first, last, cursor = records.first, records.last, tracker.cursor
        if cursor is not None and last <= cursor:
            return records, len(records)
        start = 0 if cursor is None or first > cursor else cursor - first + 1
        tracker.record_seq(first + start)
        tracker.cursor = last
        return records, start
    return [r for r in records if r.seq is None or tracker.record_seq(r.seq)], 0


class Kmsg:
    """A reader over /dev/kmsg or a file/FIFO of its records (non-blocking)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except PermissionError as exc:
            raise KmsgError(
                f"cannot read {path}: {exc.strerror} (needs CAP_SYSLOG while kernel.dmesg_restrict=1)", privilege=True
            ) from None
        except OSError as exc:
            raise KmsgError(f"cannot open {path}: {exc.strerror}") from None
        mode = os.fstat(self.fd).st_mode
        self.records_mode = stat.S_ISCHR(mode)
        self._buf = b""
        self.overruns = 0  # EPIPE reads

    def close(self) -> None:
        os.close(self.fd)

    def read_available(self) -> Iterator[Record]:
        """Every record that can be read now, without blocking."""
        while True:
            batch = self.read_batch()
            yield from batch
            if len(batch) < BATCH:
                return

    def read_batch(self, limit: int = BATCH, screen: bytes = b"") -> RecordBatch:
        """The records that can be read now without blocking, up to about
        `limit` (a file or FIFO may give one chunk's lines more); fewer than
        `limit` means nothing more was there. `screen`: the fault table's
        screen (`agent.kernel.patterns.Table.screen`), applied in the same pass."""
        if self.records_mode:
            return self._records(limit, screen)
        return self._lines(limit, screen)

    def _records(self, limit: int, screen: bytes) -> RecordBatch:
        # One record per read(); each starts with its "prio,seq,usec,flags;" prefix and ends
        # with "\n" (its " KEY=value" lines are no records), so joined they read as lines.
        raws: list[bytes] = []
        while len(raws) < limit:
            try:
                raw = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                break
            except BrokenPipeError:
                self.overruns += 1
                continue
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # a record longer than the buffer: cannot happen with 8 KiB
                    continue
                raise
            if not raw:
                break
            raws.append(raw)
        return RecordBatch(screen, b"\n".join(raws))

    def _lines(self, limit: int, screen: bytes) -> RecordBatch:
        texts: list[bytes] = []
        lines = 0
        enough = limit  # lines read before the text is parsed: there are no more records than lines
        while True:
            try:
                chunk = os.read(self.fd, CHUNK)
            except BlockingIOError:
                chunk = b""
            if chunk:
                data = self._buf + chunk
                end = data.rfind(b"\n") + 1
                text, self._buf = data[:end], data[end:]
                texts.append(text)
                lines += text.count(b"\n")
                if lines < enough:
                    continue
            batch = RecordBatch(screen, b"".join(texts))
            if not chunk or len(batch) >= limit:
                return batch
            # " KEY=value" continuation lines or empty ones: read on, and parse
            # again only after twice as many lines (linear in a file of them)
            enough = 2 * lines

    def wait(self, timeout: float, wake: int = -1) -> None:
        """Until something may be readable, `wake` (a pipe's read end, when given) is readable, or
        `timeout`. A regular file or a FIFO without a writer is always "readable" to select(), so
        those are polled every `FILE_POLL` seconds instead (followed like ``tail -f``)."""
        if self.records_mode:
            select.select([self.fd] if wake < 0 else [self.fd, wake], [], [], timeout)
        else:
            time.sleep(min(timeout, FILE_POLL))


def read_once(path: str) -> list[Record]:
    """Every record the kernel log holds now, read once (`agent selftest`,
    `agent run --once`); raises `KmsgError` when it cannot be opened."""
    k = Kmsg(path)
    try:
        return list(k.read_available())
    finally:
        k.close()
