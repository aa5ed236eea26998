"""Filesystem probes in a child process that the agent can leave behind.

A thread that calls statfs, stat or write on a mount whose server stopped
answering (NFS, FUSE) sleeps in the kernel uninterruptibly (D state), and
SIGKILL cannot wake it. In the agent's own process such a thread keeps the
whole process from going away: exit_group kills every other thread, but the
process is only reaped, and its file table (the state-dir lock with it) only
released, when the last thread has left the kernel. So a hung probe would keep
the agent alive after SIGTERM and keep a restarted agent out of its state dir
until the mount recovers (tests/test_probe_isolation.py shows it on a real
FUSE mount).

These calls therefore run in one small long-lived worker process per agent
(`python -m agent.probe_worker`), one thread per call inside it, so one hung path
does not delay the others. The worker is started by exec with close_fds (and
the lock is O_CLOEXEC), so it never holds the state-dir lock; it ends when its
stdin closes, which happens when the agent exits whatever state it is in. A
worker stuck in a hung call lingers as its own process until the mount answers
or goes away, holding nothing of the agent's.

`IsolatedProber.call` has the semantics of `agent.probe.Prober.call`: a call
that does not return within its timeout is reported as hung, and the same key
is not probed again until it returns. The function must be picklable (a
module-level function or a `functools.partial` of one) from a module that is
cheap to import: the worker imports only what it is asked to run.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from .probe import PendingCall, Prober, ProbeResult
from .probe_worker import LEN, read_frame

log = logging.getLogger(__name__)

T = TypeVar("T")


def _python() -> str:
    """This interpreter. sys.executable is empty when Python could not resolve its
    own path (an unprivileged user below a directory it cannot read)."""
    return sys.executable or os.readlink("/proc/self/exe")


def _env() -> dict[str, str]:
    """The worker imports the same `agent` as this process, however it was found."""
    path = [os.path.abspath(p or os.curdir) for p in sys.path]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(path)))


class WorkerGone(RuntimeError):
    """The probe worker process exited (or could not start) before answering."""


class _Worker:
    """One worker process and the thread that reads its answers."""

    def __init__(self, name: str) -> None:
        # exec with close_fds: nothing of the agent's is inherited, not even its stderr
        # (a worker left in a hung call must not hold the agent's log stream open).
        self.proc = subprocess.Popen(
            [_python(), "-S", "-m", "agent.probe_worker", name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True, bufsize=0,
            env=_env(),
        )
        self.calls: dict[int, PendingCall] = {}
        self.lock = threading.Lock()
        self.alive = True
        threading.Thread(target=self._read, name=f"probeproc-{name}", daemon=True).start()

    def send(self, cid: int, call: PendingCall, fn: Callable[[], Any]) -> None:
        data = pickle.dumps((cid, fn))
        with self.lock:
            if not self.alive:
                raise WorkerGone("the probe worker has exited")
            self.calls[cid] = call
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(LEN.pack(len(data)) + data)
            except OSError:
                del self.calls[cid]
                self.alive = False
                raise WorkerGone("the probe worker has exited") from None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while (frame := read_frame(self.proc.stdout)) is not None:
                cid, ok, payload = pickle.loads(frame)
                with self.lock:
                    call = self.calls.pop(cid, None)
                if call is not None:
                    call.finish(payload if ok else None, None if ok else payload)
        except (OSError, pickle.UnpicklingError, ValueError, EOFError) as exc:
            log.error("probe worker %d: unreadable answer: %s", self.proc.pid, exc)
        with self.lock:
            self.alive = False
            pending, self.calls = self.calls, {}
        for call in pending.values():
            call.finish(error=WorkerGone(f"the probe worker exited (status {self.proc.poll()})"))
        self.proc.wait()

    def close(self) -> None:
        with self.lock:
            self.alive = False
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the worker exits at end of input
        except OSError:
            pass


class IsolatedProber:
    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._calls = Prober(name)  # the calls sent to the worker, and which of them hang
        self._worker: _Worker | None = None
        self._ids = itertools.count(1)
        self._fallback: Prober | None = None

    def _running(self) -> _Worker | None:
        """The worker, started if needed; None when none can be started (then
        probes run in this process's threads, as a last resort)."""
        with self._lock:
            if self._fallback is not None:
                return None
            if self._worker is None or not self._worker.alive:
                try:
                    self._worker = _Worker(self.name)
                except OSError as exc:
                    log.warning("cannot start the %s probe worker (%s): its probes run in the agent's own threads, "
                                "where one hung in the kernel keeps the agent from exiting", self.name, exc)
                    self._fallback = Prober(self.name)
                    return None
            return self._worker

    def call(self, key: Hashable, fn: Callable[[], T], timeout: float) -> ProbeResult[T]:
        worker = self._running()
        if worker is None:
            assert self._fallback is not None
            return self._fallback.call(key, fn, timeout)

        def start(call: PendingCall) -> None:
            try:
                worker.send(next(self._ids), call, fn)
            except (OSError, WorkerGone) as exc:
                call.finish(error=exc)

        return self._calls.run(key, start, timeout)

    def hung(self) -> list[Hashable]:
        return self._calls.hung() + (self._fallback.hung() if self._fallback is not None else [])

    def worker_pid(self) -> int | None:
        with self._lock:
            return self._worker.proc.pid if self._worker is not None and self._worker.alive else None

    def close(self) -> None:
        """Let the worker go (it exits once its calls are answered or at once if none hangs)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()
