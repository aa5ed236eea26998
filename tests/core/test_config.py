from __future__ import annotations

import subprocess
import tomllib
import sys

import pytest

from agent import config, schema


def run_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, timeout=60)


def test_embedded_defaults_equal_schema_defaults() -> None:
    assert config.load(None) == config.defaults()


def test_shipped_config_documents_every_key() -> None:
    """config/agent.toml spells out every key with its default, not just a subset."""
    from pathlib import Path

    shipped = tomllib.loads((Path(__file__).parent.parent.parent / "config" / "agent.toml").read_text())
    assert shipped == schema.plain(config.defaults())


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        pytest.param('[checks.disk]\nintervl = "5s"\n', "checks.disk.intervl", 'did you mean "interval"', id="unknown key"),
        pytest.param('[checks.disk]\ninterval = "5x"\n', "checks.disk.interval", "expected a duration", id="bad duration"),
        pytest.param('[checks.disk]\ninterval = 5\n', "checks.disk.interval", "expected a duration", id="number as duration"),
        pytest.param('[checks.disk]\nenabled = "yes"\n', "checks.disk.enabled", "expected true or false", id="wrong type"),
        pytest.param('[agent]\njitter = 0.9\n', "agent.jitter", "at most 0.5", id="out of range"),
        pytest.param('[agent]\nlog_format = "xml"\n', "agent.log_format", 'one of "auto"', id="bad choice"),
        pytest.param('[metrics]\nlisten = "9904"\n', "metrics.listen", 'expected "host:port"', id="bad listen"),
        pytest.param('[checks.dsk]\n', "checks.dsk", 'did you mean "disk"', id="unknown check"),
        pytest.param('[checks.disk\n', "line 1", "TOML syntax error", id="syntax error"),
    ],
)
def test_bad_config_is_one_line_exit_2(tmp_path, text: str, key: str, expected: str) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    res = run_agent("config", "check", str(path))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert str(path) in lines[0] and key in lines[0] and expected in lines[0]
    assert "Traceback" not in res.stderr


def test_unreadable_file(tmp_path) -> None:
    res = run_agent("config", "check", str(tmp_path / "missing.toml"))
    assert res.returncode == 2 and "cannot read the file" in res.stderr


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), ("1.5s", 1.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert config.parse_duration(text) == seconds


def test_show_round_trips(tmp_path) -> None:
    res = run_agent("config", "show")
    assert res.returncode == 0
    path = tmp_path / "shown.toml"
    path.write_text(res.stdout)
    assert config.load(str(path)).checks == config.defaults().checks
