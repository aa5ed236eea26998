"""NVIDIA kernel log lines: Xid, SXid, fallen off the bus, RmInitAdapter
failures (twin of `native/src/xid.rs`).

Input is many lines of kernel log in any of the usual shapes: raw
``/dev/kmsg`` records (``4,1234,5678,-;NVRM: …``), ``dmesg`` with or without
timestamps (``[  123.456789] NVRM: …``), syslog / ``journalctl -k``
(``Mar 10 12:00:01 host kernel: NVRM: …``), ``dmesg -x`` / ``--time-format iso``
(``kern  :err   : 2025-01-25T10:34:54,859532+00:00 NVRM: …``), printk levels (``<4>NVRM: …``),
and the indented continuation lines dmesg and journalctl print for a
multi-line record.
The marker (``NVRM: `` or ``nvidia-nvswitch``) must start the line or follow
one of those prefixes, so a user program that merely mentions "NVRM: Xid" in
the middle of its own log line is not taken for the kernel.

Formats (open-gpu-kernel-modules ``kernel_rc.c``, ``osinit.c``, ``osapi.c``,
``common_nvswitch.h``)::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.   (<= 565)
    NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 94, pid=7194, Contained: ...                   (MIG)
    NVRM: Xid (0000:01:00): 31, Ch 0000000b, ...                                                   (very old)
    NVRM: Xid (PCI:0000:3b:00): 45, pid=7, name=x, Ch 00000008 caused by previous Xid 79           (>= 575)
    NVRM: Xid (PCI:XXXX:XX:XX): 79, ... / NVRM: Xid (<redacted>): 48, ... / NVRM: Xid: 79, pid=...  (scrubbed
        before they were shared: an Xid of an unknown device, ``pci`` empty; SXids keep their strict address)
    nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 12028, Non-fatal, Link 32 ...
    NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
    NVRM: GPU at 0000:01:00.0 has fallen off the bus.                                              (old)
    NVRM: The NVIDIA GPU 0000:01:00.0 / NVRM: (PCI ID: 10de:2204) installed in this system has /
    NVRM: fallen off the bus and is not responding to commands.                                    (3 lines, at probe)
    NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x56:1474)
    NVRM: rm_init_adapter failed, device minor number 0
    NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  ...            (driver (re)loaded)

Facility: a raw ``/dev/kmsg`` record (``prio,seq,usec,flags;``) and a printk
or ``dmesg -r`` level prefix (``<prio>``) state the syslog priority,
``facility << 3 | level``. The kernel's own lines have facility 0 (kern);
what a process writes to ``/dev/kmsg`` never has (the kernel gives it
``user`` or the non-zero facility its ``<N>`` names: see `agent.kmsg`), so
``12,…;NVRM: Xid …`` is a process's line, not the driver's. ``dmesg`` and
journal text state none (`NO_FACILITY`). The first line of a multi-line
message lends its PCI address only to a line of the same facility.

Record: ``line`` (0-based index of the line the event is reported on),
``kind`` (`KIND_*`), ``xid`` (0 when the kind has none), ``caused_by`` (the
Xid named by `` caused by previous Xid N``, else 0), ``facility`` (0 to 255
as stated, `NO_FACILITY` when the line states none); strings ``pci`` exactly as
printed (without ``PCI:``), ``pid`` exactly as printed (``'<unknown>'`` kept),
``name``, ``mig`` (``GPU-I:05 GPU-CI:01``), ``message`` (the text after the Xid
number and pid/name, or after ``NVRM: `` for other kinds) and ``time`` (the
timestamp the line carried: dmesg's bracket content, or the kmsg record's
microseconds as seconds; empty when it had none).
"""

from __future__ import annotations

from typing import NamedTuple

from .text import decode, u64

KIND_XID = 1
KIND_SXID = 2
KIND_FALLEN_OFF_BUS = 3
KIND_RMINIT_FAILED = 4
KIND_DRIVER_LOADED = 5
KIND_NAMES = {
    KIND_XID: "xid",
    KIND_SXID: "sxid",
    KIND_FALLEN_OFF_BUS: "fallen-off-bus",
    KIND_RMINIT_FAILED: "rminit-failed",
    KIND_DRIVER_LOADED: "driver-loaded",
}

# How many lines the three-line "fallen off the bus" message at probe may span.
MULTILINE_SPAN = 3
KERNEL_FACILITY = 0
NO_FACILITY = 256  # the line states no facility (dmesg, journal text); stated ones are 0..255

_WS = b" \t\n\r\x0b\x0c"
_HEX = frozenset(b"0123456789abcdefABCDEF:.")


class XidRecord(NamedTuple):
    line: int
    kind: int
    xid: int
    caused_by: int
    facility: int
    pci: str
    pid: str
    name: str
    mig: str
    message: str
    time: str

    @property
    def kind_name(self) -> str:
        return KIND_NAMES[self.kind]

    @property
    def from_kernel(self) -> bool:
        """Facility kern, or none stated (dmesg and journal text)."""
        return self.facility in (KERNEL_FACILITY, NO_FACILITY)


def parse(data: bytes) -> list[XidRecord]:
    out: list[XidRecord] = []
    pending = b""  # PCI address from "NVRM: The NVIDIA GPU <pci>"
    pending_line, pending_facility = -MULTILINE_SPAN, NO_FACILITY
    for i, raw in enumerate(data.split(b"\n")):
        line = raw.rstrip(_WS)
        time, marker, rest = _locate(line)
        if marker == b"":
            continue
        facility = _facility(line)
        if marker == b"S":
            rec = _sxid(rest)
        elif rest.startswith(b"Xid ("):
            rec = _xid(_paren_head(rest[5:], redacted=True))
        elif rest.startswith(b"Xid: "):
            rec = _xid(_number_head(rest[5:], b"", b""))
        elif rest.startswith(b"The NVIDIA GPU ") and b"fallen off the bus" not in rest:
            pending, pending_line, pending_facility = _pci_token(rest[15:]), i, facility
            continue
        elif b"fallen off the bus" in rest:
            pci = _fallen_pci(rest)
            if pci == b"" and i - pending_line < MULTILINE_SPAN and pending_facility == facility:
                pci = pending
            pending, pending_line = b"", -MULTILINE_SPAN
            rec = (KIND_FALLEN_OFF_BUS, 0, 0, pci, b"", b"", b"", rest)
        elif b"RmInitAdapter failed" in rest or rest.startswith(b"rm_init_adapter failed"):
            pci = _pci_token(rest[4:]) if rest.startswith(b"GPU ") else b""
            rec = (KIND_RMINIT_FAILED, 0, 0, pci, b"", b"", b"", rest)
        elif rest.startswith(b"loading NVIDIA UNIX"):
            rec = (KIND_DRIVER_LOADED, 0, 0, b"", b"", b"", b"", rest)
        else:
            continue
        if rec is not None:
            kind, xid, caused, pci, pid, name, mig, msg = rec
            out.append(XidRecord(i, kind, xid, caused, facility, *(decode(s) for s in (pci, pid, name, mig, msg, time))))
    return out


def _locate(line: bytes) -> tuple[bytes, bytes, bytes]:
    """(time, marker, text after the marker); marker b"" when the line is not ours,
    b"N" for ``NVRM: ``, b"S" for ``nvidia-nvswitch``."""
    p = line.find(b"NVRM: ")
    marker, skip = b"N", 6
    if p < 0:
        p = line.find(b"nvidia-nvswitch") if b"SXid" in line else -1
        marker, skip = b"S", 15
    if p < 0:
        return b"", b"", b""
    head = line[:p]
    if head.strip(_WS) == b"" or head.endswith((b"kernel: ", b">")):  # blank: a continuation line
        time = b""
    elif head.endswith(b"] "):
        lb = head.rfind(b"[")
        if lb < 0:
            return b"", b"", b""
        time = head[lb + 1 : -2].strip(_WS)
    elif head.endswith(b";"):
        time = _kmsg_time(head[:-1])
    elif head.endswith(b" ") and _is_iso(head.split()[-1]):  # dmesg --time-format iso
        time = head.split()[-1]
    elif head.startswith(b"kern ") and head.endswith(b": "):  # dmesg -x without time
        time = b""
    else:
        return b"", b"", b""
    return time, marker, line[p + skip :]


def _facility(line: bytes) -> int:
    """The facility a line states: ``<prio>`` at its start, or the first field
    of a ``prio,seq,usec[,…];`` kmsg prefix; `NO_FACILITY` for neither."""
    if line.startswith(b"<"):
        end = line.find(b">")
        prio = u64(line[1:end]) if end > 1 else None
    else:
        head, sep, _ = line.partition(b";")
        f = head.split(b",", 3)
        prio = u64(f[0]) if sep and len(f) >= 3 and u64(f[1]) is not None else None
    return NO_FACILITY if prio is None else min(prio >> 3, 255)


def _is_iso(tok: bytes) -> bool:
    """``2025-01-25T10:34:54,859532+00:00``: four digits, a dash, a T."""
    return len(tok) > 10 and tok[:4].isdigit() and tok[4:5] == b"-" and b"T" in tok


def _kmsg_time(prefix: bytes) -> bytes:
    """``prio,seq,usec,flags`` → usec as seconds (``5.000678``); b"" if not a kmsg prefix."""
    f = prefix.split(b",")
    if len(f) < 3:
        return b""
    usec = u64(f[2])
    if usec is None:
        return b""
    return b"%d.%06d" % (usec // 1_000_000, usec % 1_000_000)


def _is_pci(s: bytes) -> bool:
    return s != b"" and b":" in s and all(c in _HEX for c in s)


def _pci_token(s: bytes) -> bytes:
    toks = s.split(None, 1)
    tok = toks[0].split(b"\\", 1)[0] if toks else b""  # /dev/kmsg escapes a newline as \x0a
    if tok.startswith(b"PCI:"):
        tok = tok[4:]
    tok = tok.rstrip(b":")
    return tok if _is_pci(tok) else b""


def _fallen_pci(rest: bytes) -> bytes:
    if rest.startswith(b"The NVIDIA GPU "):  # the three lines as one kmsg record (newlines escaped)
        return _pci_token(rest[15:])
    if rest.startswith(b"GPU at "):
        return _pci_token(rest[7:])
    if rest.startswith(b"GPU "):
        return _pci_token(rest[4:])
    return b""


def _digits(s: bytes) -> int:
    n = 0
    while n < len(s) and 0x30 <= s[n] <= 0x39:
        n += 1
    return n


def _paren_head(s: bytes, redacted: bool = False) -> tuple[bytes, bytes, int, bytes] | None:
    """``PCI:0000:3b:00 GPU-I:05): 79, tail`` → (pci, mig, number, tail after the number).
    With `redacted`, an address that is not one (``PCI:XXXX:XX:XX``, ``<redacted>``: a log
    scrubbed before it was shared) is an unknown device (pci b""), not a non-event."""
    close = s.find(b")")
    if close < 0:
        return None
    inner = s[:close]
    if inner.startswith(b"PCI:"):
        inner = inner[4:]
    pci, _, mig = inner.partition(b" ")
    after = s[close + 1 :]
    if not after.startswith(b": "):
        return None
    if not _is_pci(pci):
        if not redacted:
            return None
        pci = b""
        if not mig.strip(_WS).startswith(b"GPU-I:"):
            mig = b""
    return _number_head(after[2:], pci, mig.strip(_WS))


def _number_head(after: bytes, pci: bytes, mig: bytes) -> tuple[bytes, bytes, int, bytes] | None:
    """``79, tail`` → (pci, mig, 79, tail): the number, then nothing or a comma."""
    n = _digits(after)
    number = u64(after[:n])
    if number is None:
        return None
    tail = after[n:]
    if tail != b"" and not tail.startswith(b","):
        return None
    return pci, mig, number, tail[1:].lstrip(b" ")


def _xid(head: tuple[bytes, bytes, int, bytes] | None) -> tuple[int, int, int, bytes, bytes, bytes, bytes, bytes] | None:
    if head is None:
        return None
    pci, mig, xid, body = head
    pid = name = b""
    if body.startswith(b"pid="):
        k = body.find(b", ")
        if k >= 0 and body.startswith(b", name=", k):
            pid, rest = body[4:k], body[k + 7 :]
            e = rest.find(b", ")
            name, body = (rest, b"") if e < 0 else (rest[:e], rest[e + 2 :])
        elif k >= 0:
            pid, body = body[4:k], body[k + 2 :]
        else:
            pid, body = body[4:], b""
    message = body.strip(_WS)
    caused = 0
    c = message.rfind(b"caused by previous Xid ")
    if c >= 0:
        tail = message[c + 23 :]
        n = _digits(tail)
        if n and n == len(tail):
            caused = u64(tail) or 0
    return KIND_XID, xid, caused, pci, pid, name, mig, message


def _sxid(rest: bytes) -> tuple[int, int, int, bytes, bytes, bytes, bytes, bytes] | None:
    s = rest.find(b": SXid (")
    if s < 0 or _digits(rest) != s:
        return None
    head = _paren_head(rest[s + 8 :])
    if head is None:
        return None
    pci, mig, sxid, body = head
    return KIND_SXID, sxid, 0, pci, b"", b"", mig, body.strip(_WS)
