"""What the disk feature declares to the catalog: its reasons and metrics."""

from __future__ import annotations

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity

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

CATALOG = Catalog.declare(REASONS, METRICS)
