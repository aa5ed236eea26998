"""[checks.infiniband] through `agent config check`: a bad value is one line naming the key, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        pytest.param('include = ["mlx5_0/1/2"]', "checks.infiniband.include[0]", 'or "device/port"', id="too many slashes"),
        pytest.param('counters_exclude = [""]', "checks.infiniband.counters_exclude[0]", "expected a device glob", id="empty glob"),
        pytest.param('hw_counters = ["../counters/link_downed"]', "checks.infiniband.hw_counters[0]", "expected a counter file name", id="a path, not a name"),
        pytest.param("expected_ports = -1", "checks.infiniband.expected_ports", "at least 0", id="negative count"),
        pytest.param('flap_window = "10s"', "checks.infiniband.flap_window", 'at least "1m"', id="window too short"),
        pytest.param('drop_after = 240', "checks.infiniband.drop_after", "a duration", id="number, not a duration"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(tmp_path: Path, text: str, key: str, expected: str) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(f"[checks.infiniband]\n{text}\n")
    res = subprocess.run([sys.executable, "-m", "agent", "config", "check", str(path)],
                         check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"agent: {path}: {key}: ") and expected in line, line
