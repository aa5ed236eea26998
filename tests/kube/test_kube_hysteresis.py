"""Hysteresis per finding key: when a finding starts and stops counting."""

from __future__ import annotations

import dataclasses

import pytest

from agent.kube.hysteresis import Hysteresis, reports
from agent.kube.settings import HysteresisSection
from kube_support import CATALOG, finding, snapshot


SLOW = HysteresisSection(raise_cycles=3, raise_after=300, clear_cycles=2, clear_after=600)


def run(h: Hysteresis, steps: list[tuple[float, list[str], int]], **kw: object) -> list[list[str]]:
    """Feed (time, reasons reported, run counter) and return the active reasons after each step."""
    out = []
    for t, reasons, runs in steps:
        h.observe(reports(snapshot([finding(r) for r in reasons], runs=runs, **kw)), t, t)  # type: ignore[arg-type]
        out.append(sorted(k[2] for k in h.active))
    return out


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([(0, ["FakeDiskFull"], 1)], [["FakeDiskFull"]], id="critical counts at once"),
        pytest.param(
            [(0, ["FakeDiskSlow"], 1), (30, ["FakeDiskSlow"], 2), (60, ["FakeDiskSlow"], 3)],
            [[], [], ["FakeDiskSlow"]], id="warning after 3 runs",
        ),
        pytest.param(
            [(0, ["FakeDiskSlow"], 1), (30, ["FakeDiskSlow"], 1), (60, ["FakeDiskSlow"], 1)],
            [[], [], []], id="the same run seen again is not a new cycle",
        ),
        pytest.param(
            [(0, ["FakeDiskSlow"], 1), (30, [], 2), (60, ["FakeDiskSlow"], 3), (90, ["FakeDiskSlow"], 4)],
            [[], [], [], []], id="a gap restarts the count",
        ),
        pytest.param(
            [(0, ["FakeDiskSlow"], 1), (301, ["FakeDiskSlow"], 1)], [[], ["FakeDiskSlow"]], id="warning after raise_after",
        ),
        pytest.param(
            [(0, ["FakeDiskFull"], 1), (30, [], 2), (60, [], 3)], [["FakeDiskFull"], ["FakeDiskFull"], []],
            id="released after 2 clean runs",
        ),
        pytest.param(
            [(0, ["FakeDiskFull"], 1), (30, [], 2), (40, ["FakeDiskFull"], 3), (50, [], 4)],
            [["FakeDiskFull"]] * 4, id="a relapse restarts the clear count",
        ),
        pytest.param(
            [(0, ["FakeDiskFull"], 1), (30, [], 1), (700, [], 1)], [["FakeDiskFull"], ["FakeDiskFull"], []],
            id="released after clear_after without new runs",
        ),
    ],
)
def test_raise_and_clear(steps: list[tuple[float, list[str], int]], expected: list[list[str]]) -> None:
    assert run(Hysteresis(SLOW, CATALOG), steps) == expected


@pytest.mark.parametrize(
    "unknown",
    [
        pytest.param({"failed": True}, id="check failed (CheckFailed holds every subject)"),
        pytest.param({"extra": "FakeProbeError"}, id="unknown finding for the same subject"),
    ],
)
def test_unknown_never_clears(unknown: dict[str, object]) -> None:
    h = Hysteresis(SLOW, CATALOG)
    h.observe(reports(snapshot([finding("FakeDiskFull")], runs=1)), 0, 0)
    for i, t in enumerate(range(30, 3000, 30)):
        extra = [finding(str(unknown["extra"]))] if "extra" in unknown else []
        h.observe(reports(snapshot(extra, runs=2 + i, failed=bool(unknown.get("failed")))), t, t)
    assert [k[2] for k in h.active] == ["FakeDiskFull"]


def test_unknown_never_raises() -> None:
    h = Hysteresis(HysteresisSection(raise_cycles=1, raise_after=0, clear_cycles=1, clear_after=0), CATALOG)
    h.observe(reports(snapshot([finding("FakeProbeError")], runs=1)), 0, 0)
    assert h.active == {}


def test_a_check_that_never_ran_holds_the_restored_state() -> None:
    h = Hysteresis(SLOW, CATALOG)
    h.observe(reports(snapshot([finding("FakeDiskFull")], runs=1)), 0, 0)
    restored = Hysteresis.from_json(SLOW, CATALOG, h.to_json())
    never_ran = snapshot([], runs=0)
    snap = dataclasses.replace(never_ran, checks={"disk": dataclasses.replace(never_ran.checks["disk"], observation=None)})
    for t in (10_000, 20_000):
        restored.observe(reports(snap), t, t)
    assert [k[2] for k in restored.active] == ["FakeDiskFull"]


def test_next_deadline_is_the_time_rule() -> None:
    h = Hysteresis(SLOW, CATALOG)
    h.observe(reports(snapshot([finding("FakeDiskSlow")], runs=1)), 100, 100)
    assert h.next_deadline() == 400
