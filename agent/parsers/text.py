"""Byte helpers with the same semantics as `native/src/text.rs`."""

from __future__ import annotations

import re

_U64_MAX = (1 << 64) - 1
_OCTAL = re.compile(rb"\\([0-3][0-7][0-7])")


def u64(field: bytes) -> int | None:
    """A non-empty run of ASCII digits that fits in a u64, else None."""
    if not field.isdigit():  # bytes.isdigit is ASCII-only and False for b""
        return None
    try:
        value = int(field)
    except ValueError:  # more than 4300 digits: int()'s limit (CVE-2020-10735); a u64 has 20 at most
        field = field.lstrip(b"0")
        if len(field) > 20:
            return None
        value = int(field or b"0")
    return value if value <= _U64_MAX else None


def unescape_octal(field: bytes) -> bytes:
    r"""Decode the kernel's ``\ooo`` escapes (seq_file ``mangle``); other backslashes stay."""
    if b"\\" not in field:
        return field
    return _OCTAL.sub(lambda m: bytes((int(m.group(1), 8),)), field)


def decode(field: bytes) -> str:
    """Kernel strings are bytes; decode them as the filesystem does (no data lost)."""
    return field.decode("utf-8", "surrogateescape")
