"""The network engine (`agent.checks.network` is its adapter): link state (netlink), error and drop rates (/proc/net/dev),
and reachability of targets (name resolution and a TCP connect).

Everything here works unprivileged: RTM_GETLINK, /proc/net/dev, sysfs and a
TCP connect need no capability. What the check cannot see (netlink refused,
a link that sysfs shows but netlink does not, a resolver that never answers)
is an unknown finding, never a fault.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from ..findings import Observation, ObservationBuilder
from ..hostpaths import HostPaths
from ..schema import format_duration
from .catalog import CATALOG, LINK_REASONS
from .counters import Rates, RateTracker, read_net_dev
from .links import OPERSTATES, FlapWindow, LinkError, LinkReader, LinkState, discover, in_sysfs, speed
from .reach import Outcome, default_targets, probe_all
from .settings import NetworkConfig

log = logging.getLogger(__name__)

CHECK = "network"


_COUNTERS = (
    ("receive_bytes", "rx_bytes"), ("receive_packets", "rx_packets"), ("receive_errors", "rx_errs"),
    ("receive_drops", "rx_drop"), ("transmit_bytes", "tx_bytes"), ("transmit_packets", "tx_packets"),
    ("transmit_errors", "tx_errs"), ("transmit_drops", "tx_drop"),
)  # fmt: skip


class NetworkMonitor:
    """The network engine: links, counters and targets, judged on each `run`."""

    def __init__(self, paths: HostPaths, state_dir: str, cfg: NetworkConfig, clock: Callable[[], float]) -> None:
        self.paths, self.state_dir, self.cfg, self._clock = paths, state_dir, cfg, clock
        self._discover_error = ""
        self.targets = cfg.targets or default_targets()
        self.interfaces: tuple[str, ...] | None = cfg.interfaces or self._discover()
        self._rates = RateTracker()
        self._flaps: dict[str, FlapWindow] = {}
        self._reach: Observation | None = None
        self._reach_due = 0.0
        if self.targets:
            log.info("network: probing %s", ", ".join(self.targets))

    def _discover(self) -> tuple[str, ...] | None:
        try:
            found = discover(self.paths, self.state_dir)
        except Exception as exc:  # noqa: BLE001 - runs while the agent builds its checks: it must not stop the agent
            first = not self._discover_error
            self._discover_error = str(exc) if isinstance(exc, LinkError) else f"{type(exc).__name__}: {exc}"
            (log.error if first else log.debug)(
                "network: cannot choose the interfaces to watch: %s", self._discover_error
            )
            return None
        if found:
            log.info("network: watching %s (physical, up with carrier at start)", ", ".join(found))
        else:
            log.info("network: no physical interface is up with carrier; no link to watch")
        return found

    def known_findings(self) -> Iterable[tuple[str, str]]:
        reasons = list(LINK_REASONS)
        reasons += ["LinkErrors"] if self.cfg.error_rate_warning > 0 else []
        reasons += ["LinkDrops"] if self.cfg.drop_rate_warning > 0 else []
        for name in self.interfaces or ():
            yield from ((name, r) for r in reasons)
        for t in self.targets:
            yield from ((t, r) for r in ("TargetUnreachable", "TargetProbeHung"))

    def run(self, b: ObservationBuilder) -> None:
        now = self._clock()
        if self.interfaces is None:
            self.interfaces = self._discover()
        if self.interfaces is None:
            b.finding(CHECK, "LinkStateUnknown", f"cannot choose the interfaces to watch: {self._discover_error}")
        elif self.interfaces:
            indexes = self._links(b, self.interfaces, now)
            self._counters(b, self.interfaces, indexes, now)
        self._targets(b, now)

    # ------------------------------------------------------------ links

    def _links(self, b: ObservationBuilder, names: tuple[str, ...], now: float) -> dict[str, int]:
        try:
            with LinkReader() as reader:
                states = {n: _get(reader, n) for n in names}
        except LinkError as exc:
            states = {n: exc for n in names}
        for gone in set(self._flaps) - {n for n, s in states.items() if isinstance(s, LinkState)}:
            del self._flaps[gone]
        indexes = {}
        for name, state in states.items():
            if isinstance(state, LinkState):
                indexes[name] = state.index
                self._link(b, state, now)
            elif isinstance(state, LinkError):
                b.finding(name, "LinkStateUnknown", f"cannot read the link over netlink: {state}")
            elif in_sysfs(self.paths, name):
                b.finding(
                    name,
                    "LinkStateUnknown",
                    f"{self.paths.sys('class/net', name)} exists but netlink has no such link: the agent runs "
                    "in another network namespace than the host's (a pod needs hostNetwork: true)",
                )
            else:
                b.finding(
                    name,
                    "InterfaceMissing",
                    "watched (configured, or up at start), but the kernel has no such interface",
                )
        return indexes

    def _link(self, b: ObservationBuilder, s: LinkState, now: float) -> None:
        b.sample("node_health_network_link_admin_up", s.admin_up, device=s.name)
        b.sample("node_health_network_link_carrier", s.carrier, device=s.name)
        for state in OPERSTATES:
            b.sample("node_health_network_link_operstate", state == s.operstate, device=s.name, operstate=state)
        if not s.admin_up:
            b.finding(s.name, "LinkAdminDown", f"administratively down (operstate {s.operstate})")
        elif not s.passing:
            carrier = "carrier" if s.carrier else "no carrier"
            b.finding(s.name, "LinkDown", f"up but not passing traffic: {carrier}, operstate {s.operstate}")
        if s.carrier_changes is not None:
            b.sample("node_health_network_link_carrier_changes_total", s.carrier_changes, device=s.name)
            window = self._flaps.setdefault(s.name, FlapWindow(self.cfg.flap_window))
            changes = window.changes(now, s.index, s.carrier_changes)
            if changes > self.cfg.flap_threshold:
                b.finding(
                    s.name,
                    "LinkFlapping",
                    f"{changes} carrier changes within {format_duration(self.cfg.flap_window)} "
                    f"(threshold {self.cfg.flap_threshold})",
                )
        b.subject(s.name, _detail(s, speed(self.paths, s.name)))

    # ------------------------------------------------------------ counters

    def _counters(self, b: ObservationBuilder, names: tuple[str, ...], indexes: dict[str, int], now: float) -> None:
        try:
            stats = read_net_dev(self.paths)
        except (OSError, ValueError) as exc:
            for name in names:
                b.finding(name, "InterfaceCountersUnknown", f"cannot read {self.paths.proc('net/dev')}: {exc}")
            return
        self._rates.keep(set(names) & set(stats))
        for name in names:
            s = stats.get(name)
            if s is None:
                if name in indexes:  # netlink has it, /proc/net/dev of this namespace does not
                    b.finding(name, "InterfaceCountersUnknown", f"not in {self.paths.proc('net/dev')}")
                continue
            for metric, field in _COUNTERS:
                b.sample(f"node_health_network_{metric}_total", getattr(s, field), device=name)
            rates = self._rates.update(name, s, now, indexes.get(name))
            if rates is not None:
                self._rate_findings(b, name, rates)

    def _rate_findings(self, b: ObservationBuilder, name: str, r: Rates) -> None:
        over = f"over {r.seconds:.0f}s"
        if 0 < self.cfg.error_rate_warning <= r.errors:
            b.finding(
                name,
                "LinkErrors",
                f"{r.errors:.3g} errors/s (rx {r.rx_errors:.3g}, tx {r.tx_errors:.3g}) {over}, "
                f"threshold {self.cfg.error_rate_warning:g}/s",
            )
        if 0 < self.cfg.drop_rate_warning <= r.drops:
            b.finding(
                name,
                "LinkDrops",
                f"{r.drops:.3g} drops/s (rx {r.rx_drops:.3g}, tx {r.tx_drops:.3g}) {over}, "
                f"threshold {self.cfg.drop_rate_warning:g}/s",
            )

    # ------------------------------------------------------------ targets

    def _targets(self, b: ObservationBuilder, now: float) -> None:
        if not self.targets:
            return
        if self._reach is None or now >= self._reach_due:
            self._reach = _reach(probe_all(self.targets, self.cfg.connect_timeout))
            self._reach_due = now + self.cfg.connect_interval
        b.extend(self._reach)


def _get(reader: LinkReader, name: str) -> LinkState | LinkError | None:
    try:
        return reader.get(name)
    except LinkError as exc:
        return exc


def _detail(s: LinkState, mbps: int | None) -> str:
    parts = ["up" if s.admin_up else "admin down", "carrier" if s.carrier else "no carrier"]
    if s.operstate != "up":
        parts.append(f"operstate {s.operstate}")
    if mbps and s.carrier:
        parts.append(f"{mbps}Mb/s")
    return ", ".join(parts)


def _reach(outcomes: list[Outcome]) -> Observation:
    b = ObservationBuilder(CHECK, CATALOG)
    for o in outcomes:
        if o.reachable is None:
            b.finding(o.target, "TargetProbeHung", o.detail)
            continue
        b.sample("node_health_network_target_reachable", o.reachable, target=o.target)
        if o.reachable:
            b.sample("node_health_network_target_connect_duration_seconds", o.seconds, target=o.target)
            b.subject(o.target, f"reachable in {o.seconds * 1000:.1f}ms ({o.detail})")
        else:
            b.finding(o.target, "TargetUnreachable", o.detail)
            b.subject(o.target, o.detail)
    return b.build()
