"""A fixture host for the disk check: /proc, /sys and / as plain directories
(what --path.procfs, --path.sysfs and --path.rootfs point at), built per test.

Mount points listed in the fixture mountinfo are real directories under the
fixture root, so statfs and the write probe run for real (on the filesystem
that holds the test's tmp dir); `dev` is that filesystem's device, so the
check sees the device the mount table promises.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent import config
from agent.check import CheckContext
from agent.checks.disk import DiskCheck, DiskConfig
from agent.findings import Observation
from agent.hostpaths import HostPaths


class HostTree:
    def __init__(self, base: Path) -> None:
        self.proc, self.sys, self.root = base / "proc", base / "sys", base / "root"
        for d in (self.proc, self.sys, self.root):
            d.mkdir(parents=True)
        st = os.stat(self.root).st_dev
        self.dev = (os.major(st), os.minor(st))
        self.lines: list[str] = []
        self._next_id = 20

    @property
    def paths(self) -> HostPaths:
        return HostPaths(procfs=str(self.proc), sysfs=str(self.sys), rootfs=str(self.root))

    # ------------------------------------------------------------ /proc

    def mount(
        self,
        mount_point: str,
        *,
        dev: tuple[int, int] | None = None,
        fstype: str = "ext4",
        source: str = "/dev/vda1",
        options: str = "rw,relatime",
        super_options: str = "rw",
        parent: int = 1,
        root: str = "/",
        escaped: str | None = None,
        local: bool = True,
    ) -> int:
        """Add a line to pid 1's mountinfo (and the mount point under the root)."""
        self._next_id += 1
        major, minor = dev or self.dev
        shown = escaped or mount_point
        self.lines.append(
            f"{self._next_id} {parent} {major}:{minor} {root} {shown} {options} shared:1 - {fstype} {source} {super_options}"
        )
        if local:
            (self.root / mount_point.lstrip("/")).mkdir(parents=True, exist_ok=True)
        self.write_mountinfo()
        return self._next_id

    def write_mountinfo(self, pid: str = "1", lines: list[str] | None = None) -> None:
        d = self.proc / pid
        d.mkdir(exist_ok=True)
        (d / "mountinfo").write_text("\n".join(self.lines if lines is None else lines) + "\n")

    def diskstats(self, *rows: tuple[tuple[int, int], str, int, int, int, int]) -> None:
        """((major, minor), name, reads, writes, in_flight, io_ticks_ms) per device."""
        lines = [
            f"{maj} {mn} {name} {reads} 0 0 0 {writes} 0 0 0 {inflight} {ticks} {ticks} 0 0 0 0 0 0"
            for (maj, mn), name, reads, writes, inflight, ticks in rows
        ]
        (self.proc / "diskstats").write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------ /sys

    def disk(self, name: str, *, scsi: tuple[str, str] | None = None) -> Path:
        """A whole disk; `scsi` = (ioerr_cnt, state) gives it a SCSI device."""
        d = self.sys / "devices" / "pci0000:00" / "0000:00:1f.2" / "host0" / "block" / name
        d.mkdir(parents=True)
        if scsi is not None:
            self.scsi(d, *scsi)
        return d

    def scsi(self, disk: Path, ioerr_cnt: str, state: str) -> None:
        (disk / "device").mkdir(exist_ok=True)
        (disk / "device" / "ioerr_cnt").write_text(ioerr_cnt + "\n")
        (disk / "device" / "state").write_text(state + "\n")

    def partition(self, disk: Path, name: str) -> Path:
        d = disk / name
        d.mkdir()
        (d / "partition").write_text("1\n")
        return d

    def mapper(self, name: str, below: list[Path]) -> Path:
        d = self.sys / "devices" / "virtual" / "block" / name
        (d / "slaves").mkdir(parents=True)
        for target in below:
            (d / "slaves" / target.name).symlink_to(os.path.relpath(target, d / "slaves"))
        return d

    def link(self, dev: tuple[int, int], target: Path) -> None:
        links = self.sys / "dev" / "block"
        links.mkdir(parents=True, exist_ok=True)
        (links / f"{dev[0]}:{dev[1]}").symlink_to(os.path.relpath(target, links))

    def ext4(self, name: str, errors: int, func: str = "", when: int = 0) -> None:
        d = self.sys / "fs" / "ext4" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "errors_count").write_text(f"{errors}\n")
        (d / "last_error_func").write_text(f"{func}\n")
        (d / "last_error_time").write_text(f"{when}\n")

    # ------------------------------------------------------------ the check

    def check(self, state_dir: str = "/nonexistent/nha-state", **cfg: object) -> DiskCheck:
        cfg.setdefault("include_state_dir", False)
        ctx = CheckContext(paths=self.paths, state_dir=state_dir, config=config.defaults())
        return DiskCheck(ctx, DiskConfig(**cfg))  # type: ignore[arg-type]


def reasons(obs: Observation, subject: str) -> set[str]:
    return {f.reason for f in obs.findings if f.subject == subject}


def value(obs: Observation, name: str, path: str) -> float | None:
    for s in obs.samples:
        if s.name == name and dict(s.labels).get("mountpoint") == path:
            return s.value
    return None
