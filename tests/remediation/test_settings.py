"""[remediation]: defaults are safe, and a bad value is one line naming file, key, value and expectation (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent.config import ConfigError, defaults, parse


def test_defaults_observe_and_enable_nothing():
    r = defaults().remediation
    assert r.mode == "observe" and r.actions == ()
    assert not r.allows("drain") and not r.allows("reboot")
    assert r.reboot.min_uptime == 1800 and r.retire.after_reboots == 2 and r.retire.window == 7 * 86400
    assert r.gpu_reset.allow_mig is False and r.reboot.kured_sentinel == "/var/run/reboot-required"


@pytest.mark.parametrize(
    ("toml", "key", "words"),
    [
        pytest.param('[remediation.reboot]\nmethod = "ipmi"', "remediation.reboot.method", '"systemd", "kured", "command"',
                     id="unknown method"),
        pytest.param('[remediation]\nmode = "on"', "remediation.mode", '"observe", "enforce"', id="unknown mode"),
        pytest.param('[remediation]\nreboot_after = "-5m"', "remediation.reboot_after", "a duration", id="negative duration"),
        pytest.param('[remediation.reboot]\nmin_uptime = -1', "remediation.reboot.min_uptime", "a duration string",
                     id="a number for a duration"),
        pytest.param('[remediation]\nactions = ["drain", "nuke"]', "remediation.actions[1]", '"nuke"', id="unknown action"),
        pytest.param('[remediation.retire]\ncommand = ["/no/such/retire-node"]', "remediation.retire.command",
                     '"/no/such/retire-node" does not exist', id="retire command that does not exist"),
        pytest.param('[remediation.reboot]\nmethod = "command"', "remediation.reboot.command", 'method = "command"',
                     id="command method without a command"),
        pytest.param('[remediation.reboot]\nmethod = "command"\ncommand = ["no-such-reboot-tool"]',
                     "remediation.reboot.command", "not on PATH", id="reboot command not on PATH"),
        pytest.param('[remediation.retire]\nafter_reboots = 0', "remediation.retire.after_reboots", "at least 1",
                     id="retire after zero reboots"),
    ],
)
def test_bad_values_are_one_line(toml, key, words):
    with pytest.raises(ConfigError) as exc:
        parse(toml, "/etc/nha.toml")
    line = str(exc.value)
    assert "\n" not in line and line.startswith(f"/etc/nha.toml: {key}: ") and words in line


def test_agent_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[remediation.retire]\ncommand = ["/no/such/retire-node"]\n')
    p = subprocess.run([sys.executable, "-m", "agent", "run", "--config", str(cfg), "--state-dir", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "remediation.retire.command" in lines[0] and "Traceback" not in p.stderr


def test_a_good_enforce_config_loads(tmp_path):
    cmd = tmp_path / "reboot-node"
    cmd.write_text("#!/bin/sh\n")
    cmd.chmod(0o755)
    r = parse(f'[remediation]\nmode = "enforce"\nactions = ["drain", "reboot"]\n[remediation.reboot]\nmethod = "command"\n'
              f'command = ["{cmd}", "--now"]\n', "x.toml").remediation
    assert r.allows("reboot") and not r.allows("reset_gpu") and r.reboot.command == (str(cmd), "--now")
