"""State dir (atomic writes, lock, corrupt files) and the sd_notify client."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from agent.hostpaths import HostPaths
from agent.sdnotify import Notifier
from agent.statedir import StateDir, StateDirError, StateFile, boot_id, obj

ANY_OBJECT = StateFile("findings.json", obj)


def test_atomic_write_leaves_no_temporary_files(tmp_path) -> None:
    sd = StateDir(str(tmp_path / "state"))
    sd.ensure()
    for i in range(20):
        sd.write_json("findings.json", {"n": i})
    assert sd.load(ANY_OBJECT) == {"n": 19}
    assert sorted(os.listdir(sd.path)) == ["findings.json"]
    assert oct(os.stat(sd.path).st_mode & 0o777) == "0o700"


def test_corrupt_file_reads_as_absent_and_is_set_aside(tmp_path, caplog) -> None:
    sd = StateDir(str(tmp_path))
    (tmp_path / "findings.json").write_bytes(b"{not json")
    assert sd.load(ANY_OBJECT) is None
    assert [p.name.startswith("findings.json.bad-") for p in tmp_path.iterdir()] == [True]
    assert sd.load(ANY_OBJECT) is None  # absent now
    assert "damaged" in caplog.text


def test_lock_is_exclusive(tmp_path) -> None:
    a, b = StateDir(str(tmp_path)), StateDir(str(tmp_path))
    a.lock()
    with pytest.raises(StateDirError, match="another agent"):
        b.lock()


def test_boot_id_from_procfs(tmp_path) -> None:
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("abc-123\n")
    assert boot_id(HostPaths(procfs=str(tmp_path))) == "abc-123"
    assert len(boot_id(HostPaths())) == 36


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_notify_messages_and_watchdog(tmp_path, abstract: bool) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"nha-test-{uuid.uuid4().hex}"
        sock.bind(b"\0" + name.encode())
        addr = "@" + name
    else:
        addr = str(tmp_path / "n.sock")
        sock.bind(addr)
    sock.settimeout(2)
    n = Notifier({"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())})
    assert n.enabled and n.watchdog_interval == 1.0
    n.ready("healthy")
    assert sock.recv(4096).decode().splitlines()[:2] == ["READY=1", "STATUS=healthy"]
    n.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    n.watchdog()  # within half the interval: no second ping
    n.status("healthy")  # unchanged: nothing sent
    n.status("warning: disk / DiskFull")
    assert sock.recv(4096) == b"STATUS=warning: disk / DiskFull"
    sock.close()


def test_watchdog_for_another_pid_is_ignored() -> None:
    n = Notifier({"NOTIFY_SOCKET": "/nonexistent", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval is None
    assert not Notifier({}).enabled
