"""An SRE runs `agent selftest` without sudo: what the disk check cannot do as
an ordinary user is an unknown InsufficientPrivilege naming what it needs,
never a fault it could not see; the exit code reflects only real findings."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import require_tool
from mountns import MountNamespace

pytestmark = [pytest.mark.privileged, pytest.mark.timeout(120)]

NOBODY = 65534


@pytest.fixture
def public_dir() -> Iterator[str]:
    """A directory an ordinary user can reach (pytest's tmp_path is root-only)."""
    path = tempfile.mkdtemp(prefix="nha-disk-priv-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(argv: list[str]) -> list[str]:
    setpriv = require_tool("setpriv")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]


def config(directory: str, paths: list[str]) -> str:
    path = os.path.join(directory, "agent.toml")
    # Thresholds at 0: the host's real fill level must not decide these tests.
    with open(path, "w") as fh:
        fh.write(
            f"[checks.disk]\npaths = {json.dumps(paths)}\ninclude_state_dir = false\n"
            "warning_free_percent = 0.0\ncritical_free_percent = 0.0\n"
            "inodes_warning_free_percent = 0.0\ninodes_critical_free_percent = 0.0\n"
        )
    os.chmod(path, 0o644)
    return path


def selftest_argv(cfg: str) -> list[str]:
    return [sys.executable, "-m", "agent", "selftest", "--json", "--only", "disk", "--config", cfg]


def parse(rc: int, stdout: str, stderr: str) -> tuple[int, dict[str, Any]]:
    assert rc in (0, 1), stderr
    return rc, json.loads(stdout)


def by_reason(report: dict[str, Any], subject: str) -> dict[str, dict[str, Any]]:
    return {f["reason"]: f for f in report["findings"] if f["subject"] == subject}


def test_root_not_writable_is_unknown_not_a_fault(public_dir) -> None:
    import subprocess

    res = subprocess.run(as_nobody(selftest_argv(config(public_dir, ["/"]))), capture_output=True, text=True, timeout=60, check=False)
    rc, report = parse(res.returncode, res.stdout, res.stderr)
    found = by_reason(report, "/")
    assert set(found) == {"InsufficientPrivilege"}, report
    assert found["InsufficientPrivilege"]["unknown"]
    assert "uid 65534" in found["InsufficientPrivilege"]["message"] and "root" in found["InsufficientPrivilege"]["message"]
    assert (rc, report["healthy"]) == (0, True)


@pytest.fixture
def mounts(mount_ns: MountNamespace, public_dir: str) -> dict[str, str]:
    """tmpfs mounts: root-only, open to all, behind a directory nobody may enter, read-only."""
    out = {}
    for name, mode in (("root-only", "755"), ("open", "1777"), ("readonly", "1777")):
        out[name] = mount_ns.tmpfs(os.path.join(public_dir, name), f"size=1m,mode={mode}")
    mount_ns.run(["mount", "-o", "remount,ro", out["readonly"]])
    os.mkdir(os.path.join(public_dir, "private"), 0o700)
    out["hidden"] = mount_ns.tmpfs(os.path.join(public_dir, "private", "mnt"))
    return out


def test_what_nobody_can_and_cannot_see(mount_ns, mounts, public_dir) -> None:
    cfg = config(public_dir, [mounts[k] for k in ("root-only", "open", "hidden", "readonly")])
    res = mount_ns.run(as_nobody(selftest_argv(cfg)), check=False)
    rc, report = parse(res.returncode, res.stdout, res.stderr)

    write = by_reason(report, mounts["root-only"])
    assert set(write) == {"InsufficientPrivilege"} and "write probe" in write["InsufficientPrivilege"]["message"]
    assert by_reason(report, mounts["open"]) == {}
    stat = by_reason(report, mounts["hidden"])
    assert set(stat) == {"InsufficientPrivilege"} and "statfs" in stat["InsufficientPrivilege"]["message"]
    # A real fault is still seen without privileges, and only it sets the exit code.
    assert set(by_reason(report, mounts["readonly"])) == {"DiskReadOnly"}
    assert (rc, report["healthy"]) == (1, False)
    assert {f["reason"] for f in report["findings"] if not f["unknown"]} == {"DiskReadOnly"}
