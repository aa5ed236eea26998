"""node-problem-detector's kernel-monitor rules (its shipped config/kernel-monitor.json,
tests/fixtures/kernel/npd/README.md) converted into fault-table patterns, tried on its
own problem lines with `agent scan-log --patterns`; a bad file refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent import cli
from agent.findings import Severity
from agent.kernel.catalog import OPERATOR_REASON
from agent.kernel.npd import NpdError, patterns
from agent.kernel.patterns import Table, scan_log

NPD = Path(__file__).parent.parent / "fixtures" / "kernel" / "npd"


def test_the_shipped_rules_convert_with_their_grade() -> None:
    converted = patterns((NPD / "kernel-monitor.json").read_bytes())
    assert [p.name for p in converted][:4] == ["npd_oom_killing", "npd_task_hung", "npd_unregister_net_device", "npd_kernel_oops"]
    assert len(converted) == 14 and len({p.name for p in converted}) == 14
    by = {p.name: p for p in converted}
    assert (by["npd_xfs_has_shutdown"].severity, by["npd_xfs_has_shutdown"].hold) == (Severity.CRITICAL, None)
    assert (by["npd_task_hung"].severity, by["npd_task_hung"].action) == (Severity.WARNING, "none")
    assert OPERATOR_REASON not in {p.reason for p in converted}  # each keeps its rule's reason (test_kernel_named_reasons.py)


def test_npd_rules_alone_find_npd_problem_lines() -> None:
    """The converted rules, without the built-in table, flag the lines NPD's own generator writes."""
    table = Table(patterns((NPD / "kernel-monitor.json").read_bytes()))
    found = [(n, p.name) for n, _, p, _ in scan_log((NPD / "problems.log").read_bytes(), table)]
    assert found == [
        (2, "npd_oom_killing"), (3, "npd_unregister_net_device"), (5, "npd_kernel_oops"), (41, "npd_kernel_oops_2"),
        (77, "npd_task_hung"), (96, "npd_task_hung"),
    ]


def test_scan_log_patterns_adds_them_after_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["scan-log", str(NPD / "problems.log"), "--patterns", str(NPD / "kernel-monitor.json"), "--json"])
    events = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(e["line"], e["fault"]) for e in events] == [
        (2, "memcg_oom_kill"), (3, "netdev_unregister_stuck"), (4, "fs_read_only"), (5, "kernel_oops"), (8, "kernel_oops"),
        (41, "kernel_oops"), (77, "hung_task"), (96, "hung_task"),
    ]  # the built-ins catch every line NPD flags (and NPD's readonly line, which its kmsg rules do not)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        pytest.param("{", "expected a JSON kernel-monitor configuration", id="not JSON"),
        pytest.param('{"rules": 3}', "rules: expected a list", id="rules not a list"),
        pytest.param('{"rules": [{"type": "sometimes", "reason": "Xy", "pattern": "x"}]}', 'rules[0].type: expected "temporary"', id="bad type"),
        pytest.param('{"rules": [{"type": "temporary", "reason": "Xy", "pattern": "BUG: ("}]}', "rules[0].pattern: expected a regular expression", id="bad regex"),
    ],
)
def test_a_bad_rules_file_is_refused_in_one_line(tmp_path: Path, body: str, words: str) -> None:
    bad = tmp_path / "km.json"
    bad.write_text(body)
    with pytest.raises(NpdError, match=words.replace("[", r"\[").replace("(", r"\(")):
        patterns(body.encode())
    res = subprocess.run([sys.executable, "-m", "agent", "scan-log", "--patterns", str(bad), str(NPD / "problems.log")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and str(bad) in res.stderr and words in res.stderr
