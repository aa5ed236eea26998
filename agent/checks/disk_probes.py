"""What the disk check asks of a filesystem itself: statvfs and a write probe.

All of them can block forever on a dead network mount; the check runs them
through `agent.probeproc.IsolatedProber`, in a worker process, never in the
agent's own (a thread stuck there would keep the agent from exiting and hold
its lock). So this module imports nothing but the standard library: the worker
imports it to run `probe` and `nearest_existing`. Everything here that does
not touch a filesystem is a pure function of a `statvfs_result`.
"""

from __future__ import annotations

import errno
import math
import os
import time
from dataclasses import dataclass

PROBE_PREFIX = ".node-health-agent-probe-"
PROBE_PAYLOAD = b"node-health-agent write probe: safe to delete\n"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

PRIVILEGE_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    stat: os.statvfs_result
    wrote: bool  # the write probe ran and succeeded
    write_error: OSError | None  # the write probe ran and failed
    duration: float  # seconds for statvfs and the write probe together
    device: tuple[int, int]  # major:minor of the filesystem the agent saw at the path

    def hidden(self, expected: tuple[int, int]) -> bool:
        """The agent sees another filesystem at the path than the host mounted there."""
        return self.device != expected


def probe(local: str, write: bool, expected: tuple[int, int] | None) -> ProbeOutcome:
    """statvfs `local`, then (when asked, when the agent sees the filesystem it
    `expected` there, and when its view of it is writable) create, write, fsync
    and remove a probe file in it. statvfs and stat errors raise."""
    t0 = time.monotonic()
    st = os.statvfs(local)
    dev = os.stat(local).st_dev
    seen = (os.major(dev), os.minor(dev))
    wrote, error = False, None
    if write and not st.f_flag & os.ST_RDONLY and (expected is None or seen == expected):
        try:
            write_probe(local)
            wrote = True
        except OSError as exc:
            error = exc
    return ProbeOutcome(st, wrote, error, time.monotonic() - t0, seen)


def nearest_existing(path: str) -> str:
    """The state dir, or its nearest existing ancestor before the agent creates it."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != "/":
        p = os.path.dirname(p)
    return os.path.realpath(p)


def probe_name(directory: str) -> str:
    return os.path.join(directory, f"{PROBE_PREFIX}{os.getpid()}")


def write_probe(directory: str) -> None:
    """Create, write, fsync and remove our probe file. O_EXCL|O_NOFOLLOW: never
    write through a link or into a file that is not ours; a leftover of ours
    (a crash mid-probe, a reused pid) is removed and the probe retried."""
    name = probe_name(directory)
    try:
        fd = os.open(name, _CREATE, 0o600)
    except FileExistsError:
        os.unlink(name)
        fd = os.open(name, _CREATE, 0o600)
    try:
        try:
            os.write(fd, PROBE_PAYLOAD)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


def errno_text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- space and inodes


@dataclass(frozen=True, slots=True)
class Usage:
    """One resource (blocks or inodes) of a filesystem, counted as df counts it."""

    total: int
    free: int  # free for root
    available: int  # free for ordinary users (df's "Avail")

    @property
    def accounted(self) -> bool:
        return self.total > 0

    @property
    def used_percent(self) -> float:
        """df's Use%: used / (used + available), so root's reserve counts as used."""
        used = self.total - self.free
        denom = used + self.available
        return 100.0 * used / denom if denom > 0 else 0.0

    @property
    def free_percent(self) -> float:
        return 100.0 - self.used_percent


def blocks(st: os.statvfs_result) -> Usage:
    return Usage(st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize, st.f_bavail * st.f_frsize)


def inodes(st: os.statvfs_result) -> Usage:
    # Filesystems without a fixed inode table (btrfs, some FUSE) report f_files == 0:
    # that is "not accounted", not "exhausted".
    return Usage(st.f_files, st.f_ffree, st.f_ffree)


def level(usage: Usage, warning: float, critical: float) -> str | None:
    """"critical", "warning" or None for a free percentage against thresholds."""
    if not usage.accounted:
        return None
    free = usage.free_percent
    if free < critical:
        return "critical"
    if free < warning:
        return "warning"
    return None


def shown_percent(usage: Usage) -> str:
    """Rounded up as df rounds it, so the number matches what an SRE sees."""
    return f"{math.ceil(usage.used_percent)}%"


def human_bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} {units[i]}" if i == 0 else f"{n:.1f} {units[i]}"
