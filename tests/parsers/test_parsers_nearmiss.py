"""Damaged and unusual lines: both parsers skip or keep the same ones, with the same values.

Each case names what the records must be (a short projection of them), so the
twins cannot agree on a wrong answer. Cases that once made them disagree, or
that once parsed wrong against the real kernel file, are marked "regression".
"""

from __future__ import annotations

import pytest
from test_parsers_twins import U64_MAX, twins

# A string with a NUL byte in it cannot cross the native boundary (strings are
# NUL-separated there): the Python twin answers, and `twins` checks that it did.
FALLS_BACK = pytest.mark.native_fallback

C16 = b"1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16"
HEADER = (
    b"Inter-|   Receive                                                |  Transmit\n"
    b" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
)


# fmt: off
NET_DEV = [
    pytest.param(HEADER, [], id="header-only"),
    pytest.param(b"", [], id="empty"),
    pytest.param(b"  eth0: " + C16, [("eth0", 1, 16)], id="no-trailing-newline"),
    pytest.param(b"  eth0: 1 2 3\n", [], id="truncated-line"),
    pytest.param(b"  eth0: " + C16[:-3] + b"\n", [], id="fifteen-counters"),
    pytest.param(b"  eth0: 1 2 x 4 5 6 7 8 9 10 11 12 13 14 15 16\n", [], id="non-numeric-field"),
    pytest.param(b"  eth0: +1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", [], id="plus-sign"),
    pytest.param(b"  eth0: -1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", [], id="minus-sign"),
    pytest.param(b"  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 1.5\n", [], id="decimal-point"),
    pytest.param(b"eth0: 18446744073709551616" + C16[1:] + b"\n", [], id="overflow-u64"),
    pytest.param(b"eth0: 18446744073709551615" + C16[1:] + b"\n", [("eth0", U64_MAX, 16)], id="u64-max"),
    pytest.param(b"eth0: 00000000000000000000000000042" + C16[1:] + b"\n", [("eth0", 42, 16)], id="leading-zeros"),
    pytest.param(b"eth0: " + b"9" * 5000 + C16[1:] + b"\n", [], id="regression-5000-digits"),
    pytest.param(b"eth0: " + b"0" * 5000 + b"7" + C16[1:] + b"\n", [("eth0", 7, 16)], id="regression-5000-zeros"),
    pytest.param(b"  eth0 " + C16 + b"\n", [], id="missing-colon"),
    pytest.param(b"  : " + C16 + b"\n", [], id="empty-name"),
    pytest.param(b"eth0: " + C16 + b" 17 x\n", [("eth0", 1, 16)], id="extra-fields-ignored"),
    pytest.param(b"\n\n  eth0: " + C16 + b"\n\n  eth1: " + C16 + b"\n\n", [("eth0", 1, 16), ("eth1", 1, 16)], id="blank-lines"),
    pytest.param(HEADER.replace(b"\n", b"\r\n") + b"  eth0: " + C16 + b"\r\n", [("eth0", 1, 16)], id="crlf"),
    pytest.param(b"  eth0:\x0b1\t2\x0c3\r4 5 6 7 8 9 10 11 12 13 14 15 16\n", [("eth0", 1, 16)], id="vertical-tab-and-friends"),
    pytest.param(b"enp65s0f1np1:123456789012 " + C16[2:] + b"\n", [("enp65s0f1np1", 123456789012, 16)], id="counter-touching-colon"),
    pytest.param(b"  et\xffh0: " + C16 + b"\n", [("et\udcffh0", 1, 16)], id="non-utf8-name"),
    pytest.param("  bré0: ".encode() + C16 + b"\n", [("bré0", 1, 16)], id="utf8-name"),
    pytest.param(b"  my nic: " + C16 + b"\n", [("my nic", 1, 16)], id="space-inside-name"),
    pytest.param(b"  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 \xd9\xa1\n", [], id="arabic-indic-digit"),
    pytest.param(b"  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 \xc2\xb2\n", [], id="superscript-two"),
    pytest.param(b"  et\x00h0: " + C16 + b"\n  eth1: " + C16 + b"\n", [("et\x00h0", 1, 16), ("eth1", 1, 16)], id="nul-in-name", marks=FALLS_BACK),
    pytest.param(b"  eth0: " + C16 + b" \x00\n", [("eth0", 1, 16)], id="nul-after-counters"),
    pytest.param(b"  eth0: " + C16 + b"\x00\n", [], id="nul-glued-to-last-counter"),
    pytest.param(b"a:b: " + C16 + b"\n", [], id="second-colon"),
    pytest.param(b"eth0:" + b" 1" * 16, [("eth0", 1, 1)], id="ends-right-after-last-digit"),
    pytest.param(b"eth0:" + b" 12345678901234567890" + b" 1" * 15, [("eth0", 12345678901234567890, 1)], id="twenty-digits"),
    pytest.param(b"eth0:" + b" 1234567890123456" * 16 + b"\n", [("eth0", 1234567890123456, 1234567890123456)], id="sixteen-digits"),
]
# fmt: on


@pytest.mark.parametrize(("data", "expected"), NET_DEV)
def test_net_dev(data: bytes, expected: list[tuple[str, int, int]]) -> None:
    assert [(r.name, r.rx_bytes, r.tx_compressed) for r in twins("net_dev", data)] == expected


S11 = b" 1 2 3 4 5 6 7 8 9 10 11"


# fmt: off
DISKSTATS = [
    pytest.param(b"   8       0 sda" + S11 + b"\n", [("sda", 8, 0, 11, 11, 0)], id="pre-4.18-11-stats"),
    pytest.param(b"   8       0 sda" + S11 + b" 12 13 14\n", [("sda", 8, 0, 14, 11, 0)], id="14-stats"),
    pytest.param(b"   8       0 sda" + S11 + b" 12 13 14 15\n", [("sda", 8, 0, 15, 11, 0)], id="4.18-15-stats"),
    pytest.param(b" 259       1 nvme0n1p1" + S11 + b" 12 13 14 15 16 17\n", [("nvme0n1p1", 259, 1, 17, 11, 17)], id="5.5-17-stats"),
    pytest.param(b"   8       0 sda" + S11 + b" 12 13 14 15 16 17 18 x\n", [("sda", 8, 0, 17, 11, 17)], id="extra-fields-ignored"),
    pytest.param(b"   8       0 sda" + S11[:-3] + b"\n", [], id="10-stats"),
    pytest.param(b" 259       0 nvme0n1 1 2 3\n", [], id="truncated-line"),
    pytest.param(b"   8       0\n", [], id="no-name"),
    pytest.param(b"   8\n", [], id="major-only"),
    pytest.param(b"  +8       0 sda" + S11 + b"\n", [], id="plus-major"),
    pytest.param(b"   8       x sda" + S11 + b"\n", [], id="non-numeric-minor"),
    pytest.param(b"   8       0 sda 1 2 3 x 5 6 7 8 9 10 11\n", [], id="non-numeric-stat"),
    pytest.param(b"   8       0 sda" + S11 + b" 12 13 14 15 16 x\n", [], id="non-numeric-16th-stat"),
    pytest.param(b"   8       0 sda 18446744073709551616" + S11[2:] + b"\n", [], id="overflow-u64"),
    pytest.param(b"   8       0 sda" + S11 + b" 18446744073709551615\n", [("sda", 8, 0, 12, 11, 0)], id="u64-max"),
    pytest.param(b"\n   8 0 sda" + S11 + b"\n\n 253 0 dm-0" + S11 + b"\n", [("sda", 8, 0, 11, 11, 0), ("dm-0", 253, 0, 11, 11, 0)], id="blank-lines"),
    pytest.param(b"   8       0 sda" + S11 + b"\r\n", [("sda", 8, 0, 11, 11, 0)], id="crlf"),
    pytest.param(b"   8\x0b0\x0bsda" + S11.replace(b" ", b"\x0b") + b"\n", [("sda", 8, 0, 11, 11, 0)], id="vertical-tabs"),
    pytest.param(b"   8       0 s\xe9a" + S11 + b"\n", [("s\udce9a", 8, 0, 11, 11, 0)], id="non-utf8-name"),
    pytest.param(b"   8       0 s\x00a" + S11 + b"\n", [("s\x00a", 8, 0, 11, 11, 0)], id="nul-in-name", marks=FALLS_BACK),
    pytest.param(b"   8       0 123" + S11 + b"\n", [("123", 8, 0, 11, 11, 0)], id="numeric-name"),
    pytest.param(b"   8       0 sda" + S11, [("sda", 8, 0, 11, 11, 0)], id="no-trailing-newline"),
    pytest.param(b"   8       0 sda" + b" 99999999999999999" * 17, [("sda", 8, 0, 17, 99999999999999999, 99999999999999999)], id="seventeen-digits"),
]
# fmt: on


@pytest.mark.parametrize(("data", "expected"), DISKSTATS)
def test_diskstats(data: bytes, expected: list[tuple[str, int, int, int, int, int]]) -> None:
    recs = twins("diskstats", data)
    assert [(r.name, r.major, r.minor, r.nfields, r.weighted_io_time_ms, r.flush_time_ms) for r in recs] == expected


M = b"36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"


# fmt: off
MOUNTINFO = [
    pytest.param(M + b"\n", [(36, "/mnt2", "master:1", "ext3", "/dev/root", "rw,errors=continue")], id="proc5-example"),
    pytest.param(M.replace(b" master:1", b""), [(36, "/mnt2", "", "ext3", "/dev/root", "rw,errors=continue")], id="no-optional-fields"),
    pytest.param(M.replace(b"master:1", b"shared:1 master:2"), [(36, "/mnt2", "shared:1 master:2", "ext3", "/dev/root", "rw,errors=continue")], id="two-optional-fields"),
    pytest.param(M.replace(b" - ", b" "), [], id="missing-separator"),
    pytest.param(M.replace(b"/dev/root rw,errors=continue", b"/dev/root"), [], id="no-super-options"),
    pytest.param(M.replace(b"/dev/root rw,errors=continue", b"/dev/root "), [(36, "/mnt2", "master:1", "ext3", "/dev/root", "")], id="empty-super-options"),
    pytest.param(M.replace(b"/dev/root", b""), [(36, "/mnt2", "master:1", "ext3", "", "rw,errors=continue")], id="regression-empty-source"),
    pytest.param(M.replace(b"/mnt2", b"/mnt\r2\x0b\x0c"), [(36, "/mnt\r2\x0b\x0c", "master:1", "ext3", "/dev/root", "rw,errors=continue")], id="regression-raw-cr-vt-ff-in-path"),
    pytest.param(M + b" x=a b", [(36, "/mnt2", "master:1", "ext3", "/dev/root", "rw,errors=continue x=a b")], id="regression-space-in-super-options"),
    pytest.param(M + b"\r\n", [(36, "/mnt2", "master:1", "ext3", "/dev/root", "rw,errors=continue\r")], id="crlf-kept-in-last-field"),
    pytest.param(M.replace(b"/mnt2", b"/a\\040b\\011c\\012d\\134e"), [(36, "/a b\tc\nd\\e", "master:1", "ext3", "/dev/root", "rw,errors=continue")], id="octal-escapes"),
    pytest.param(M.replace(b"/mnt2", b"/a\\400\\9\\04\\\\040"), [(36, "/a\\400\\9\\04\\ ", "master:1", "ext3", "/dev/root", "rw,errors=continue")], id="not-escapes"),
    pytest.param(M.replace(b"/mnt2", b"/a\\000b"), [(36, "/a\x00b", "master:1", "ext3", "/dev/root", "rw,errors=continue")], id="escaped-nul", marks=FALLS_BACK),
    pytest.param(M.replace(b"/mnt2", b"/a\x00b"), [(36, "/a\x00b", "master:1", "ext3", "/dev/root", "rw,errors=continue")], id="raw-nul", marks=FALLS_BACK),
    pytest.param(M.replace(b"/mnt2", b"/caf\xe9"), [(36, "/caf\udce9", "master:1", "ext3", "/dev/root", "rw,errors=continue")], id="non-utf8-path"),
    pytest.param(M.replace(b"36 35", b"+36 35"), [], id="plus-id"),
    pytest.param(M.replace(b"36 35", b"x 35"), [], id="non-numeric-id"),
    pytest.param(M.replace(b"98:0", b"98"), [], id="no-colon-in-dev"),
    pytest.param(M.replace(b"98:0", b"98:"), [], id="empty-minor"),
    pytest.param(M.replace(b"98:0", b"98:0:1"), [], id="two-colons-in-dev"),
    pytest.param(M.replace(b"36 35", b"18446744073709551616 35"), [], id="overflow-id"),
    pytest.param(M.replace(b"36 35", b"36  35"), [], id="double-space-in-fixed-fields"),
    pytest.param(M.replace(b" ", b"\t"), [], id="tab-separated"),
    pytest.param(b"36 35 98:0 /mnt1", [], id="truncated-line"),
    pytest.param(b"36 35 98:0 / - rw - ext4 src rw", [(36, "-", "", "ext4", "src", "rw")], id="mount-point-is-dash"),
    pytest.param(b"36 35 98:0 / /m - shared:1 - ext4 src rw", [(36, "/m", "shared:1", "ext4", "src", "rw")], id="options-field-is-dash"),
    pytest.param(b"\n" + M + b"\n\n" + M + b"\n", [(36, "/mnt2", "master:1", "ext3", "/dev/root", "rw,errors=continue")] * 2, id="blank-lines"),
]
# fmt: on


@pytest.mark.parametrize(("data", "expected"), MOUNTINFO)
def test_mountinfo(data: bytes, expected: list[tuple[int, str, str, str, str, str]]) -> None:
    recs = twins("mountinfo", data)
    assert [
        (r.mount_id, r.mount_point, r.optional_fields, r.fstype, r.source, r.super_options) for r in recs
    ] == expected
