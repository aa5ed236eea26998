"""The parsers against what a real kernel writes for unusual names (root: namespaces, mounts).

Mounts with every byte the kernel escapes, and with bytes it leaves raw, in a
private mount namespace; veth interfaces with unusual names in a network
namespace, their counters checked against sysfs. Everything a test makes has
a random name and goes away with its namespace.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_tool
from test_parsers_twins import twins

pytestmark = pytest.mark.privileged

# Runs in a child: a private mount namespace, tmpfs mounts on the given
# directories with the given sources, then its own mountinfo on stdout.
MOUNT_CHILD = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x20000, 0x4000, 0x40000
if libc.unshare(CLONE_NEWNS) or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None):
    sys.exit(f"unshare/mount: {os.strerror(ctypes.get_errno())}")
pairs = eval(sys.stdin.read())
for target, source in pairs:
    os.mkdir(target)
    if libc.mount(source, target, b"tmpfs", 0, b"size=1m"):
        sys.exit(f"mount {target!r}: {os.strerror(ctypes.get_errno())}")
sys.stdout.buffer.write(open("/proc/self/mountinfo", "rb").read())
"""

NAMES = [
    pytest.param(b"a b", b"src with spaces", id="spaces"),
    pytest.param(b"tab\there", b"s\tt", id="tab"),
    pytest.param(b"new\nline", b"n\nl", id="newline"),
    pytest.param(b"back\\slash", b"b\\s", id="backslash"),
    pytest.param(b"cr\rvt\x0bff\x0c", b"s\rc", id="raw-cr-vt-ff"),
    pytest.param(b"\\040literal", b"\\134", id="escape-lookalike"),
    pytest.param("utf8-\u00e9\u4e2d".encode(), "\u00e9".encode(), id="utf8"),
    pytest.param(b"latin1-\xe9\xff", b"\xe9", id="not-utf8"),
    pytest.param(b"-", b"-", id="dash"),
    pytest.param(b"empty-source", b"", id="empty-source"),
]


@pytest.mark.parametrize(("name", "source"), NAMES)
def test_mountinfo_names(tmp_path: Path, name: bytes, source: bytes) -> None:
    target = os.fsencode(tmp_path) + b"/" + name
    child = subprocess.run(
        [sys.executable, "-c", MOUNT_CHILD],
        input=repr([(target, source)]).encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr.decode(errors="replace")
    recs = [r for r in twins("mountinfo", child.stdout) if r.mount_point == os.fsdecode(target)]
    assert len(recs) == 1, "the mount is read back under its exact name"
    rec = recs[0]
    assert (rec.fstype, rec.source, rec.root) == ("tmpfs", source.decode("utf-8", "surrogateescape"), "/")
    assert rec.super_options.startswith("rw,size=1024k")
    assert rec.major == 0  # tmpfs has an anonymous device


@pytest.fixture()
def netns() -> Iterator[str]:
    ip = require_tool("ip")
    name = f"nha-parsers-{secrets.token_hex(4)}"
    subprocess.run([ip, "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run([ip, "netns", "del", name], check=False)


def in_ns(ns: str, *cmd: str | bytes) -> bytes:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, timeout=30).stdout


IFNAMES = [b"abcdefghijklmno", b"x@y.z-1_2", "d\u00e9v\u4e2d".encode(), b"enp65s0f1np1"]


def test_net_dev_names_and_counters_match_sysfs(netns: str) -> None:
    for ifname, peer in zip(IFNAMES[::2], IFNAMES[1::2]):
        in_ns(netns, "ip", "link", "add", "name", ifname, "type", "veth", "peer", "name", peer)
    in_ns(netns, "ip", "link", "set", "lo", "up")
    # some traffic on lo, so that the counters are not all 0
    in_ns(
        netns,
        sys.executable,
        "-c",
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); [s.sendto(b'x' * 999, ('127.0.0.1', 9)) for _ in range(7)]",
    )
    recs = {r.name: r for r in twins("net_dev", in_ns(netns, "cat", "/proc/net/dev"))}
    assert set(recs) == {"lo", *(n.decode("utf-8", "surrogateescape") for n in IFNAMES)}
    lo = recs["lo"]
    assert lo.tx_packets >= 7 and lo.tx_bytes >= 7 * 999
    sysfs = in_ns(netns, "sh", "-c", "cd /sys/class/net/lo/statistics && cat tx_packets tx_bytes rx_packets rx_bytes")
    assert [int(v) for v in sysfs.split()] == [lo.tx_packets, lo.tx_bytes, lo.rx_packets, lo.rx_bytes]
