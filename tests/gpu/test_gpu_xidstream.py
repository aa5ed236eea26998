"""The Xid stream: deduplication across sources, how long findings stay, gaps,
persistence. Pure logic with a test clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.findings import Severity
from agent.gpu.xid_catalog import catalog, classify
from agent.gpu.xid_tracker import MAX_KEYS, PAIR_DEPTH, Event, XidStream
from agent.parsers.xid import KIND_DRIVER_LOADED, KIND_FALLEN_OFF_BUS, KIND_SXID, KIND_XID

PCI = "0000:3b:00"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stream(clock: Clock, overrides: dict[int, Severity] | None = None) -> XidStream:
    return XidStream(
        dedupe_window=10, app_hold=300, coverage_hold=3600, overrides=overrides or {},
        subject_of=lambda pci, kind: ({PCI: ("gpu3", "3")}.get(pci, (f"pci-{pci}", "unknown"))), clock=clock,
    )


def ev(clock: Clock, source: str, xid: int, kind: int = KIND_XID, pci: str = PCI, backlog: bool = False, msg: str = "m") -> Event:
    return Event(source, kind, xid, pci, msg, clock(), backlog)


def active(s: XidStream) -> dict[tuple[str, str], Severity]:
    return {(f.subject, f.reason): f.severity for f in s.findings()}


def xid_count(s: XidStream, xid: str = "79") -> int:
    return s.counts.get(("3", xid), 0)


def test_one_xid_from_both_sources_is_one_finding_and_one_count() -> None:
    c = Clock()
    s = stream(c)
    s.add(ev(c, "nvml", 79, msg="reported by NVML"))
    c.now += 0.5
    s.add(ev(c, "kmsg", 79, msg="GPU has fallen off the bus."))
    assert active(s) == {("gpu3", "Xid79"): Severity.CRITICAL}
    assert xid_count(s) == 1
    assert "GPU has fallen off the bus." in s.findings()[0].message  # the kernel's words win
    assert s.source_events == {"kmsg": 1, "nvml": 1}


@pytest.mark.parametrize("order", [("kmsg", "nvml"), ("nvml", "kmsg")], ids=["kmsg first", "nvml first"])
def test_sources_pair_off_one_to_one(order: tuple[str, str]) -> None:
    c = Clock()
    s = stream(c)
    for src in [order[0]] * 3 + [order[1]] * 3:
        s.add(ev(c, src, 13))
    assert xid_count(s, "13") == 3


def test_same_xid_outside_the_window_is_a_new_event() -> None:
    c = Clock()
    s = stream(c)
    s.add(ev(c, "nvml", 79))
    c.now += 11
    s.add(ev(c, "kmsg", 79))
    assert xid_count(s) == 2


def test_fallen_off_bus_line_pairs_with_xid_79() -> None:
    c = Clock()
    s = stream(c)
    s.add(ev(c, "kmsg", 79))
    s.add(ev(c, "kmsg", 0, kind=KIND_FALLEN_OFF_BUS))
    s.add(ev(c, "nvml", 79))
    assert xid_count(s) == 1
    assert active(s) == {("gpu3", "Xid79"): Severity.CRITICAL}


def test_backlog_never_pairs_with_live_events() -> None:
    c = Clock()
    s = stream(c)
    s.add(ev(c, "kmsg", 79, backlog=True))
    s.add(ev(c, "nvml", 79))
    assert xid_count(s) == 2


@pytest.mark.parametrize("backlog", [False, True], ids=["live", "backlog"])
@pytest.mark.parametrize("fallen_first", [False, True], ids=["xid line first", "fallen line first"])
def test_a_gpu_falling_off_the_bus_is_one_event_live_and_from_the_backlog(backlog: bool, fallen_first: bool) -> None:
    """The driver's fallen-off-the-bus message and its Xid 79 line are one event,
    whether read as they happen or from the ring buffer at start; the backlog
    pairs by the records' own times (1 s apart here, read at the same moment)."""
    c = Clock()
    s = stream(c)
    lines = [(KIND_XID, 79), (KIND_FALLEN_OFF_BUS, 0)]
    for i, (kind, xid) in enumerate(reversed(lines) if fallen_first else lines):
        at = 500.0 + i if backlog else c.now
        s.add(Event("kmsg", kind, xid, PCI, "m", at, backlog))
        if not backlog:
            c.now += 1
    assert xid_count(s) == 1 and active(s) == {("gpu3", "Xid79"): Severity.CRITICAL}


def test_backlog_pairs_only_within_the_window_of_the_records_times() -> None:
    c = Clock()
    s = stream(c)
    s.add(Event("kmsg", KIND_XID, 79, PCI, "m", 100.0, True))
    s.add(Event("kmsg", KIND_FALLEN_OFF_BUS, 0, PCI, "m", 300.0, True))  # 200 s later: another fall
    s.add(Event("kmsg", KIND_XID, 13, PCI, "m", 300.0, True))
    s.add(Event("kmsg", KIND_XID, 13, PCI, "m", 300.0, True))  # the backlog has one source: two 13s are two
    assert xid_count(s) == 2 and xid_count(s, "13") == 2


def test_application_xid_expires_after_its_hold_sticky_one_stays() -> None:
    c = Clock()
    s = stream(c)
    s.add(ev(c, "kmsg", 13))
    s.add(ev(c, "kmsg", 95))
    assert active(s) == {("gpu3", "Xid13"): Severity.INFO, ("gpu3", "Xid95"): Severity.CRITICAL}
    c.now += 301
    assert s.expire()
    assert active(s) == {("gpu3", "Xid95"): Severity.CRITICAL}
    assert xid_count(s, "13") == 1  # counted for good


def test_old_application_xid_in_the_backlog_is_counted_not_shown() -> None:
    c = Clock()
    s = stream(c)
    s.add(Event("kmsg", KIND_XID, 13, PCI, "m", c.now - 3600, backlog=True))
    assert active(s) == {} and xid_count(s, "13") == 1


def test_driver_reload_ends_reset_gpu_findings_not_reboot_ones() -> None:
    c = Clock()
    s = stream(c)
    s.add(ev(c, "kmsg", 119))
    s.add(ev(c, "kmsg", 79))
    assert s.add(ev(c, "kmsg", 0, kind=KIND_DRIVER_LOADED, pci=""))
    assert active(s) == {("gpu3", "Xid79"): Severity.CRITICAL}


@pytest.mark.parametrize(
    ("xid", "message", "severity"),
    [
        pytest.param(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x0)", Severity.CRITICAL, id="149 fatal"),
        pytest.param(144, "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008)", Severity.WARNING, id="144 nonfatal"),
        pytest.param(154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", Severity.CRITICAL, id="154 to node reboot"),
        pytest.param(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", Severity.INFO, id="154 back to none"),
        pytest.param(45, "Ch 00000001 caused by previous Xid 149", Severity.INFO, id="45 follows another Xid"),
        pytest.param(999, "an Xid from the future", Severity.WARNING, id="unknown Xid"),
    ],
)
def test_severity_from_the_line(xid: int, message: str, severity: Severity) -> None:
    v = classify(KIND_XID, xid, message)
    assert v is not None and v.severity is severity


def test_sxid_severity_follows_fatal() -> None:
    assert classify(KIND_SXID, 12028, "Non-fatal, Link 32 egress").severity is Severity.WARNING  # type: ignore[union-attr]
    assert classify(KIND_SXID, 10, "Fatal, Link 02 ingress").severity is Severity.CRITICAL  # type: ignore[union-attr]


def test_operator_override_changes_severity() -> None:
    c = Clock()
    s = stream(c, {109: Severity.WARNING, 13: Severity.CRITICAL})
    s.add(ev(c, "kmsg", 109))
    s.add(ev(c, "kmsg", 13))
    assert active(s) == {("gpu3", "Xid109"): Severity.WARNING, ("gpu3", "Xid13"): Severity.CRITICAL}


def test_unknown_pci_and_unknown_xid_are_bounded_labels() -> None:
    c = Clock()
    s = stream(c)
    s.add(ev(c, "kmsg", 999, pci="0000:99:00"))
    assert s.counts == {("unknown", "other"): 1}
    assert active(s) == {("pci-0000:99:00", "XidOther"): Severity.WARNING}


def test_sequence_gap_is_lost_coverage() -> None:
    c = Clock()
    s = stream(c)
    assert [s.record_seq(q) for q in (0, 1, 2, 7, 7, 3)] == [True, True, True, True, False, False]
    assert (s.lost, s.gaps) == (4, 1)
    [f] = s.findings()
    assert (f.reason, f.unknown) == ("KmsgCoverageLost", True) and "seq 3..6" in f.message
    c.now += 3601
    assert s.expire() and s.findings() == []


def test_first_record_after_a_wrapped_ring_is_lost_coverage() -> None:
    c = Clock()
    s = stream(c)
    s.record_seq(5000)
    assert s.lost == 5000


def test_state_round_trip() -> None:
    c = Clock()
    s = stream(c)
    s.record_seq(0)
    s.record_seq(41)
    s.add(ev(c, "kmsg", 79))
    s.add(ev(c, "kmsg", 13))
    t = stream(c)
    t.load_json(s.to_json())
    assert (t.cursor, t.lost, t.counts, t.findings()) == (s.cursor, s.lost, s.counts, s.findings())


def test_every_special_xid_is_in_the_catalog() -> None:
    from agent.gpu.xid_catalog import SPECIAL_XIDS

    assert SPECIAL_XIDS <= set(catalog())


# ------------------------------------------------------------ dedupe: bounded, constant time, same pairing


def _reference_duplicates(events: list[tuple[float, str, int, int, str, bool]], window: float) -> list[bool]:
    """The pairing as it was first written (a scan of every sighting of the
    window for each event), kept here as the specification."""
    live: list[tuple[str, int, float, set[str]]] = []
    old: list[tuple[str, int, float, set[str]]] = []  # the backlog's own (only its 79 and fallen lines pair)
    out = []
    for now, source, kind, xid, pci, backlog in events:
        live = [r for r in live if now - r[2] <= window]
        old = [r for r in old if now - r[2] <= window]
        token = "kmsg-fallen" if kind == KIND_FALLEN_OFF_BUS else source
        xid = 79 if kind == KIND_FALLEN_OFF_BUS else xid
        dup = False
        pairs = not backlog or (xid == 79 and token in ("kmsg", "kmsg-fallen"))
        recent = old if backlog else live
        if pairs and pci:
            for r in recent:
                if r[0] == pci and r[1] == xid and token not in r[3]:
                    r[3].add(token)
                    dup = True
                    break
            else:
                recent.append((pci, xid, now, {token}))
        out.append(dup)
    return out


EVENTS = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.0, 0.5, 3.0, 11.0]),  # time since the previous event
        st.sampled_from(["kmsg", "nvml"]),
        st.sampled_from([KIND_XID, KIND_XID, KIND_FALLEN_OFF_BUS]),
        st.sampled_from([13, 79, 48]),
        st.sampled_from([PCI, "0000:18:00", ""]),
        st.sampled_from([False, False, False, True]),  # backlog
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_dedupe_pairs_exactly_as_the_reference(steps: list[tuple[float, str, int, int, str, bool]]) -> None:
    c = Clock()
    s = stream(c)
    timed = []
    for dt, source, kind, xid, pci, backlog in steps:
        c.now += dt
        timed.append((c.now, source, kind, xid, pci, backlog))
    expected = _reference_duplicates(timed, 10)
    got = []
    for now, source, kind, xid, pci, backlog in timed:
        c.now = now
        got.append(s._duplicate(Event(source, kind, xid, pci, "m", now, backlog), 79 if kind == KIND_FALLEN_OFF_BUS else xid))
    assert got == expected


def test_dedupe_memory_is_bounded_in_a_storm_of_one_source() -> None:
    c = Clock()
    s = stream(c)
    for i in range(20_000):
        c.now += 0.0001
        s.add(ev(c, "kmsg", (13, 31, 48, 79)[i % 4]))
    assert sum(s.counts.values()) == 20_000  # nothing pairs within one source: every line is an event
    assert len(s.unmatched) == 4
    assert all(len(q) <= PAIR_DEPTH for w in s.unmatched.values() for q in w.values())


def test_dedupe_keeps_at_most_max_keys_gpu_xid_pairs() -> None:
    c = Clock()
    s = stream(c)
    for i in range(MAX_KEYS * 3):
        s._duplicate(ev(c, "kmsg", 13, pci=f"0000:{i // 256:02x}{i % 256:02x}:00"), 13)
    assert len(s.unmatched) <= MAX_KEYS
    c.now += 0.1
    assert s._duplicate(ev(c, "nvml", 13, pci=f"0000:{(MAX_KEYS * 3 - 1) // 256:02x}{(MAX_KEYS * 3 - 1) % 256:02x}:00"), 13)


def test_pairing_holds_to_pair_depth_and_counts_twice_beyond_it() -> None:
    c = Clock()
    s = stream(c)
    for src in ["kmsg"] * PAIR_DEPTH + ["nvml"] * PAIR_DEPTH:
        s.add(ev(c, src, 13))
    assert xid_count(s, "13") == PAIR_DEPTH
    t = stream(c)
    for src in ["kmsg"] * (PAIR_DEPTH + 5) + ["nvml"] * (PAIR_DEPTH + 5):
        t.add(ev(c, src, 13))
    assert xid_count(t, "13") == PAIR_DEPTH + 10  # the 5 oldest lines were forgotten: their NVML twins count again


def test_a_source_matches_the_oldest_sighting_still_in_the_window() -> None:
    c = Clock()
    s = stream(c)
    for at, src in ((0, "kmsg"), (6, "kmsg"), (7, "nvml"), (12, "nvml")):
        c.now = 1000.0 + at
        s.add(ev(c, src, 13))
    assert xid_count(s, "13") == 2  # 7 s took the line of 0 s, 12 s the line of 6 s


def test_a_verified_reset_ends_that_gpus_reset_gpu_findings_from_before_it() -> None:
    c = Clock()
    s = stream(c)
    s.add(ev(c, "kmsg", 119))  # reset_gpu
    s.add(ev(c, "kmsg", 79))  # reboot: a reset does not cure it
    s.add(ev(c, "kmsg", 119, pci="0000:5e:00"))  # another GPU's
    c.now += 5
    assert s.forget_reset("gpu3", c.now) == ["Xid119"]
    assert active(s) == {("gpu3", "Xid79"): Severity.CRITICAL, ("pci-0000:5e:00", "Xid119"): Severity.CRITICAL}
    c.now += 20  # past the dedupe window: a new Xid, not the one before the reset seen again
    s.add(ev(c, "kmsg", 119))
    assert ("gpu3", "Xid119") in active(s), "an Xid after the reset counts again"
    assert s.forget_reset("gpu3", c.now - 1) == [], "a reset before its last event did not cure it"
    assert xid_count(s, "119") == 2


def test_the_latest_event_time_is_saved_and_an_older_file_still_loads() -> None:
    from agent.gpu.xid_tracker import check_saved

    c = Clock()
    s = stream(c)
    s.add(ev(c, "kmsg", 119))
    saved = check_saved(s.to_json())
    again = stream(c)
    again.load_json(saved)
    c.now += 1
    assert again.forget_reset("gpu3", c.now - 2) == [] and again.forget_reset("gpu3", c.now) == ["Xid119"]
    old = s.to_json()
    old["active"] = [row[:7] for row in old["active"]]  # written before the latest event time was kept
    older = stream(c)
    older.load_json(check_saved(old))
    assert older.forget_reset("gpu3", c.now) == ["Xid119"]
