"""I/O error signs from the real kernel: an ext4 filesystem on a loop device,
with errors injected through /sys/fs/ext4/<dev>/trigger_fs_error (which calls
ext4_error(), exactly as a detected corruption does)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_tool, skip_or_fail
from diskrun import CheckRunner, reasons, sample
from mountns import MountNamespace

pytestmark = [pytest.mark.privileged, pytest.mark.timeout(120)]


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[str]:
    require_tool("losetup")
    mkfs = require_tool("mkfs.ext4")
    image = tmp_path / "ext4.img"
    with open(image, "wb") as fh:
        fh.truncate(32 << 20)
    subprocess.run([mkfs, "-q", "-F", str(image)], check=True, capture_output=True)
    res = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        skip_or_fail(f"no loop device: {res.stderr.strip()}")
    dev = res.stdout.strip()
    yield dev
    subprocess.run(["losetup", "--detach", dev], capture_output=True, check=False)


@pytest.fixture
def ns(loop: str) -> Iterator[MountNamespace]:
    # Depends on `loop` so that the namespace (and its mount) goes first.
    with MountNamespace() as ns:
        yield ns


def mount_ext4(ns: MountNamespace, dev: str, mnt: Path, errors: str) -> None:
    mnt.mkdir()
    ns.run(["mount", "-t", "ext4", "-o", f"errors={errors}", dev, str(mnt)])


def trigger_error(dev: str) -> None:
    path = f"/sys/fs/ext4/{os.path.basename(dev)}/trigger_fs_error"
    if not os.path.exists(path):
        skip_or_fail(f"{path} is missing (kernel without ext4 sysfs error injection)")
    with open(path, "w") as fh:
        fh.write("node-health-agent test error\n")


def runner_for(ns: MountNamespace, tmp_path: Path, mnt: Path) -> CheckRunner:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f"[checks.disk]\npaths = {json.dumps([str(mnt)])}\ninclude_state_dir = false\n")
    return CheckRunner(ns, str(cfg))


def test_recorded_errors_warn_and_new_errors_are_critical(ns, loop, tmp_path) -> None:
    mnt = tmp_path / "ext4"
    mount_ext4(ns, loop, mnt, "continue")
    runner = runner_for(ns, tmp_path, mnt)
    try:
        first = runner.run()
        assert reasons(first, str(mnt)) == set()
        assert sample(first, "node_health_disk_filesystem_errors_total", str(mnt)) == 0
        assert f"ext4 on {loop}" in first["subjects"][str(mnt)]

        trigger_error(loop)
        second = runner.run()
        assert reasons(second, str(mnt)) == {"FilesystemErrors", "FilesystemErrorsGrowing"}
        assert sample(second, "node_health_disk_filesystem_errors_total", str(mnt)) == 1

        third = runner.run()  # no new errors: the record stays, the growth is over
        assert reasons(third, str(mnt)) == {"FilesystemErrors"}
    finally:
        runner.close()


def test_errors_remount_read_only_is_seen_in_mountinfo(ns, loop, tmp_path) -> None:
    mnt = tmp_path / "ext4"
    mount_ext4(ns, loop, mnt, "remount-ro")
    runner = runner_for(ns, tmp_path, mnt)
    try:
        assert reasons(runner.run(), str(mnt)) == set()
        trigger_error(loop)
        after = runner.run()
    finally:
        runner.close()
    assert {"DiskReadOnly", "FilesystemErrors", "FilesystemErrorsGrowing"} <= reasons(after, str(mnt))
    assert "DiskWriteFailed" not in reasons(after, str(mnt))
    assert sample(after, "node_health_disk_read_only", str(mnt)) == 1
