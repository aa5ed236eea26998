"""The disk check's view of the mount table: which filesystem each subject is.

Mount state is read from pid 1's mountinfo, the host's view, as node_exporter
does: the agent's own mount namespace may differ (a container, or systemd's
ProtectSystem= bind mounts that make paths read-only for the agent alone).
When pid 1's file cannot be read (hidepid, no hostPID) the agent's own table is
used, with its paths mapped back to host paths.
https://github.com/prometheus/node_exporter/blob/master/collector/filesystem_linux.go
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..hostpaths import HostPaths, read_bounded
from ..native import MountInfo, parse_mountinfo

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MountTable:
    entries: tuple[MountInfo, ...]  # mount points are host paths
    source: str  # the file it came from
    fallback_reason: str = ""  # why pid 1's table was not used ("" when it was)


def read_host_mounts(paths: HostPaths) -> MountTable:
    """pid 1's mount table, or the agent's own mapped to host paths. Raises OSError."""
    first = paths.proc("1", "mountinfo")
    try:
        return MountTable(tuple(parse_mountinfo(read_bounded(first))), first)
    except OSError as exc:
        why = f"{first}: {exc.strerror or exc}"
    own = paths.proc("self", "mountinfo")
    entries = parse_mountinfo(read_bounded(own))
    return MountTable(tuple(_unrooted(entries, paths)), own, why)


def read_own_mounts(procfs: str = "/proc") -> list[MountInfo]:
    """The agent's own mount table (local paths): where its state dir really lives."""
    return parse_mountinfo(read_bounded(os.path.join(procfs, "self", "mountinfo")))


def _unrooted(entries: Iterable[MountInfo], paths: HostPaths) -> Iterable[MountInfo]:
    """Our own mounts under the host root, renamed to host paths; the container's
    own mounts (its /, /proc, …) are not the host's and are dropped."""
    base = paths.root("/").rstrip("/")
    for m in entries:
        if not base or m.mount_point == base or m.mount_point.startswith(base + "/"):
            yield m._replace(mount_point=paths.unroot(m.mount_point))


def mount_at(entries: Sequence[MountInfo], path: str) -> MountInfo | None:
    """The mount visible at exactly `path`: the top of a stack of mounts there."""
    here = [m for m in entries if m.mount_point == path]
    if len(here) <= 1:
        return here[0] if here else None
    under = {m.parent_id for m in here}
    top = [m for m in here if m.mount_id not in under]
    return top[-1] if top else here[-1]


def containing(entries: Sequence[MountInfo], path: str) -> MountInfo | None:
    """The mount that holds `path` (an absolute, symlink-free path)."""
    best: MountInfo | None = None
    for m in entries:
        mp = m.mount_point
        inside = path == mp or mp == "/" or path.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best.mount_point)):
            best = mount_at(entries, mp)
    return best


def by_device(entries: Sequence[MountInfo], major: int, minor: int) -> MountInfo | None:
    """A host mount of the filesystem on `major:minor`, its root mount preferred."""
    same = [m for m in entries if (m.major, m.minor) == (major, minor)]
    whole = [m for m in same if m.root == "/"]
    pick = whole or same
    return pick[0] if pick else None


def read_only(m: MountInfo) -> bool:
    """Read-only for this mount (per-mount flag) or for the whole filesystem
    (the superblock: ext4 errors=remount-ro sets it)."""
    return "ro" in m.options.split(",") or "ro" in m.super_options.split(",")


def describe(m: MountInfo) -> str:
    return f"{m.fstype} on {m.source}"
