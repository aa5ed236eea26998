"""Reading the real /dev/kmsg: records with sequence numbers and facilities,
the facility a process's write gets, and the privilege error when the agent
may not read it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from agent.kmsg import Kmsg, parse_record

# Real record prefixes (Documentation/ABI/testing/dev-kmsg: "prio,seq,usec,flags;"):
# prio = facility << 3 | level; the kernel's own printk is facility 0.
FACILITIES = [
    pytest.param(b"3,2045,191045112,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE", 0, True, id="kern.err (NVRM Xid)"),
    pytest.param(b"4,811,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", 0, True, id="kern.warning"),
    pytest.param(b"6,1,0,-;Linux version 6.18.44", 0, True, id="kern.info"),
    pytest.param(b"7,99,1,c;nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal", 0, True, id="kern.debug, continuation flag"),
    pytest.param(b"0,5,1,-,caller=T12;kernel panic", 0, True, id="kern.emerg with a caller field"),
    pytest.param(b"12,351,1009035642,-;NVRM: Xid (PCI:0000:3b:00): 79, forged", 1, False, id="user.warning: a plain write"),
    pytest.param(b"8,352,1009035654,-;NVRM: Xid (PCI:0000:3b:00): 79, forged", 1, False, id="user.emerg: <0> forced to user"),
    pytest.param(b"11,353,1009036509,-;NVRM: Xid (PCI:0000:3b:00): 79, forged", 1, False, id="user.err: <3> or <2051>"),
    pytest.param(b"30,356,1009050704,-;systemd[1]: Started foo.service.", 3, False, id="daemon.info: systemd"),
    pytest.param(b"2047,7,1,-;NVRM: Xid (PCI:0000:3b:00): 79, x", 255, False, id="the largest facility the kernel prints"),
    pytest.param(b"012,7,1,-;NVRM: Xid (PCI:0000:3b:00): 79, x", 1, False, id="near miss: leading zero is still user"),
    pytest.param(b"9,7,1,-;NVRM: Xid (PCI:0000:3b:00): 79, x", 1, False, id="near miss: user.alert, one above kern.debug"),
]


@pytest.mark.parametrize(("raw", "facility", "from_kernel"), FACILITIES)
def test_facility_of_real_records(raw: bytes, facility: int, from_kernel: bool) -> None:
    r = parse_record(raw + b"\n")
    assert (r.facility, r.from_kernel) == (facility, from_kernel)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, dmesg text", id="dmesg line"),
        pytest.param(b"-4,7,1,-;NVRM: x", id="negative priority"),
        pytest.param(b"4;NVRM: x", id="one field"),
        pytest.param(b"x4,7,1,-;NVRM: x", id="priority not a number"),
    ],
)
def test_lines_without_a_kmsg_prefix_state_no_facility(raw: bytes) -> None:
    r = parse_record(raw)
    assert (r.seq, r.facility, r.from_kernel) == (None, None, True)


def test_file_lines_read_fast_or_slow_give_the_records_of_parse_record(tmp_path) -> None:
    raws = [p.values[0] for p in FACILITIES]
    odd = [b"[ 12.5] NVRM: plain", b"4,8,x,-;usec not a number", b"4,99999999999999999999,1,-;seq past u64"]
    for name, lines in (("fast", raws), ("slow", raws + odd)):
        path = tmp_path / name
        path.write_bytes(b"".join(line + b"\n SUBSYSTEM=pci\n" for line in lines))
        k = Kmsg(str(path))
        try:
            assert list(k.read_available()) == [parse_record(line) for line in lines], name
        finally:
            k.close()


@pytest.mark.parametrize(
    ("raw", "seq", "usec", "message"),
    [
        pytest.param(b"6,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, x\n SUBSYSTEM=pci\n", 1234, 5678901, b"NVRM: Xid (PCI:0000:3b:00): 79, x", id="record with dictionary"),
        pytest.param(b"4,7,0,c,caller=T1;hello\n", 7, 0, b"hello", id="extra header fields"),
        pytest.param(b"[ 12.5] NVRM: plain dmesg\n", None, None, b"[ 12.5] NVRM: plain dmesg", id="not a kmsg record"),
    ],
)
def test_parse_record(raw: bytes, seq: int | None, usec: int | None, message: bytes) -> None:
    r = parse_record(raw)
    assert (r.seq, r.usec, r.message) == (seq, usec, message)


@pytest.mark.privileged
def test_real_dev_kmsg_records_have_increasing_sequence_numbers() -> None:
    marker = f"node-health-agent-test {uuid.uuid4()}"  # a harmless line: never an NVRM one on a shared host
    k = Kmsg("/dev/kmsg")
    try:
        assert k.records_mode
        backlog = list(k.read_available())
        assert backlog and all(r.seq is not None for r in backlog)
        seqs = [r.seq for r in backlog]
        assert seqs == sorted(seqs)
        with open("/dev/kmsg", "w") as fh:
            fh.write(marker + "\n")
        k.wait(2.0)
        new = list(k.read_available())
        mine = [r for r in new if r.message == marker.encode()]
        assert mine and mine[0].seq > seqs[-1]  # type: ignore[operator]
    finally:
        k.close()


@pytest.mark.privileged
def test_unreadable_log_says_which_privilege(tmp_path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    path.chmod(0o000)
    os.chmod(tmp_path, 0o755)
    code = (
        "import os\nfrom agent.kmsg import Kmsg, KmsgError\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"try:\n    Kmsg({str(path)!r})\nexcept KmsgError as e:\n    print(e.privilege, e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert res.stdout.startswith("True") and "CAP_SYSLOG" in res.stdout, res.stderr


@pytest.mark.privileged
def test_a_process_cannot_write_a_kernel_facility_record() -> None:
    """devkmsg_write() keeps facility 1 (user) unless a <N> prefix names a
    non-zero one; <0> and <2048> (facility 256, masked to 0) stay user."""
    with open("/proc/sys/kernel/printk_devkmsg") as fh:
        if fh.read().strip() == "off":
            pytest.skip("kernel.printk_devkmsg=off drops writes to /dev/kmsg")
    marker = f"node-health-agent-test {uuid.uuid4()}"  # harmless lines, never NVRM ones on a shared host
    prefixes = {"": 1, "<0>": 1, "<3>": 1, "<2048>": 1, "<30>": 3}
    k = Kmsg("/dev/kmsg")
    try:
        list(k.read_available())
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        try:
            for p in prefixes:
                os.write(fd, f"{p}{marker} {p or 'plain'}\n".encode())  # one write() is one record
        finally:
            os.close(fd)
        mine: dict[str, int | None] = {}
        while len(mine) < len(prefixes):
            k.wait(2.0)
            new = list(k.read_available())
            assert new, f"records not read back: {mine}"
            for r in new:
                if r.message.startswith(marker.encode()):
                    mine[r.message.decode().rsplit(" ", 1)[1]] = r.facility
        assert mine == {p or "plain": f for p, f in prefixes.items()}
    finally:
        k.close()
