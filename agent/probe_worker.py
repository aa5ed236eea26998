"""The probe worker process of `agent.probeproc`: reads (id, function) frames on
stdin, runs each in a thread of its own and writes (id, ok, value or
exception) frames to stdout, until its stdin closes.

It imports only the standard library, so the process stays small (about 10 MB
of RSS); the functions it runs import what they need.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

LEN = struct.Struct("<I")
MAX_FRAME = 1 << 20


def read_frame(fh: IO[bytes]) -> bytes | None:
    head = read_exact(fh, LEN.size)
    if head is None:
        return None
    (n,) = LEN.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    body = read_exact(fh, n)
    if body is None:
        raise EOFError("cut short")
    return body


def read_exact(fh: IO[bytes], n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = fh.read(n - len(buf))
        if not chunk:
            if buf:
                raise EOFError("cut short")
            return None
        buf += chunk
    return buf


def serve() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C goes to the agent; we end with its pipe
    out_lock = threading.Lock()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def run(cid: int, fn: Callable[[], Any]) -> None:
        try:
            answer: tuple[int, bool, Any] = (cid, True, fn())
        except BaseException as exc:  # noqa: BLE001 - the caller's result
            answer = (cid, False, exc)
        try:
            data = pickle.dumps(answer)
        except Exception as exc:  # noqa: BLE001 - an unpicklable value or exception
            data = pickle.dumps((cid, False, RuntimeError(f"{type(exc).__name__}: {exc}")))
        with out_lock:
            stdout.write(LEN.pack(len(data)) + data)
            stdout.flush()

    while (frame := read_frame(stdin)) is not None:
        cid, fn = pickle.loads(frame)
        threading.Thread(target=run, args=(cid, fn), daemon=True).start()
    # End of input: the agent is gone or closed us. A thread still in a hung
    # call keeps this process until the call returns; nothing else waits on it.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(serve())
