"""benches/fleet_breaker.py at a small size, so that the fleet breaker's promise is held in CI: the real Ladder
and KubeRemediation on every node, one fake API server, virtual time (issue 24 item 1)."""

from __future__ import annotations

import importlib.util
import logging
import pathlib
import sys
from typing import Any

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benches" / "fleet_breaker.py"


def load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("fleet_breaker_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_fleet_wide_false_positive_stops_at_the_threshold_until_the_reset(caplog: pytest.LogCaptureFixture) -> None:
    """Every node reports the same rma finding. The breaker trips with at most the threshold of nodes disrupted
    (drained) and none retired beyond it, stays stopped (2 h here), resumes after a person's reset, and stops
    again at the threshold."""
    caplog.set_level(logging.CRITICAL)
    out = load_bench().run(nodes=40, budget=2, count=30, faulty=40, fault="rma", hold_h=2.0, limit_h=4.0, percent=10.0)
    before, threshold = out["before_reset"], out["threshold"]
    assert threshold == 4  # 10 % of 40 nodes, below the count (30)
    assert len(before["tripped_at_s"]) == 1 and before["simulated_s"] - before["tripped_at_s"][0] >= 2 * 3600
    assert 1 <= before["nodes_drained"] <= threshold and before["retired"] <= threshold
    assert before["records_created_while_tripped"] == 0 and before["reboots"] == 0
    assert before["breaker"] == "tripped" and "more than 4" in before["breaker_reason"]
    assert len(out["tripped_at_s"]) == 2, "resumed after the reset, and stopped again"
    assert before["nodes_drained"] < out["nodes_drained"] <= 2 * threshold
    assert out["retired"] <= 2 * threshold and out["records_now"] <= threshold


def test_faults_on_a_few_nodes_never_trip_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL)
    out = load_bench().run(nodes=40, budget=2, count=30, faulty=3, fault="rma", hold_h=0.0, limit_h=3.0, reset=False,
                           percent=10.0)
    assert out["tripped_at_s"] == [] and out["breaker"] == ""
    assert out["nodes_drained"] == 3 and out["retired"] == 3, "each faulty node handled"
