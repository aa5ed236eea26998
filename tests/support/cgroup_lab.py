"""Real cgroups for tests: a child process placed in a cgroup made for it, on
the host's cgroup v2 (unified) or a v1 hierarchy, removed afterwards."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator

from conftest import skip_or_fail


def mount_of(fstype: str, option: str = "") -> str | None:
    """Where this machine mounts a cgroup2 (fstype "cgroup2") or a v1 hierarchy with `option` ("pids")."""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, extra = left.split(), right.split()
            if extra and extra[0] == fstype and (not option or option in extra[-1].split(",")):
                return fields[4]
    return None


@contextlib.contextmanager
def process_in_cgroup(fstype: str, relpath: str, option: str = "") -> Iterator[int]:
    """A `sleep` child moved into <mount>/<relpath> (made here, with its parents);
    yields its PID; kills it and removes the cgroups it made."""
    if os.geteuid() != 0:
        skip_or_fail("needs root to make cgroups")
    mount = mount_of(fstype, option)
    if mount is None:
        skip_or_fail(f"no {fstype} {option} hierarchy mounted")
    assert mount is not None
    made: list[str] = []
    path = mount
    for part in relpath.strip("/").split("/"):
        path = os.path.join(path, part)
        if not os.path.isdir(path):
            os.mkdir(path)
            made.append(path)
    child = subprocess.Popen(["sleep", "600"])
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as fh:
            fh.write(str(child.pid))
        yield child.pid
    finally:
        child.kill()
        child.wait()
        for p in reversed(made):
            for _ in range(50):  # the cgroup empties a moment after its last process is reaped
                try:
                    os.rmdir(p)
                    break
                except OSError:
                    time.sleep(0.02)
