"""What the disk check looks at: one `Target` per subject.

Configured paths are host paths expected to be mount points. The state dir is
different: it is a path in the agent's own mount namespace (in a DaemonSet, a
hostPath volume), so the filesystem that holds it is found in the agent's own
mount table and named by the host mount of the same device, and it is left
out when a configured path already covers that filesystem.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ..findings import ObservationBuilder
from ..hostpaths import HostPaths
from ..native import MountInfo
from ..probeproc import IsolatedProber
from .disk_mounts import MountTable, by_device, containing, read_only, read_own_mounts
from .disk_probes import nearest_existing

if TYPE_CHECKING:
    from .disk import DiskConfig


@dataclass(frozen=True, slots=True)
class Target:
    subject: str  # host path: the finding subject and the `path` label
    local: str  # the same place as the agent sees it: where statfs and the probe run
    mount: MountInfo | None  # the host's mount there (None: not mounted)
    holds_state: bool = False

    @property
    def expect_mount(self) -> bool:
        return not self.holds_state

    def wants_write(self, cfg: DiskConfig) -> bool:
        return cfg.write_probe and self.mount is not None and not read_only(self.mount)

    def expected_device(self) -> tuple[int, int] | None:
        """The device the agent must see at `local`. Only filesystems on a block
        device report the same st_dev as mountinfo's major:minor: btrfs gives
        each subvolume its own anonymous device, so those are not compared."""
        if self.mount is None or self.mount.major == 0:
            return None
        return (self.mount.major, self.mount.minor)


def locate_state_fs(
    state_dir: str,
    table: MountTable,
    targets: list[Target],
    paths: HostPaths,
    prober: IsolatedProber,
    timeout: float,
    b: ObservationBuilder | None,
) -> Target | None:
    """The target for the filesystem holding `state_dir`, or None when a
    configured target already covers it (or it cannot be located now)."""
    res = prober.call(("state-dir", state_dir), partial(nearest_existing, state_dir), timeout)
    if res.hung_for is not None:
        if b is not None:
            b.finding(state_dir, "DiskProbeHung", f"looking up the state dir {state_dir} has not returned for {res.hung_for:.1f}s")
        return None
    if res.error is not None:
        raise res.error
    local = res.value
    assert local is not None
    own = containing(read_own_mounts(), local)
    if own is None:
        return None
    device = (own.major, own.minor)
    if any(t.mount is not None and (t.mount.major, t.mount.minor) == device for t in targets):
        return None
    host = by_device(table.entries, *device)
    subject = host.mount_point if host is not None else paths.unroot(own.mount_point)
    if any(t.subject == subject for t in targets):
        return None
    return Target(subject, local, host or own, holds_state=True)
