"""Native parsers and their Python twins give equal records on real and realistic input.

Every case runs both implementations and requires the same list of the same
record types with the same field types; most also pin what the records must
be, so the pair cannot agree on a wrong answer. Fixture files are in the
kernel's own printf formats (net/core/net-procfs.c, block/genhd.c,
fs/proc_namespace.c); near-misses are the ways a line can be damaged.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import native_loaded, native_vs_twin, skip_or_fail

from agent import native

FIXTURES = Path(__file__).parent.parent / "fixtures" / "parsers"
NATIVE = {"net_dev": native.parse_net_dev, "diskstats": native.parse_diskstats, "mountinfo": native.parse_mountinfo}
U64_MAX = (1 << 64) - 1


@pytest.fixture(autouse=True)
def _native_loaded() -> None:
    native_loaded()


def twins(kind: str, data: bytes) -> list[Any]:
    """Both implementations' records, required equal, the native ones made by
    the native code (no fallback to the twin unless a string holds a NUL byte);
    returns them."""
    return native_vs_twin(kind, data, NATIVE[kind])


# ---------------------------------------------------------------- fixture files


@pytest.mark.parametrize(
    ("kind", "name", "records"),
    [
        pytest.param("net_dev", "net_dev_64nics", 64, id="net_dev-64-nics"),
        pytest.param("diskstats", "diskstats_5.5_17fields", 64, id="diskstats-5.5"),
        pytest.param("diskstats", "diskstats_4.18_15fields", 64, id="diskstats-4.18"),
        pytest.param("diskstats", "diskstats_4.4_11fields", 64, id="diskstats-4.4"),
        pytest.param("mountinfo", "mountinfo_k8s_gpu_node", 501, id="mountinfo-k8s-gpu-node"),
    ],
)
def test_fixture_files(kind: str, name: str, records: int) -> None:
    assert len(twins(kind, (FIXTURES / name).read_bytes())) == records


def test_net_dev_fixture_values() -> None:
    recs = {r.name: r for r in twins("net_dev", (FIXTURES / "net_dev_64nics").read_bytes())}
    # a name longer than the %6s column runs into the first counter: "enp65s0f1np1:4113554843466978"
    assert tuple(recs["enp65s0f1np1"])[1:] == (
        4113554843466978, 647090584154, 0, 0, 0, 0, 0, 38866712348,
        381773903637386, 307634088346, 669, 0, 0, 0, 2207, 0,
    )  # fmt: skip
    assert {"lo", "ib0", "ib7", "bond0.100", "flannel.1", "vxlan.calico"} <= recs.keys()
    assert sum(n.startswith(("veth", "cali", "lxc")) for n in recs) > 20


@pytest.mark.parametrize(
    ("name", "nfields", "tail"),
    [
        pytest.param("diskstats_5.5_17fields", 17, (56480899, 51195, 693726, 25345), id="5.5-flushes"),
        pytest.param("diskstats_4.18_15fields", 15, (15348244, 67678, 0, 0), id="4.18-discards"),
        pytest.param("diskstats_4.4_11fields", 11, (0, 0, 0, 0), id="4.4-no-discards"),
    ],
)
def test_diskstats_fixture_versions(name: str, nfields: int, tail: tuple[int, ...]) -> None:
    recs = {r.name: r for r in twins("diskstats", (FIXTURES / name).read_bytes())}
    nvme = recs["nvme8n2"]
    assert (nvme.major, nvme.minor, nvme.nfields) == (259, 40, nfields)
    assert (nvme.sectors_discarded, nvme.discard_time_ms, nvme.flushes_completed, nvme.flush_time_ms) == tail
    assert {"dm-0", "md127", "nvme0n1p3", "sda2", "loop7", "sr0"} <= recs.keys()
    assert all(r.nfields == nfields for r in recs.values())


def test_mountinfo_fixture_values() -> None:
    recs = twins("mountinfo", (FIXTURES / "mountinfo_k8s_gpu_node").read_bytes())
    by_mp = {r.mount_point: r for r in recs}
    alice = by_mp["/home/alice/my data"]
    assert (alice.source, alice.fstype, alice.optional_fields) == (
        "alice@storage:/data set",
        "fuse.sshfs",
        "shared:90 master:2",
    )
    assert by_mp["/mnt/tab\tname"].optional_fields == ""
    assert by_mp["/mnt/new\nline"].optional_fields == "unbindable"
    assert by_mp["/mnt/back\\slash"].optional_fields == "master:7 propagate_from:3"
    assert by_mp["/mnt/bind of sub"].root == "/sub dir"
    assert by_mp["/mnt/empty-source"][-3:] == ("tmpfs", "", "rw,inode64")
    overlay = [r for r in recs if r.fstype == "overlay"]
    assert len(overlay) > 80 and all(r.super_options.startswith("rw,lowerdir=/var/lib/containerd/") for r in overlay)
    kubelet = [r for r in recs if r.mount_point.startswith("/var/lib/kubelet/pods/")]
    assert any("kubernetes.io~projected/kube-api-access-" in r.mount_point for r in kubelet)
    assert any(r.mount_point.endswith("/mount") and "kubernetes.io~csi/pvc-" in r.mount_point for r in kubelet)
    assert any(r.root.startswith("net:[") and r.fstype == "nsfs" for r in recs)
    assert (recs[0].mount_id, recs[0].parent_id, recs[0].major, recs[0].minor) == (21, 1, 259, 2)


# ---------------------------------------------------------------- this machine's /proc


def _readable(paths: list[str]) -> list[tuple[str, bytes]]:
    out = []
    for path in paths:
        try:
            out.append((path, Path(path).read_bytes()))
        except OSError:  # a process that exited, a file this kernel lacks
            continue
    return out


def test_real_net_dev() -> None:
    recs = twins("net_dev", Path("/proc/net/dev").read_bytes())
    assert "lo" in {r.name for r in recs}


def test_real_diskstats_match_sysfs() -> None:
    recs = twins("diskstats", Path("/proc/diskstats").read_bytes())
    if not recs:
        skip_or_fail("no block devices in /proc/diskstats")
    checked = 0
    for rec in recs:
        # the kernel's own "major:minor" for the device, read independently of both parsers
        dev = _readable([f"/sys/class/block/{rec.name.replace('/', '!')}/dev"])
        if dev:
            assert dev[0][1].decode().strip() == f"{rec.major}:{rec.minor}"
            checked += 1
    assert checked > 0


def test_real_mountinfo_of_every_process() -> None:
    files = _readable(["/proc/self/mountinfo", *sorted(glob.glob("/proc/[0-9]*/mountinfo"))])
    for _, data in files:
        twins("mountinfo", data)
    own = twins("mountinfo", files[0][1])
    assert any(r.mount_point == "/" for r in own)
    assert all(os.path.lexists(r.mount_point) for r in own if r.mount_point.startswith("/proc"))
    assert os.stat("/proc").st_dev in {os.makedev(r.major, r.minor) for r in own if r.mount_point == "/proc"}
