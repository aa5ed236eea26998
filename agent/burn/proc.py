"""A child process the burn polls and may kill, never waits on.

It runs in its own session, so a kill reaches everything it started; stdout
lines go to a callback from a reader thread, the last lines of stderr are kept
for the message when it dies.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO

LINE_LIMIT = 1 << 16  # a longer line is split; neither stream can exhaust memory
STDERR_TAIL = 20


class Process:
    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None, on_line: Callable[[bytes], None]) -> None:
        self._on_line = on_line
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, on_line), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self._keep_stderr), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: IO[bytes], sink: Callable[[bytes], None]) -> None:
        for raw in iter(lambda: stream.readline(LINE_LIMIT), b""):
            sink(raw)

    def _keep_stderr(self, raw: bytes) -> None:
        self._stderr.append(raw.decode("utf-8", "replace").rstrip())

    def returncode(self) -> int | None:
        """The exit status once it has exited and its output is read; None while it runs."""
        code = self.proc.poll()
        if code is None:
            return None
        for t in self._readers:
            t.join(timeout=2.0)
        return code

    def stderr_tail(self, lines: int = 3) -> str:
        return " | ".join(line for line in list(self._stderr)[-lines:] if line)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def how_it_ended(self, code: int) -> str:
        return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
