"""The kernel-fault screen (native/src/kscreen.rs) held equal to its Python
twin on the fault table's real lines and on generated ones, made by the native
code; and the table's scan through the screen equal to trying every regex."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import native_loaded, native_vs_twin

from agent.kernel.catalog import PATTERNS
from agent.kernel.patterns import DEFAULT, build
from agent.parsers.kscreen import spec

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kernel" / "patterns.txt"
LINES = [line.split(" ", 1)[1].encode() for line in FIXTURE.read_text().splitlines() if line and not line.startswith("#")]
SPEC = spec([entry for p in PATTERNS for entry in p.screen]) + b"\0"


@pytest.fixture(autouse=True)
def _native_loaded() -> None:
    native_loaded()


def test_the_tables_screen_on_real_lines() -> None:
    hits = native_vs_twin("kscreen", SPEC + b"\n".join(LINES * 5))
    assert len(hits) > len(PATTERNS) * 5  # every pattern's lines, and near misses sharing a prefix


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b"BUG: \x1eINFO: task \x1fblocked\0INFO: task x blocked\nBUG: y\n\nhello", [(0, 1), (1, 0)], id="entries"),
        pytest.param(b"BUG: y\nOops", [], id="no screen"),
        pytest.param(b"\0BUG: y", [], id="empty screen"),
        pytest.param(b"\x1f\0BUG: y", [], id="neither prefix nor needle: ignored"),
        pytest.param(b"\x1fBUG\0BUG: y\nan xBUG\nBU", [(0, 0), (1, 0)], id="no prefix: the needle anywhere"),
        pytest.param(b"a\x1fz\x1e\x1fWD\x1eb\0a WD z\nb WD\nWD\nb", [(0, 0), (1, 1), (2, 1), (3, 2)], id="first entry in screen order"),
        pytest.param(b"mlx5 \x1fabc\0mlx5 ab\nmlx5 xabc\nmlx5abc", [(1, 0)], id="needle after the prefix"),
        pytest.param(b"a\x1fb\0a\0b\nab", [(0, 0), (1, 0)], id="a NUL in a message is just a byte"),
    ],
)
def test_screen_cases(data: bytes, expected: list[tuple[int, int]]) -> None:
    assert [tuple(h) for h in native_vs_twin("kscreen", data)] == expected


_piece = st.sampled_from([b"BUG: ", b"INFO: task ", b"mlx5_core ", b"nvme nvme", b"{1}", b"EDAC MC", b" UE ", b"x", b"\n", b" ", b"\x1e", b"\x1f", b"\0", b"\xff"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_piece, max_size=40), st.lists(st.tuples(st.one_of(st.just(b""), _piece), _piece), max_size=6))
def test_generated_inputs_native_equals_twin(pieces: list[bytes], entries: list[tuple[bytes, bytes]]) -> None:
    screen = b"\x1e".join(p + b"\x1f" + n for p, n in entries)
    native_vs_twin("kscreen", screen + b"\0" + b"".join(pieces))
    native_vs_twin("kscreen", b"".join(pieces))


def test_every_pattern_is_screened_by_its_own_entries() -> None:
    """Soundness: a message a pattern matches (or announces it: FaultPattern.prelude) starts with one of that
    pattern's prefixes (needle after it), or holds the needle of one of its entries without a prefix."""
    for line in LINES:
        for p in PATTERNS:
            if DEFAULT._each[PATTERNS.index(p)][0].match(line) or (p.prelude and re.match(p.prelude.encode(), line)):
                assert any(line.startswith(a.encode()) and n.encode() in line[len(a):] for a, n in p.screen), (p.name, line)


_real = st.sampled_from(LINES)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_real, st.binary(max_size=30).map(lambda b: b.replace(b"\n", b" "))), max_size=60))
def test_scan_through_the_screen_equals_every_regex(messages: list[bytes]) -> None:
    table = build([("gsp", {"pattern": r"NVRM: GPU\d+ GSP"}), ("hung_task", {"pattern": r"INFO: task \S+ blocked"})])
    for t in (DEFAULT, table):
        t.pending = None
        screened = t.scan(messages)
        t.pending = None
        assert screened == t.scan_regex_only(messages)
