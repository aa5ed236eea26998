"""The shipped systemd unit: it parses, and it allows what the agent needs."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

from conftest import require_tool

UNIT = Path(__file__).parent.parent / "systemd" / "node-health-agent.service"


def _service() -> dict[str, str]:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return dict(parser["Service"])


def test_unit_has_the_contract_the_daemon_implements() -> None:
    svc = _service()
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main"
    assert svc["WatchdogSec"] and svc["Restart"] == "on-failure"
    assert svc["RestartPreventExitStatus"] == "2", "a bad config (exit 2) is not restarted in a loop"
    assert "--config /etc/node-health-agent/agent.toml" in svc["ExecStart"]
    assert "kill -HUP" in svc["ExecReload"]
    caps = svc["CapabilityBoundingSet"].split()
    assert {"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYSLOG"} <= set(caps)
    assert svc["StateDirectory"] == "node-health-agent"  # /var/lib/node-health-agent, the default state dir
    assert "ProtectKernelLogs" not in svc, "it would hide /dev/kmsg"
    assert svc.get("ProtectSystem") != "strict", "it would make / read-only for the disk check's write probe"


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    require_tool("systemd-analyze")
    agent = shutil.which("agent")
    assert agent, "the agent console script is installed"
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/node-health-agent/bin/agent", agent))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in res.stderr.splitlines() if UNIT.name in line]
    assert res.returncode == 0 and not problems, res.stderr
