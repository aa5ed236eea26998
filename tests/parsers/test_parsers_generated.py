"""Generated input: the twins agree on anything, and both read back what the kernel writes.

Three kinds of generated input: arbitrary bytes; lines put together from the
pieces each format is made of (so that most are near-valid and reach deep
into the parsers); and kernel-formatted lines built from known values, where
both parsers must return exactly those values (an oracle of its own).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_parsers_twins import U64_MAX, twins

KINDS = ("net_dev", "diskstats", "mountinfo")
# NHA_FUZZ_EXAMPLES=5000 for a long hunt (docs/parsers-and-benches.md); the default keeps the suite quick
fuzz = settings(
    max_examples=int(os.environ.get("NHA_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Input that may put a NUL byte in a string: there (and only there, `twins`
# checks per call) the native parser hands the call to its Python twin.
FALLS_BACK_ON_NUL = pytest.mark.native_fallback

# ---------------------------------------------------------------- any bytes


@FALLS_BACK_ON_NUL
@fuzz
@given(st.binary(max_size=2048))
def test_arbitrary_bytes(data: bytes) -> None:
    for kind in KINDS:
        twins(kind, data)


PIECES = st.sampled_from(
    [b" ", b"  ", b"\t", b"\n", b"\r\n", b"\x0b", b"\x0c", b":", b"-", b" - ", b"\\", b"\\040", b"\\134", b"\\000",
     b"\\9", b"\x00", b"\xff", b"\xc3\xa9", b"0", b"1", b"42", b"18446744073709551615", b"18446744073709551616",
     b"+1", b"eth0", b"sda", b"/", b"/mnt", b"shared:1", b"master:2", b"98:0", b"tmpfs", b"rw,relatime"]
)  # fmt: skip


@FALLS_BACK_ON_NUL
@fuzz
@given(st.lists(PIECES, max_size=120).map(b"".join))
def test_format_pieces(data: bytes) -> None:
    for kind in KINDS:
        twins(kind, data)


# ---------------------------------------------------------------- near-valid lines

NUMBER = st.one_of(
    st.integers(0, U64_MAX).map(lambda n: str(n).encode()),
    st.integers(0, 300).map(lambda n: str(n).encode()),
    st.integers(U64_MAX - 3, U64_MAX).map(lambda n: str(n).encode()),
    st.tuples(st.integers(0, 25), st.integers(0, 10**6)).map(lambda t: b"0" * t[0] + str(t[1]).encode()),
)
BAD_NUMBER = st.sampled_from(
    [b"", b"+1", b"-1", b"1x", b"x", b"\xd9\xa1", b"1.0", b"\x00", b"0x10", b"18446744073709551616", b"9" * 30]
)
BLANK = st.sampled_from([b" ", b" ", b" ", b"  ", b"        ", b"\t", b"\x0b", b"\x0c", b"\r"])
NAME = st.one_of(
    st.sampled_from([b"eth0", b"enp65s0f1np1", b"ib0", b"veth1a2b3c4", b"lo", b"sda", b"nvme0n1p1", b"dm-0", b"md127"]),
    st.binary(max_size=16),
)
EOL = st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b"\n\n"])


@st.composite
def numbers(draw: st.DrawFn, min_size: int, max_size: int) -> bytes:
    """Blank-separated numbers; one time in three, one of them is damaged."""
    values = draw(st.lists(NUMBER, min_size=min_size, max_size=max_size))
    if values and draw(st.integers(0, 2)) == 0:
        values[draw(st.integers(0, len(values) - 1))] = draw(BAD_NUMBER)
    return b"".join(draw(BLANK) + v for v in values)


@st.composite
def net_dev_lines(draw: st.DrawFn) -> bytes:
    out = []
    for _ in range(draw(st.integers(1, 4))):
        colon = draw(st.sampled_from([b":", b":", b":", b": ", b" :", b"", b"::"]))
        out.append(draw(BLANK) + draw(NAME) + colon + draw(numbers(14, 18)) + draw(EOL))
    return b"".join(out)


@st.composite
def diskstats_lines(draw: st.DrawFn) -> bytes:
    out = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from([b" ", b"\t"])) + draw(NAME)
        out.append(draw(numbers(1, 2)) + name + draw(numbers(9, 19)) + draw(EOL))
    return b"".join(out)


PATH = st.one_of(
    st.sampled_from([b"/", b"/proc", b"/a\\040b", b"/x\\011y\\012z\\134", b"net:[4026531840]", b"-", b""]),
    st.binary(max_size=24).map(lambda b: b"/" + b),
)
OPTIONAL = st.lists(
    st.sampled_from([b"shared:1", b"master:2", b"propagate_from:3", b"unbindable", b"", b"-x"]), max_size=3
)


@st.composite
def mountinfo_lines(draw: st.DrawFn) -> bytes:
    out = []
    for _ in range(draw(st.integers(1, 4))):
        dev = draw(NUMBER) + draw(st.sampled_from([b":", b":", b":", b"", b"::"])) + draw(NUMBER)
        fields = [
            draw(NUMBER),
            draw(NUMBER),
            dev,
            draw(PATH),
            draw(PATH),
            draw(st.sampled_from([b"rw", b"ro,noatime", b"-"])),
        ]
        fields += draw(OPTIONAL) + draw(st.sampled_from([[b"-"], [b"-"], [b"-"], [], [b"--"]]))
        fields += draw(st.lists(st.one_of(PATH, st.sampled_from([b"ext4", b"tmpfs", b"rw,a=b c"])), max_size=5))
        seps = [b" "] * len(fields)
        if draw(st.integers(0, 2)) == 0:
            seps[draw(st.integers(0, len(seps) - 1))] = draw(st.sampled_from([b"  ", b"\t", b""]))
        out.append(b"".join(f + s for f, s in zip(fields, seps)).rstrip(b" ") + draw(EOL))
    return b"".join(out)


@FALLS_BACK_ON_NUL
@fuzz
@given(net_dev_lines())
def test_net_dev_near_valid(data: bytes) -> None:
    twins("net_dev", data)


@FALLS_BACK_ON_NUL
@fuzz
@given(diskstats_lines())
def test_diskstats_near_valid(data: bytes) -> None:
    twins("diskstats", data)


@FALLS_BACK_ON_NUL
@fuzz
@given(mountinfo_lines())
def test_mountinfo_near_valid(data: bytes) -> None:
    twins("mountinfo", data)


# ---------------------------------------------------------------- kernel-formatted lines, known values

U64 = st.integers(0, U64_MAX)
# dev_valid_name (net/core/dev.c): 1-15 bytes, no '/', ':' or whitespace, not "." or ".."
IFNAME = st.binary(min_size=1, max_size=15).filter(
    lambda n: n not in (b".", b"..") and not any(c in b"/: \t\n\x0b\x0c\r\xa0" for c in n) and b"\x00" not in n
)


@fuzz
@given(st.lists(st.tuples(IFNAME, st.lists(U64, min_size=16, max_size=16)), max_size=8))
def test_net_dev_kernel_format(nics: list[tuple[bytes, list[int]]]) -> None:
    fmt = b"%6s:%8d %7d %4d %4d %4d %5d %10d %9d %8d %7d %4d %4d %4d %5d %7d %10d\n"
    data = b"Inter-|   Receive\n face |bytes\n" + b"".join(fmt % (name, *vals) for name, vals in nics)
    expected = [(name.decode("utf-8", "surrogateescape"), *vals) for name, vals in nics]
    assert [tuple(r) for r in twins("net_dev", data)] == expected


DISKNAME = st.binary(min_size=1, max_size=32).filter(lambda n: not any(c in b" \t\n\x0b\x0c\r\x00" for c in n))


@fuzz
@given(
    st.lists(
        st.tuples(
            st.integers(0, 4095),
            st.integers(0, 2**20 - 1),
            DISKNAME,
            st.sampled_from([11, 15, 17]),
            st.lists(U64, min_size=17, max_size=17),
        ),
        max_size=8,
    )
)
def test_diskstats_kernel_format(disks: list[tuple[int, int, bytes, int, list[int]]]) -> None:
    data = b"".join(
        b"%4d %7d %s " % (ma, mi, name) + b" ".join(b"%d" % v for v in vals[:n]) + b"\n"
        for ma, mi, name, n, vals in disks
    )
    expected = [
        (name.decode("utf-8", "surrogateescape"), ma, mi, n, *vals[:n], *[0] * (17 - n))
        for ma, mi, name, n, vals in disks
    ]
    assert [tuple(r) for r in twins("diskstats", data)] == expected


def mangle(raw: bytes) -> bytes:
    """The kernel's escaping of paths and sources in mountinfo (seq_file mangle: space, tab, newline, backslash)."""
    return b"".join(b"\\%03o" % c if c in b" \t\n\\" else bytes((c,)) for c in raw)


TEXT = st.binary(min_size=1, max_size=40).filter(lambda b: b"\x00" not in b)


@fuzz
@given(st.lists(st.tuples(st.integers(0, 2**31), TEXT, TEXT), max_size=6))
def test_mountinfo_kernel_format(mounts: list[tuple[int, bytes, bytes]]) -> None:
    line = b"%d 1 0:%d / /%s rw,relatime shared:%d - tmpfs %s rw,size=%dk\n"
    data = b"".join(line % (i, i, mangle(mp), i, mangle(src), i) for i, mp, src in mounts)
    expected = [(i, "/" + os.fsdecode(mp), f"shared:{i}", os.fsdecode(src), f"rw,size={i}k") for i, mp, src in mounts]
    got = twins("mountinfo", data)
    assert [(r.mount_id, r.mount_point, r.optional_fields, r.source, r.super_options) for r in got] == expected
