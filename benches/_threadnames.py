"""Imported at start-up by `bench_cost.py` (as ``sitecustomize`` via PYTHONPATH): each Python thread
gives its name to its OS thread (prctl PR_SET_NAME, first 15 bytes), so that /proc/<pid>/task/*/comm
says which thread woke and used the CPU. Python 3.11 does not do this itself. Bench-only."""

from __future__ import annotations

import ctypes
import threading

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_NAME = 15
_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named(self: threading.Thread) -> None:
    try:
        _libc.prctl(_PR_SET_NAME, self.name.encode()[:15], 0, 0, 0)
    except Exception:  # noqa: BLE001 - naming is best effort
        pass
    _inner(self)


threading.Thread._bootstrap_inner = _named  # type: ignore[attr-defined]
