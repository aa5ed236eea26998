"""The state directory: small JSON files written atomically, and the boot id.

Writes go to a temporary file in the same directory, are fsynced, renamed
over the old file and the directory is fsynced, so a crash leaves either the
old or the new content, never a torn file. A lock file keeps two agents from
sharing one state directory.

Every file is read back through one loader, `StateDir.load`, with the
`StateFile` that declares its shape. A file that is empty, cut short, not
UTF-8 JSON, or JSON of another shape (a list where an object is expected, a
field of the wrong type) is damaged: it is set aside as
``<name>.bad-<UTC time>`` (renamed, not deleted, so it can be inspected; the
newest `KEEP_BAD` per file are kept), named in one log line, counted in
``node_health_state_file_rejected_total{file}``, and that part of the state
starts fresh. A damaged file can never crash the agent.

A **read-only** `StateDir` (``StateDir(path, read_only=True)``, or every one
of the process after `read_only_process()`: `agent remediation status`,
`agent selftest`) never creates, renames, moves or writes anything: a damaged
file is left where it is (and said so, in `problems`), a write is dropped.
The running agent's files are byte-identical after such a command.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .hostpaths import HostPaths, read_text

log = logging.getLogger(__name__)

T = TypeVar("T")
KEEP_BAD = 5  # set-aside copies kept per state file: a bug that writes bad files cannot fill the disk


class StateDirError(Exception):
    exit_code = 2  # the state dir must be mended: a restart cannot help


class StateDirLocked(StateDirError):
    """Another agent holds the lock; it may be stopping, so trying again can help."""

    exit_code = 3


_read_only_process = False


def read_only_process() -> None:
    """Every `StateDir` made from now on in this process is read-only (a read-only command)."""
    global _read_only_process
    _read_only_process = True


class StateDir:
    def __init__(self, path: str, *, read_only: bool | None = None) -> None:
        self.path = path
        self.read_only = _read_only_process if read_only is None else read_only
        self._lock_fd: int | None = None
        self.problems: dict[str, str] = {}  # file name -> why its last load found nothing usable

    def ensure(self) -> None:
        if self.read_only:
            return
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StateDirError(f"state dir {self.path}: cannot create it: {exc.strerror}") from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise StateDirError(f"state dir {self.path}: not writable by this user")

    def lock(self) -> None:
        """Take the exclusive lock (held until the process exits)."""
        if self.read_only:
            raise StateDirError(f"state dir {self.path}: opened read-only, never locked")
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
        if self.read_only:
            log.debug("read-only state dir %s: %s not written", self.path, name)
            return
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

    def remove(self, name: str) -> None:
        """Delete a file of the state dir (absent: nothing to do); read-only: nothing."""
        if self.read_only:
            return
        try:
            os.unlink(self.file(name))
        except FileNotFoundError:
            pass

    def load(self, spec: StateFile[T]) -> T | None:
        """The stored value as `spec` reads it, or None when the file is absent,
        unreadable (EACCES, EIO: left where it is) or damaged (set aside)."""
        path = self.file(spec.name)
        self.problems.pop(spec.name, None)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.problems[spec.name] = f"unreadable: {exc.strerror or exc}"
            log.error("state file %s is unreadable, ignoring it: %s", path, exc.strerror or exc)
            return None
        try:
            if not data.strip():
                raise Damaged("empty")
            return spec.parse(json.loads(data))
        except (Damaged, TypeError, ValueError, KeyError) as exc:  # UnicodeDecodeError, JSONDecodeError: ValueError
            why = f"{type(exc).__name__}: {exc}"
            self.problems[spec.name] = f"damaged: {why[:200]}"
            if self.read_only:
                log.error("state file %s is damaged (%s); left where it is (read-only)", path, why[:200])
            else:
                self._set_aside(spec.name, why)
            return None

    def _set_aside(self, name: str, why: str) -> None:
        path = self.file(name)
        us = time.time_ns() // 1000
        while True:  # UTC time to the microsecond: names sort by age
            bad = f"{path}.bad-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(us // 1_000_000))}.{us % 1_000_000:06d}Z"
            if not os.path.lexists(bad):
                break
            us += 1
        try:
            os.rename(path, bad)
            where = f"set aside as {bad}"
        except OSError as exc:
            where = f"cannot set it aside ({exc.strerror or exc})"
        _count_rejected(name)
        log.error("state file %s is damaged (%s): %s; that part of the state starts fresh", path, why[:200], where)
        self._prune_bad(name)

    def _prune_bad(self, name: str) -> None:
        try:
            old = sorted(e for e in os.listdir(self.path) if e.startswith(f"{name}.bad-"))
        except OSError:
            return
        for entry in old[:-KEEP_BAD]:
            try:
                os.unlink(os.path.join(self.path, entry))
            except OSError:
                pass


class Damaged(ValueError):
    """A state file's content is not of the shape its `StateFile` expects."""


_known: set[str] = set()
_rejected: dict[str, int] = {}
_rejected_lock = threading.Lock()


@dataclass(frozen=True)
class StateFile(Generic[T]):
    """One file of the state dir: its name and the function that turns its JSON
    into the value the agent uses. `parse` raises `Damaged` (or TypeError,
    ValueError, KeyError) for content of another shape; the shape helpers below
    say what was expected where."""

    name: str
    parse: Callable[[Any], T]

    def __post_init__(self) -> None:
        with _rejected_lock:
            _known.add(self.name)


def _count_rejected(name: str) -> None:
    with _rejected_lock:
        _rejected[name] = _rejected.get(name, 0) + 1


def rejected() -> dict[str, int]:
    """State files set aside since start, per file name; 0 for every declared file."""
    with _rejected_lock:
        return {name: _rejected.get(name, 0) for name in sorted(_known | set(_rejected))}


# ---------------------------------------------------------------- shape helpers


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def obj(value: Any, where: str = "the file") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Damaged(f"{where}: expected an object, got {_kind(value)}")
    return value


def seq(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise Damaged(f"{where}: expected a list, got {_kind(value)}")
    return value


def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise Damaged(f"{where}: expected a string, got {_kind(value)}")
    return value


def integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Damaged(f"{where}: expected an integer, got {_kind(value)}")
    return value


def number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Damaged(f"{where}: expected a number, got {_kind(value)}")
    return float(value)


def flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise Damaged(f"{where}: expected true or false, got {_kind(value)}")
    return value


def texts(value: Any, where: str) -> list[str]:
    return [text(v, f"{where}[{i}]") for i, v in enumerate(seq(value, where))]


def boot_id(paths: HostPaths) -> str:
    """The kernel's id for this boot (changes on every reboot)."""
    return read_text(paths.proc("sys/kernel/random/boot_id"), "") or ""
