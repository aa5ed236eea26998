"""Turns what the disk check saw for one target into samples and findings.

Rule 7 of the design holds here: a probe the agent was not allowed to run
(EACCES/EPERM, a read-only view of a path the host has read-write) is an
unknown `InsufficientPrivilege`, never DiskReadOnly or DiskWriteFailed.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..findings import ObservationBuilder
from ..probe import ProbeResult
from .disk_devices import DeviceSigns
from .disk_mounts import describe, read_only
from .disk_probes import (
    PRIVILEGE_ERRNOS,
    ProbeOutcome,
    Usage,
    blocks,
    errno_text,
    human_bytes,
    inodes,
    level,
    shown_percent,
)
from .disk_targets import Target

if TYPE_CHECKING:
    from ..native import MountInfo
    from .disk import DiskConfig


def _sample(b: ObservationBuilder, name: str, value: float, t: Target) -> None:
    b.sample(f"node_health_disk_{name}", value, mountpoint=t.subject)


def report(
    b: ObservationBuilder,
    t: Target,
    cfg: DiskConfig,
    source: str,
    result: ProbeResult[ProbeOutcome] | None,
    signs: Mapping[tuple[int, int], DeviceSigns],
) -> None:
    s = t.subject
    if t.mount is None:
        _sample(b, "mounted", 0, t)
        b.finding(s, "NotMounted", f"{s} is not a mount point (per {source})")
        b.subject(s, "not mounted")
        return
    _sample(b, "mounted", 1, t)
    notes: list[str] = []
    host_ro = read_only(t.mount)
    if host_ro:
        b.finding(s, "DiskReadOnly", f"{s} is mounted read-only ({_ro_options(t.mount)})")
        notes.append("read-only")
    probe_ro = _probe(b, t, cfg, result, notes) if result is not None else False
    _sample(b, "read_only", 1 if host_ro or probe_ro else 0, t)
    sign = signs.get((t.mount.major, t.mount.minor))
    if sign is not None:
        _device(b, t, sign, notes)
    if t.holds_state:
        notes.append("holds the state dir")
    notes.append(describe(t.mount))
    b.subject(s, ", ".join(notes))


def _ro_options(m: MountInfo) -> str:
    return f"mount options {m.options}; filesystem options {m.super_options}"


def _probe(b: ObservationBuilder, t: Target, cfg: DiskConfig, res: ProbeResult[ProbeOutcome], notes: list[str]) -> bool:
    """statfs and write probe results; True when the write probe got EROFS."""
    s = t.subject
    if res.hung_for is not None:
        _sample(b, "probe_success", 0, t)
        b.finding(
            s, "DiskProbeHung",
            f"statfs/write probe of {t.local} has not returned for {res.hung_for:.1f}s "
            f"(probe_timeout {cfg.probe_timeout:g}s; a dead network mount?); not probed again until it returns",
        )
        notes.append(f"probe hung for {res.hung_for:.0f}s")
        return False
    if res.error is not None:
        _sample(b, "probe_success", 0, t)
        _stat_error(b, t, res.error, notes)
        return False
    out = res.value
    assert out is not None
    want = t.expected_device()
    if want is not None and out.hidden(want):
        _sample(b, "probe_success", 0, t)
        seen = f"{out.device[0]}:{out.device[1]}"
        _not_visible(b, t, f"the host mounts device {want[0]}:{want[1]} there, the agent sees {seen}", notes)
        return False
    _sample(b, "probe_duration_seconds", out.duration, t)
    raised = _space(b, t, cfg, out, notes)
    ok, ro = _write(b, t, cfg, out, raised, notes)
    _sample(b, "probe_success", 1 if ok else 0, t)
    return ro


def _stat_error(b: ObservationBuilder, t: Target, exc: BaseException, notes: list[str]) -> None:
    if not isinstance(exc, OSError):
        raise exc  # a bug, not a disk fault: CheckFailed
    if exc.errno in PRIVILEGE_ERRNOS:
        b.finding(
            t.subject, "InsufficientPrivilege",
            f"statfs {t.local}: {errno_text(exc)}; needs search permission on the path "
            f"(root or CAP_DAC_READ_SEARCH; running as uid {os.geteuid()})",
        )
        notes.append("cannot statfs")
        return
    if exc.errno == errno.ENOENT:  # the host has it mounted; the agent has no such path
        _not_visible(b, t, f"the agent has no {t.local}", notes)
        return
    b.finding(t.subject, "DiskStatFailed", f"statfs {t.local} failed: {errno_text(exc)}")
    notes.append("statfs failed")


def _not_visible(b: ObservationBuilder, t: Target, what: str, notes: list[str]) -> None:
    b.finding(
        t.subject, "MountNotVisible",
        f"{t.subject} is mounted on the host but {what} (in a DaemonSet, mount the host root with "
        "mountPropagation: HostToContainer)",
    )
    notes.append("not visible to the agent")


def _space(b: ObservationBuilder, t: Target, cfg: DiskConfig, out: ProbeOutcome, notes: list[str]) -> set[str]:
    blk, ino = blocks(out.stat), inodes(out.stat)
    for name, value in (
        ("size_bytes", blk.total), ("free_bytes", blk.free), ("available_bytes", blk.available),
        ("files", ino.total), ("files_free", ino.free),
    ):
        _sample(b, name, value, t)
    space = _level(b, t, blk, cfg.warning_free_percent, cfg.critical_free_percent, ("DiskFull", "DiskSpaceLow"), _bytes_text)
    inode = _level(
        b, t, ino, cfg.inodes_warning_free_percent, cfg.inodes_critical_free_percent, ("InodesExhausted", "InodesLow"), _inodes_text
    )
    raised = {r for r in (space, inode) if r}
    notes.append(f"{shown_percent(blk)} used" if blk.accounted else "no block accounting")
    notes.append(f"{shown_percent(ino)} inodes used" if ino.accounted else "no inode accounting")
    return raised


def _bytes_text(u: Usage) -> str:
    return f"{human_bytes(u.available)} of {human_bytes(u.total)} available"


def _inodes_text(u: Usage) -> str:
    return f"{u.free} of {u.total} inodes free"


def _level(
    b: ObservationBuilder, t: Target, u: Usage, warning: float, critical: float,
    reasons: tuple[str, str], text: Callable[[Usage], str],
) -> str | None:
    lv = level(u, warning, critical)
    if lv is None:
        return None
    reason, threshold = (reasons[0], critical) if lv == "critical" else (reasons[1], warning)
    b.finding(
        t.subject, reason,
        f"{shown_percent(u)} used: {text(u)} ({u.free_percent:.1f}% free, {lv} below {threshold:g}%)",
    )
    return reason


def _write(
    b: ObservationBuilder, t: Target, cfg: DiskConfig, out: ProbeOutcome, raised: set[str], notes: list[str]
) -> tuple[bool, bool]:
    """(probe succeeded, write got EROFS)."""
    s, err = t.subject, out.write_error
    if not t.wants_write(cfg) or out.wrote:
        return True, False
    if err is None:  # the agent's own view is read-only, the host's is not
        b.finding(
            s, "InsufficientPrivilege",
            f"the agent sees {t.local} read-only while the host has it read-write (systemd ProtectSystem=/"
            "ReadOnlyPaths=, or a readOnly hostPath volume): the write probe needs it writable, or set write_probe = false",
        )
        notes.append("write probe not possible")
        return True, False
    if err.errno == errno.EROFS:
        b.finding(s, "DiskReadOnly", f"write probe in {t.local} failed: {errno_text(err)} (the mount table says rw)")
        return False, True
    if err.errno in PRIVILEGE_ERRNOS:
        b.finding(s, "InsufficientPrivilege", _privilege_text(t, err))
        notes.append("write probe not permitted")
    elif err.errno == errno.ENOSPC:
        if not raised & {"DiskFull", "InodesExhausted"}:
            b.finding(s, "DiskFull", f"write probe in {t.local} failed: {errno_text(err)}")
    else:
        b.finding(s, "DiskWriteFailed", f"write probe in {t.local} failed: {errno_text(err)}")
    return False, False


def _privilege_text(t: Target, err: OSError) -> str:
    head = f"write probe in {t.local}: {errno_text(err)}"
    if os.geteuid() != 0:
        return f"{head}; needs write access there (run as root; running as uid {os.geteuid()})"
    return (
        f"{head}; root was refused (NFS root_squash, an LSM policy, an immutable directory, or a dropped "
        "CAP_DAC_OVERRIDE): the write probe cannot tell whether it is writable"
    )


def _device(b: ObservationBuilder, t: Target, sign: DeviceSigns, notes: list[str]) -> None:
    s, dev = t.subject, sign.device.name
    if sign.ext4 is not None:
        _sample(b, "filesystem_errors_total", sign.ext4.count, t)
        last = _last_error(sign.ext4.last_function, sign.ext4.last_time)
        if sign.ext4.count:
            b.finding(s, "FilesystemErrors", f"ext4 on {dev} has recorded {sign.ext4.count} error(s) since its last fsck{last}")
            notes.append(f"{sign.ext4.count} fs errors")
        if sign.new_ext4_errors:
            b.finding(s, "FilesystemErrorsGrowing", f"{sign.new_ext4_errors} new ext4 error(s) on {dev} since the previous run{last}")
    if sign.scsi is not None:
        _sample(b, "device_io_errors_total", sign.scsi.io_errors, t)
        if sign.new_io_errors:
            b.finding(s, "DeviceIOErrors", f"{sign.new_io_errors} new I/O error(s) on the SCSI disk(s) under {dev} (ioerr_cnt)")
        if sign.scsi.offline:
            b.finding(s, "DeviceOffline", f"SCSI disk(s) {', '.join(sign.scsi.offline)} under {dev} are offline")
    if sign.io is not None:
        _sample(b, "io_in_progress", sign.io.in_flight, t)
        if sign.stalled_for is not None:
            b.finding(
                s, "DiskIOStalled",
                f"{sign.io.in_flight} I/O(s) in flight on {dev} and none completed in the last {sign.stalled_for:.0f}s",
            )


def _last_error(func: str, when: int) -> str:
    if not when:
        return ""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    return f" (last in {func} at {stamp})" if func else f" (last at {stamp})"
