"""The fault table compiled once, and matched against many messages at a time.

Matching is two steps. A screen picks the candidates: every built-in pattern
declares the literal prefixes its messages start with (and a needle they
hold after it), checked for a whole batch in one call of the native
extension (`native/src/kscreen.rs`, twin `agent/parsers/kscreen.py`); an
operator's pattern, which declares none, is screened by its own regex (one
alternation of all of them). Only a candidate is tried against the patterns
one by one, in table order, to say which. A kernel log is almost all
messages that match nothing, and in Python the regex screen alone cost as
much as the Xid follower's whole work (benches/README.md, the kernel log
scanner).

`message_of` takes the message out of a saved log's line (``dmesg``,
``dmesg -T``, ``journalctl -k``, raw ``/dev/kmsg`` records, syslog files), so
`agent scan-log` matches exactly what the follower matches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .. import native
from ..catalog import Catalog
from ..findings import Severity
from ..parsers.kscreen import spec
from .catalog import OPERATOR_REASON, PATTERNS, FaultPattern, operator_reasons, with_reasons

NAME = re.compile(r"[a-z0-9_]{1,64}")


class PatternError(ValueError):
    """An operator's pattern that cannot be used; the message says what was expected."""


def check_regex(pattern: str) -> str | None:
    """Why `pattern` cannot be in the table (None: it can)."""
    try:
        compiled = re.compile(pattern.encode())
    except (re.error, UnicodeEncodeError) as exc:
        return f'expected a regular expression, got "{pattern}" ({exc})'
    if compiled.groupindex or re.search(r"\\[1-9]|\(\?P=", pattern):
        return f'expected a regular expression without named groups or backreferences, got "{pattern}"'
    if compiled.match(b""):
        return f'expected a regular expression that cannot match an empty message, got "{pattern}"'
    return None


def _literal_head(pattern: str) -> bytes:
    """The literal text a regular expression's matches start with (up to its first special character)."""
    m = re.match(r"[^\\.^$*+?{}\[\]|()]*", pattern)
    return (m.group() if m else "").encode()


@dataclass(frozen=True, slots=True)
class Match:
    index: int  # of the message in the list scanned
    pattern: FaultPattern


class Table:
    """The patterns in force: the built-in ones, minus those disabled, with the
    operator's changes and additions (`agent.kernel.settings` validates them)."""

    def __init__(self, patterns: Sequence[FaultPattern]) -> None:
        self.patterns = tuple(patterns)
        self.by_name = {p.name: p for p in self.patterns}
        # the kernel catalog and the reasons an operator's patterns name: what the findings are made by
        self.catalog: Catalog = with_reasons(operator_reasons(self.patterns))
        self._each = [(re.compile(p.pattern.encode()), p) for p in self.patterns]
        # (announcing line, the pattern, the message it claims after it): see FaultPattern.prelude
        self._preludes = [(re.compile(p.prelude.encode()), p, re.compile(p.then.encode()) if p.then else None)
                          for p in self.patterns if p.prelude]
        self.pending: tuple[FaultPattern, re.Pattern[bytes] | None] | None = None  # the last announcement
        # the literal start of each announcement: only a message that starts with one meets their regexes
        self._prelude_heads = tuple(_literal_head(p.prelude) for p in self.patterns if p.prelude)
        entries = [entry for p in self.patterns for entry in p.screen]
        self.screen = spec(entries)  # for `agent.kmsg.RecordBatch.screened`
        self._spec = self.screen + b"\0" if entries else b""
        rest = [p for p in self.patterns if not p.screen]  # an operator's: screened by their regex
        self._rest = re.compile(b"|".join(b"(?:" + p.pattern.encode() + b")" for p in rest)) if rest else None
        self.screened_only = self._rest is None  # the screen alone picks every candidate
        # Per screen entry, the patterns from its own on: none before it can match a message that
        # this entry is the first to accept (their entries come first and accept none of it).
        owner = [i for i, p in enumerate(self.patterns) for _ in p.screen]
        self._from_entry = [tuple(self._each[i:]) for i in owner]

    def scan(self, messages: Sequence[bytes]) -> list[Match]:
        """The messages that a pattern matches, with the first pattern (in table
        order) that does. The screen (native) and the regex of the unscreened
        patterns pick the candidates; every pattern's screen accepts every
        message the pattern matches (tests hold it), so only candidates are tried."""
        hits = [h.line for h in native.parse_kscreen(self._spec + b"\n".join(messages))] if self._spec else []
        if self._rest is not None:
            more = [i for i, m in enumerate(map(self._rest.match, messages)) if m is not None]
            hits = sorted(set(hits).union(more))
        return self.confirm((i, messages[i]) for i in hits)

    def _first(self, msg: bytes, each: Sequence[tuple[re.Pattern[bytes], FaultPattern]]) -> FaultPattern | None:
        """The first of `each` that matches `msg`, the last announcement's claim first
        (`FaultPattern.prelude`); an announcing line matches none and is remembered."""
        if self._preludes:
            if msg.startswith(self._prelude_heads):
                for rx, p, then in self._preludes:
                    if rx.match(msg):
                        self.pending = (p, then)
                        return None
            pending, self.pending = self.pending, None
            if pending is None:
                for rx, p in each:
                    if rx.match(msg):
                        return p
                return None
            if pending is not None and pending[1] is not None and pending[1].match(msg):
                return pending[0]
            for rx, p in each:
                if rx.match(msg):
                    return p
            self.pending = pending  # matched nothing: the announcement still stands
            return None
        for rx, p in each:
            if rx.match(msg):
                return p
        return None

    def confirm(self, candidates: Iterable[tuple[int, bytes]]) -> list[Match]:
        """The candidates (index, message) that a pattern matches, with the first
        pattern (in table order) that does."""
        out: list[Match] = []
        for i, msg in candidates:
            p = self._first(msg, self._each)
            if p is not None:
                out.append(Match(i, p))
        return out

    def confirm_screened(self, entries: Sequence[int], messages: Sequence[bytes]) -> list[tuple[int, FaultPattern]]:
        """`confirm` for messages the screen picked, when it alone picks
        (`screened_only`): (position in `messages`, first pattern that matches
        it), trying the patterns from that of the message's first accepting
        entry (`entries`) on."""
        out = []
        from_entry = self._from_entry
        if self._preludes:
            for j, (k, msg) in enumerate(zip(entries, messages)):
                found = self._first(msg, from_entry[k])
                if found is not None:
                    out.append((j, found))
            return out
        for j, (k, msg) in enumerate(zip(entries, messages)):
            for rx, p in from_entry[k]:
                if rx.match(msg):
                    out.append((j, p))
                    break
        return out

    def scan_regex_only(self, messages: Sequence[bytes]) -> list[Match]:
        """`scan` without the screen: every message tried against every pattern (the tests' oracle)."""
        out = []
        for i, msg in enumerate(messages):
            p = self._first(msg, self._each)
            if p is not None:
                out.append(Match(i, p))
        return out

    def match(self, message: bytes) -> FaultPattern | None:
        found = self.scan([message])
        return found[0].pattern if found else None


def build(
    overrides: Iterable[tuple[str, dict[str, object]]] = (), disabled: Iterable[str] = ()
) -> Table:
    """The table of `merged` patterns. Raises PatternError."""
    return Table(merged(overrides, disabled))


def merged(
    overrides: Iterable[tuple[str, dict[str, object]]] = (), disabled: Iterable[str] = ()
) -> list[FaultPattern]:
    """The built-in patterns with `disabled` names dropped and `overrides` (name,
    fields) applied: a built-in's name changes its fields, a new name adds a
    pattern (reason `KernelLogPattern` unless it names one) after the built-in ones. Raises
    PatternError for a bad regex or a new pattern without one."""
    off = set(disabled)
    table = [p for p in PATTERNS if p.name not in off]
    index = {p.name: i for i, p in enumerate(table)}
    for name, fields in overrides:
        if "pattern" in fields:
            problem = check_regex(str(fields["pattern"]))
            if problem:
                raise PatternError(problem)
        if name in index:
            if "pattern" in fields:  # its own regex: the built-in's screen no longer says what it matches
                fields = {**fields, "screen": ()}
            table[index[name]] = replace(table[index[name]], **fields)  # type: ignore[arg-type]
            continue
        if not fields.get("pattern"):
            raise PatternError(f'expected a "pattern" for "{name}", which is not a built-in pattern')
        kw = {k: v for k, v in fields.items() if k != "pattern"}
        kw.setdefault("reason", OPERATOR_REASON)
        kw.setdefault("severity", Severity.WARNING)
        kw.setdefault("action", "none")
        table.append(FaultPattern(name, pattern=str(fields["pattern"]), summary="", **kw))  # type: ignore[arg-type]
    return table


DEFAULT = Table(PATTERNS)

# ------------------------------------------------------------------ saved logs

# One line of a saved kernel log, its message captured: the optional kmsg record
# header ("prio,seq,usec,flags;"), a printk level ("<4>"), dmesg -x's "kern  :err   : ",
# a syslog / journal head ("<stamp> host kernel: ": syslog's "Nov 25 10:00:01" (journalctl's
# short and short-precise with microseconds), ISO time (short-iso, rsyslog's RFC 3339),
# short-full's "Tue 2026-11-25 10:00:01 UTC", short-monotonic's "[  123.456789]"), dmesg's
# --time-format iso stamp and dmesg's bracket ("[  123.456789] ", "[Tue Nov 25 10:00:01 2026] "), with
# the caller's id a kernel built with CONFIG_PRINTK_CALLER adds after it ("[  123.456789][  T896] ": task 896,
# "[C3]": CPU 3 in interrupt context).
# A bracket holds a digit: a message of its own that starts with one ("[Hardware Error]: ...") is kept.
_LINE = re.compile(
    rb"^(?:\d{1,19},\d{1,19},(?P<usec>\d{1,19})(?:,[^;]*)?;)?"
    rb"(?:<\d{1,4}>)?"
    rb"(?:[a-z]{2,8} *:[a-z]{2,6} *: )?"
    rb"(?:(?P<syslog>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,9})?|\d{4}-\d\d-\d\dT\S+"
    rb"|[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})? [A-Z0-9+-]{1,6}|\[ *\d{1,12}\.\d{1,9}\]) \S+ kernel: )?"
    rb"(?:(?P<iso>\d{4}-\d\d-\d\dT\S+) )?"
    rb"(?:\[(?P<bracket>[^\]\d]{0,39}\d[^\]]{0,39})\](?:\[ *[TC]\d{1,10}\])? ?)?"
)


def message_of(line: bytes) -> bytes:
    """The kernel message in one line of a saved log (the line itself when it has no known prefix)."""
    m = _LINE.match(line)
    return line[m.end():] if m else line


def time_of(line: bytes) -> str:
    """The time a saved line carries: dmesg's bracket, the journal's or ISO stamp, or a
    kmsg record's microseconds as seconds; "" when none."""
    m = _LINE.match(line)
    if m is None:
        return ""
    if m["bracket"]:
        return m["bracket"].strip().decode("ascii", "replace")
    if m["usec"]:
        usec = int(m["usec"])
        return f"{usec // 1_000_000}.{usec % 1_000_000:06d}"
    stamp = m["iso"] or m["syslog"]
    return stamp.strip(b"[] ").decode("ascii", "replace") if stamp else ""


def facility_of(line: bytes) -> int | None:
    """The syslog facility a saved line states (a kmsg record header or a
    ``<prio>`` prefix), else None (dmesg and journal text: the kernel's)."""
    head, sep, _ = line.partition(b";")
    if sep:
        f = head.split(b",", 3)
        if len(f) >= 3 and f[0].isdigit() and f[1].isdigit():
            return int(f[0]) >> 3
    if line.startswith(b"<"):
        end = line.find(b">", 1, 6)
        if end > 1 and line[1:end].isdigit():
            return int(line[1:end]) >> 3
    return None


def scan_log(data: bytes, table: Table = DEFAULT, not_kernel: list[int] | None = None) -> list[tuple[int, str, FaultPattern, bytes]]:
    """The faults of a saved kernel log: (line number from 1, its time, the
    pattern, the message). A line that states a facility other than the
    kernel's (a process wrote it) is no fault; its number goes to `not_kernel`."""
    lines = data.split(b"\n")
    kept: list[int] = []
    messages: list[bytes] = []
    for i, line in enumerate(lines):
        if not line or line[0] == 0x20:  # empty, or a " KEY=value" continuation of a kmsg record
            continue
        kept.append(i)
        messages.append(message_of(line.rstrip(b"\r")))
    out = []
    for m in table.scan(messages):
        i = kept[m.index]
        facility = facility_of(lines[i])
        if facility not in (None, 0):
            if not_kernel is not None:
                not_kernel.append(i + 1)
            continue
        out.append((i + 1, time_of(lines[i]), m.pattern, messages[m.index]))
    return out
