"""Network check: link state (netlink), error and drop rates (/proc/net/dev),
and reachability of targets (name resolution and a TCP connect).

Everything here works unprivileged: RTM_GETLINK, /proc/net/dev, sysfs and a
TCP connect need no capability. What the check cannot see (netlink refused,
a link that sysfs shows but netlink does not, a resolver that never answers)
is an unknown finding, never a fault.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..catalog import MetricSpec, Reason
from ..config import CheckConfig, format_duration, opt
from ..findings import Observation, ObservationBuilder, Severity
from . import CheckContext, CheckSpec
from .net_counters import Rates, RateTracker, read_net_dev
from .net_links import (
    OPERSTATES,
    FlapWindow,
    LinkError,
    LinkReader,
    LinkState,
    discover,
    in_sysfs,
    interface_name,
    speed,
)
from .net_reach import Outcome, default_targets, probe_all, target

log = logging.getLogger(__name__)


def _reason(name: str, severity: Severity, summary: str, *, unknown: bool = False) -> Reason:
    return Reason(name, severity, summary, unknown=unknown, family="Network")


W, C = Severity.WARNING, Severity.CRITICAL
REASONS: tuple[Reason, ...] = (
    _reason("InterfaceMissing", C, "A watched interface does not exist (removed, renamed, or its driver failed)."),
    _reason("LinkAdminDown", C, "A watched interface is administratively down (IFF_UP cleared)."),
    _reason(
        "LinkDown", C,
        "A watched interface is up but passes no traffic: no carrier, or operstate other than up (unknown, "
        "which drivers that do not track operstate report, counts as up).",
    ),
    _reason("LinkFlapping", W, "The carrier changed more than flap_threshold times within flap_window."),
    _reason("LinkErrors", W, "rx+tx errors per second at or above error_rate_warning (the message splits rx and tx)."),
    _reason("LinkDrops", W, "rx+tx drops per second at or above drop_rate_warning."),
    _reason(
        "LinkStateUnknown", W,
        "Netlink could not say the link's state, or has no link that sysfs shows (the agent runs in another "
        "network namespace); the message says why.",
        unknown=True,
    ),
    _reason("InterfaceCountersUnknown", W, "/proc/net/dev could not be read, or lacks the interface.", unknown=True),
    _reason(
        "TargetUnreachable", W, "A target did not accept a TCP connection: refused, timed out, no route, DNS failure."
    ),
    _reason(
        "TargetProbeHung",
        W,
        "An earlier probe of the target (name resolution or connect) has still not returned; not probed again until it does.",
        unknown=True,
    ),
)
LINK_REASONS = (
    "InterfaceMissing",
    "LinkAdminDown",
    "LinkDown",
    "LinkFlapping",
    "LinkStateUnknown",
    "InterfaceCountersUnknown",
)

_IF, _T = ("device",), ("target",)
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_network_link_admin_up", "gauge", "1 if the interface is administratively up (IFF_UP).", _IF
    ),
    MetricSpec("node_health_network_link_carrier", "gauge", "1 if the interface has carrier (IFLA_CARRIER).", _IF),
    MetricSpec(
        "node_health_network_link_operstate",
        "gauge",
        "1 for the interface's current RFC 2863 operstate, 0 for the others (all seven are exported).",
        ("device", "operstate"),
    ),
    MetricSpec(
        "node_health_network_link_carrier_changes_total",
        "counter",
        "Carrier up and down transitions since the interface was created (IFLA_CARRIER_CHANGES).",
        _IF,
    ),
    MetricSpec("node_health_network_receive_bytes_total", "counter", "Bytes received (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_receive_packets_total", "counter", "Packets received (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_receive_errors_total", "counter", "Receive errors (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_receive_drops_total", "counter", "Received packets dropped (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_transmit_bytes_total", "counter", "Bytes transmitted (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_transmit_packets_total", "counter", "Packets transmitted (/proc/net/dev).", _IF),
    MetricSpec("node_health_network_transmit_errors_total", "counter", "Transmit errors (/proc/net/dev).", _IF),
    MetricSpec(
        "node_health_network_transmit_drops_total", "counter", "Packets dropped on transmit (/proc/net/dev).", _IF
    ),
    MetricSpec(
        "node_health_network_target_reachable",
        "gauge",
        "1 if the target accepted a TCP connection at the last probe, 0 if not; absent while its probe is hung.",
        _T,
    ),
    MetricSpec(
        "node_health_network_target_connect_duration_seconds",
        "gauge",
        "Name resolution plus TCP connect time of the last successful probe.",
        _T,
    ),
)

_COUNTERS = (
    ("receive_bytes", "rx_bytes"), ("receive_packets", "rx_packets"), ("receive_errors", "rx_errs"),
    ("receive_drops", "rx_drop"), ("transmit_bytes", "tx_bytes"), ("transmit_packets", "tx_packets"),
    ("transmit_errors", "tx_errs"), ("transmit_drops", "tx_drop"),
)  # fmt: skip


@dataclass(frozen=True)
class NetworkConfig(CheckConfig):
    interval: float = opt(15.0, "Time between runs.", duration=True, min=1)
    interfaces: tuple[str, ...] = opt(
        (),
        "Interfaces to watch. Empty: the physical ones (with /sys/class/net/<if>/device) that are up with "
        "carrier when the agent starts, remembered in the state dir until the next boot.",
        check=interface_name,
    )
    flap_window: float = opt(300.0, "Window over which carrier changes are counted.", duration=True, min=1)
    flap_threshold: int = opt(
        2, "More carrier changes than this within flap_window is LinkFlapping (one bounce is 2 changes).", min=0
    )
    error_rate_warning: float = opt(1.0, "rx+tx errors per second that raise LinkErrors; 0 turns it off.", min=0)
    drop_rate_warning: float = opt(
        100.0, "rx+tx drops per second that raise LinkDrops; 0 turns it off (benign rx drops are common).", min=0
    )
    targets: tuple[str, ...] = opt(
        (),
        'TCP targets, "host:port" ("[::1]:443" for IPv6). Empty: the Kubernetes API server '
        "($KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT) when running in a pod, else none.",
        check=target,
    )
    connect_timeout: float = opt(
        3.0, "Budget for name resolution plus TCP connect of one target.", duration=True, min=0.05
    )
    connect_interval: float = opt(
        60.0,
        "Probe targets at most this often (one connection per node per interval); 0: every run.",
        duration=True,
        min=0,
    )

    def validate(self) -> tuple[str, str] | None:
        if self.connect_timeout + 1 > self.timeout:
            most = format_duration(max(self.timeout - 1, 0))
            return (
                "connect_timeout",
                f'expected at most timeout minus 1s ("{most}"), got "{format_duration(self.connect_timeout)}"',
            )
        return None


class NetworkCheck:
    name = "network"

    def __init__(self, ctx: CheckContext, cfg: NetworkConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx, self.cfg, self._clock = ctx, cfg, clock
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
            found = discover(self.ctx.paths, self.ctx.state_dir)
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

    def run(self) -> Observation:
        b = ObservationBuilder(self.name)
        now = self._clock()
        if self.interfaces is None:
            self.interfaces = self._discover()
        if self.interfaces is None:
            b.finding(self.name, "LinkStateUnknown", f"cannot choose the interfaces to watch: {self._discover_error}")
        elif self.interfaces:
            indexes = self._links(b, self.interfaces, now)
            self._counters(b, self.interfaces, indexes, now)
        self._targets(b, now)
        return b.build()

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
            elif in_sysfs(self.ctx.paths, name):
                b.finding(
                    name,
                    "LinkStateUnknown",
                    f"{self.ctx.paths.sys('class/net', name)} exists but netlink has no such link: the agent runs "
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
        b.subject(s.name, _detail(s, speed(self.ctx.paths, s.name)))

    # ------------------------------------------------------------ counters

    def _counters(self, b: ObservationBuilder, names: tuple[str, ...], indexes: dict[str, int], now: float) -> None:
        try:
            stats = read_net_dev(self.ctx.paths)
        except (OSError, ValueError) as exc:
            for name in names:
                b.finding(name, "InterfaceCountersUnknown", f"cannot read {self.ctx.paths.proc('net/dev')}: {exc}")
            return
        self._rates.keep(set(names) & set(stats))
        for name in names:
            s = stats.get(name)
            if s is None:
                if name in indexes:  # netlink has it, /proc/net/dev of this namespace does not
                    b.finding(name, "InterfaceCountersUnknown", f"not in {self.ctx.paths.proc('net/dev')}")
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
    b = ObservationBuilder(NetworkCheck.name)
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


SPEC = CheckSpec(
    name="network",
    summary="Links (admin state, carrier, operstate, flapping), error and drop rates, reachability of targets.",
    config=NetworkConfig,
    build=NetworkCheck,
)
