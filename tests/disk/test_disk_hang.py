"""A dead mount must not hang the disk check: statfs on a FUSE filesystem that
never answers (tests/support/fuse_hang.py) stands in for a dead NFS server."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from diskrun import CheckRunner, reasons, sample
from fuse_hang import FuseHangProcess
from mountns import MountNamespace

pytestmark = [pytest.mark.privileged, pytest.mark.timeout(120)]


@pytest.fixture
def ns(mount_ns: MountNamespace) -> MountNamespace:
    if not Path("/dev/fuse").exists():
        pytest.fail("/dev/fuse is missing: the kernel needs CONFIG_FUSE_FS")
    return mount_ns


@pytest.fixture
def dead(ns: MountNamespace, tmp_path: Path) -> Iterator[FuseHangProcess]:
    mnt = tmp_path / "dead-nfs"
    mnt.mkdir()
    fs = FuseHangProcess(str(mnt), prefix=ns.cmd([]))
    yield fs
    fs.close()


@pytest.fixture
def healthy(ns: MountNamespace, tmp_path: Path) -> str:
    return ns.tmpfs(tmp_path / "healthy")


@pytest.fixture
def runner(ns, dead, healthy, tmp_path) -> Iterator[CheckRunner]:
    config = tmp_path / "agent.toml"
    paths = [dead.mountpoint, healthy]
    # write_probe off: once healed, the FUSE server fails file creation with EIO.
    config.write_text(
        f'[checks.disk]\npaths = {json.dumps(paths)}\ninclude_state_dir = false\nwrite_probe = false\nprobe_timeout = "500ms"\n'
    )
    r = CheckRunner(ns, str(config))
    yield r
    r.close()


def run_until(runner: CheckRunner, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """Run the check until `pred` holds: the released statfs returns in the
    probe's own thread, a moment after the FUSE server answers it."""
    for _ in range(100):
        result = runner.run()
        if pred(result):
            return result
        time.sleep(0.05)
    raise AssertionError(f"no run showed {what}")


def test_hung_path_is_reported_and_the_others_still_are(runner, dead, healthy) -> None:
    first = runner.run()
    hung = [f for f in first["findings"] if f["subject"] == dead.mountpoint]
    assert [(f["reason"], f["severity"], f["unknown"]) for f in hung] == [("DiskProbeHung", "warning", True)]
    assert sample(first, "node_health_disk_probe_success", dead.mountpoint) == 0
    assert sample(first, "node_health_disk_size_bytes", dead.mountpoint) is None
    assert reasons(first, healthy) == set()
    assert "% used" in first["subjects"][healthy]
    assert sample(first, "node_health_disk_probe_success", healthy) == 1
    assert dead.hung_count("statfs") == 1


def test_hung_path_is_not_probed_again_until_the_call_returns(runner, dead, healthy) -> None:
    runner.run()
    second = runner.run()
    assert reasons(second, dead.mountpoint) == {"DiskProbeHung"}
    assert sample(second, "node_health_disk_probe_success", healthy) == 1
    assert dead.hung_count("statfs") == 1  # the kernel saw no second statfs

    dead.release(heal=True)  # the server comes back: the held statfs returns
    third = run_until(runner, lambda r: not reasons(r, dead.mountpoint), "the probe to return")
    assert sample(third, "node_health_disk_size_bytes", dead.mountpoint) == 1000 * 4096
    assert reasons(third, healthy) == set()


def test_hung_path_probed_again_once_the_call_returned(runner, dead) -> None:
    runner.run()
    dead.release()  # answers the held statfs; the next one hangs again
    run_until(runner, lambda r: dead.hung_count("statfs") == 2, "a second statfs")
    assert reasons(runner.run(), dead.mountpoint) == {"DiskProbeHung"}
    assert dead.hung_count("statfs") == 2


def test_no_hung_mount_is_left_behind(ns, tmp_path) -> None:
    mnt = tmp_path / "dead"
    mnt.mkdir()
    fs = FuseHangProcess(str(mnt), prefix=ns.cmd([]))
    blocked = ns.popen(["stat", "-f", str(mnt)])
    fs.wait_for(lambda line: line.startswith("hung statfs"), "the statfs")
    fs.close()
    assert blocked.wait(timeout=30) != 0  # released with an error, not left hanging
    assert str(mnt) not in ns.run(["cat", "/proc/self/mountinfo"]).stdout
