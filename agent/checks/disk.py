"""Disk check: each configured mount point (and the filesystem that holds the
state dir) is mounted, writable, not read-only, has free space and inodes, and
shows no I/O error signs; a dead network mount cannot hang it.

statfs and the write probe run in the agent's probe worker process
(`agent.probeproc.IsolatedProber`) with a per-path `probe_timeout`: a path
whose probe hangs is reported (DiskProbeHung) and not probed again until that
call returns, while the other paths are reported in the same run; a probe
stuck in the kernel can neither keep the agent alive after SIGTERM nor hold
its state-dir lock. See docs/disk.md.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from ..catalog import MetricSpec, Reason
from ..config import CheckConfig, opt
from ..findings import Observation, ObservationBuilder, Severity
from ..hostpaths import read_bounded
from ..native import DiskStats, parse_diskstats
from ..probe import ProbeResult
from ..probeproc import IsolatedProber
from . import CheckContext, CheckSpec
from .disk_devices import DeviceSigns, DeviceTracker
from .disk_mounts import MountTable, mount_at, read_host_mounts
from .disk_probes import ProbeOutcome, probe
from .disk_report import report
from .disk_targets import Target, locate_state_fs

log = logging.getLogger(__name__)

_CRIT, _WARN = Severity.CRITICAL, Severity.WARNING


def _r(name: str, severity: Severity, summary: str, unknown: bool = False) -> Reason:
    return Reason(name, severity, summary, unknown=unknown, family="Disk")


REASONS: tuple[Reason, ...] = (
    _r("NotMounted", _CRIT, "A configured path is not a mount point in the host's mount table."),
    _r("DiskReadOnly", _CRIT, "The filesystem is mounted read-only, or a write to it failed with EROFS."),
    _r("DiskWriteFailed", _CRIT, "Creating, writing, fsyncing or removing the probe file failed (e.g. EIO)."),
    _r("DiskStatFailed", _CRIT, "statfs on the mount point failed (ENOTCONN of a dead FUSE daemon, ESTALE, EIO)."),
    _r("DiskFull", _CRIT, "Free space for ordinary users is below critical_free_percent (or a write got ENOSPC)."),
    _r("DiskSpaceLow", _WARN, "Free space for ordinary users is below warning_free_percent."),
    _r("InodesExhausted", _CRIT, "Free inodes are below inodes_critical_free_percent."),
    _r("InodesLow", _WARN, "Free inodes are below inodes_warning_free_percent."),
    _r("FilesystemErrors", _WARN, "The filesystem has recorded errors since its last fsck (ext4 errors_count)."),
    _r("FilesystemErrorsGrowing", _CRIT, "The filesystem recorded new errors since the previous run."),
    _r("DeviceIOErrors", _WARN, "A SCSI disk under the filesystem counted new I/O errors (ioerr_cnt) since the previous run."),
    _r("DeviceOffline", _CRIT, "A SCSI disk under the filesystem is offline (error handling gave up on it)."),
    _r("DiskIOStalled", _CRIT, "I/O was in flight on the device at two runs and none completed in between."),
    _r(
        "DiskProbeHung", _WARN,
        "statfs or the write probe has not returned within probe_timeout (a dead network mount?); "
        "the path is not probed again until it returns.",
        unknown=True,
    ),
    _r(
        "MountNotVisible", Severity.INFO,
        "The agent sees another filesystem at the path than the host has mounted there (a DaemonSet without "
        "mountPropagation: HostToContainer); its space and writability are not reported.",
        unknown=True,
    ),
)


def _m(name: str, help_: str, kind: str = "gauge") -> MetricSpec:
    return MetricSpec(f"node_health_disk_{name}", kind, help_, ("mountpoint",))  # type: ignore[arg-type]


METRICS: tuple[MetricSpec, ...] = (
    _m("mounted", "1 if the configured path is a mount point in the host's mount table."),
    _m("read_only", "1 if the filesystem is mounted read-only or a write got EROFS."),
    _m("size_bytes", "Filesystem size (statfs f_blocks * f_frsize)."),
    _m("free_bytes", "Free bytes, including the part reserved for root."),
    _m("available_bytes", "Bytes available to ordinary users (what df shows as Avail)."),
    _m("files", "Inodes in the filesystem (0: it has no fixed inode table)."),
    _m("files_free", "Free inodes."),
    _m("probe_success", "1 if statfs and the write probe (when it ran) succeeded; 0 if one failed or hung."),
    _m("probe_duration_seconds", "Time statfs and the write probe took."),
    _m("filesystem_errors_total", "Errors the filesystem recorded since its last fsck (ext4 errors_count).", "counter"),
    _m("device_io_errors_total", "I/O errors counted by the SCSI disks under the filesystem (ioerr_cnt).", "counter"),
    _m("io_in_progress", "I/Os in flight on the filesystem's block device (/proc/diskstats)."),
)


def _absolute(value: str) -> str | None:
    return None if value.startswith("/") else f'expected an absolute path, got "{value}"'


@dataclass(frozen=True)
class DiskConfig(CheckConfig):
    interval: float = opt(30.0, "Time between runs.", duration=True, min=1)
    paths: tuple[str, ...] = opt(("/",), "Mount points to check (host paths); each must be a mount point.", check=_absolute)
    include_state_dir: bool = opt(True, "Also check the filesystem that holds the agent's state dir.")
    write_probe: bool = opt(True, "Create, write, fsync and remove a small probe file on each filesystem.")
    warning_free_percent: float = opt(10.0, "Warn when free space (for ordinary users, as df) is below this.", min=0, max=100)
    critical_free_percent: float = opt(5.0, "Critical when free space is below this.", min=0, max=100)
    inodes_warning_free_percent: float = opt(10.0, "Warn when free inodes are below this.", min=0, max=100)
    inodes_critical_free_percent: float = opt(5.0, "Critical when free inodes are below this.", min=0, max=100)
    probe_timeout: float = opt(
        5.0, "Per path: statfs and the write probe taking longer are reported as DiskProbeHung.", duration=True, min=0.01
    )

    def validate(self) -> tuple[str, str] | None:
        for prefix in ("", "inodes_"):
            warn, crit = getattr(self, f"{prefix}warning_free_percent"), getattr(self, f"{prefix}critical_free_percent")
            if warn > 0 and crit > warn:  # a warning threshold of 0 is off: it orders nothing
                return f"{prefix}critical_free_percent", f"expected at most {prefix}warning_free_percent ({warn:g}), got {crit:g}"
        return None


# One prober for every DiskCheck: a config reload builds a new check, but a
# statfs that hung in the old one is still hung and must not be started twice.
PROBER = IsolatedProber("disk")


class DiskCheck:
    name = "disk"

    def __init__(self, ctx: CheckContext, cfg: DiskConfig) -> None:
        self.paths, self.cfg, self.state_dir = ctx.paths, cfg, ctx.state_dir
        # normpath keeps a leading "//" (POSIX leaves its meaning open); Linux does not care.
        self.configured = tuple(dict.fromkeys("/" + os.path.normpath(p).lstrip("/") for p in cfg.paths))
        self.devices = DeviceTracker(ctx.paths)
        self._fallback = ""  # why pid 1's mountinfo was not used, for logging once
        self._hung: set[str] = set()

    # ------------------------------------------------------------ subjects

    def _mounts(self) -> MountTable:
        table = read_host_mounts(self.paths)
        if table.fallback_reason != self._fallback:
            if table.fallback_reason:
                log.info("cannot read pid 1's mountinfo (%s): using %s", table.fallback_reason, table.source)
            self._fallback = table.fallback_reason
        return table

    def _targets(self, table: MountTable, b: ObservationBuilder | None) -> list[Target]:
        targets = [Target(p, self.paths.root(p), mount_at(table.entries, p)) for p in self.configured]
        if self.cfg.include_state_dir:
            state = locate_state_fs(self.state_dir, table, targets, self.paths, PROBER, self.cfg.probe_timeout, b)
            if state is not None:
                targets.append(state)
        return targets

    def known_findings(self) -> list[tuple[str, str]]:
        try:
            targets = self._targets(self._mounts(), None)
        except (OSError, ValueError):
            targets = [Target(p, p, None) for p in self.configured]
        return [
            (t.subject, r.name) for t in targets for r in REASONS if t.expect_mount or r.name != "NotMounted"
        ]

    # ------------------------------------------------------------ run

    def run(self) -> Observation:
        b = ObservationBuilder(self.name)
        table = self._mounts()
        targets = self._targets(table, b)
        results = self._probe_all(targets)
        signs = self._device_signs(targets)
        for t in targets:
            report(b, t, self.cfg, table.source, results.get(t.local), signs)
        return b.build()

    def _probe_all(self, targets: list[Target]) -> dict[str, ProbeResult[ProbeOutcome]]:
        """statfs and write probes of all paths at once: a run takes one
        probe_timeout at most, however many paths hang."""
        jobs = {
            t.local: partial(probe, t.local, t.wants_write(self.cfg), t.expected_device())
            for t in targets
            if t.mount is not None
        }
        if not jobs:
            return {}
        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="disk-probe-wait") as pool:
            futures = {k: pool.submit(PROBER.call, k, fn, self.cfg.probe_timeout) for k, fn in jobs.items()}
        results: dict[str, ProbeResult[ProbeOutcome]] = {k: f.result() for k, f in futures.items()}
        self._log_hung({k for k, r in results.items() if r.hung_for is not None})
        return results

    def _log_hung(self, hung: set[str]) -> None:
        for path in sorted(hung - self._hung):
            log.error("statfs/write probe of %s hung (over %gs): not probed again until it returns", path, self.cfg.probe_timeout)
        for path in sorted(self._hung - hung):
            log.info("probe of %s returned", path)
        self._hung = hung

    def _device_signs(self, targets: list[Target]) -> dict[tuple[int, int], DeviceSigns]:
        devices = {(t.mount.major, t.mount.minor) for t in targets if t.mount is not None and t.mount.major != 0}
        return self.devices.update(devices, self._diskstats() if devices else {})

    def _diskstats(self) -> dict[tuple[int, int], DiskStats]:
        try:
            rows = parse_diskstats(read_bounded(self.paths.proc("diskstats")))
        except (OSError, ValueError) as exc:
            log.debug("cannot read diskstats: %s", exc)
            return {}
        return {(s.major, s.minor): s for s in rows}


SPEC = CheckSpec(
    name="disk",
    summary="Filesystems: mounted, writable, free space and inodes, I/O errors.",
    config=DiskConfig,
    build=DiskCheck,
)
