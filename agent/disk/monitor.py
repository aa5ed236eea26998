"""The disk engine (`agent.checks.disk` is its adapter): each configured mount point (and the filesystem that holds the
state dir) is mounted, writable, not read-only, has free space and inodes, and
shows no I/O error signs; a dead network mount cannot hang it.

statfs and the write probe run in the agent's probe worker process
(`agent.probeproc.IsolatedProber`) with a per-path `probe_timeout`: a path
whose probe hangs is reported (DiskProbeHung) and not probed again until that
call returns, while the other paths are reported in the same run; a probe
stuck in the kernel can neither keep the agent alive after SIGTERM nor hold
its state-dir lock. See docs/disk.md.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from ..findings import ObservationBuilder
from ..hostpaths import HostPaths, read_bounded
from ..native import DiskStats, parse_diskstats
from ..probe import ProbeResult
from ..probeproc import IsolatedProber
from .catalog import REASONS
from .devices import DeviceSigns, DeviceTracker
from .mounts import MountTable, mount_at, read_host_mounts
from .probes import ProbeOutcome, probe
from .report import report
from .settings import DiskConfig
from .targets import Target, locate_state_fs

log = logging.getLogger(__name__)


# One prober for every DiskMonitor: a config reload builds a new check, but a
# statfs that hung in the old one is still hung and must not be started twice.
PROBER = IsolatedProber("disk")


class DiskMonitor:
    """The disk engine: finds the targets, probes them all at once, reports each."""

    def __init__(self, paths: HostPaths, state_dir: str, cfg: DiskConfig) -> None:
        self.paths, self.cfg, self.state_dir = paths, cfg, state_dir
        # normpath keeps a leading "//" (POSIX leaves its meaning open); Linux does not care.
        self.configured = tuple(dict.fromkeys("/" + os.path.normpath(p).lstrip("/") for p in cfg.paths))
        self.devices = DeviceTracker(paths)
        self._fallback = ""  # why pid 1's mountinfo was not used, for logging once
        self._hung: set[str] = set()

    # ------------------------------------------------------------ subjects

    def _mounts(self) -> MountTable:
        table = read_host_mounts(self.paths)
        if table.fallback_reason != self._fallback:
            if table.fallback_reason:
                log.info("cannot read pid 1's mountinfo (%s): using %s", table.fallback_reason, table.source)
            self._fallback = table.fallback_reason
        return table

    def _targets(self, table: MountTable, b: ObservationBuilder | None) -> list[Target]:
        targets = [Target(p, self.paths.root(p), mount_at(table.entries, p)) for p in self.configured]
        if self.cfg.include_state_dir:
            state = locate_state_fs(self.state_dir, table, targets, self.paths, PROBER, self.cfg.probe_timeout, b)
            if state is not None:
                targets.append(state)
        return targets

    def known_findings(self) -> list[tuple[str, str]]:
        try:
            targets = self._targets(self._mounts(), None)
        except (OSError, ValueError):
            targets = [Target(p, p, None) for p in self.configured]
        return [
            (t.subject, r.name) for t in targets for r in REASONS if t.expect_mount or r.name != "NotMounted"
        ]

    # ------------------------------------------------------------ run

    def run(self, b: ObservationBuilder) -> None:
        table = self._mounts()
        targets = self._targets(table, b)
        results = self._probe_all(targets)
        signs = self._device_signs(targets)
        for t in targets:
            report(b, t, self.cfg, table.source, results.get(t.local), signs)

    def _probe_all(self, targets: list[Target]) -> dict[str, ProbeResult[ProbeOutcome]]:
        """statfs and write probes of all paths at once: a run takes one
        probe_timeout at most, however many paths hang."""
        jobs = {
            t.local: partial(probe, t.local, t.wants_write(self.cfg), t.expected_device())
            for t in targets
            if t.mount is not None
        }
        if not jobs:
            return {}
        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="disk-probe-wait") as pool:
            futures = {k: pool.submit(PROBER.call, k, fn, self.cfg.probe_timeout) for k, fn in jobs.items()}
        results: dict[str, ProbeResult[ProbeOutcome]] = {k: f.result() for k, f in futures.items()}
        self._log_hung({k for k, r in results.items() if r.hung_for is not None})
        return results

    def _log_hung(self, hung: set[str]) -> None:
        for path in sorted(hung - self._hung):
            log.error("statfs/write probe of %s hung (over %gs): not probed again until it returns", path, self.cfg.probe_timeout)
        for path in sorted(self._hung - hung):
            log.info("probe of %s returned", path)
        self._hung = hung

    def _device_signs(self, targets: list[Target]) -> dict[tuple[int, int], DeviceSigns]:
        devices = {(t.mount.major, t.mount.minor) for t in targets if t.mount is not None and t.mount.major != 0}
        return self.devices.update(devices, self._diskstats() if devices else {})

    def _diskstats(self) -> dict[tuple[int, int], DiskStats]:
        try:
            rows = parse_diskstats(read_bounded(self.paths.proc("diskstats")))
        except (OSError, ValueError) as exc:
            log.debug("cannot read diskstats: %s", exc)
            return {}
        return {(s.major, s.minor): s for s in rows}
