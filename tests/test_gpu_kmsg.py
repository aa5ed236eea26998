"""Reading the real /dev/kmsg: records with sequence numbers, and the
privilege error when the agent may not read it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from agent.gpu.kmsg import Kmsg, parse_record


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
        "import os\nfrom agent.gpu.kmsg import Kmsg, KmsgError\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"try:\n    Kmsg({str(path)!r})\nexcept KmsgError as e:\n    print(e.privilege, e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert res.stdout.startswith("True") and "CAP_SYSLOG" in res.stdout, res.stderr
