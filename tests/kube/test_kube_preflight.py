"""The preflight gate: the burn's Preflight findings hold the node with `<prefix>preflight`
until the burn passed, at once, outside the taint budget; with the burn off, a
kubelet-registered preflight taint is left alone."""

from __future__ import annotations

from typing import Any

import pytest

from agent.kube.settings import HysteresisSection
from fakeapi import FakeApiServer
from kube_support import (
    NODE, PREFIX, BUDGET_NS, QUOTA, Clock, fake, finding, make_reconciler, our_taints, settings, snapshot,  # noqa: F401
)

PREFLIGHT = PREFIX + "preflight"
BURN_REASONS = ("PreflightPending", "PreflightFailed")
# Slow hysteresis everywhere: the gate must not wait for it.
SLOW = HysteresisSection(raise_cycles=5, raise_after=600, clear_cycles=5, clear_after=600)


def burn(findings: list[Any], runs: int) -> Any:
    return snapshot(findings, runs=runs, check="burn", known=BURN_REASONS)


def test_pending_taints_at_once_and_pass_releases_at_once(fake: FakeApiServer, tmp_path: Any) -> None:
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock)
    rec.step(clock(), burn([finding("PreflightPending", "node", "burn")], runs=1))
    assert our_taints(fake) == [(PREFLIGHT, "PreflightPending", "NoSchedule")]
    clock.t += 60
    rec.step(clock(), burn([finding("PreflightFailed", "gpu1", "burn")], runs=2))
    assert our_taints(fake) == [(PREFLIGHT, "PreflightFailed", "NoSchedule")]
    clock.t += 60
    rec.step(clock(), burn([], runs=3))  # a later boot passed: released on the first clean run
    assert our_taints(fake) == []
    assert fake.objects("coordination.k8s.io", "leases") == [], "the gate never takes a budget slot"


def test_a_kubelet_registered_preflight_taint_is_removed_when_the_burn_passes(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.edit_node(NODE, lambda n: n["spec"].setdefault("taints", []).append({"key": PREFLIGHT, "effect": "NoSchedule"}))
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(), clock=clock)
    rec.step(clock(), burn([finding("PreflightPending", "node", "burn")], runs=1))
    assert [t for t in our_taints(fake) if t[0] == PREFLIGHT], "held while pending"
    rec.step(clock(), burn([], runs=2))
    assert our_taints(fake) == []


def test_the_gate_is_applied_even_with_no_budget_left(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.set_quota(BUDGET_NS, QUOTA, 0)
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(), clock=clock)
    rec.step(clock(), burn([finding("PreflightPending", "node", "burn")], runs=1))
    assert our_taints(fake) == [(PREFLIGHT, "PreflightPending", "NoSchedule")]


@pytest.mark.parametrize("registered", [True, False], ids=["registered by the kubelet", "absent"])
def test_with_the_burn_off_the_preflight_taint_is_left_alone(fake: FakeApiServer, tmp_path: Any, registered: bool) -> None:
    if registered:
        fake.edit_node(NODE, lambda n: n["spec"].setdefault("taints", []).append({"key": PREFLIGHT, "effect": "NoSchedule"}))
    before = our_taints(fake)
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(), clock=clock)
    rec.step(clock(), snapshot([], runs=1, check="disk", known=("DiskFull",)))  # no check watches Preflight
    assert our_taints(fake) == before
    assert not [r for r in fake.writes() if r.path == f"/api/v1/nodes/{NODE}"], "no taint write at all"


def test_a_burn_that_cannot_run_opens_the_gate_and_stays_visible(fake: FakeApiServer, tmp_path: Any) -> None:
    """No backend (no cuda-bindings, no dcgmi): nothing is known of the GPUs, so the node is not held for it."""
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), settings(hysteresis=SLOW), clock=clock)
    rec.step(clock(), burn([finding("PreflightPending", "preflight", "burn")], runs=1))
    assert our_taints(fake) == [(PREFLIGHT, "PreflightPending", "NoSchedule")]
    rec.step(clock(), burn([finding("BurnUnavailable", "backend", "burn")], runs=2))
    assert our_taints(fake) == []
