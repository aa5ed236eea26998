"""Every name a finding's `check` label can carry is one an SRE can type back: `agent selftest --only`
and ``[kubernetes.policy] overrides`` take the check names and the names of the checks' event sources
(``xid``: the gpu check's Xid stream; ``kernel-log``: the kernel check's fault table), and a single pass
reports a source's findings under the same name as the daemon (docs/gpu.md, docs/kernel.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.check import CheckContext
from agent.cli.main import _only_checks
from agent.cli.shared import UsageError
from agent.config import load, parse
from agent.findings import Severity
from agent.hostpaths import HostPaths
from agent.kube.policy import effect_for
from agent.registry import CHECKS, FINDING_SOURCES
from agent.schema import ConfigError


def test_each_source_reports_under_its_check_or_a_declared_name(tmp_path: Path) -> None:
    cfg = load(None)
    ctx = CheckContext(HostPaths(), str(tmp_path), cfg, single_pass=False)
    seen = set()
    for name, spec in CHECKS.items():
        if spec.sources is None:
            continue
        for source in spec.sources(ctx, cfg.checks[name]):
            assert source.name in (name, *spec.finding_sources), f"{name}'s source {source.name} is not declared"
            seen.add(source.name)
    assert {"xid", "kernel-log"} <= seen, "the default config runs both sources"
    assert FINDING_SOURCES == {"xid": "gpu", "kernel-log": "kernel"}


@pytest.mark.parametrize(("names", "checks"), [
    pytest.param(["xid"], ["gpu"], id="xid runs the gpu check"),
    pytest.param(["kernel-log"], ["kernel"], id="kernel-log runs the kernel check"),
    pytest.param(["gpu", "xid", "disk"], ["gpu", "disk"], id="a check named twice runs once"),
    pytest.param(None, None, id="no --only: every enabled check"),
])
def test_selftest_only_takes_the_names_findings_carry(names: list[str] | None, checks: list[str] | None) -> None:
    assert _only_checks(names, CHECKS, FINDING_SOURCES) == checks


def test_selftest_only_refuses_a_name_no_finding_carries() -> None:
    with pytest.raises(UsageError, match='unknown check "xdi" \\(did you mean "xid"\\?\\)'):
        _only_checks(["xdi"], CHECKS, FINDING_SOURCES)


def test_a_policy_override_names_the_xid_stream_as_its_findings_do(tmp_path: Path) -> None:
    """`xid/Xid48` was refused ("unknown check"), while `gpu/Xid48` loaded and never matched an Xid finding."""
    cfg = parse('[kubernetes.policy.overrides]\n"xid/Xid48" = "NoSchedule"\n"kernel-log" = "none"\n', "t.toml")
    policy = cfg.kubernetes.policy
    assert effect_for("xid", "Xid48", Severity.CRITICAL, policy) == "NoSchedule"
    assert effect_for("kernel-log", "KernelHungTask", Severity.CRITICAL, policy) == "none"
    assert effect_for("xid", "Xid79", Severity.CRITICAL, policy) == policy.critical, "other Xids keep the default"
    with pytest.raises(ConfigError, match='unknown check "xidd"'):
        parse('[kubernetes.policy.overrides]\n"xidd/Xid48" = "NoSchedule"\n', "t.toml")
