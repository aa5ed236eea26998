"""A probe stuck on a dead mount can neither keep the agent alive after SIGTERM
nor hold its state-dir lock (DESIGN rule 1); a restarted agent comes up on the
same state dir while the mount is still hung. The FUSE server of
tests/support/fuse_hang.py never answers statfs, as a dead NFS server would not."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from agentproc import Agent, wait_for
from fuse_hang import FuseHangProcess
from mountns import MountNamespace

from agent.disk.probes import nearest_existing
from agent.probeproc import IsolatedProber, WorkerGone

pytestmark = [pytest.mark.privileged, pytest.mark.timeout(180)]


@pytest.fixture
def dead(mount_ns: MountNamespace, tmp_path: Path) -> Iterator[FuseHangProcess]:
    if not Path("/dev/fuse").exists():
        pytest.fail("/dev/fuse is missing: the kernel needs CONFIG_FUSE_FS")
    mnt = tmp_path / "dead-nfs"
    mnt.mkdir()
    fs = FuseHangProcess(str(mnt), prefix=mount_ns.cmd([]))
    yield fs
    fs.close()


def lock_is_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def leader_state(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    return ""


def only_child(pid: int) -> int:
    [child] = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(child)


HOLDER = textwrap.dedent("""
    import fcntl, os, sys, threading
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Thread(target=os.statvfs, args=(sys.argv[2],), daemon=True).start()
    print("locked", flush=True)
    sys.stdin.readline()
    sys.exit(0)
""")


def test_kernel_a_thread_in_a_hung_call_keeps_an_exited_process_and_its_lock(mount_ns, dead, tmp_path) -> None:
    """Why probes cannot run in the agent's own threads: the main thread exits,
    but the process is not reaped and its files (the lock) are not released
    while another of its threads waits in the kernel on the dead mount."""
    lock = tmp_path / "agent.lock"
    proc = mount_ns.popen([sys.executable, "-c", HOLDER, str(lock), dead.mountpoint],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "locked"
        dead.wait_for(lambda line: line.startswith("hung statfs"), "the statfs")
        holder = only_child(proc.pid)  # below nsenter, which forked it into the PID namespace
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        wait_for(lambda: leader_state(holder) == "Z", what="the main thread to exit")
        assert proc.poll() is None, "the process has not gone away"
        assert not lock_is_free(lock), "its lock is still held"
    finally:
        dead.release(heal=True)  # the server answers: the stuck thread returns
    assert proc.wait(timeout=60) == 0
    assert lock_is_free(lock)


def test_hung_call_in_the_worker_is_reported_and_the_others_answer(mount_ns, dead, tmp_path) -> None:
    code = textwrap.dedent(f"""
        import json, os, sys
        from functools import partial
        from agent.probeproc import IsolatedProber
        from agent.disk.probes import probe
        p = IsolatedProber("test")
        out = []
        for key in ("dead", "dead", "tmp"):
            path = {dead.mountpoint!r} if key == "dead" else {str(tmp_path)!r}
            r = p.call(key, partial(probe, path, False, None), 0.5)
            out.append([key, r.hung_for is not None, r.error is None and r.value is not None])
        fds = os.listdir(f"/proc/{{p.worker_pid()}}/fd")
        links = [os.readlink(f"/proc/{{p.worker_pid()}}/fd/{{n}}") for n in fds if os.path.exists(f"/proc/{{p.worker_pid()}}/fd/{{n}}")]
        print(json.dumps({{"calls": out, "hung": p.hung(), "links": links}}), flush=True)
    """)
    fd = os.open(tmp_path / "agent.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)  # noqa: F841 - open while it runs
    res = mount_ns.run([sys.executable, "-c", code], timeout=60)
    got = json.loads(res.stdout)
    assert got["calls"] == [["dead", True, False], ["dead", True, False], ["tmp", False, True]]
    assert got["hung"] == ["dead"]
    assert dead.hung_count("statfs") == 1, "a hung key is not probed again"
    assert all(link.startswith(("pipe:", "/dev/null")) for link in got["links"]), got["links"]


def test_worker_answers_values_and_errors(tmp_path: Path) -> None:
    p = IsolatedProber("test")
    try:
        ok = p.call("a", partial(nearest_existing, str(tmp_path / "not" / "yet")), 10)
        assert ok.ok and ok.value == str(tmp_path)
        err = p.call("b", partial(os.statvfs, str(tmp_path / "missing")), 10)
        assert isinstance(err.error, FileNotFoundError) and err.error.filename == str(tmp_path / "missing")
    finally:
        p.close()


def test_a_worker_that_dies_is_reported_then_replaced(tmp_path: Path) -> None:
    p = IsolatedProber("test")
    try:
        assert p.call("a", partial(os.getpid), 10).ok
        first = p.worker_pid()
        assert first is not None and first != os.getpid()
        gone = p.call("kill", partial(os.kill, first, signal.SIGKILL), 10)
        assert isinstance(gone.error, WorkerGone)
        again = p.call("a", partial(os.getpid), 10)
        assert again.ok and again.value not in (first, os.getpid())
    finally:
        p.close()


DISK_ONLY = """
[checks.disk]
paths = {paths}
include_state_dir = false
write_probe = false
probe_timeout = "500ms"
interval = "1s"
[checks.network]
enabled = false
[checks.gpu]
enabled = false
[checks.burn]
enabled = false
"""


def test_sigterm_with_a_hung_mount_exits_and_a_restart_comes_up_at_once(mount_ns, dead, tmp_path) -> None:
    config = DISK_ONLY.format(paths=json.dumps([dead.mountpoint]))
    first = Agent(tmp_path, config, wrap=mount_ns.cmd([]))
    second = None
    try:
        first.wait_ready()
        wait_for(lambda: first.value("node_health_finding", subject=dead.mountpoint, reason="DiskProbeHung") == 1,
                 what="the hang finding")
        assert dead.hung_count("statfs") == 1
        first.signal(signal.SIGTERM)
        assert first.proc.wait(timeout=60) == 0, first.logs()  # a generous bound: it exits, not hangs
        assert dead.hung_count("statfs") == 1 and dead.proc.poll() is None, "the mount is still hung"
        assert lock_is_free(tmp_path / "state" / "agent.lock")

        second = Agent(tmp_path, config, wrap=mount_ns.cmd([]))
        second.wait_ready()  # came up on the same state dir: no "another agent holds its lock"
        assert second.value("node_health_check_runs_total", check="disk") is not None
        wait_for(lambda: second.value("node_health_finding", subject=dead.mountpoint, reason="DiskProbeHung") == 1,
                 what="the hang finding of the second agent")
        assert dead.hung_count("statfs") == 2, "its own worker's statfs hangs as well"
    finally:
        dead.close()  # unhang the abandoned workers before stopping anything
        first.stop()
        if second is not None:
            second.stop()


def test_without_a_worker_probes_still_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """Where no interpreter can be started (an unprivileged user below an unreadable
    directory), the probes run in this process, as before, and say so once."""
    monkeypatch.setattr("agent.probeproc._python", lambda: str(tmp_path / "no-python"))
    p = IsolatedProber("test")
    assert p.call("a", partial(nearest_existing, str(tmp_path)), 10).value == str(tmp_path)
    assert p.call("b", partial(nearest_existing, str(tmp_path)), 10).ok
    assert p.worker_pid() is None
    assert [r.getMessage() for r in caplog.records if "probe worker" in r.getMessage()] != []
    assert len([r for r in caplog.records if "probe worker" in r.getMessage()]) == 1
