"""Which filesystem each subject is: mountinfo on fixture trees (pid 1's table,
the fallback to the agent's own, host-root mapping, escapes, stacked mounts,
read-only flags, the state dir's filesystem)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from disktree import HostTree, reasons, value

from agent.checks.disk import REASONS
from agent.disk.probes import PROBE_PREFIX


@pytest.fixture
def host(tmp_path: Path) -> HostTree:
    return HostTree(tmp_path)


def test_mount_point_with_escaped_space(host: HostTree) -> None:
    host.mount("/", fstype="ext4", source="/dev/vda1")
    host.mount("/mnt/scratch disk", escaped="/mnt/scratch\\040disk", fstype="xfs", source="/dev/nvme0n1")
    obs = host.check(paths=("/mnt/scratch disk",)).run()
    assert reasons(obs, "/mnt/scratch disk") == set()
    assert obs.subjects["/mnt/scratch disk"].endswith("xfs on /dev/nvme0n1")
    assert value(obs, "node_health_disk_mounted", "/mnt/scratch disk") == 1


def test_detail_reads_like_df(host: HostTree) -> None:
    host.mount("/")
    obs = host.check(paths=("/",)).run()
    detail = obs.subjects["/"]
    assert "% used, " in detail and ("% inodes used" in detail or "no inode accounting" in detail)
    assert detail.endswith("ext4 on /dev/vda1")
    for name in ("size_bytes", "available_bytes", "free_bytes", "files", "files_free", "probe_success"):
        assert value(obs, f"node_health_disk_{name}", "/") is not None, name


@pytest.mark.parametrize(
    "configured",
    [pytest.param("/data", id="absent from mountinfo"), pytest.param("/data/sub", id="a directory inside a mount")],
)
def test_not_a_mount_point(host: HostTree, configured: str) -> None:
    host.mount("/")
    host.mount("/data")
    (host.root / "data" / "sub").mkdir(exist_ok=True)
    if configured == "/data":
        host.lines.pop()
        host.write_mountinfo()
    obs = host.check(paths=(configured,)).run()
    assert reasons(obs, configured) == {"NotMounted"}
    assert value(obs, "node_health_disk_mounted", configured) == 0
    assert value(obs, "node_health_disk_probe_success", configured) is None  # not probed: it would be the parent fs


@pytest.mark.parametrize(
    ("options", "super_options"),
    [
        pytest.param("ro,relatime", "rw", id="mount read-only"),
        pytest.param("rw,relatime", "ro,errors=remount-ro", id="filesystem remounted read-only after errors"),
    ],
)
def test_read_only_in_the_host_table(host: HostTree, options: str, super_options: str) -> None:
    host.mount("/data", options=options, super_options=super_options)
    obs = host.check(paths=("/data",)).run()
    assert reasons(obs, "/data") == {"DiskReadOnly"}
    assert value(obs, "node_health_disk_read_only", "/data") == 1
    assert not list((host.root / "data").iterdir())  # no write probe on a read-only mount


@pytest.mark.parametrize(
    ("lower", "upper", "expected"),
    [
        pytest.param("rw", "ro", {"DiskReadOnly"}, id="read-only mount on top"),
        pytest.param("ro", "rw", set(), id="writable mount on top of a read-only one"),
    ],
)
def test_stacked_mounts_the_top_one_counts(host: HostTree, lower: str, upper: str, expected: set[str]) -> None:
    first = host.mount("/data", options=lower)
    host.mount("/data", options=upper, parent=first)
    host.lines.reverse()  # the table's order must not matter, the parent links do
    host.write_mountinfo()
    assert reasons(host.check(paths=("/data",)).run(), "/data") == expected


def test_falls_back_to_own_mountinfo_mapped_to_host_paths(host: HostTree) -> None:
    """No pid 1 in procfs (hidepid, no hostPID): our own table, whose mount
    points are local paths under the host root; the container's own mounts
    (its /, /etc/hosts) are not the host's."""
    root = str(host.root)
    own = [
        "1 0 0:50 / / rw - overlay overlay rw",
        f"2 1 {host.dev[0]}:{host.dev[1]} / {root} ro,relatime - ext4 /dev/vda1 rw",
        f"3 1 {host.dev[0]}:{host.dev[1]} /data {root}/data rw,relatime - ext4 /dev/vda1 rw",
        "4 1 0:51 / /etc rw,relatime - tmpfs config-volume rw",
    ]
    (host.root / "data").mkdir()
    host.write_mountinfo("self", own)
    obs = host.check(paths=("/", "/data", "/etc")).run()
    assert reasons(obs, "/") == {"DiskReadOnly"}  # the host root is mounted ro into the container
    assert reasons(obs, "/data") == set()
    assert reasons(obs, "/etc") == {"NotMounted"}


def test_rootfs_maps_host_paths_for_the_probe(host: HostTree) -> None:
    host.mount("/var/lib/kubelet")
    obs = host.check(paths=("/var/lib/kubelet",)).run()
    local = os.statvfs(host.root / "var" / "lib" / "kubelet")
    assert value(obs, "node_health_disk_size_bytes", "/var/lib/kubelet") == local.f_blocks * local.f_frsize
    assert value(obs, "node_health_disk_probe_success", "/var/lib/kubelet") == 1


def test_another_filesystem_at_the_path_is_not_reported_as_the_hosts(host: HostTree) -> None:
    """The host mounted a disk at /data after the DaemonSet started without
    mountPropagation: the agent sees the root filesystem's empty directory."""
    host.mount("/data", dev=(8, 17), source="/dev/sdb1")
    obs = host.check(paths=("/data",)).run()
    assert reasons(obs, "/data") == {"MountNotVisible"}
    assert [f.unknown for f in obs.findings] == [True]
    assert value(obs, "node_health_disk_size_bytes", "/data") is None
    assert not list((host.root / "data").iterdir())


def test_host_mount_missing_from_the_agents_view(host: HostTree) -> None:
    host.mount("/data", local=False)
    obs = host.check(paths=("/data",)).run()
    assert reasons(obs, "/data") == {"MountNotVisible"}
    assert "the agent has no" in obs.findings[0].message


def test_duplicate_paths_are_one_subject(host: HostTree) -> None:
    host.mount("/data")
    obs = host.check(paths=("/data", "/data/", "//data")).run()
    assert list(obs.subjects) == ["/data"]
    assert len([s for s in obs.samples if s.name == "node_health_disk_mounted"]) == 1


def test_known_findings_cover_every_reason_per_path(host: HostTree) -> None:
    host.mount("/")
    host.mount("/data")
    known = set(host.check(paths=("/", "/data")).known_findings())
    assert known == {(p, r.name) for p in ("/", "/data") for r in REASONS}


# ---------------------------------------------------------------- state dir


def test_state_dir_on_a_configured_filesystem_is_not_a_second_subject(host: HostTree, tmp_path: Path) -> None:
    host.mount("/", dev=_real_dev_of(tmp_path))
    state = tmp_path / "state"
    state.mkdir()
    check = host.check(paths=("/",), include_state_dir=True, state_dir=str(state))
    assert list(check.run().subjects) == ["/"]


def test_state_dir_on_a_bind_mount_of_a_configured_filesystem(host: HostTree, tmp_path: Path) -> None:
    """The host mounts the state dir's filesystem at /hostfs and bind-mounts a
    part of it at /srv, which is configured: same filesystem, no second subject."""
    host.mount("/", dev=(0, 9999), fstype="overlay", source="overlay")
    host.mount("/hostfs", dev=_real_dev_of(tmp_path), local=False)
    host.mount("/srv", dev=_real_dev_of(tmp_path), root="/srv")
    check = host.check(paths=("/srv",), include_state_dir=True, state_dir=str(tmp_path))
    assert list(check.run().subjects) == ["/srv"]


@pytest.mark.parametrize("exists", [pytest.param(True, id="state dir exists"), pytest.param(False, id="not created yet")])
def test_state_dir_filesystem_is_named_by_the_hosts_mount(host: HostTree, tmp_path: Path, exists: bool) -> None:
    host.mount("/", dev=(0, 9999), fstype="overlay", source="overlay")  # some other filesystem
    host.mount("/var/lib/agent-host", dev=_real_dev_of(tmp_path), local=False)
    state = tmp_path / "state" / "nested"
    if exists:
        state.mkdir(parents=True)
    check = host.check(paths=("/",), include_state_dir=True, state_dir=str(state))
    obs = check.run()
    assert list(obs.subjects) == ["/", "/var/lib/agent-host"]
    assert "holds the state dir" in obs.subjects["/var/lib/agent-host"]
    assert reasons(obs, "/var/lib/agent-host") == set()
    known = {r for s, r in check.known_findings() if s == "/var/lib/agent-host"}
    assert "NotMounted" not in known and "DiskFull" in known
    if exists:
        assert not [p for p in state.iterdir() if p.name.startswith(PROBE_PREFIX)]


def _real_dev_of(path: Path) -> tuple[int, int]:
    """The device our own mount table gives for the filesystem holding `path`."""
    from agent.disk.mounts import containing, read_own_mounts

    m = containing(read_own_mounts(), os.path.realpath(path))
    assert m is not None
    return (m.major, m.minor)
