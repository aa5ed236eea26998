"""The state directory: small JSON files written atomically, and the boot id.

Writes go to a temporary file in the same directory, are fsynced, renamed
over the old file and the directory is fsynced, so a crash leaves either the
old or the new content, never a torn file. A lock file keeps two agents from
sharing one state directory.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
from typing import Any

from .hostpaths import HostPaths, read_text

log = logging.getLogger(__name__)


class StateDirError(Exception):
    exit_code = 2  # the state dir must be mended: a restart cannot help


class StateDirLocked(StateDirError):
    """Another agent holds the lock; it may be stopping, so trying again can help."""

    exit_code = 3


class StateDir:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock_fd: int | None = None

    def ensure(self) -> None:
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StateDirError(f"state dir {self.path}: cannot create it: {exc.strerror}") from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise StateDirError(f"state dir {self.path}: not writable by this user")

    def lock(self) -> None:
        """Take the exclusive lock (held until the process exits)."""
        fd = os.open(os.path.join(self.path, "agent.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirLocked(f"state dir {self.path}: another agent holds its lock") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def write_json(self, name: str, data: Any) -> None:
        self.write_bytes(name, json.dumps(data, sort_keys=True, separators=(",", ":")).encode())

    def write_bytes(self, name: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=self.path)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.file(name))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def read_json(self, name: str) -> Any | None:
        """The stored value, or None when absent; a corrupt file is logged and treated as absent."""
        try:
            with open(self.file(name), "rb") as fh:
                return json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.error("state file %s is unreadable, ignoring it: %s", self.file(name), exc)
            return None


def boot_id(paths: HostPaths) -> str:
    """The kernel's id for this boot (changes on every reboot)."""
    return read_text(paths.proc("sys/kernel/random/boot_id"), "") or ""
