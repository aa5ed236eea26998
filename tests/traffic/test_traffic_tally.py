"""Exported traffic counters only go up: across a re-created or zeroed count
rule and across a restart, whether the rules kept counting or not."""

from __future__ import annotations

import json

import pytest

from agent.traffic.tally import STATE_FILE, Tallies, Tally


@pytest.mark.parametrize(
    ("readings", "totals"),
    [
        pytest.param([("a", 10, 1000), ("a", 12, 1500)], [1000, 1500], id="same rule keeps counting"),
        pytest.param([("a", 10, 1000), ("b", 1, 60)], [1000, 1060], id="rule re-created"),
        pytest.param([("a", 10, 1000), ("a", 0, 0), ("a", 3, 200)], [1000, 1000, 1200], id="zeroed with iptables -Z"),
        pytest.param([("a", 10, 1000), ("b", 50, 5000)], [1000, 6000], id="re-created and already past the old count"),
        pytest.param([("a", 10, 1000), ("a", 10, 1000), ("b", 0, 0), ("c", 0, 0)], [1000, 1000, 1000, 1000],
                     id="re-created twice without traffic"),
    ],
)
def test_total_never_goes_back(readings: list[tuple[str, int, int]], totals: list[int]) -> None:
    t = Tally()
    seen = []
    for gen, packets, nbytes in readings:
        t.observe(gen, packets, nbytes)
        seen.append(t.total_bytes)
    assert seen == totals


def test_first_reading_is_taken_as_is() -> None:
    t = Tally()
    assert t.observe("a", 5, 500) is False
    assert (t.total_packets, t.total_bytes) == (5, 500)


def test_restart_with_rules_that_kept_counting(tmp_path) -> None:
    before = Tallies(str(tmp_path))
    before.get("internet-out", "ipv4").observe("a", 10, 1000)
    before.save()
    after = Tallies(str(tmp_path))
    t = after.get("internet-out", "ipv4")
    assert t.observe("a", 20, 3000) is False
    assert t.total_bytes == 3000


def test_restart_with_rules_recreated_meanwhile(tmp_path) -> None:
    before = Tallies(str(tmp_path))
    before.get("internet-out", "ipv4").observe("a", 10, 1000)
    before.repaired("ipv4")
    before.save()
    after = Tallies(str(tmp_path))
    t = after.get("internet-out", "ipv4")
    assert t.observe("b", 30, 4000) is True  # new generation, even though it counts more
    assert t.total_bytes == 5000
    assert after.repairs == {"ipv4": 1}


def test_save_writes_only_on_change(tmp_path) -> None:
    tallies = Tallies(str(tmp_path))
    tallies.get("internet-in", "ipv4").observe("a", 1, 100)
    tallies.save()
    path = tmp_path / STATE_FILE
    mtime = path.stat().st_mtime_ns
    tallies.save()  # nothing changed: no write (a write would replace the file)
    assert path.stat().st_mtime_ns == mtime
    assert json.loads(path.read_text())["tallies"]["internet-in/ipv4"]["bytes"] == 100


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("{not json", id="torn file"),
        pytest.param('{"version": 99, "tallies": {}}', id="unknown version"),
        pytest.param('{"version": 1, "tallies": {"internet-in/ipv4": {"bytes": -1}}}', id="bad numbers"),
    ],
)
def test_bad_state_file_starts_afresh(tmp_path, content: str) -> None:
    (tmp_path / STATE_FILE).write_text(content)
    tallies = Tallies(str(tmp_path))
    assert tallies.get("internet-in", "ipv4").total_bytes == 0
