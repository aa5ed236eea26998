"""Signs of I/O trouble the kernel exposes for the block device under a mount.

A mount's ``major:minor`` names its block device in ``/sys/dev/block``; that
link resolves to the device's directory, from which a partition's disk is the
parent directory and a device-mapper or md device's disks are its ``slaves/``
(Documentation/ABI/stable/sysfs-block). Filesystems on no block device (tmpfs,
NFS, FUSE, btrfs' anonymous devices) have none of these signs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..hostpaths import HostPaths, read_text
from ..native import DiskStats

MAX_DEPTH = 8  # dm on md on partitions: a few levels; bounded against odd loops
SCSI_OFFLINE = frozenset({"offline", "transport-offline"})


@dataclass(frozen=True, slots=True)
class BlockDevice:
    name: str  # kernel name: "vda1", "dm-0", "nvme0n1p2"
    sysdir: str  # its directory under /sys/devices
    disks: tuple[str, ...]  # sysfs directories of the whole disks below it


def block_device(paths: HostPaths, major: int, minor: int) -> BlockDevice | None:
    link = paths.sys("dev", "block", f"{major}:{minor}")
    if not os.path.lexists(link):
        return None
    sysdir = os.path.realpath(link)
    return BlockDevice(os.path.basename(sysdir), sysdir, tuple(dict.fromkeys(_disks(sysdir, 0))))


def _disks(sysdir: str, depth: int) -> list[str]:
    if os.path.exists(os.path.join(sysdir, "partition")):
        return _disks(os.path.dirname(sysdir), depth + 1) if depth < MAX_DEPTH else []
    slaves = os.path.join(sysdir, "slaves")
    try:
        below = sorted(os.listdir(slaves))
    except OSError:
        below = []
    if not below or depth >= MAX_DEPTH:
        return [sysdir]
    out: list[str] = []
    for name in below:
        out.extend(_disks(os.path.realpath(os.path.join(slaves, name)), depth + 1))
    return out


def _int(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


# ---------------------------------------------------------------- ext4


@dataclass(frozen=True, slots=True)
class Ext4Errors:
    count: int
    last_function: str  # the kernel function that reported the last error ("" if none)
    last_time: int  # unix time of the last error (0 if none)


def ext4_errors(paths: HostPaths, dev: BlockDevice) -> Ext4Errors | None:
    """ext4's superblock error counter: persistent across mounts until e2fsck
    clears it (Documentation/ABI/testing/sysfs-fs-ext4)."""
    base = paths.sys("fs", "ext4", dev.name)
    count = _int(read_text(os.path.join(base, "errors_count")))
    if count is None:
        return None
    func = read_text(os.path.join(base, "last_error_func"), "") or ""
    when = _int(read_text(os.path.join(base, "last_error_time"))) or 0
    return Ext4Errors(count, func, when)


# ---------------------------------------------------------------- SCSI disks


@dataclass(frozen=True, slots=True)
class ScsiState:
    io_errors: int  # sum of ioerr_cnt over the SCSI disks below the mount
    offline: tuple[str, ...]  # names of disks whose state is offline


def scsi_state(dev: BlockDevice) -> ScsiState | None:
    """SCSI disks count commands that completed with an error in
    ``device/ioerr_cnt`` (hex) and say ``offline`` in ``device/state`` after
    error handling gave up on them. NVMe and virtio disks have neither."""
    total, offline, seen = 0, [], False
    for disk in dev.disks:
        count = _int(read_text(os.path.join(disk, "device", "ioerr_cnt")), 16)
        state = read_text(os.path.join(disk, "device", "state"))
        if count is None and state is None:
            continue
        seen = True
        total += count or 0
        if state in SCSI_OFFLINE:
            offline.append(os.path.basename(disk))
    return ScsiState(total, tuple(offline)) if seen else None


# ---------------------------------------------------------------- stalls


@dataclass(frozen=True, slots=True)
class IoSample:
    completed: int  # reads, writes, discards and flushes completed
    in_flight: int
    io_ticks_ms: int


def io_sample(s: DiskStats) -> IoSample:
    done = s.reads_completed + s.writes_completed + s.discards_completed + s.flushes_completed
    return IoSample(done, s.ios_in_progress, s.io_time_ms)


def stalled(before: IoSample, now: IoSample) -> bool:
    """I/O was in flight at both samples, none completed between them, and the
    device stayed busy (io_ticks grew): requests are stuck in the device or
    below it (a dead path under dm-multipath queue_if_no_path, a hung HBA).
    Documentation/admin-guide/iostats.rst."""
    return (
        before.in_flight > 0
        and now.in_flight > 0
        and now.completed == before.completed
        and now.io_ticks_ms > before.io_ticks_ms
    )


# ---------------------------------------------------------------- per run


@dataclass(frozen=True, slots=True)
class DeviceSigns:
    device: BlockDevice
    ext4: Ext4Errors | None
    new_ext4_errors: int  # since the previous run (0 on the first)
    scsi: ScsiState | None
    new_io_errors: int
    io: IoSample | None
    stalled_for: float | None  # seconds between the samples that show a stall


class DeviceTracker:
    """Reads the signs for the devices under this run's mounts and keeps the
    previous run's counters for deltas: only the current devices, so memory is
    bounded by the configured paths whatever the host does."""

    def __init__(self, paths: HostPaths) -> None:
        self.paths = paths
        self._last: dict[tuple[int, int], tuple[float, DeviceSigns]] = {}

    def update(self, devices: set[tuple[int, int]], diskstats: dict[tuple[int, int], DiskStats]) -> dict[tuple[int, int], DeviceSigns]:
        now = time.monotonic()
        out: dict[tuple[int, int], DeviceSigns] = {}
        for key in devices:
            dev = block_device(self.paths, *key)
            if dev is None:
                continue
            prev = self._last.get(key)
            out[key] = _signs(self.paths, dev, diskstats.get(key), prev, now)
        self._last = {k: (now, s) for k, s in out.items()}
        return out


def _signs(
    paths: HostPaths, dev: BlockDevice, stats: DiskStats | None, prev: tuple[float, DeviceSigns] | None, now: float
) -> DeviceSigns:
    ext4, scsi = ext4_errors(paths, dev), scsi_state(dev)
    io = io_sample(stats) if stats is not None else None
    before = prev[1] if prev is not None and prev[1].device == dev else None
    new_fs = _grown(before.ext4.count if before and before.ext4 else None, ext4.count if ext4 else None)
    new_io = _grown(before.scsi.io_errors if before and before.scsi else None, scsi.io_errors if scsi else None)
    stall = None
    if prev is not None and before is not None and before.io is not None and io is not None and stalled(before.io, io):
        stall = now - prev[0]
    return DeviceSigns(dev, ext4, new_fs, scsi, new_io, io, stall)


def _grown(before: int | None, now: int | None) -> int:
    # A counter that went down was reset (e2fsck, a re-probed disk): no new errors.
    if before is None or now is None or now <= before:
        return 0
    return now - before
