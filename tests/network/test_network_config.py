"""[checks.network] through the real loader and `agent config check`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent import config


def config_check(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "agent", "config", "check", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        pytest.param('targets = ["10.0.0.1"]', "checks.network.targets[0]", 'expected "host:port"', id="no port"),
        pytest.param(
            'targets = ["ok:443", "::1:443"]',
            "checks.network.targets[1]",
            'expected "host:port"',
            id="IPv6 without brackets",
        ),
        pytest.param(
            'targets = ["api:99999"]', "checks.network.targets[0]", 'expected "host:port"', id="port out of range"
        ),
        pytest.param('targets = [":443"]', "checks.network.targets[0]", "with a host name", id="no host"),
        pytest.param('targets = "10.0.0.1:443"', "checks.network.targets", "expected a list", id="string, not a list"),
        pytest.param(
            'interfaces = ["eth0:1"]',
            "checks.network.interfaces[0]",
            "expected an interface name",
            id="alias as interface",
        ),
        pytest.param(
            'interfaces = ["a-name-longer-than-15"]',
            "checks.network.interfaces[0]",
            "1-15 bytes",
            id="interface name too long",
        ),
        pytest.param(
            'connect_timeout = "10s"',
            "checks.network.connect_timeout",
            "at most timeout minus 1s",
            id="connect timeout not below check timeout",
        ),
        pytest.param(
            "error_rate_warning = -1", "checks.network.error_rate_warning", "at least 0", id="negative threshold"
        ),
        pytest.param(
            "flap_threshold = 1.5", "checks.network.flap_threshold", "an integer", id="fractional flap threshold"
        ),
        pytest.param(
            'conect_timeout = "1s"',
            "checks.network.conect_timeout",
            'did you mean "connect_timeout"',
            id="misspelt key",
        ),
    ],
)
def test_bad_network_config_is_one_line_exit_2(tmp_path: Path, text: str, key: str, expected: str) -> None:
    res = config_check(tmp_path, f"[checks.network]\n{text}\n")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert str(tmp_path / "agent.toml") in lines[0] and key in lines[0] and expected in lines[0]
    assert "Traceback" not in res.stderr


def test_good_network_config_loads(tmp_path: Path) -> None:
    res = config_check(
        tmp_path,
        '[checks.network]\ninterfaces = ["eth0", "ib0"]\ntargets = ["10.96.0.1:443", "[::1]:9904", "api.example.com:6443"]\n'
        'timeout = "5s"\nconnect_timeout = "4s"\nconnect_interval = "0s"\n',
    )
    assert res.returncode == 0, res.stderr
    cfg = config.load(str(tmp_path / "agent.toml")).check("network")
    assert cfg.targets == ("10.96.0.1:443", "[::1]:9904", "api.example.com:6443")
    assert (cfg.timeout, cfg.connect_timeout, cfg.connect_interval) == (5.0, 4.0, 0.0)
