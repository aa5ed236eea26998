"""Where the host's /proc, /sys and / are, and bounded reads of pseudo-files.

On a bare-metal host these are the usual paths. In the DaemonSet the host is
mounted under /host (`--path.procfs=/host/proc` …), and tests point them at
fixture trees. Checks never build these paths themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Pseudo-files report st_size 0 (or 4096): read until EOF, never trust the size,
# but stop at a bound so a runaway file cannot exhaust memory.
READ_LIMIT = 16 << 20


@dataclass(frozen=True, slots=True)
class HostPaths:
    procfs: str = "/proc"
    sysfs: str = "/sys"
    rootfs: str = "/"

    def proc(self, *parts: str) -> str:
        return os.path.join(self.procfs, *parts)

    def sys(self, *parts: str) -> str:
        return os.path.join(self.sysfs, *parts)

    def root(self, host_path: str) -> str:
        """A path on the host as seen from here (``/var/lib`` → ``/host/var/lib``)."""
        if self.rootfs in ("", "/"):
            return host_path
        return os.path.join(self.rootfs, host_path.lstrip("/"))

    def unroot(self, local_path: str) -> str:
        """The inverse of `root`: a local path back to the host's name for it."""
        if self.rootfs in ("", "/"):
            return local_path
        base = self.rootfs.rstrip("/")
        if local_path == base:
            return "/"
        if local_path.startswith(base + "/"):
            return local_path[len(base) :]
        return local_path


def read_bounded(path: str, limit: int = READ_LIMIT) -> bytes:
    """Read a whole (pseudo-)file in one pass; raises OSError, ValueError past `limit`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise ValueError(f"{path}: larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str, default: str | None = None) -> str | None:
    """A small sysfs attribute as stripped text; `default` when it cannot be read."""
    try:
        return read_bounded(path, 1 << 20).decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return default
