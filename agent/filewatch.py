"""Reload when a config file changes on disk.

A ConfigMap or Secret mounted into a pod is a symlink into a ``..data``
directory that the kubelet swaps atomically for a new one when the object
changes (https://kubernetes.io/docs/concepts/configuration/configmap/#mounted-configmaps-are-updated-automatically):
the path stays, the file behind it is new. A `stat` through the symlink every
couple of seconds sees that (a new inode), as it sees a file edited in place
(a new size or mtime), at the cost of one system call per file. A change is
acted on once it has settled: the next look sees the same stamp, so a file
written in place (truncated, then written) is not read half-written.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Stamp = tuple[tuple[str, Any], ...]


def stamp(paths: tuple[str, ...]) -> Stamp:
    """What identifies the files' contents, cheaply: through symlinks, the
    device, inode, size and times, or the error that stat gave."""
    out: list[tuple[str, Any]] = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))
        except OSError as exc:
            out.append((path, exc.errno))
    return tuple(out)


class FileWatcher:
    """Calls `on_change` (from its own thread) when any of `paths()` changes."""

    def __init__(self, paths: Callable[[], tuple[str, ...]], on_change: Callable[[], None], interval: float = 2.0) -> None:
        self._paths = paths
        self._on_change = on_change
        self._interval = interval
        self._stop = threading.Event()
        self._last = stamp(paths())  # what the config was loaded from (or last reloaded)
        self._seen = self._last  # the previous look
        self._thread = threading.Thread(target=self._run, name="config-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.look()

    def look(self) -> bool:
        """One look at the files; True when it called `on_change`."""
        now = stamp(self._paths())
        settled, self._seen = now == self._seen, now
        if now == self._last or not settled:  # unchanged, or still changing: look again before reading it
            return False
        changed = [p for (p, a), (q, b) in zip(self._last, now) if p != q or a != b] or [p for p, _ in now]
        self._last = now
        log.info("%s changed on disk: reloading", ", ".join(changed))
        self._on_change()
        return True
