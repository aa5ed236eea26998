"""The InfiniBand engine (`agent.checks.infiniband` is its adapter): reads every watched
port under /sys/class/infiniband, exports its state, rate and counters, and judges it
against the config, its peers and what the state dir remembers (docs/infiniband.md)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from fnmatch import fnmatchcase
from functools import partial

from ..findings import ObservationBuilder
from ..hostpaths import HostPaths
from ..statedir import StateDir, boot_id
from .catalog import REASONS
from .judge import counter_windows, judge_count, judge_counters, judge_state, peer_groups
from .memory import MAX_DOWNS, MEMORY_FILE, STATE_FILE, Memory, PortMemory, record
from .settings import InfinibandConfig
from .sysfs import ERROR_COUNTERS, CounterReader, Device, Port, class_dir, list_ports, read_device

log = logging.getLogger(__name__)

SUBJECT = "infiniband"
PORT_REASONS = tuple(r.name for r in REASONS if r.name not in ("IbDeviceMissing", "IbPortsMissing"))
_DATA = (
    ("transmit_bytes", "port_xmit_data", 4),  # port_xmit_data/port_rcv_data count 4-byte words
    ("receive_bytes", "port_rcv_data", 4),
    ("transmit_packets", "port_xmit_packets", 1),
    ("receive_packets", "port_rcv_packets", 1),
)


def matches(patterns: Iterable[str], device: str, port: int) -> bool:
    return any(fnmatchcase(device, g) or fnmatchcase(f"{device}/{port}", g) for g in patterns)


class IbMonitor:
    """The engine: one `run` reads, exports and judges every watched port."""

    def __init__(self, paths: HostPaths, state_dir: str, cfg: InfinibandConfig, clock: Callable[[], float]) -> None:
        self.paths, self.cfg, self._clock = paths, cfg, clock
        self.state = StateDir(state_dir)
        self._save_failed = False
        self._mem: Memory | None = None  # loaded once; this process is the file's only writer
        self._saved: object = None  # the substance of what was last written

    def watched(self, device: str, port: int) -> bool:
        cfg = self.cfg
        return (not cfg.include or matches(cfg.include, device, port)) and not matches(cfg.exclude, device, port)

    def _reads_counters(self, device: str, port: int) -> bool:
        return not matches(self.cfg.counters_exclude, device, port)

    def _listing(self) -> dict[str, list[int]]:
        try:
            found = list_ports(self.paths)
        except FileNotFoundError:
            return {}
        return {d: w for d, ports in found.items() if (w := [p for p in ports if self.watched(d, p)]) or not ports}

    def known_findings(self) -> list[tuple[str, str]]:
        try:
            listing = self._listing()
        except OSError:
            listing = {}
        mem = self.state.load(MEMORY_FILE) if os.path.isdir(self.state.path) else None
        remembered = {d: p for d, p in (mem.devices if mem else {}).items() if any(self.watched(d, n) for n in p)}
        out = [(f"{d}/{n}", r) for d, ports in listing.items() for n in ports for r in PORT_REASONS]
        out += [(d, "IbDeviceMissing") for d in sorted(set(remembered) | set(listing))]
        if self.cfg.expected_ports:
            out.append((SUBJECT, "IbPortsMissing"))
        return out

    # ------------------------------------------------------------ run

    def run(self, b: ObservationBuilder) -> None:
        now = self._clock()
        if self._mem is None:
            self._mem = (self.state.load(MEMORY_FILE) if os.path.isdir(self.state.path) else None) or Memory()
        mem = self._mem
        mem.begin(boot_id(self.paths), now)
        listing = self._listing()
        reader = CounterReader(self.cfg.hw_counters, skipped=mem.skipped)
        base = class_dir(self.paths)
        devices = [
            read_device(base, name, ports, partial(self._reads_counters, name), reader)
            for name, ports in listing.items()
        ]
        for path in reader.newly_skipped:
            log.warning("infiniband: reading %s failed with EINVAL (a firmware-restricted function?): "
                        "not read again until the next boot", os.path.join(base, path))
        self._missing(b, mem, listing)
        if not devices and not mem.devices:
            b.finding(SUBJECT, "NotApplicable", f"no InfiniBand or RoCE device under {base}")
        groups = peer_groups(devices)
        ports: list[Port] = []
        for d in devices:
            self._device(b, d, mem)
            for p in d.ports:
                ports.append(p)
                pm = mem.port(p.name)
                self._remember(p, pm, now)
                judge_state(b, p, pm, groups[(d.model, p.link_layer)], self.cfg, now)
                judge_counters(b, p, pm, self.cfg, now)
                self._port(b, p, pm, now)
        judge_count(b, ports, self.cfg)
        active = sum(p.active for p in ports)
        b.sample("node_health_infiniband_ports", len(ports), state="present")
        b.sample("node_health_infiniband_ports", active, state="active")
        b.sample("node_health_infiniband_ports", self.cfg.expected_ports or len(ports), state="expected")
        if ports or mem.devices:
            b.subject(SUBJECT, f"{active} of {len(ports)} ports ACTIVE" + (
                f", {self.cfg.expected_ports} expected" if self.cfg.expected_ports else ""))
        for d in devices:
            mem.devices[d.name] = [p.number for p in d.ports]
        self._save(mem)

    def _missing(self, b: ObservationBuilder, mem: Memory, listing: dict[str, list[int]]) -> None:
        for name, ports in sorted(mem.devices.items()):
            if name in listing or not any(self.watched(name, n) for n in ports):
                continue
            b.finding(name, "IbDeviceMissing", f"seen before with ports {', '.join(map(str, ports))}; "
                      f"not under {class_dir(self.paths)} now")

    def _device(self, b: ObservationBuilder, d: Device, mem: Memory) -> None:
        b.sample("node_health_infiniband_device_info", 1, device=d.name, board_id=d.board_id, hca_type=d.hca_type, fw_ver=d.fw_ver)
        prefix = f"{d.name}/ports/"
        b.sample("node_health_infiniband_skipped_files", sum(s.startswith(prefix) for s in mem.skipped), device=d.name)

    def _remember(self, p: Port, pm: PortMemory, now: float) -> None:
        """Update the port's memory with this reading (before judging it)."""
        windows = counter_windows(self.cfg)
        downed = 0
        for counter, keep in windows.items():
            if counter in p.counters:
                step = record(pm.counters.setdefault(counter, []), now, p.counters[counter], keep)
                downed = step if counter == "link_downed" else downed
        went_down = pm.last_active is True and not p.active and p.state is not None
        # link_downed counts the downs between two runs that a run never saw (down and back up).
        pm.downs.extend([now] * max(downed, int(went_down)))
        pm.downs[:] = [t for t in pm.downs if t > now - self.cfg.flap_window][-MAX_DOWNS:]
        if p.active:
            pm.ever_active, pm.down_since = True, None
        elif p.state is not None and pm.down_since is None:
            pm.down_since = now
        if p.state is not None:
            pm.last_active = p.active

    def _port(self, b: ObservationBuilder, p: Port, pm: PortMemory, now: float) -> None:
        labels = {"device": p.device, "port": str(p.number)}
        b.sample("node_health_infiniband_port_info", 1, **labels, link_layer=p.link_layer)
        if p.state is not None:
            b.sample("node_health_infiniband_port_state", p.state[0], **labels)
        if p.phys is not None:
            b.sample("node_health_infiniband_port_phys_state", p.phys[0], **labels)
        b.sample("node_health_infiniband_port_active", p.active, **labels)
        if p.rate_gbps is not None:
            b.sample("node_health_infiniband_port_rate_bytes_per_second", p.rate_gbps * 1e9 / 8, **labels)
        for metric, counter, scale in _DATA:
            if counter in p.counters:
                b.sample(f"node_health_infiniband_port_{metric}_total", p.counters[counter] * scale, **labels)
        for counter in (*ERROR_COUNTERS, *self.cfg.hw_counters):
            if counter in p.counters:
                b.sample("node_health_infiniband_port_errors_total", p.counters[counter], **labels, counter=counter)
        b.sample("node_health_infiniband_port_down_events", sum(1 for t in pm.downs if t > now - self.cfg.flap_window), **labels)
        rate = f", {p.rate_gbps:g} Gb/s" if p.rate_gbps is not None and p.active else ""
        state = "ACTIVE" if p.active else f"{p.state[1] if p.state else '?'}/{p.phys[1] if p.phys else '?'}"
        b.subject(p.name, f"{state}{rate}, {p.link_layer}")

    def _save(self, mem: Memory) -> None:
        """Written when something a restart must keep has changed: a steady node writes nothing."""
        substance = mem.substance()
        if substance == self._saved or not os.path.isdir(self.state.path):
            return  # `agent selftest` without the daemon's state dir: nothing to keep
        try:
            self.state.write_json(STATE_FILE, mem.as_json())
            self._saved, self._save_failed = substance, False
        except OSError as exc:
            (log.debug if self._save_failed else log.error)(
                "infiniband: cannot save %s in %s: %s", STATE_FILE, self.state.path, exc.strerror or exc)
            self._save_failed = True
