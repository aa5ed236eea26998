"""The kernel-log batch pass (native/src/kbatch.rs) held equal to its Python
twin (agent/parsers/kbatch.py) on real kernel lines and generated ones; the
records it gives equal to `parse_record` line by line; and the subscribers'
batch paths (`unseen`, the Xid candidates, the fault table's candidates)
equal to the record-by-record paths they replace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_parsers_xid import NEAR_MISSES, REAL

from conftest import native_loaded

from agent import native
from agent.gpu.xid_source import events_from
from agent.gpu.xid_tracker import XidStream
from agent.kernel.catalog import PATTERNS
from agent.kernel.faults import FaultTracker
from agent.kernel.patterns import DEFAULT, build, message_of
from agent.kernel.source import faults
from agent.kmsg import Kmsg, Record, RecordBatch, parse_record, unseen
from agent.parsers import kbatch as twin

KERNEL = Path(__file__).parent.parent / "fixtures" / "kernel"
PATTERN_LINES = [
    line.split(" ", 1)[1].encode() for line in (KERNEL / "patterns.txt").read_text().splitlines() if line and not line.startswith("#")
]
# the Xid parser's real lines and near misses, as the messages of kmsg records (their dmesg/journal prefixes cut off)
XID_LINES = [message_of(p.values[0].encode()) for p in REAL + NEAR_MISSES]


@pytest.fixture(autouse=True)
def _native_loaded() -> None:
    native_loaded()


def both(data: bytes) -> twin.KmsgScan:
    """The native pass's output for `data`, required equal to the twin's and made by the native code."""
    assert native.parse_kbatch is native._native_kbatch  # not the twin under another name
    got = native.parse_kbatch(data)
    assert got == twin.parse(data)
    assert [type(f) for f in got] == [type(f) for f in twin.parse(data)]
    return got


def records_of(text: bytes) -> list[Record]:
    """What the reader gave before the batch pass: `parse_record` on every line that is a record."""
    return [parse_record(line) for line in text.split(b"\n") if line and line[0] != 0x20]


def as_records(messages: list[bytes], first_seq: int = 100, prio: int = 4) -> bytes:
    return b"".join(b"%d,%d,%d,-;%s\n" % (prio, first_seq + i, 5_000_000 + i, m) for i, m in enumerate(messages))


# ---------------------------------------------------------------- native == twin


@pytest.mark.parametrize("name", ["kmsg.log", "dmesg-T.log", "journalctl-k.log"])
def test_fixture_logs(name: str) -> None:
    text = (KERNEL / name).read_bytes()
    scan = both(DEFAULT.screen + b"\0" + text)
    assert scan.records == len(records_of(text)) > 0
    assert list(RecordBatch(DEFAULT.screen, text)) == records_of(text)


def test_real_fault_and_xid_lines_as_records() -> None:
    messages = PATTERN_LINES + XID_LINES
    text = as_records(messages)
    scan = both(DEFAULT.screen + b"\0" + text)
    assert (scan.records, scan.sequential, scan.complete, scan.first, scan.last) == (len(messages), 1, 1, 100, 99 + len(messages))
    assert list(scan.nvidia) == [i for i, m in enumerate(messages) if b"NVRM" in m or b"SXid" in m]
    screened = DEFAULT.scan(messages)
    # every line a pattern matches is a screen candidate, and the screen's first entry is the one kscreen names
    assert {m.index for m in screened} <= set(scan.screened[0::2])
    hits = native.parse_kscreen(DEFAULT.screen + b"\0" + b"\n".join(messages))
    assert [(h.line, h.entry) for h in hits] == list(zip(scan.screened[0::2], scan.screened[1::2], strict=True))


@pytest.mark.parametrize(
    ("text", "records", "sequential", "complete"),
    [
        pytest.param(b"6,1,10,-;a\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n6,2,20,-;b\n", 2, 1, 1, id="continuation lines"),
        pytest.param(b"6,1,10,-;a\n\n\n6,2,20;b", 2, 1, 1, id="empty lines, no flags, no last newline"),
        pytest.param(b"6,1,10,-;NVRM: x\\x0ay\\xffz\n", 1, 1, 1, id="escaped bytes"),
        pytest.param(b"6,1,10,-;caf\xc3\xa9 \xff\xfe NVRM\n", 1, 1, 1, id="not UTF-8"),
        pytest.param(b"6,1,,-;a\n6,2,x;b\n", 2, 1, 0, id="usec missing or not a number"),
        pytest.param(b"6,1,10;a\n6,3,10;b\n", 2, 0, 1, id="a gap in seq"),
        pytest.param(b"6,x,10;a\n,1,2;b\n6,1;c\nno header\n[  12.5] NVRM: d\n", 5, 0, 0, id="malformed headers"),
        pytest.param(b"6,18446744073709551615,1;a\n6,0,1;b\n", 2, 0, 1, id="seq at u64 max does not wrap"),
        pytest.param(b"6,18446744073709551616,1;a\n", 1, 0, 0, id="seq over u64"),
        pytest.param(b"000000000000000000000000006,00000000000000000000001,2;a\n", 1, 1, 1, id="leading zeros"),
        pytest.param(b"6,1,10,a;b;NVRM;c\n6,2,3,NVRM;d\n", 2, 1, 1, id="semicolons, NVRM in the header only"),
        pytest.param(b"6,1,10;a\0b\n6,2,10;\0\n", 2, 1, 1, id="NUL bytes in messages"),
        pytest.param(b"", 0, 0, 0, id="nothing"),
    ],
)
def test_odd_records(text: bytes, records: int, sequential: int, complete: int) -> None:
    scan = both(DEFAULT.screen + b"\0" + text)
    assert (scan.records, scan.sequential, scan.complete) == (records, sequential, complete)
    assert list(RecordBatch(DEFAULT.screen, text)) == records_of(text)


def test_no_nul_no_records() -> None:
    assert both(b"6,1,10;NVRM: x").records == 0


def test_the_nvidia_candidates_are_in_the_message_only() -> None:
    scan = both(b"\0" + b"6,2,3,NVRM;d\n6,3,4;xx SXid\nNVRM at the start of a line without a header\n")
    assert list(scan.nvidia) == [1, 2]


_PIECES = st.sampled_from(
    [b"6,", b"12,", b"4", b"1", b"0", b"18446744073709551615", b"99999999999999999999", b",", b";", b"-;", b"c;",
     b"\n", b"\n ", b" KEY=v\n", b"NVRM: Xid (PCI:0000:3b:00): 79, ", b"SXid", b"INFO: task ", b"BUG: ", b"mlx5_core ",
     b"watchdog: BUG: soft lockup", b"\\x0a", b"\xff", b"\xc3\xa9", b"\0", b" ", b"x", b"blocked for more than"]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=50).map(b"".join))
def test_generated_text_native_equals_twin_and_parse_record(text: bytes) -> None:
    both(DEFAULT.screen + b"\0" + text)
    both(text)  # the first NUL, if any, ends the screen
    if b"\0" not in text:
        assert list(RecordBatch(DEFAULT.screen, text)) == records_of(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    both(data)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"BUG: ", b"mlx5 ", b"a", b""]), st.sampled_from([b"", b"x", b"\x1f"])), max_size=5),
       st.lists(_PIECES, max_size=30).map(b"".join))
def test_generated_screens(entries: list[tuple[bytes, bytes]], text: bytes) -> None:
    spec = b"\x1e".join(p + b"\x1f" + n for p, n in entries)
    both(spec + b"\0" + text)


def test_the_twin_answers_under_the_python_parsers(monkeypatch: pytest.MonkeyPatch) -> None:
    """`NODE_HEALTH_AGENT_PARSERS=python`: the batch is the twin's, with the same records."""
    text = as_records(PATTERN_LINES + XID_LINES) + b"junk\n 5,1,2;continuation\n"
    native_batch = RecordBatch(DEFAULT.screen, text)
    monkeypatch.setattr(native, "parse_kbatch", twin.parse)
    twin_batch = RecordBatch(DEFAULT.screen, text)
    assert list(twin_batch) == list(native_batch) == records_of(text)
    assert twin_batch.nvidia_from(0) == native_batch.nvidia_from(0)
    assert twin_batch.screened(DEFAULT.screen) == native_batch.screened(DEFAULT.screen)


# ---------------------------------------------------------------- the batch's records and candidates


def test_records_by_index_slice_and_in_bulk() -> None:
    messages = PATTERN_LINES + XID_LINES
    text = as_records(messages)
    batch = RecordBatch(DEFAULT.screen, text)
    want = records_of(text)
    assert len(batch) == len(want)
    assert batch[0] == want[0] and batch[-1] == want[-1] and batch[3:9] == want[3:9]
    with pytest.raises(IndexError):
        batch[len(want)]
    many = list(range(0, len(want), 3))
    assert batch.at(many) == [want[i] for i in many]  # the bulk path (every record has a header and a usec)
    assert all(type(r) is Record for r in batch.at(many))
    odd = RecordBatch(b"", text + b"6,9999,x;no usec\n")
    assert odd.at(many) == [want[i] for i in many]  # one record without a usec: record by record


def test_screened_with_another_screen() -> None:
    table = build([], disabled=["hung_task"])
    text = as_records(PATTERN_LINES)
    batch = RecordBatch(DEFAULT.screen, text)
    other = RecordBatch(table.screen, text)
    assert batch.screened(table.screen) == other.screened(table.screen)
    assert batch.screened(table.screen) != batch.screened(DEFAULT.screen)
    indices, _ = batch.screened(DEFAULT.screen, 10)
    assert indices and min(indices) >= 10


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 40), st.integers(1, 30), st.one_of(st.none(), st.integers(0, 80)))
def test_unseen_equals_record_by_record(first: int, n: int, cursor: int | None) -> None:
    text = as_records([b"m%d" % i for i in range(n)], first_seq=first)
    batch = RecordBatch(b"", text)
    assert batch.sequential
    streams = []
    for _ in range(2):
        s = XidStream(dedupe_window=10.0, app_hold=60.0, coverage_hold=60.0, overrides={}, subject_of=lambda p, k: ("gpu", "0"))
        s.cursor = cursor
        streams.append(s)
    fresh, start = unseen(batch, streams[0])
    want = [r for r in list(batch) if r.seq is None or streams[1].record_seq(r.seq)]
    assert list(fresh)[start:] == want
    a, b = streams
    assert (a.cursor, a.lost, a.gaps, a.coverage_message) == (b.cursor, b.lost, b.gaps, b.coverage_message)
    t1, t2 = FaultTracker(DEFAULT), FaultTracker(DEFAULT)
    t1.cursor = t2.cursor = cursor
    fresh, start = unseen(batch, t1)
    assert list(fresh)[start:] == [r for r in list(batch) if t2.record_seq(r.seq or 0)]
    assert t1.cursor == t2.cursor


def test_unseen_of_a_batch_with_a_gap_or_a_list_is_record_by_record() -> None:
    s = XidStream(dedupe_window=10.0, app_hold=60.0, coverage_hold=60.0, overrides={}, subject_of=lambda p, k: ("gpu", "0"))
    batch = RecordBatch(b"", b"6,1,1;a\n6,5,1;b\n6,3,1;c\n")
    fresh, start = unseen(batch, s)
    assert (start, [r.seq for r in fresh], s.cursor, s.lost, s.gaps) == (0, [1, 5], 5, 4, 2)
    fresh, start = unseen([Record(None, None, b"dmesg text")], s)
    assert (start, len(fresh)) == (0, 1)


@pytest.mark.parametrize("start", [0, 7, 40])
def test_the_subscribers_batch_paths_equal_their_list_paths(start: int) -> None:
    messages = (PATTERN_LINES + XID_LINES) * 2
    text = as_records(messages) + as_records(PATTERN_LINES[:5] + XID_LINES[:5], first_seq=500, prio=12)  # a process wrote these
    batch = RecordBatch(DEFAULT.screen, text)
    records = list(batch)
    assert faults(DEFAULT, batch, start) == faults(DEFAULT, records[start:])
    mine, foreign = faults(DEFAULT, batch, start)
    assert mine and foreign
    operator = build([("gsp", {"pattern": r"NVRM: GPU\d+ GSP"})])  # not screened: its own regex, on every message
    assert faults(operator, batch, start) == faults(operator, records[start:])
    got = events_from(batch, [], True, 0.0, start)
    want = events_from(records[start:], [], True, 0.0)
    assert got == want and got.events and got.foreign


def test_confirm_screened_equals_every_regex() -> None:
    text = as_records(PATTERN_LINES * 3)
    batch = RecordBatch(DEFAULT.screen, text)
    indices, entries = batch.screened(DEFAULT.screen)
    messages = [batch[i].message for i in indices]
    got = [(indices[j], p.name) for j, p in DEFAULT.confirm_screened(entries, messages)]
    want = [(m.index, m.pattern.name) for m in DEFAULT.scan_regex_only([r.message for r in batch])]
    assert got == want and len({name for _, name in got}) == len(PATTERNS)


# ---------------------------------------------------------------- reading


def _read_all(path: str, limit: int) -> list[RecordBatch]:
    k = Kmsg(path)
    try:
        out = [k.read_batch(limit)]
        while len(out[-1]) >= limit:
            out.append(k.read_batch(limit))
        return out
    finally:
        k.close()


@pytest.mark.parametrize("shape", ["plain", "continuations", "blank lines", "mixed"])
def test_a_file_reads_as_parse_record_of_its_lines(tmp_path: Path, shape: str) -> None:
    lines = []
    for i in range(3000):
        lines.append(b"6,%d,%d,-;line %d NVRM" % (i, i * 10, i) if shape != "mixed" or i % 7 else b"[  1.0] dmesg %d" % i)
        if shape == "continuations" or shape == "mixed" and i % 3 == 0:
            lines += [b" SUBSYSTEM=pci", b" DEVICE=+pci:0000:3b:00.0"]
        if shape == "blank lines" or shape == "mixed" and i % 5 == 0:
            lines += [b"", b""]
    text = b"\n".join(lines) + b"\n"
    path = tmp_path / "kmsg"
    path.write_bytes(text)
    for limit in (1, 64, 1000, 4096):
        batches = _read_all(os.fspath(path), limit)
        assert [r for b in batches for r in b] == records_of(text)
        assert all(len(b) >= limit for b in batches[:-1]) and len(batches[-1]) < limit  # short only at the end
