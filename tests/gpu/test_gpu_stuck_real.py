"""A real process in uninterruptible sleep on a /dev/nvidia* path, found by the
scanner in the machine's own /proc.

In a private mount namespace, a tmpfs over /dev holds a directory
``/dev/nvidia0`` on which a FUSE server that never answers statfs is mounted
(tests/support/fuse_hang.py). A process opens ``/dev/nvidia0`` (O_PATH) and calls
statvfs on it: it waits for the server, interruptibly. A signal it handles
makes FUSE send INTERRUPT, which the server leaves unanswered too, and the
kernel then waits killably (``request_wait_answer`` in fs/fuse/dev.c):
``D`` in /proc/<pid>/stat, the state of a task stuck in a wedged driver. Its
fd link reads ``/dev/nvidia0`` as a driver's device node would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentproc import wait_for
from fuse_hang import FuseHangProcess
from mountns import MountNamespace

from agent.gpu.stuck import StuckTracker, scan
from agent.hostpaths import HostPaths

pytestmark = [pytest.mark.privileged, pytest.mark.timeout(120)]

SCRIPT = """
import os, signal, sys
signal.signal(signal.SIGUSR1, lambda *a: None)
fd = os.open("/dev/nvidia0", os.O_PATH)
print("open", flush=True)
try:
    os.statvfs("/dev/nvidia0")
except OSError as exc:
    print("statfs failed", exc.errno, flush=True)
"""


@pytest.fixture
def fake_dev(mount_ns: MountNamespace) -> Iterator[FuseHangProcess]:
    if not Path("/dev/fuse").exists():
        pytest.fail("/dev/fuse is missing: the kernel needs CONFIG_FUSE_FS")
    # Only inside the namespace: the host's /dev is not touched.
    mount_ns.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=755", "nha-test-dev", "/dev"])
    mount_ns.run(["mknod", "-m", "666", "/dev/fuse", "c", "10", "229"])
    mount_ns.run(["mknod", "-m", "666", "/dev/null", "c", "1", "3"])
    mount_ns.run(["mkdir", "/dev/nvidia0"])
    fs = FuseHangProcess("/dev/nvidia0", prefix=mount_ns.cmd([]))
    yield fs
    fs.close()


def child_of(pid: int) -> int:
    """The process nsenter forked into the pid namespace."""
    def child() -> int:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return int(fh.read().split()[0])

    return int(wait_for(child, what="nsenter's child"))


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rpartition(")")[2].split()[0]


def test_a_process_in_d_state_on_dev_nvidia_is_found(mount_ns: MountNamespace, fake_dev: FuseHangProcess) -> None:
    proc = mount_ns.popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "open"
        fake_dev.wait_for(lambda line: line.startswith("hung statfs"), "the statfs to be held")
        pid = child_of(proc.pid)
        wait_for(lambda: state_of(pid) == "S", what="the process to wait for the FUSE server")
        assert not [s for s in scan(HostPaths()) if s.pid == pid], "S (interruptible): not stuck"
        os.kill(pid, signal.SIGUSR1)
        wait_for(lambda: state_of(pid) == "D", what="the process to enter D state")
        tracker = StuckTracker()
        for n in (1, 2, 3):
            mine = [(s.devices, k) for s, k in tracker.update(scan(HostPaths())) if s.pid == pid]
            assert mine == [(("/dev/nvidia0",), n)]
    finally:
        fake_dev.close()  # answers the held requests: the process returns and exits
        proc.wait(timeout=30)
