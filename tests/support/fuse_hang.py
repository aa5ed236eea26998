"""A FUSE filesystem that never answers: statfs on it blocks like a dead NFS mount.

A tiny server speaking the FUSE kernel protocol on /dev/fuse directly
(include/uapi/linux/fuse.h): it answers FUSE_INIT, answers GETATTR for its
root, and leaves the operations in `hang` (by default only STATFS) without an
answer, so `statvfs()` of the mount point blocks until the server releases
it, aborts the connection, or dies. No libfuse needed.

Run it where the mount should exist (usually inside a private mount
namespace, see `mountns.py`), as a subprocess:

    python tests/support/fuse_hang.py MOUNTPOINT [--hang statfs,getattr]

It prints ``ready MAJOR:MINOR`` once mounted and ``hung OPNAME N`` each time it
leaves a request unanswered (N: how many of that op so far). Commands on
stdin: ``release`` answers every held request (statfs then returns, later
ones hang again), ``heal`` answers them and stops hanging, ``quit`` or end of
input unmounts and exits. Creating a file fails with ``--create-error``
(default EIO, a disk that fails writes; EROFS is an NFS export that went
read-only under a rw mount), so a write probe on it fails once statfs answers. `FuseHangProcess` drives that from a
test; `HangingFuse` is the server itself, for use in-process.

In a test (the `mount_ns` fixture is in conftest.py)::

    fs = FuseHangProcess(str(tmp_path / "dead"), prefix=mount_ns.cmd([]))
    agent = mount_ns.popen([sys.executable, "-m", "agent", "run", "--config", cfg, ...])
    ...  # the disk check's statfs of fs.mountpoint now blocks; fs.hung_count("statfs")
    fs.close()  # or fs.release(heal=True) to let it answer

A held request that the server has already read cannot be interrupted, not
even by SIGKILL: a process whose thread waits on it does not exit until the
request is answered (`release`) or the connection ends (`close`, or the
server dying with its namespace). Tear the FUSE server down before waiting
for the process under test to exit.

Teardown never leaves a hung mount behind: held requests are answered with
an error, the connection is aborted through /sys/fs/fuse/connections/N/abort
when fusectl is mounted, the mount is detached (``umount -l``), and closing
/dev/fuse ends the connection whatever happened before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

# Opcodes (include/uapi/linux/fuse.h)
LOOKUP, FORGET, GETATTR, STATFS, INIT, CREATE, INTERRUPT, DESTROY, BATCH_FORGET = 1, 2, 3, 17, 26, 35, 36, 38, 42
OPNAMES = {"lookup": LOOKUP, "getattr": GETATTR, "statfs": STATFS}
NO_REPLY = frozenset({FORGET, INTERRUPT, BATCH_FORGET})

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
INIT_IN = struct.Struct("<IIII")  # major, minor, max_readahead, flags
# major, minor, max_readahead, flags, max_background, congestion_threshold, max_write,
# time_gran, max_pages, map_alignment, flags2, unused[7]
INIT_OUT = struct.Struct("<IIIIHHIIHHI7I")
# fuse_attr_out: attr_valid, attr_valid_nsec, dummy, then fuse_attr: ino, size, blocks,
# atime, mtime, ctime, atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags
ATTR_OUT = struct.Struct("<QII6Q10I")
# fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6]
STATFS_OUT = struct.Struct("<5Q4I6I")

KERNEL_MAJOR, OUR_MINOR = 7, 31
READ_SIZE = 1 << 21  # at least FUSE_MIN_READ_BUFFER plus max_write
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class HangingFuse:
    """The server, mounted at `mountpoint` in the calling process's mount namespace."""

    def __init__(
        self,
        mountpoint: str,
        hang: frozenset[int] = frozenset({STATFS}),
        on_hang: Callable[[int, int], None] | None = None,
        create_error: int = errno.EIO,
    ) -> None:
        self.mountpoint = os.path.abspath(mountpoint)
        self.hang = hang
        self.create_error = create_error
        self.on_hang = on_hang  # called (opcode, count) from the server thread
        self.held: list[tuple[int, int]] = []  # (opcode, unique) left unanswered
        self.counts: dict[int, int] = {}
        self.device = ""  # "0:NN" once mounted
        self._lock = threading.Lock()
        self._fd = -1
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        opts = f"fd={self._fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()},allow_other"
        rc = _libc.mount(b"nha-fuse-hang", self.mountpoint.encode(), b"fuse", MS_NOSUID | MS_NODEV, opts.encode())
        if rc != 0:
            err = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(err, f"mount fuse at {self.mountpoint}: {os.strerror(err)}")
        self.device = _device_of(self.mountpoint)
        self._thread = threading.Thread(target=self._serve, name="fuse-hang", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ protocol

    def _serve(self) -> None:
        while True:
            try:
                req = os.read(self._fd, READ_SIZE)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue  # ENOENT: the request was interrupted before we read it
                return  # ENODEV/ECONNABORTED: unmounted or aborted
            if len(req) < IN_HEADER.size:
                continue
            _len, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(req)
            self._handle(opcode, unique, nodeid, req[IN_HEADER.size :])

    def _handle(self, opcode: int, unique: int, nodeid: int, body: bytes) -> None:
        if opcode in NO_REPLY:
            return
        if opcode == INIT:
            _major, minor, readahead, _flags = INIT_IN.unpack_from(body)
            self._reply(unique, 0, INIT_OUT.pack(KERNEL_MAJOR, min(minor, OUR_MINOR), readahead, 0, 16, 12, 4096, 1, 0, 0, 0, *[0] * 7))
            return
        if opcode in self.hang:
            with self._lock:
                self.held.append((opcode, unique))
                self.counts[opcode] = n = self.counts.get(opcode, 0) + 1
            if self.on_hang is not None:
                self.on_hang(opcode, n)
            return
        self._answer(opcode, unique, nodeid)

    def _answer(self, opcode: int, unique: int, nodeid: int) -> None:
        if opcode == GETATTR and nodeid == 1:
            attr = (1, 0, 0, 0, 0, 0, 0, 0, 0, 0o40755, 2, os.getuid(), os.getgid(), 0, 4096, 0)
            self._reply(unique, 0, ATTR_OUT.pack(1, 0, 0, *attr))
        elif opcode == STATFS:
            self._reply(unique, 0, STATFS_OUT.pack(1000, 500, 500, 100, 50, 4096, 255, 4096, 0, *[0] * 6))
        elif opcode == LOOKUP:
            self._reply(unique, -errno.ENOENT)
        elif opcode == CREATE:
            self._reply(unique, -self.create_error)  # a disk that fails writes, an NFS export that is ro…
        elif opcode == DESTROY:
            self._reply(unique, 0)
        else:
            self._reply(unique, -errno.ENOSYS)

    def _reply(self, unique: int, error: int, payload: bytes = b"") -> None:
        try:
            os.write(self._fd, OUT_HEADER.pack(OUT_HEADER.size + len(payload), error, unique) + payload)
        except OSError:
            pass  # ENOENT: the caller was interrupted and gave up on this request

    # ------------------------------------------------------------ control

    def release(self, error: int = 0, heal: bool = False) -> int:
        """Answer every held request (with `error`, e.g. -EIO, or a real answer);
        with `heal`, stop holding new ones too."""
        with self._lock:
            if heal:
                self.hang = frozenset()
            held, self.held = self.held, []
        for opcode, unique in held:
            if error:
                self._reply(unique, error)
            else:
                self._answer(opcode, unique, 1)
        return len(held)

    def close(self) -> None:
        """Unhang every caller and remove the mount; safe to call twice."""
        if self._fd < 0:
            return
        self.release(-errno.EIO)
        abort = f"/sys/fs/fuse/connections/{self.device.partition(':')[2]}/abort"
        if self.device and os.path.exists(abort):
            try:
                with open(abort, "w") as fh:
                    fh.write("1")
            except OSError:
                pass
        _libc.umount2(self.mountpoint.encode(), MNT_DETACH)
        if self._thread is not None:
            # With nothing held and the mount gone the connection ends and the
            # reader gets ENODEV; closing /dev/fuse below ends it in any case.
            self._thread.join(timeout=5)
        os.close(self._fd)
        self._fd = -1


def _device_of(mountpoint: str) -> str:
    """major:minor of the FUSE mount, from mountinfo (a stat would be answered by us)."""
    escaped = "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in mountpoint)
    device = ""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            f = line.split()
            if f[4] == escaped and line.split(" - ")[1].startswith("fuse"):
                device = f[2]  # the last one: the top of a stack of mounts there
    if not device:
        raise RuntimeError(f"{mountpoint}: FUSE mount not in /proc/self/mountinfo")
    return device


# ---------------------------------------------------------------- subprocess


def main(argv: Sequence[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Mount a FUSE filesystem that never answers some operations.")
    p.add_argument("mountpoint")
    p.add_argument("--hang", default="statfs", help="comma-separated: " + ",".join(OPNAMES))
    p.add_argument("--create-error", default="EIO", help="errno name file creation fails with (EIO, EROFS, EACCES)")
    args = p.parse_args(argv)
    hang = frozenset(OPNAMES[name.strip()] for name in args.hang.split(",") if name.strip())
    names = {v: k for k, v in OPNAMES.items()}

    def told(opcode: int, n: int) -> None:
        print(f"hung {names.get(opcode, opcode)} {n}", flush=True)

    fs = HangingFuse(args.mountpoint, hang, on_hang=told, create_error=getattr(errno, args.create_error))
    fs.start()
    print(f"ready {fs.device}", flush=True)
    try:
        for line in sys.stdin:
            if line.strip() in ("release", "heal"):
                print(f"released {fs.release(heal=line.strip() == 'heal')}", flush=True)
            elif line.strip() == "quit":
                break
    finally:
        fs.close()
    return 0


class FuseHangProcess:
    """Drives `main` in a subprocess; `prefix` enters a namespace (e.g. `MountNamespace.cmd([])`)."""

    def __init__(
        self, mountpoint: str, prefix: Sequence[str] = (), hang: str = "statfs", create_error: str = "EIO"
    ) -> None:
        self.mountpoint = mountpoint
        self.prefix = list(prefix)
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, os.path.abspath(__file__), mountpoint, "--hang", hang, "--create-error", create_error],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
        )
        self.device = ""
        self.hung: dict[str, int] = {}
        self._cond = threading.Condition()
        self._lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        first = self.wait_for(lambda line: line.startswith("ready "), "the FUSE mount")
        self.device = first.split()[1]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                if line.startswith("hung "):
                    _, op, n = line.split()
                    self.hung[op] = int(n)
                self._lines.append(line.strip())
                self._cond.notify_all()
        with self._cond:
            self._lines.append("<exit>")
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[str], bool], what: str, timeout: float = 30.0) -> str:
        """The first output line (since start) for which `pred` holds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = 0
            while True:
                for line in self._lines[seen:]:
                    if pred(line):
                        return line
                    if line == "<exit>":
                        err = self.proc.stderr.read() if self.proc.stderr else ""
                        raise RuntimeError(f"fuse_hang exited before {what}: {err.strip()}")
                seen = len(self._lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fuse_hang: no {what} in {timeout}s")
                self._cond.wait(left)

    def hung_count(self, op: str = "statfs") -> int:
        with self._cond:
            return self.hung.get(op, 0)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def release(self, heal: bool = False) -> None:
        """Answer the held requests; with `heal`, answer every later one too."""
        def released() -> int:
            return sum(1 for line in self._lines if line.startswith("released "))

        with self._cond:
            before = released()
        self.send("heal" if heal else "release")
        with self._cond:
            if not self._cond.wait_for(lambda: released() > before, 30):
                raise TimeoutError("fuse_hang did not answer the release")

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("quit")
                self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            # Normally already gone with the server; never leave a mount behind.
            subprocess.run([*self.prefix, "umount", "-l", self.mountpoint], capture_output=True, check=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
