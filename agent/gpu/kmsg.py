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

Any other path (a regular file, a FIFO) is read as lines in the same format,
which is how the tests feed records; lines without the kmsg prefix are
records without a sequence number.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..parsers.text import u64

FILE_POLL = 0.02
READ_SIZE = 8192  # the kernel's record limit (CONSOLE_EXT_LOG_MAX) is 8 KiB


@dataclass(frozen=True, slots=True)
class Record:
    seq: int | None
    usec: int | None
    message: bytes


class KmsgError(Exception):
    def __init__(self, message: str, privilege: bool = False) -> None:
        super().__init__(message)
        self.privilege = privilege


def parse_record(raw: bytes) -> Record:
    """One record (``prio,seq,usec,flags;message``, continuation lines dropped)."""
    first = raw.split(b"\n", 1)[0]
    head, sep, msg = first.partition(b";")
    if sep:
        f = head.split(b",")
        if len(f) >= 3 and u64(f[0]) is not None and u64(f[1]) is not None:
            return Record(u64(f[1]), u64(f[2]), msg)
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
        if self.records_mode:
            yield from self._records()
        else:
            yield from self._lines()

    def _records(self) -> Iterator[Record]:
        while True:
            try:
                raw = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                return
            except BrokenPipeError:
                self.overruns += 1
                continue
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # a record longer than the buffer: cannot happen with 8 KiB
                    continue
                raise
            if not raw:
                return
            yield parse_record(raw)

    def _lines(self) -> Iterator[Record]:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                chunk = b""
            if not chunk:
                return
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                if line and not line.startswith(b" "):  # " KEY=value" continuation lines
                    yield parse_record(line)

    def wait(self, timeout: float) -> None:
        """Until something may be readable, or `timeout`. A regular file or a
        FIFO without a writer is always "readable" to select(), so those are
        polled every `FILE_POLL` seconds instead (followed like ``tail -f``)."""
        if self.records_mode:
            select.select([self.fd], [], [], timeout)
        else:
            time.sleep(min(timeout, FILE_POLL))
