"""I/O error signs on fixture sysfs and diskstats: the mount's major:minor to
its block device (partitions, device-mapper), ext4 error counters, SCSI
ioerr_cnt and state, stalled in-flight I/O; counters compared per run."""

from __future__ import annotations

from pathlib import Path

import pytest
from disktree import HostTree, reasons, value

DEVICE_REASONS = {"FilesystemErrors", "FilesystemErrorsGrowing", "DeviceIOErrors", "DeviceOffline", "DiskIOStalled"}
SDA1 = (8, 1)


@pytest.fixture
def host(tmp_path: Path) -> HostTree:
    return HostTree(tmp_path)


def device_reasons(host: HostTree, check: object, path: str = "/data") -> set[str]:
    # The fixture's devices are not the one under the tmp dir: the check also
    # says it cannot see the host's filesystem there (MountNotVisible), which
    # these tests do not look at.
    return reasons(check.run(), path) & DEVICE_REASONS  # type: ignore[attr-defined]


def test_ext4_errors_recorded_then_growing(host: HostTree) -> None:
    sda = host.disk("sda")
    host.link(SDA1, host.partition(sda, "sda1"))
    host.mount("/data", dev=SDA1, source="/dev/sda1")
    host.ext4("sda1", 0)
    check = host.check(paths=("/data",))
    assert device_reasons(host, check) == set()

    host.ext4("sda1", 3, "ext4_lookup", 1700000000)
    obs = check.run()
    assert reasons(obs, "/data") & DEVICE_REASONS == {"FilesystemErrors", "FilesystemErrorsGrowing"}
    assert value(obs, "node_health_disk_filesystem_errors_total", "/data") == 3
    growing = next(f for f in obs.findings if f.reason == "FilesystemErrorsGrowing")
    assert growing.severity.value == "critical" and "ext4_lookup" in growing.message and "sda1" in growing.message

    assert device_reasons(host, check) == {"FilesystemErrors"}  # recorded, no longer growing
    host.ext4("sda1", 0)  # e2fsck cleared the record
    assert device_reasons(host, check) == set()


def test_errors_recorded_before_start_are_not_growing(host: HostTree) -> None:
    host.link(SDA1, host.partition(host.disk("sda"), "sda1"))
    host.mount("/data", dev=SDA1)
    host.ext4("sda1", 2)
    check = host.check(paths=("/data",))
    assert device_reasons(host, check) == {"FilesystemErrors"}


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        pytest.param(("0x2", "running"), ("0x2", "running"), set(), id="old errors only"),
        pytest.param(("0x2", "running"), ("0x1a", "running"), {"DeviceIOErrors"}, id="new I/O errors"),
        pytest.param(("0x2", "running"), ("0x2", "offline"), {"DeviceOffline"}, id="disk set offline"),
        pytest.param(("0x2", "running"), ("0x2", "blocked"), set(), id="blocked during error recovery"),
        pytest.param(("0x9", "running"), ("0x0", "running"), set(), id="counter reset by a re-probed disk"),
    ],
)
def test_scsi_disk_under_a_partition(host: HostTree, before, after, expected) -> None:
    sda = host.disk("sda", scsi=before)
    host.link(SDA1, host.partition(sda, "sda1"))
    host.mount("/data", dev=SDA1)
    check = host.check(paths=("/data",))
    assert device_reasons(host, check) == set()
    host.scsi(sda, *after)
    obs = check.run()
    assert reasons(obs, "/data") & DEVICE_REASONS == expected
    assert value(obs, "node_health_disk_device_io_errors_total", "/data") == int(after[0], 16)


def test_device_mapper_sums_the_disks_below(host: HostTree) -> None:
    """dm-0 (LVM) over sda1 and sdb: both SCSI disks count."""
    sda, sdb = host.disk("sda", scsi=("0x1", "running")), host.disk("sdb", scsi=("0x2", "running"))
    dm = host.mapper("dm-0", [host.partition(sda, "sda1"), sdb])
    host.link((253, 0), dm)
    host.mount("/data", dev=(253, 0), source="/dev/mapper/vg-data")
    host.ext4("dm-0", 0)
    check = host.check(paths=("/data",))
    obs = check.run()
    assert value(obs, "node_health_disk_device_io_errors_total", "/data") == 3
    assert value(obs, "node_health_disk_filesystem_errors_total", "/data") == 0
    host.scsi(sdb, "0x4", "running")
    assert device_reasons(host, check) == {"DeviceIOErrors"}


def test_virtio_disk_has_no_scsi_counters(host: HostTree) -> None:
    host.link((254, 0), host.disk("vda"))
    host.mount("/data", dev=(254, 0), source="/dev/vda")
    obs = host.check(paths=("/data",)).run()
    assert value(obs, "node_health_disk_device_io_errors_total", "/data") is None
    assert reasons(obs, "/data") & DEVICE_REASONS == set()


STALL = (SDA1, "sda1")


@pytest.mark.parametrize(
    ("first", "second", "stalled"),
    [
        pytest.param((100, 50, 3, 1000), (100, 50, 3, 3000), True, id="in flight, nothing completed, busy"),
        pytest.param((100, 50, 3, 1000), (101, 50, 3, 3000), False, id="a read completed"),
        pytest.param((100, 50, 3, 1000), (100, 50, 0, 3000), False, id="drained"),
        pytest.param((100, 50, 0, 1000), (100, 50, 2, 1000), False, id="idle before"),
        pytest.param((100, 50, 3, 1000), (100, 50, 3, 1000), False, id="io_ticks did not grow"),
    ],
)
def test_stalled_io(host: HostTree, first, second, stalled: bool) -> None:
    host.link(SDA1, host.partition(host.disk("sda"), "sda1"))
    host.mount("/data", dev=SDA1)
    check = host.check(paths=("/data",))
    host.diskstats((*STALL, *first))
    assert device_reasons(host, check) == set()  # one sample is not a stall
    host.diskstats((*STALL, *second))
    obs = check.run()
    assert (reasons(obs, "/data") & DEVICE_REASONS) == ({"DiskIOStalled"} if stalled else set())
    assert value(obs, "node_health_disk_io_in_progress", "/data") == second[2]
    host.diskstats((*STALL, second[0] + 1, second[1], 0, second[3] + 10))
    assert device_reasons(host, check) == set()  # completions again: cleared


def test_memory_holds_only_current_devices(host: HostTree) -> None:
    host.link(SDA1, host.partition(host.disk("sda"), "sda1"))
    host.mount("/data", dev=SDA1)
    host.ext4("sda1", 0)
    check = host.check(paths=("/data",))
    check.run()
    host.lines.clear()
    host.mount("/data", dev=(8, 33))  # remounted from another disk without sysfs entries
    check.run()
    assert check.monitor.devices._last == {}
