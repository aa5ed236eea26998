"""The kernel-fault table's screen (twin of `native/src/kscreen.rs`): which
messages start with one of the table's literal prefixes, and contain the
entry's needle after it where the entry names one.

Input: the screen, a NUL byte, then the messages separated by ``\\n``. The
screen is its entries separated by 0x1e, each ``prefix`` or ``prefix 0x1f
needle``; an entry with an empty prefix and a needle accepts a message that
holds the needle anywhere; an entry with neither is ignored; no NUL byte: no
screen, nothing matches. Record: ``line`` (0-based), ``entry`` (the index of the
first entry, in screen order, that accepts the line).
"""

from __future__ import annotations

from typing import NamedTuple

ENTRY, NEEDLE = b"\x1e", b"\x1f"


class ScreenHit(NamedTuple):
    line: int
    entry: int


def spec(entries: list[tuple[str, str]]) -> bytes:
    """The screen of (prefix, needle) entries, as the parser takes it before the NUL byte."""
    return ENTRY.join(p.encode() + (NEEDLE + n.encode() if n else b"") for p, n in entries)


Screen = dict[int, list[tuple[int, bytes, bytes]]]
ANYWHERE = -1  # the key of the entries without a prefix (a needle anywhere in the message)


def screen(spec_: bytes) -> Screen:
    """The entries of a screen (as written before the NUL byte), by the first
    byte of their prefix; those without a prefix under `ANYWHERE`."""
    by_first: Screen = {}
    if spec_:
        for k, e in enumerate(spec_.split(ENTRY)):
            prefix, _, needle = e.partition(NEEDLE)
            if prefix:
                by_first.setdefault(prefix[0], []).append((k, prefix, needle))
            elif needle:
                by_first.setdefault(ANYWHERE, []).append((k, prefix, needle))
    return by_first


def entry(by_first: Screen, msg: bytes) -> int | None:
    """The index of the first entry (in screen order) that accepts `msg`, else None."""
    if not msg:
        return None
    head = None
    for k, prefix, needle in by_first.get(msg[0], ()):
        if msg.startswith(prefix) and (not needle or needle in msg[len(prefix):]):
            head = k
            break
    for k, _, needle in by_first.get(ANYWHERE, ()):
        if head is not None and k > head:
            break
        if needle in msg:
            return k
    return head


def parse(data: bytes) -> list[ScreenHit]:
    spec_, sep, text = data.partition(b"\0")
    if not sep:
        return []
    by_first = screen(spec_)
    out = []
    for i, msg in enumerate(text.split(b"\n")):
        k = entry(by_first, msg)
        if k is not None:
            out.append(ScreenHit(i, k))
    return out
