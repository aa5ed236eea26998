"""`/proc/<pid>/mountinfo` parser (twin of `native/src/mountinfo.rs`).

Format in proc(5): ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw``;
paths carry the kernel's ``\\ooo`` escapes for space, tab, newline and backslash.

Fields are separated by exactly one space, as ``show_mountinfo``
(fs/proc_namespace.c) prints them: other whitespace (``\\r``, ``\\v``, ``\\f``)
is left raw and belongs to a name, and an empty mount source shows as two
spaces in a row (``- tmpfs  rw``). The super options are the rest of the line.
"""

from __future__ import annotations

from typing import NamedTuple

from .text import decode, u64, unescape_octal


class MountInfo(NamedTuple):
    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str
    mount_point: str
    options: str
    optional_fields: str
    fstype: str
    source: str
    super_options: str


def parse(data: bytes) -> list[MountInfo]:
    out: list[MountInfo] = []
    for line in data.split(b"\n"):
        f = line.split(b" ")
        if len(f) < 10:
            continue
        try:
            sep = f.index(b"-", 6)
        except ValueError:
            continue
        if sep + 3 >= len(f):
            continue
        major_b, colon, minor_b = f[2].partition(b":")
        ids = (u64(f[0]), u64(f[1]), u64(major_b), u64(minor_b))
        if not colon or None in ids:
            continue
        strings = (f[3], f[4], f[5], b" ".join(f[6:sep]), f[sep + 1], f[sep + 2], b" ".join(f[sep + 3 :]))
        out.append(MountInfo(*ids, *(decode(unescape_octal(s)) for s in strings)))  # type: ignore[arg-type]
    return out
