"""Policy: active findings → desired taints and conditions (a pure function)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from agent.findings import Severity
from agent.kube.hysteresis import Active
from agent.kube.policy import DesiredCondition, DesiredTaint, decide, effect_for, events_for
from agent.kube.hysteresis import Transition
from kube_support import CATALOG, settings


def active(reason: str, severity: str, check: str = "disk", subject: str = "/data") -> Active:
    return Active(check, subject, reason, Severity(severity), "msg", 0.0, check)


@pytest.mark.parametrize(
    ("findings", "overrides", "taints"),
    [
        pytest.param([], {}, [], id="healthy: no taint"),
        pytest.param([active("FakeDiskFull", "critical")], {},
                     [("node-health-agent/disk", "FakeDiskFull", "NoSchedule")], id="critical: NoSchedule"),
        pytest.param([active("FakeDiskSlow", "warning")], {}, [], id="warning: condition only"),
        pytest.param([active("FakeDiskSlow", "warning")], {"disk/FakeDiskSlow": "PreferNoSchedule"},
                     [("node-health-agent/disk", "FakeDiskSlow", "PreferNoSchedule")], id="override check/reason"),
        pytest.param([active("FakeDiskFull", "critical")], {"disk": "none"}, [], id="override check: none"),
        pytest.param([active("FakeGpuLost", "critical", "gpu")], {"*/FakeGpuLost": "NoExecute"},
                     [("node-health-agent/gpu", "FakeGpuLost", "NoExecute")], id="override any check"),
        pytest.param([active("FakeDiskSlow", "warning"), active("FakeDiskFull", "critical", subject="/")], {},
                     [("node-health-agent/disk", "FakeDiskFull", "NoSchedule")], id="one taint per family, worst wins"),
        pytest.param([active("FakeDiskFull", "critical"), active("FakeGpuLost", "critical", "gpu")], {},
                     [("node-health-agent/disk", "FakeDiskFull", "NoSchedule"),
                      ("node-health-agent/gpu", "FakeGpuLost", "NoSchedule")], id="two families, two taints"),
    ],
)
def test_taints(findings: list[Active], overrides: dict[str, str], taints: list[tuple[str, str, str]]) -> None:
    cfg = settings()
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, overrides=MappingProxyType(overrides)))
    got = decide(findings, ["Disk"], cfg, CATALOG)
    assert [(t.key, t.value, t.effect) for t in got.taints] == taints
    assert all(isinstance(t, DesiredTaint) and t.budgeted for t in got.taints)


@pytest.mark.parametrize(
    ("findings", "families", "expected"),
    [
        pytest.param([], ["Disk"], [("NodeHealthDiskProblem", "False", "NoDiskProblem")], id="watched family, healthy"),
        pytest.param([active("FakeDiskSlow", "warning")], ["Disk"],
                     [("NodeHealthDiskProblem", "True", "FakeDiskSlow")], id="warning sets the condition"),
        pytest.param([active("FakeGpuLost", "critical", "gpu")], [],
                     [("NodeHealthGPUProblem", "True", "FakeGpuLost")], id="an active family is always reported"),
        pytest.param([], [], [], id="nothing watched, nothing written"),
    ],
)
def test_conditions(findings: list[Active], families: list[str], expected: list[tuple[str, str, str]]) -> None:
    got = decide(findings, families, settings(), CATALOG)
    assert [(c.type, c.status, c.reason) for c in got.conditions] == expected
    assert all(isinstance(c, DesiredCondition) for c in got.conditions)


def test_condition_message_is_stable_and_bounded() -> None:
    many = [active("FakeDiskFull", "critical", subject=f"/mnt/disk{i:02d}") for i in range(40)]
    a = decide(many, ["Disk"], settings(), CATALOG).conditions[0]
    for x in many:
        x.message = "changed free-text message"
    b = decide(many, ["Disk"], settings(), CATALOG).conditions[0]
    assert a == b and len(a.message) <= 256 and a.message.endswith("more)")


@pytest.mark.parametrize(
    ("check", "reason", "severity", "overrides", "effect"),
    [
        pytest.param("disk", "FakeDiskFull", Severity.CRITICAL, {}, "NoSchedule", id="critical default"),
        pytest.param("disk", "FakeDiskSlow", Severity.WARNING, {}, "none", id="warning default"),
        pytest.param("disk", "FakeDiskFull", Severity.CRITICAL, {"disk": "PreferNoSchedule", "disk/FakeDiskFull": "NoExecute"},
                     "NoExecute", id="check/reason beats check"),
        pytest.param("disk", "FakeDiskFull", Severity.CRITICAL, {"*/FakeDiskFull": "none", "disk": "NoExecute"},
                     "NoExecute", id="check beats */reason"),
        pytest.param("disk", "NotApplicable", Severity.INFO, {}, "none", id="info never taints"),
    ],
)
def test_effect_lookup(check: str, reason: str, severity: Severity, overrides: dict[str, str], effect: str) -> None:
    cfg = dataclasses.replace(settings().policy, overrides=MappingProxyType(overrides))
    assert effect_for(check, reason, severity, cfg) == effect


def test_events_for_transitions() -> None:
    a = active("FakeDiskFull", "critical")
    raised, cleared = events_for([Transition("raised", a), Transition("cleared", a)])
    assert (raised.type, raised.reason, raised.action) == ("Warning", "FakeDiskFull", "Detected")
    assert (cleared.type, cleared.reason, cleared.action) == ("Normal", "FakeDiskFullCleared", "Cleared")
