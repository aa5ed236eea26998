"""The disk check against the real kernel, in a private mount namespace: a
small tmpfs filled up, out of inodes, remounted read-only, and recovered;
`agent selftest` inside the namespace reads the namespace's pid 1 mountinfo."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mountns import MountNamespace

pytestmark = [pytest.mark.privileged, pytest.mark.timeout(120)]


@pytest.fixture
def ns(mount_ns: MountNamespace) -> MountNamespace:
    return mount_ns


@pytest.fixture
def tmpfs(ns: MountNamespace, tmp_path: Path) -> str:
    return ns.tmpfs(tmp_path / "tmpfs-mnt", "size=1m,nr_inodes=64,mode=755")


def write_config(path: Path, mounts: list[str], **extra: Any) -> str:
    lines = ["[checks.disk]", f"paths = {json.dumps(mounts)}", "include_state_dir = false"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def selftest(ns: MountNamespace, config: str, *prefix: str) -> tuple[int, dict[str, Any]]:
    res = ns.run([*prefix, sys.executable, "-m", "agent", "selftest", "--json", "--only", "disk", "--config", config], check=False)
    assert res.returncode in (0, 1), res.stderr
    return res.returncode, json.loads(res.stdout)


def findings(report: dict[str, Any], subject: str) -> dict[str, dict[str, Any]]:
    return {f["reason"]: f for f in report["findings"] if f["subject"] == subject}


def fill(ns: MountNamespace, mnt: str) -> None:
    # dd stops with ENOSPC: that is the point.
    ns.run(["dd", "if=/dev/zero", f"of={mnt}/fill", "bs=64k"], check=False)


def exhaust_inodes(ns: MountNamespace, mnt: str) -> None:
    ns.run(["sh", "-c", f"mkdir {mnt}/many && i=0; while touch {mnt}/many/$i 2>/dev/null; do i=$((i+1)); done"], check=False)


@pytest.mark.parametrize(
    ("break_it", "reason", "repair"),
    [
        pytest.param(fill, "DiskFull", ["rm", "-f", "{mnt}/fill"], id="full tmpfs, then freed"),
        pytest.param(exhaust_inodes, "InodesExhausted", ["rm", "-rf", "{mnt}/many"], id="inodes exhausted, then freed"),
        pytest.param(
            lambda ns, mnt: ns.run(["mount", "-o", "remount,ro", mnt]),
            "DiskReadOnly", ["mount", "-o", "remount,rw", "{mnt}"], id="remounted read-only, then rw",
        ),
        pytest.param(
            lambda ns, mnt: ns.run(["mount", "-o", "remount,bind,ro", mnt]),
            "DiskReadOnly", ["mount", "-o", "remount,bind,rw", "{mnt}"], id="bind mount made read-only, then rw",
        ),
    ],
)
def test_fault_is_critical_and_clears(ns, tmpfs, tmp_path, break_it, reason, repair) -> None:
    config = write_config(tmp_path / "agent.toml", [tmpfs])
    rc, report = selftest(ns, config)
    assert (rc, report["findings"]) == (0, []), report
    assert "% used" in report["checks"][0]["subjects"][tmpfs]

    break_it(ns, tmpfs)
    rc, report = selftest(ns, config)
    found = findings(report, tmpfs)
    assert rc == 1 and not report["healthy"]
    assert found[reason]["severity"] == "critical" and not found[reason]["unknown"]
    assert "DiskWriteFailed" not in found  # the cause is named once, not as a write failure too
    assert len([f for f in report["findings"] if f["subject"] == tmpfs]) == len(found)  # and only once

    ns.run([part.format(mnt=tmpfs) for part in repair])
    rc, report = selftest(ns, config)
    assert (rc, report["findings"]) == (0, []), report


def test_space_thresholds_warn_before_critical(ns, tmpfs, tmp_path) -> None:
    ns.run(["dd", "if=/dev/zero", f"of={tmpfs}/half", "bs=64k", "count=10"])  # 640 KiB of 1 MiB: 37.5% free
    config = write_config(tmp_path / "agent.toml", [tmpfs], warning_free_percent=50.0, critical_free_percent=20.0)
    rc, report = selftest(ns, config)
    assert rc == 1
    assert findings(report, tmpfs)["DiskSpaceLow"]["severity"] == "warning"
    assert "DiskFull" not in findings(report, tmpfs)


def test_not_a_mount_point_is_critical(ns, tmp_path) -> None:
    plain = tmp_path / "not-mounted"
    plain.mkdir()
    rc, report = selftest(ns, write_config(tmp_path / "agent.toml", [str(plain)]))
    assert rc == 1
    assert set(findings(report, str(plain))) == {"NotMounted"}


def test_read_only_only_in_the_agents_namespace_is_not_a_disk_fault(ns, tmpfs, tmp_path) -> None:
    """systemd's ProtectSystem=/ReadOnlyPaths= or a readOnly hostPath: the agent
    sees the path read-only, the host (pid 1) has it read-write."""
    config = write_config(tmp_path / "agent.toml", [tmpfs])
    inner = f"mount -o remount,bind,ro {tmpfs} && exec \"$@\""
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c", inner, "sh")
    rc, report = selftest(ns, config, *prefix)
    found = findings(report, tmpfs)
    assert set(found) == {"InsufficientPrivilege"}, report
    assert found["InsufficientPrivilege"]["unknown"] and "read-only" in found["InsufficientPrivilege"]["message"]
    assert rc == 0 and report["healthy"]


@pytest.mark.parametrize(
    ("create_error", "reason", "rc"),
    [
        pytest.param("EIO", "DiskWriteFailed", 1, id="EIO: the disk fails writes"),
        pytest.param("EROFS", "DiskReadOnly", 1, id="EROFS under a rw mount: an NFS export gone read-only"),
        pytest.param("EACCES", "InsufficientPrivilege", 0, id="EACCES as root: root_squash, cannot tell"),
    ],
)
def test_write_probe_failure(ns, tmp_path, create_error: str, reason: str, rc: int) -> None:
    """A filesystem whose statfs answers but file creation fails."""
    from fuse_hang import FuseHangProcess

    mnt = tmp_path / "failing"
    mnt.mkdir()
    fs = FuseHangProcess(str(mnt), prefix=ns.cmd([]), hang="", create_error=create_error)
    try:
        code, report = selftest(ns, write_config(tmp_path / "agent.toml", [str(mnt)]))
    finally:
        fs.close()
    found = findings(report, str(mnt))
    assert set(found) == {reason}, report
    assert create_error in found[reason]["message"]
    assert code == rc


def test_probe_leaves_no_file_behind(ns, tmpfs, tmp_path) -> None:
    selftest(ns, write_config(tmp_path / "agent.toml", [tmpfs]))
    listing = ns.run(["ls", "-A", tmpfs]).stdout.split()
    assert listing == []


def test_runs_from_the_agents_view_when_pid1_mountinfo_is_unreadable(ns, tmpfs, tmp_path) -> None:
    """With a procfs whose pid 1 is not visible, the agent's own table is used."""
    procfs = tmp_path / "proc-without-pid1"
    procfs.mkdir()
    (procfs / "self").mkdir()
    (procfs / "self" / "mountinfo").write_text(ns.run(["cat", "/proc/self/mountinfo"]).stdout)
    config = write_config(tmp_path / "agent.toml", [tmpfs])
    res = ns.run(
        [sys.executable, "-m", "agent", "selftest", "--json", "--only", "disk", "--config", config, "--path.procfs", str(procfs)],
        check=False,
    )
    report = json.loads(res.stdout)
    assert res.returncode == 0 and "tmpfs on nha-test-tmpfs" in report["checks"][0]["subjects"][tmpfs], report


def test_subprocess_helpers_clean_up(tmp_path) -> None:
    """Mounts made in a MountNamespace never reach the machine's own table."""
    with MountNamespace() as ns:
        mnt = ns.tmpfs(tmp_path / "m")
        inside = ns.run(["cat", "/proc/1/mountinfo"]).stdout
    outside = Path("/proc/self/mountinfo").read_text()
    assert str(mnt) in inside and str(mnt) not in outside
