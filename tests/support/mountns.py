"""A private mount namespace for tests: mounts made in it are invisible to the
rest of the machine and vanish with it.

The namespace is held open by a sleeping init (``unshare --mount
--propagation private --pid --fork --mount-proc``): it has its own pid
namespace too, so inside it ``/proc/1/mountinfo`` — what the disk check reads,
as node_exporter does — is the namespace's own table. Commands run inside
with `run`/`popen` (``nsenter --mount --pid``). `close` kills the init, which
kills everything still inside and releases every mount (a hung FUSE mount
included). The holder dies with the test process (PR_SET_PDEATHSIG), so a
crashed test leaves nothing behind either.

Python 3.11 has no os.unshare, and a multi-threaded process cannot unshare
its mount namespace anyway; the tests drive the agent inside instead.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any, Self

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class MountNamespace:
    def __init__(self) -> None:
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc", "--kill-child",
             "sleep", "infinity"],
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl, safe enough before exec
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # util-linux' unshare complains when its child is killed
        )
        self.pid = 0
        self.pid = self._wait_for_init()

    def _wait_for_init(self, timeout: float = 20.0) -> int:
        """The host pid of the namespace's init, once it runs `sleep` (mounts done)."""
        deadline = time.monotonic() + timeout
        children = f"/proc/{self._holder.pid}/task/{self._holder.pid}/children"
        while time.monotonic() < deadline:
            if self._holder.poll() is not None:
                raise RuntimeError(f"unshare exited with {self._holder.returncode}")
            try:
                with open(children) as fh:
                    pids = fh.read().split()
                if pids:
                    with open(f"/proc/{pids[0]}/comm") as fh:
                        if fh.read().strip() == "sleep":
                            return int(pids[0])
            except OSError:
                pass
            time.sleep(0.02)
        self.close()
        raise TimeoutError("the namespace's init did not start")

    def cmd(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", f"--target={self.pid}", "--mount", "--pid", "--", *argv]

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0, **kw: Any) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(self.cmd(argv), check=False, capture_output=True, text=True, timeout=timeout, **kw)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} (in the namespace) exited {res.returncode}: {res.stderr.strip()}")
        return res

    def popen(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(self.cmd(argv), text=True, **kw)

    def tmpfs(self, path: str | os.PathLike[str], options: str = "size=1m") -> str:
        """Mount a small tmpfs (source "nha-test-tmpfs") at `path`, made if missing."""
        os.makedirs(path, exist_ok=True)
        self.run(["mount", "-t", "tmpfs", "-o", options, "nha-test-tmpfs", os.fspath(path)])
        return os.fspath(path)

    def close(self) -> None:
        if self._holder.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL) if self.pid else self._holder.kill()
            except OSError:
                pass
            try:
                self._holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._holder.kill()
                self._holder.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
