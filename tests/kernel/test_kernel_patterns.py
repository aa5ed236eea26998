"""The kernel-fault table: every pattern on real kernel lines, near misses
that must match nothing, the operator's changes, and bad patterns refused in
one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import load
from agent.findings import ACTIONS, Severity
from agent.kernel.catalog import OPERATOR_REASON, PATTERNS
from agent.kernel.patterns import DEFAULT, build, facility_of, message_of
from agent.registry import CATALOG
from agent.schema import ConfigError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kernel" / "patterns.txt"


def _lines() -> list[tuple[str, str]]:
    out = []
    for line in FIXTURE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, message = line.split(" ", 1)
            out.append((name, message))
    return out


LINES = _lines()


@pytest.mark.parametrize(("expected", "message"), LINES, ids=[f"{n}: {m[:60]}" for n, m in LINES])
def test_each_fixture_line_matches_its_pattern_or_none(expected: str, message: str) -> None:
    found = DEFAULT.match(message.encode())
    assert (found.name if found else "-") == expected


def test_every_builtin_pattern_has_real_lines_in_the_fixture() -> None:
    covered = {name for name, _ in LINES}
    assert {p.name for p in PATTERNS} <= covered
    assert "-" in covered


def test_one_scan_of_many_messages_equals_one_at_a_time() -> None:
    messages = [m.encode() for _, m in LINES] * 3
    assert [(x.index, x.pattern.name) for x in DEFAULT.scan(messages)] == [
        (i, p.name) for i, m in enumerate(messages) if (p := DEFAULT.match(m)) is not None
    ]


def test_every_pattern_declares_a_reason_of_the_catalog_with_its_severity() -> None:
    for p in PATTERNS:
        reason = CATALOG.reason(p.reason)
        assert (reason.severity, reason.family, reason.action) == (p.severity, "Kernel", p.action), p.name
        assert p.action in ACTIONS
    assert len({p.name for p in PATTERNS}) == len(PATTERNS)


@pytest.mark.parametrize(
    ("line", "message", "facility"),
    [
        pytest.param(b"4,1234,5678,-;INFO: task x:1 blocked for more than 1 seconds.", b"INFO: task x:1 blocked for more than 1 seconds.", 0, id="kmsg record"),
        pytest.param(b"12,1234,5678,-;BUG: soft lockup - CPU#1 stuck for 1s!", b"BUG: soft lockup - CPU#1 stuck for 1s!", 1, id="kmsg record a process wrote"),
        pytest.param(b"[  123.456789] Oops: 0000 [#1] SMP", b"Oops: 0000 [#1] SMP", None, id="dmesg"),
        pytest.param(b"[Tue Nov 25 10:00:01 2026] Oops: 0000 [#1] SMP", b"Oops: 0000 [#1] SMP", None, id="dmesg -T"),
        pytest.param(b"Nov 25 10:00:01 gpu-node-17 kernel: Oops: 0000 [#1] SMP", b"Oops: 0000 [#1] SMP", None, id="journalctl -k"),
        pytest.param(b"Nov  5 10:00:01 gpu-node-17 kernel: [ 12.5] Oops: 0000", b"Oops: 0000", None, id="syslog with dmesg time"),
        pytest.param(b"2026-11-25T10:00:01+0000 gpu-node-17 kernel: Oops: 0000", b"Oops: 0000", None, id="journalctl -o short-iso"),
        pytest.param(b"kern  :emerg : [  5.1] Oops: 0000", b"Oops: 0000", None, id="dmesg -x"),
        pytest.param(b"<4>Oops: 0000", b"Oops: 0000", 0, id="printk level"),
        pytest.param(b"<14>Oops: 0000", b"Oops: 0000", 1, id="dmesg -r of a process's line"),
        pytest.param(b"python3[77]: Oops: 0000", b"python3[77]: Oops: 0000", None, id="a program's own line stays whole"),
    ],
)
def test_message_and_facility_of_a_saved_line(line: bytes, message: bytes, facility: int | None) -> None:
    assert (message_of(line), facility_of(line)) == (message, facility)


def test_operator_changes_disables_and_adds_patterns() -> None:
    table = build(
        [("hung_task", {"severity": Severity.CRITICAL, "threshold": 3}),
         ("gsp_timeout", {"pattern": r"NVRM: GPU\d+ GSP RPC timeout", "hold": None})],
        disabled=["memcg_oom_kill"],
    )
    assert table.by_name["hung_task"].severity == Severity.CRITICAL and table.by_name["hung_task"].threshold == 3
    assert table.by_name["hung_task"].pattern == DEFAULT.by_name["hung_task"].pattern
    assert "memcg_oom_kill" not in table.by_name
    assert table.match(b"Memory cgroup out of memory: Killed process 1 (x) total-vm:1kB") is None
    added = table.match(b"NVRM: GPU3 GSP RPC timeout")
    assert added is not None and (added.name, added.reason, added.severity, added.action, added.hold) == (
        "gsp_timeout", OPERATOR_REASON, Severity.WARNING, "none", None)
    assert table.patterns[-1].name == "gsp_timeout"  # after the built-in ones: they win a message both match


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(body)
    return path


def test_config_patterns_reach_the_table(tmp_path: Path) -> None:
    cfg = load(str(_config(tmp_path, """
[checks.kernel]
disable = ["kernel_bug"]
[checks.kernel.patterns.hung_task]
severity = "critical"
action = "reboot"
window = "30m"
[checks.kernel.patterns.bridge_port]
pattern = 'br\\d+: port \\d+\\(\\S+\\) entered disabled state'
threshold = 2
hold = "boot"
""")))
    table = cfg.checks["kernel"].table()
    assert (table.by_name["hung_task"].action, table.by_name["hung_task"].window) == ("reboot", 1800.0)
    assert table.match(b"BUG: scheduling while atomic: x/0/0x2") is None
    p = table.match(b"br0: port 1(veth1) entered disabled state")
    assert p is not None and (p.threshold, p.hold) == (2, None)


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        pytest.param('[checks.kernel.patterns.x]\npattern = "BUG: ("\n', "checks.kernel.patterns.x.pattern", ['"BUG: ("', "expected a regular expression"], id="bad regex"),
        pytest.param('[checks.kernel.patterns.x]\npattern = "(?P<n>a)"\n', "checks.kernel.patterns.x.pattern", ["named groups"], id="named group"),
        pytest.param('[checks.kernel.patterns.x]\npattern = "a*"\n', "checks.kernel.patterns.x.pattern", ["empty message"], id="matches everything"),
        pytest.param('[checks.kernel.patterns.x]\nseverity = "warning"\n', "checks.kernel.patterns.x.pattern", ["not a built-in pattern"], id="new pattern without one"),
        pytest.param('[checks.kernel.patterns.Bad-Name]\npattern = "x"\n', "checks.kernel.patterns.Bad-Name", ['"Bad-Name"'], id="bad name"),
        pytest.param('[checks.kernel.patterns.hung_task]\nseverity = "fatal"\n', "checks.kernel.patterns.hung_task.severity", ['"fatal"'], id="bad severity"),
        pytest.param('[checks.kernel.patterns.hung_task]\naction = "reimage"\n', "checks.kernel.patterns.hung_task.action", ['"reimage"'], id="bad action"),
        pytest.param('[checks.kernel.patterns.hung_task]\nhold = "forever"\n', "checks.kernel.patterns.hung_task.hold", ['"forever"'], id="bad hold"),
        pytest.param('[checks.kernel]\ndisable = ["hung_tasks"]\n', "checks.kernel.disable[0]", ['"hung_tasks"'], id="unknown built-in"),
    ],
)
def test_bad_patterns_are_refused_naming_file_key_and_value(tmp_path: Path, body: str, key: str, words: list[str]) -> None:
    path = _config(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load(str(path))
    assert info.value.key == key and all(w in info.value.message for w in words), str(info.value)
    res = subprocess.run([sys.executable, "-m", "agent", "config", "check", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and str(path) in res.stderr and key in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


OLD_OOMS = [
    b"Memory cgroup out of memory: Kill process 2468 (python) score 1994 or sacrifice child",
    b"Killed process 2468 (python) total-vm:2345678kB, anon-rss:1048576kB, file-rss:1234kB, shmem-rss:0kB",
    b"Out of memory: Kill process 4321 (python3) score 912 or sacrifice child",
    b"Killed process 4321 (python3) total-vm:98765432kB, anon-rss:87654321kB, file-rss:0kB, shmem-rss:0kB",
    b"Memory cgroup out of memory: Kill process 77 (java) score 1000 or sacrifice child",
    b"IPv6: ADDRCONF(NETDEV_CHANGE): veth1: link becomes ready",
    b"Killed process 77 (java) total-vm:1000kB, anon-rss:900kB, file-rss:0kB, shmem-rss:0kB",
    b"Memory cgroup out of memory: Kill process 78 (java) score 1000 or sacrifice child",
    b"INFO: task python3:12345 blocked for more than 122 seconds.",
    b"Killed process 78 (java) total-vm:1000kB, anon-rss:900kB, file-rss:0kB, shmem-rss:0kB",
]
OLD_OOM_VERDICTS = [(1, "memcg_oom_kill"), (3, "oom_kill"), (6, "memcg_oom_kill"), (8, "hung_task"), (9, "oom_kill")]


def test_pre_5_kernels_bare_killed_process_is_classed_by_the_line_announcing_it() -> None:
    """Kernels before 5.1: "Memory cgroup out of memory: Kill process ... or sacrifice child" then a bare
    "Killed process ...": a cgroup's kill, not the node's. A line that matches nothing between them keeps
    the announcement; another fault ends it. The follower's path (the screen's entries in one native pass,
    `confirm_screened`), one batch or one record at a time, says the same."""
    from agent.kernel.source import faults
    from agent.kmsg import RecordBatch

    table = build()
    assert [(m.index, m.pattern.name) for m in table.scan(OLD_OOMS)] == OLD_OOM_VERDICTS
    assert table.scan_regex_only(OLD_OOMS) == table.scan(OLD_OOMS)
    one_by_one = [(i, m.pattern.name) for i, msg in enumerate(OLD_OOMS) for m in table.scan([msg])]
    assert one_by_one == OLD_OOM_VERDICTS
    text = b"\n".join(b"4,%d,%d,-;" % (10 + i, 1000 * i) + m for i, m in enumerate(OLD_OOMS))
    batch = RecordBatch(table.screen, text)
    assert batch.sequential and table.screened_only
    mine, _ = faults(table, batch)
    assert [(r.seq - 10, p.name) for r, _, p in mine] == OLD_OOM_VERDICTS


# Each format a saved kernel log comes in, as a template of one line around the message.
FORMATS = {
    "kmsg record": "6,{n},{n}000,-;{m}",
    "dmesg": "[   66.{n:06d}] {m}",
    "dmesg -t": "{m}",
    "dmesg -T": "[Sat Nov 28 10:00:{s:02d} 2026] {m}",
    "dmesg, CONFIG_PRINTK_CALLER": "[   66.{n:06d}][  T{n}] {m}",
    "dmesg -x": "kern  :err   : [   66.{n:06d}] {m}",
    "dmesg -r": "<3>[   66.{n:06d}] {m}",
    "dmesg --time-format iso": "2026-11-28T10:00:{s:02d},123456+00:00 {m}",
    "kern.log / syslog": "Nov 28 10:00:{s:02d} gpu-node-17 kernel: [   66.{n:06d}] {m}",
    "rsyslog RFC 3339": "2026-11-28T10:00:{s:02d}.123456+00:00 gpu-node-17 kernel: [   66.{n:06d}] {m}",
    "journalctl -k": "Nov  8 10:00:{s:02d} gpu-node-17 kernel: {m}",
    "journalctl -o short-iso": "2026-11-28T10:00:{s:02d}+0000 gpu-node-17 kernel: {m}",
    "journalctl -o short-precise": "Nov 28 10:00:{s:02d}.123456 gpu-node-17 kernel: {m}",
    "journalctl -o short-monotonic": "[   66.{n:06d}] gpu-node-17 kernel: {m}",
    "journalctl -o short-full": "Sat 2026-11-28 10:00:{s:02d} UTC gpu-node-17 kernel: {m}",
}


@pytest.mark.parametrize("form", FORMATS)
def test_every_fixture_line_matches_the_same_in_every_saved_log_format(form: str) -> None:
    """`agent scan-log` reads kmsg records, dmesg and journal text: each pattern's real lines
    (and each near miss) give the same verdict in every format, a whole log at a time."""
    from agent.kernel.patterns import scan_log

    text = "\n".join(FORMATS[form].format(n=i + 1, s=i % 60, m=m) for i, (_, m) in enumerate(LINES))
    table = build()
    found = [(n, p.name, msg.decode()) for n, _, p, msg in scan_log(text.encode(), table)]
    assert found == [(i + 1, name, m) for i, (name, m) in enumerate(LINES) if name != "-"]
    assert {p.name for p in PATTERNS} <= {name for _, name, _ in found}
