"""Operator-named patterns: ``[checks.kernel.patterns.<name>] reason = "..."`` names the
finding's reason (and so the node condition's reason and the taint's value), validated as
the built-ins are; the named reason reaches the catalog the daemon, selftest, scan-log and
the kube policy read, and node-problem-detector's rules keep their own reasons."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import cli
from agent.catalog import Catalog, Reason
from agent.config import ConfigError, load, parse
from agent.findings import Severity
from agent.kernel.catalog import CATALOG as KERNEL_CATALOG
from agent.kernel.catalog import OPERATOR_REASON
from agent.kernel.faults import FaultTracker
from agent.kernel.npd import patterns, to_toml
from agent.kernel.patterns import Table, build, scan_log
from agent.registry import CATALOG, catalog_for, configured_reasons

NPD = Path(__file__).parent.parent / "fixtures" / "kernel" / "npd"
GSP = b"NVRM: GPU3 GSP RPC timeout"
GSP_PATTERN = r"NVRM: GPU\d+ GSP RPC timeout"


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(body)
    return path


def test_a_named_reason_is_the_findings_reason_with_its_severity_and_action() -> None:
    table = build([("gsp_timeout", {"pattern": GSP_PATTERN, "reason": "GspRpcTimeout", "severity": Severity.CRITICAL,
                                    "action": "reboot", "hold": None}),
                   ("hung_task", {"reason": "TaskHung"})])
    tracker = FaultTracker(table, clock=lambda: 2.0)
    tracker.add(table.by_name["gsp_timeout"], GSP, 1.0)
    tracker.add(table.by_name["hung_task"], b"INFO: task x:1 blocked for more than 120 seconds.", 1.0)
    by = {f.subject: f for f in tracker.findings()}
    gsp = by["gsp_timeout"]
    assert (gsp.reason, gsp.severity, gsp.action, gsp.unknown) == ("GspRpcTimeout", Severity.CRITICAL, "reboot", False)
    assert by["hung_task"].reason == "TaskHung" and by["hung_task"].severity == Severity.WARNING  # the built-in's grade
    entry = table.catalog.reason("GspRpcTimeout")
    assert (entry.family, entry.severity, entry.action) == ("Kernel", Severity.CRITICAL, "reboot")
    assert "GspRpcTimeout" not in KERNEL_CATALOG.reasons  # the static catalog is unchanged


def test_an_unnamed_pattern_keeps_kernel_log_pattern_and_a_builtin_reason_may_be_named_again() -> None:
    table = build([("plain", {"pattern": GSP_PATTERN}),
                   ("old_oom", {"pattern": r"oom-killer: gfp_mask=", "reason": "KernelOomKill"})])
    assert table.by_name["plain"].reason == OPERATOR_REASON
    assert table.by_name["old_oom"].reason == "KernelOomKill"
    assert table.catalog is KERNEL_CATALOG  # nothing new to declare


def test_patterns_sharing_a_reason_declare_it_once_with_the_worst_severity(tmp_path: Path) -> None:
    cfg = load(str(_config(tmp_path, f"""
[checks.kernel.patterns.gsp_a]
pattern = '{GSP_PATTERN}'
reason = "GspRpcTimeout"
[checks.kernel.patterns.gsp_b]
pattern = 'NVRM: GPU\\d+ GSP RPC hang'
reason = "GspRpcTimeout"
severity = "critical"
action = "reboot"
""")))
    [(check, key, reason)] = configured_reasons(cfg.checks)
    assert (check, key, reason.name, reason.severity, reason.action) == (
        "kernel", "patterns.gsp_a.reason", "GspRpcTimeout", Severity.CRITICAL, "reboot")


@pytest.mark.parametrize(
    ("reason", "key", "words"),
    [
        pytest.param("gsp_timeout", "checks.kernel.patterns.x.reason", ['"gsp_timeout"', "CamelCase"], id="not CamelCase"),
        pytest.param("G" * 65, "checks.kernel.patterns.x.reason", ["64 characters"], id="too long"),
        pytest.param("Gsp Timeout", "checks.kernel.patterns.x.reason", ['"Gsp Timeout"'], id="a space"),
        pytest.param("KernelLogUnavailable", "checks.kernel.patterns.x.reason", ['"KernelLogUnavailable"', "of its own"],
                     id="the kernel check's own status reason"),
        pytest.param("KernelOOPS", "checks.kernel.patterns.x.reason", ['"KernelOops"'], id="a built-in's in another case"),
        pytest.param("DiskReadOnly", "checks.kernel.patterns.x.reason", ['"DiskReadOnly"', "of its own"], id="another feature's reason"),
        pytest.param("XID119", "checks.kernel.patterns.x.reason", ['"Xid119"'], id="another feature's in another case"),
    ],
)
def test_a_bad_reason_is_refused_naming_file_key_and_value(tmp_path: Path, reason: str, key: str, words: list[str]) -> None:
    path = _config(tmp_path, f'[checks.kernel.patterns.x]\npattern = "{GSP_PATTERN.replace(chr(92), chr(92) * 2)}"\nreason = "{reason}"\n')
    with pytest.raises(ConfigError) as info:
        load(str(path))
    assert info.value.key == key and all(w in info.value.message for w in words), str(info.value)
    if "of its own" in words:  # the command line: one line, exit 2
        res = subprocess.run([sys.executable, "-m", "agent", "config", "check", str(path)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and str(path) in res.stderr and key in res.stderr, res.stderr


def test_the_taint_policy_may_name_an_operators_reason_and_not_an_unknown_one() -> None:
    named = f"""
[kubernetes.policy.overrides]
"*/GspRpcTimeout" = "NoExecute"
[checks.kernel.patterns.gsp]
pattern = '{GSP_PATTERN}'
reason = "GspRpcTimeout"
"""
    assert parse(named, "a.toml").kubernetes.policy.overrides["*/GspRpcTimeout"] == "NoExecute"
    with pytest.raises(ConfigError) as info:
        parse(named.replace('reason = "GspRpcTimeout"\n', ""), "a.toml")
    assert info.value.key == "kubernetes.policy.overrides.*/GspRpcTimeout"


def test_the_daemons_catalog_declares_the_named_reasons_and_a_reload_adds_without_forgetting() -> None:
    cfg = parse(f'[checks.kernel.patterns.gsp]\npattern = \'{GSP_PATTERN}\'\nreason = "GspRpcTimeout"\n', "a.toml")
    catalog = catalog_for(cfg.checks)
    assert catalog.reason("GspRpcTimeout").family == "Kernel" and "GspRpcTimeout" not in CATALOG.reasons
    assert len(catalog.reasons) == len(CATALOG.reasons) + 1 and "GspRpcTimeout" in list(catalog.reasons)
    catalog.configure([Reason("GspHang", Severity.WARNING, "x", family="Kernel")])
    assert "GspHang" in catalog.reasons
    assert "GspRpcTimeout" in catalog.reasons  # still active findings of it clear as Kernel findings
    catalog.configure([Reason("KernelOops", Severity.INFO, "x")])  # a declared reason is never replaced
    assert catalog.reason("KernelOops").severity == Severity.CRITICAL
    with pytest.raises(ValueError, match="configurable"):
        Catalog.declare().configure([])


def test_scan_log_with_the_config_prints_the_named_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, f"""
[checks.kernel.patterns.gsp]
pattern = '{GSP_PATTERN}'
reason = "GspRpcTimeout"
severity = "critical"
action = "reboot"
hold = "boot"
""")
    log = tmp_path / "dmesg.log"
    log.write_bytes(b"[  12.000000] " + GSP + b"\n")
    code = cli.main(["scan-log", str(log), "--config", str(cfg), "--json"])
    [event] = json.loads(capsys.readouterr().out)
    assert code == 1  # critical
    assert (event["fault"], event["reason"], event["severity"], event["action"]) == ("gsp", "GspRpcTimeout", "critical", "reboot")


def test_selftest_reports_the_named_reason_from_the_kernel_log(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(f"3,1,{int(time.monotonic() * 1e6)},-;".encode() + GSP + b"\n")  # this boot, a moment ago
    cfg = _config(tmp_path, f"""
[checks.kernel]
kmsg_path = "{kmsg}"
edac = false
[checks.kernel.patterns.gsp]
pattern = '{GSP_PATTERN}'
reason = "GspRpcTimeout"
""")
    res = subprocess.run([sys.executable, "-m", "agent", "selftest", "--json", "--only", "kernel", "--config", str(cfg),
                          "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in res.stderr, res.stderr
    found = json.loads(res.stdout)["findings"]
    assert [(f["subject"], f["reason"], f["severity"]) for f in found if f["subject"] == "gsp"] == [("gsp", "GspRpcTimeout", "warning")]


def test_npd_rules_keep_their_own_reasons() -> None:
    converted = patterns((NPD / "kernel-monitor.json").read_bytes())
    by = {p.name: p.reason for p in converted}
    assert (by["npd_oom_killing"], by["npd_task_hung"], by["npd_kernel_oops"]) == ("OOMKilling", "TaskHung", "KernelOops")
    table = Table(converted)
    found = {(p.name, p.reason) for _, _, p, _ in scan_log((NPD / "problems.log").read_bytes(), table)}
    assert ("npd_task_hung", "TaskHung") in found and ("npd_oom_killing", "OOMKilling") in found


def test_npd_rules_as_toml_load_into_the_config_and_find_what_the_rules_find(tmp_path: Path) -> None:
    rules = (NPD / "kernel-monitor.json").read_bytes()
    text = to_toml(rules)
    cfg = load(str(_config(tmp_path, "[checks.kernel]\n" + text)))
    table = cfg.checks["kernel"].table()
    log = (NPD / "problems.log").read_bytes()
    direct = [(n, p.name, p.reason, p.severity) for n, _, p, _ in scan_log(log, Table(patterns(rules)))]
    pasted = [(n, p.name, p.reason, p.severity) for n, _, p, _ in scan_log(log, Table(table.patterns[-len(patterns(rules)):]))]
    assert direct == pasted and direct
    assert {r.name for _, _, r in configured_reasons(cfg.checks)} >= {"OOMKilling", "TaskHung", "XfsHasShutdown"}


def test_scan_log_to_toml_prints_the_converted_rules_and_needs_patterns(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["scan-log", "--patterns", str(NPD / "kernel-monitor.json"), "--to-toml"]) == 0
    out = capsys.readouterr().out
    assert "[checks.kernel.patterns.npd_task_hung]" in out and "reason = 'TaskHung'" in out
    res = subprocess.run([sys.executable, "-m", "agent", "scan-log", "--to-toml"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--patterns" in res.stderr and "Traceback" not in res.stderr


def test_an_npd_rule_with_a_reason_the_agent_cannot_take_is_refused_naming_it() -> None:
    from agent.kernel.npd import NpdError

    bad = json.dumps({"rules": [{"type": "temporary", "reason": "task_hung", "pattern": "task hung"}]}).encode()
    with pytest.raises(NpdError, match=r"rules\[0\]\.reason: expected a CamelCase reason"):
        patterns(bad)


def test_the_ladder_acts_on_a_named_pattern_only_when_its_action_says_so() -> None:
    from agent.remediation.faults import faults

    table = build([("gsp_reboot", {"pattern": GSP_PATTERN, "reason": "GspRpcTimeout", "action": "reboot", "hold": None}),
                   ("gsp_watch", {"pattern": r"NVRM: GPU\d+ GSP RPC hang", "reason": "GspRpcHang", "hold": None})])
    tracker = FaultTracker(table, clock=lambda: 2.0)
    tracker.add(table.by_name["gsp_reboot"], GSP, 1.0)
    tracker.add(table.by_name["gsp_watch"], b"NVRM: GPU1 GSP RPC hang", 1.0)
    assert [(f.key, f.action) for f in faults(tracker.findings(), [])] == [("kernel-log/gsp_reboot/GspRpcTimeout", "reboot")]
