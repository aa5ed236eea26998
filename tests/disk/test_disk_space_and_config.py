"""Free space and inodes counted as df counts them, the thresholds, the write
probe's file hygiene, and the disk check's config rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import config
from agent.disk import probes as disk_probes
from agent.disk.probes import Usage, blocks, inodes, level, shown_percent


def statvfs(*, blocks: int, bfree: int, bavail: int, files: int, ffree: int, frsize: int = 4096) -> os.statvfs_result:
    return os.statvfs_result((frsize, frsize, blocks, bfree, bavail, files, ffree, ffree, 0, 255))


@pytest.mark.parametrize(
    ("st", "expected"),
    [
        pytest.param(statvfs(blocks=1000, bfree=500, bavail=500, files=10, ffree=10), None, id="half free"),
        pytest.param(statvfs(blocks=1000, bfree=80, bavail=80, files=10, ffree=10), "warning", id="8% free"),
        pytest.param(statvfs(blocks=1000, bfree=40, bavail=40, files=10, ffree=10), "critical", id="4% free"),
        # ext4 keeps 5% for root: 60 blocks free but only 10 available to users is 1% free, as df shows it.
        pytest.param(statvfs(blocks=1000, bfree=60, bavail=10, files=10, ffree=10), "critical", id="free only for root"),
        pytest.param(statvfs(blocks=0, bfree=0, bavail=0, files=0, ffree=0), None, id="no block accounting"),
    ],
)
def test_space_levels(st: os.statvfs_result, expected: str | None) -> None:
    assert level(blocks(st), warning=10, critical=5) == expected


@pytest.mark.parametrize(
    ("files", "ffree", "expected"),
    [
        pytest.param(0, 0, None, id="btrfs: no inode table, not exhausted"),
        pytest.param(1000, 3, "critical", id="inodes nearly gone"),
        pytest.param(1000, 70, "warning", id="inodes low"),
        pytest.param(1000, 900, None, id="inodes plenty"),
    ],
)
def test_inode_levels(files: int, ffree: int, expected: str | None) -> None:
    st = statvfs(blocks=10, bfree=10, bavail=10, files=files, ffree=ffree)
    assert level(inodes(st), warning=10, critical=5) == expected
    assert inodes(st).accounted == (files > 0)  # shown as "no inode accounting", not "0% used"


def test_percent_matches_df() -> None:
    # df: Use% = ceil(used / (used + avail)); 1000 blocks, 600 free, 550 for users.
    u = Usage(total=1000, free=600, available=550)
    assert shown_percent(u) == "43%"
    assert u.free_percent == pytest.approx(100 * 550 / 950)


def test_thresholds_at_zero_never_fire() -> None:
    assert level(Usage(100, 0, 0), warning=0, critical=0) is None


@pytest.mark.parametrize(
    ("free", "warning", "critical", "expected"),
    [
        pytest.param(7, 0, 5, None, id="warning off: 7% free is fine"),
        pytest.param(3, 0, 5, "critical", id="warning off: critical still fires"),
        pytest.param(3, 10, 0, "warning", id="critical off: warning still fires"),
        pytest.param(0, 10, 0, "warning", id="critical off: even a full disk is only a warning"),
    ],
)
def test_one_threshold_at_zero_turns_only_that_one_off(free: int, warning: float, critical: float, expected: str | None) -> None:
    assert level(Usage(100, free, free), warning=warning, critical=critical) == expected


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("warning_free_percent = 0\n", id="space warning off, critical at its default 5"),
        pytest.param("inodes_warning_free_percent = 0\n", id="inode warning off"),
        pytest.param("critical_free_percent = 0\ninodes_critical_free_percent = 0\n", id="criticals off"),
        pytest.param("warning_free_percent = 0\ncritical_free_percent = 0\n", id="both off"),
    ],
)
def test_zero_alone_turns_a_threshold_off(tmp_path: Path, body: str) -> None:
    """docs/disk.md and config/agent.toml: 0 turns a threshold off, by itself."""
    res = check_config(tmp_path, body)
    assert res.returncode == 0, res.stderr


def test_write_probe_replaces_our_leftover_and_cleans_up(tmp_path: Path) -> None:
    leftover = Path(disk_probes.probe_name(str(tmp_path)))
    leftover.write_bytes(b"from a crashed run")
    disk_probes.write_probe(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_write_probe_never_writes_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    Path(disk_probes.probe_name(str(tmp_path))).symlink_to(victim)
    disk_probes.write_probe(str(tmp_path))
    assert victim.read_bytes() == b"precious"
    assert [p.name for p in tmp_path.iterdir()] == ["victim"]


def test_probe_name_is_clearly_ours() -> None:
    assert os.path.basename(disk_probes.probe_name("/x")) == f".node-health-agent-probe-{os.getpid()}"


# ---------------------------------------------------------------- config


def check_config(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "agent.toml"
    path.write_text("[checks.disk]\n" + body)
    return subprocess.run([sys.executable, "-m", "agent", "config", "check", str(path)], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("body", "key", "expected"),
    [
        pytest.param(
            "warning_free_percent = 5.0\ncritical_free_percent = 10.0\n",
            "checks.disk.critical_free_percent", "at most warning_free_percent (5)", id="critical above warning",
        ),
        pytest.param(
            "inodes_critical_free_percent = 20.0\n",
            "checks.disk.inodes_critical_free_percent", "at most inodes_warning_free_percent (10)", id="inodes critical above warning",
        ),
        pytest.param('paths = ["data"]\n', "checks.disk.paths[0]", "expected an absolute path", id="relative path"),
        pytest.param("warning_free_percent = 120.0\n", "checks.disk.warning_free_percent", "at most 100", id="over 100%"),
        pytest.param('probe_timeout = "soon"\n', "checks.disk.probe_timeout", "expected a duration", id="bad probe timeout"),
    ],
)
def test_bad_disk_config_is_one_line_exit_2(tmp_path: Path, body: str, key: str, expected: str) -> None:
    res = check_config(tmp_path, body)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and key in res.stderr and expected in res.stderr, res.stderr


def test_probe_timeout_may_exceed_the_check_timeout(tmp_path: Path) -> None:
    """Deliberately not constrained: a probe that outlives the run makes the
    whole run a CheckTimeout, which is reported too."""
    res = check_config(tmp_path, 'timeout = "1s"\nprobe_timeout = "30s"\n')
    assert res.returncode == 0, res.stderr


def test_defaults() -> None:
    disk = config.defaults().checks["disk"]
    assert disk.paths == ("/",) and disk.include_state_dir and disk.write_probe
    assert disk.probe_timeout == 5.0 and disk.timeout == 10.0
