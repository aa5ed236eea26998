"""The fleet simulation of benches/kube_drain.py at a small scale, so the benchmark cannot rot: every node of a
fleet fails at once, each runs the real KubeRemediation against one fake API server in virtual time."""

from __future__ import annotations

import importlib.util
import logging
import pathlib
import sys
from typing import Any

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benches" / "kube_drain.py"


def load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("kube_drain_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_every_node_is_handled_and_the_budget_is_never_exceeded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)  # every refused claim and eviction logs a warning
    nodes, budget, reboot = 50, 2, 300.0
    out = load_bench().bench_fleet(nodes, budget, apf=250.0, reboot=reboot, ready_after=10.0)
    assert out["handled"] == nodes and out["evictable_pods_left"] == 0
    assert out["evictions_201"] == 3 * nodes, "2 pods behind PDBs and 1 without per node, all evicted"
    assert out["max_slots_held"] == budget, "replayed from the server's log: never above the budget, and all used"
    assert out["slots_held_at_end"] == 0
    assert out["every_node_handled_after_s"] >= nodes / budget * reboot, "the budget is the throttle"
    # Waiting costs one refused create per retry (1, 2, 4 ... s, then every resync interval), not more.
    assert out["requests_per_node"] < 30, out
