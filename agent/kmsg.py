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
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import time
from collections.abc import Iterator
from itertools import repeat
from typing import NamedTuple

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


# A whole line of the common shape, for `Kmsg._lines` (what `parse_record` takes on its fast path).
_LINE = re.compile(rb"^(\d{1,19}),(\d{1,19}),(\d{1,19})(?:,[^;\n]*)?;(.*)$", re.M)


def _record(fields: tuple[int, int | None, bytes, int]) -> Record:
    return tuple.__new__(Record, fields)


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
                return _record((int(q), int(u) if u.isdigit() else None, msg, int(p)))
            prio, seq = u64(p), u64(q)
            if prio is not None and seq is not None:
                return Record(seq, u64(u), msg, prio)
    return Record(None, None, first)


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

    def read_batch(self, limit: int = BATCH) -> list[Record]:
        """The records that can be read now without blocking, up to about
        `limit` (a file or FIFO may give one chunk's lines more); fewer than
        `limit` means nothing more was there."""
        if self.records_mode:
            return self._records(limit)
        return self._lines(limit)

    def _records(self, limit: int) -> list[Record]:
        out: list[Record] = []
        while len(out) < limit:
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
            out.append(parse_record(raw))
        return out

    def _lines(self, limit: int) -> list[Record]:
        out: list[Record] = []
        while len(out) < limit:
            try:
                chunk = os.read(self.fd, CHUNK)
            except BlockingIOError:
                chunk = b""
            if not chunk:
                break
            data = self._buf + chunk
            end = data.rfind(b"\n") + 1
            text, self._buf = data[:end], data[end:]
            # " KEY=value" continuation lines and empty lines are no records
            lines = [line for line in text.split(b"\n") if line and line[0] != 0x20]
            found = _LINE.findall(text)
            if len(found) == len(lines):  # every line has the common shape: one pass in C
                prios, seqs, usecs, msgs = zip(*found) if found else ((), (), (), ())
                out += map(tuple.__new__, repeat(Record), zip(map(int, seqs), map(int, usecs), msgs, map(int, prios)))
            else:
                out += map(parse_record, lines)
        return out

    def wait(self, timeout: float) -> None:
        """Until something may be readable, or `timeout`. A regular file or a
        FIFO without a writer is always "readable" to select(), so those are
        polled every `FILE_POLL` seconds instead (followed like ``tail -f``)."""
        if self.records_mode:
            select.select([self.fd], [], [], timeout)
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
