"""`iptables-save [-c]` parser (twin of `native/src/iptsave.rs`): the agent's
own chains and rules, with their counters.

Tokens follow `iptables-restore` (`add_param_to_argv` in iptables' xshared.c):
spaces and tabs separate; a `"` opens a quoted part where `\\` escapes the
next byte; the closing `"` ends the token; a quote still open at the end of
the line drops its token. Selected: declarations of chains named
``NODE-HEALTH-*`` and rules in such chains or whose comment starts with
``node-health-agent:``. See the Rust module for the record layout.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

from .text import decode, u64

CHAIN_PREFIX = b"NODE-HEALTH-"
COMMENT_PREFIX = b"node-health-agent:"

KIND_CHAIN, KIND_RULE, KIND_RULE_NO_COUNTERS = 0, 1, 2


class IptRecord(NamedTuple):
    kind: int
    position: int
    packets: int
    bytes: int
    table: str
    chain: str
    comment: str
    rule: str


# One token at a time: an unquoted run that may open a quote (the closing quote
# ends the token), or a plain unquoted run. Matched with .match at a position.
_TOKEN = re.compile(rb'[ \t]*(?:([^ \t"]*)"((?:[^"\\]|\\.)*)"|([^ \t"]+))', re.DOTALL)
_ESCAPE = re.compile(rb"\\(.)", re.DOTALL)
_SEPARATORS = b" \t"


def tokens(line: bytes, pos: int = 0) -> Iterator[tuple[bytes, int]]:
    """(token, position just past the byte that ended it) for each token from `pos`."""
    n = len(line)
    while True:
        m = _TOKEN.match(line, pos)
        if m is None:
            return  # only separators left, or a quote that never closes
        plain = m.group(3)
        if plain is not None:
            end = m.end()
            if end < n and line[end] == 0x22:  # the run opens a quote that never closes
                return
            yield plain, (end + 1 if end < n else end)
            pos = end + 1
        else:
            quoted = m.group(2)
            if b"\\" in quoted:
                quoted = _ESCAPE.sub(rb"\1", quoted)
            yield m.group(1) + quoted, m.end()
            pos = m.end()
        if pos >= n:
            return


def counters(tok: bytes) -> tuple[int, int] | None:
    """``[packets:bytes]``."""
    if len(tok) < 2 or tok[0] != 0x5B or tok[-1] != 0x5D:
        return None
    packets, colon, nbytes = tok[1:-1].partition(b":")
    p, b = u64(packets), u64(nbytes)
    if not colon or p is None or b is None:
        return None
    return p, b


def _rest(line: bytes, pos: int) -> bytes:
    return line[pos:].lstrip(_SEPARATORS)


def _comment(line: bytes, pos: int) -> bytes:
    it = tokens(line, pos)
    for tok, _ in it:
        if tok == b"--comment":
            return next(it, (b"", 0))[0]
    return b""


def _maybe_ours(line: bytes) -> bool:
    """False only when no token of `line` can decode to a string containing
    COMMENT_PREFIX: quotes and escapes are the only bytes a token drops."""
    if COMMENT_PREFIX in line:
        return True
    return b'"' in line and COMMENT_PREFIX in line.translate(None, b'"\\')


def _has_nul(*parts: bytes) -> bool:
    """Strings cross the native boundary NUL-terminated; real iptables-save
    strings are C strings, so a record with a NUL inside is dropped."""
    return any(b"\0" in p for p in parts)


class _Parser:
    def __init__(self) -> None:
        self.out: list[IptRecord] = []
        self.table = b""
        self.prev_chain: bytes | None = None
        self.position = 0

    def line(self, line: bytes) -> None:
        it = tokens(line)
        first = next(it, None)
        if first is None:
            return
        tok = first[0]
        if tok[:1] == b"*":
            self.table, self.prev_chain = tok[1:], None
        elif tok[:1] == b":":
            self.declaration(tok[1:], it)
        else:
            self.rule(line, first, it)

    def declaration(self, name: bytes, it: Iterator[tuple[bytes, int]]) -> None:
        if not name.startswith(CHAIN_PREFIX):
            return
        policy = next(it, (b"", 0))[0]
        ctr = counters(next(it, (b"", 0))[0]) or (0, 0)
        if not _has_nul(self.table, name, policy):
            self.out.append(IptRecord(KIND_CHAIN, 0, *ctr, decode(self.table), decode(name), "", decode(policy)))

    def rule(self, line: bytes, first: tuple[bytes, int], it: Iterator[tuple[bytes, int]]) -> None:
        kind, ctr, tok = KIND_RULE_NO_COUNTERS, (0, 0), first
        if tok[0][:1] == b"[":
            parsed = counters(tok[0])
            if parsed is None:
                return
            kind, ctr = KIND_RULE, parsed
            tok = next(it, (b"", 0))
        chain_tok = next(it, None) if tok[0] == b"-A" else None
        if chain_tok is None:
            return
        chain, pos = chain_tok
        self.position = self.position + 1 if chain == self.prev_chain else 1
        self.prev_chain = chain
        ours = chain.startswith(CHAIN_PREFIX)
        if not ours and not _maybe_ours(line):
            return
        comment = _comment(line, pos)
        rest = _rest(line, pos)
        if (ours or comment.startswith(COMMENT_PREFIX)) and not _has_nul(self.table, chain, comment, rest):
            rec = (decode(self.table), decode(chain), decode(comment), decode(rest))
            self.out.append(IptRecord(kind, self.position, *ctr, *rec))


def parse(data: bytes) -> list[IptRecord]:
    p = _Parser()
    for line in data.split(b"\n"):
        p.line(line)
    return p.out
