"""`agent scan-log` on saved kernel logs (dmesg -T, journalctl -k, raw
/dev/kmsg records): kernel faults beside the Xids, redacted Xid addresses as
an unknown GPU, lines a process wrote left out, the exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import cli

FIXTURES = Path(__file__).parent.parent / "fixtures" / "kernel"


def scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, object]], str]:
    code = cli.main(["scan-log", *args, "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def brief(events: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [(e["line"], e["kind"], e.get("fault") or e.get("xid"), e.get("pci", None), e["severity"], e["time"]) for e in events]


def test_dmesg_T_log(capsys: pytest.CaptureFixture[str]) -> None:
    code, events, err = scan(capsys, str(FIXTURES / "dmesg-T.log"))
    assert brief(events) == [
        (3, "kernel", "hung_task", None, "warning", "Tue Nov 25 10:12:44 2026"),
        (6, "xid", 79, "", "critical", "Tue Nov 25 10:13:02 2026"),
        (7, "fallen-off-bus", 79, "", "critical", "Tue Nov 25 10:13:02 2026"),
        (8, "kernel", "memcg_oom_kill", None, "info", "Tue Nov 25 10:14:30 2026"),
        (9, "kernel", "mlx5_fatal", None, "critical", "Tue Nov 25 10:15:00 2026"),
        (10, "kernel", "mlx5_fatal", None, "critical", "Tue Nov 25 10:15:00 2026"),
    ]
    assert (code, err) == (1, "")
    mlx5 = events[4]
    assert (mlx5["reason"], mlx5["action"]) == ("Mlx5Fatal", "reboot")
    assert mlx5["message"] == "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count"


def test_journalctl_k_log(capsys: pytest.CaptureFixture[str]) -> None:
    code, events, _ = scan(capsys, str(FIXTURES / "journalctl-k.log"))
    assert brief(events) == [
        (2, "kernel", "hung_task", None, "warning", "Nov 25 10:12:44"),
        (4, "xid", 48, "", "critical", ""),
        (5, "xid", 79, "", "critical", ""),
        (6, "kernel", "soft_lockup", None, "warning", "Nov 25 10:14:30"),
        (8, "kernel", "hw_error_fatal", None, "critical", "Nov 25 10:15:00"),
    ]
    assert code == 1 and events[1]["reason"] == "Xid48" and events[1]["pid"] == "48211"


def test_raw_kmsg_records_and_lines_a_process_wrote(capsys: pytest.CaptureFixture[str]) -> None:
    code, events, err = scan(capsys, str(FIXTURES / "kmsg.log"))
    assert brief(events) == [
        (3, "kernel", "hung_task", None, "warning", "5.000000"),
        (6, "xid", 79, "", "critical", "5.000300"),
        (7, "kernel", "nvme_failed", None, "critical", "5.000400"),
    ]
    assert code == 1
    assert "1 NVIDIA lines written by processes" in err and "line 5" in err
    assert "1 kernel-fault lines written by processes" in err and "line 4" in err


def test_text_output_names_the_fault_and_the_unknown_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["scan-log", str(FIXTURES / "dmesg-T.log")]) == 1
    out = capsys.readouterr().out
    assert "3: [Tue Nov 25 10:12:44 2026] WARNING kernel fault hung_task (KernelHungTask): INFO: task python3:48211" in out
    assert "(unknown GPU: no address in the line)" in out
    assert out.endswith("6 events, 4 critical\n")


def test_nothing_critical_exits_0_and_config_changes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[ 5.0] INFO: task python3:1 blocked for more than 122 seconds.\n[ 6.0] nvidia-modeset: ERROR: GPU:0: Idling display engine timed out\n")
    code, events, _ = scan(capsys, str(log))
    assert (code, [e["fault"] for e in events]) == (0, ["hung_task"])
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[checks.kernel.patterns.hung_task]\nseverity = "critical"\n'
                   '[checks.kernel.patterns.display_idle]\npattern = "nvidia-modeset: ERROR: GPU:\\\\d+: Idling"\n')
    code, events, _ = scan(capsys, str(log), "--config", str(cfg))
    assert (code, [(e["fault"], e["severity"], e["reason"]) for e in events]) == (
        1, [("hung_task", "critical", "KernelHungTask"), ("display_idle", "warning", "KernelLogPattern")])


def test_a_bad_config_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[checks.kernel.patterns.x]\npattern = "BUG: ("\n')
    assert cli.main(["scan-log", str(FIXTURES / "kmsg.log"), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "checks.kernel.patterns.x.pattern" in err and '"BUG: ("' in err
