"""Judging the ports read this run against the config, their peers and what is remembered.

Which ports must be up: those seen ACTIVE before (remembered across reboots) and, by
homogeneity, those whose peers are mostly ACTIVE. Peers are the watched ports of the same
HCA model (board id, else HCA type) and link layer on this node: a dual-port RoCE card for
the front end is not the peer of the eight InfiniBand compute ports. A port that was never
ACTIVE and whose peers are down too (an unused, uncabled card) is not a finding unless
``expected_ports`` says how many must be ACTIVE.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ..findings import ObservationBuilder
from ..schema import format_duration
from .memory import PortMemory, increase
from .settings import InfinibandConfig
from .sysfs import DISABLED, ERROR_COUNTERS, INIT_STATES, LINK_UP, Device, Port

FATAL = (
    ("link_downed", "IbLinkDowned"),
    ("local_link_integrity_errors", "IbLinkIntegrityErrors"),
    ("excessive_buffer_overrun_errors", "IbBufferOverrunErrors"),
)


@dataclass(frozen=True, slots=True)
class Peers:
    """What homogeneity expects of a group of peers; None where the group cannot say."""

    size: int
    active: int
    rate: float | None  # the rate a strict majority of the group's ACTIVE ports run at

    @property
    def mostly_active(self) -> bool:
        return self.size >= 2 and self.active * 2 > self.size


def peer_groups(devices: Iterable[Device]) -> dict[tuple[str, str], Peers]:
    ports: dict[tuple[str, str], list[Port]] = {}
    for d in devices:
        for p in d.ports:
            ports.setdefault((d.model, p.link_layer), []).append(p)
    out = {}
    for key, group in ports.items():
        active = [p for p in group if p.active]
        rates = Counter(p.rate_gbps for p in active if p.rate_gbps is not None)
        rate, n = rates.most_common(1)[0] if rates else (None, 0)
        out[key] = Peers(len(group), len(active), rate if n >= 2 and n * 2 > len(active) else None)
    return out


def counter_windows(cfg: InfinibandConfig) -> dict[str, float]:
    """The judged counters and how long each one's history must reach back."""
    return {
        "link_downed": cfg.fatal_window,
        "local_link_integrity_errors": cfg.fatal_window,
        "excessive_buffer_overrun_errors": cfg.fatal_window,
        "symbol_error": cfg.symbol_error_window,
        "port_rcv_errors": cfg.rcv_error_window,
        "link_error_recovery": cfg.link_error_recovery_window,
    }


def _state(p: Port) -> str:
    state = p.state[1] if p.state else "?"
    phys = p.phys[1] if p.phys else "?"
    return f"{state}, {phys}"


def judge_state(b: ObservationBuilder, p: Port, mem: PortMemory, peers: Peers, cfg: InfinibandConfig, now: float) -> None:
    """Down, dropped, disabled or waiting for the subnet manager; below its rate."""
    if p.problems:
        b.finding(p.name, "IbPortUnreadable", "; ".join(p.problems))
    if p.state is None or p.phys is None:
        return
    if p.active:
        _rate(b, p, peers, cfg)
        return
    why = _expected(mem, peers)
    if why is None:
        return
    if p.phys[0] == DISABLED:
        b.finding(p.name, "IbPortDisabled", f"{_state(p)}; {why}")
    elif p.state[0] in INIT_STATES and p.phys[0] == LINK_UP:
        b.finding(p.name, "IbPortInitializing", f"{_state(p)}: waiting for the subnet manager; {why}")
    else:
        down_for = now - (mem.down_since if mem.down_since is not None else now)
        reason = "IbPortDropped" if down_for >= cfg.drop_after else "IbPortDown"
        b.finding(p.name, reason, f"{_state(p)} for {format_duration(down_for)}; {why}")


def _expected(mem: PortMemory, peers: Peers) -> str | None:
    if mem.ever_active:
        return "it was ACTIVE before"
    if peers.mostly_active:
        return f"{peers.active} of its {peers.size} peers (same model and link layer) are ACTIVE"
    return None


def _rate(b: ObservationBuilder, p: Port, peers: Peers, cfg: InfinibandConfig) -> None:
    if p.rate_gbps is None:
        return
    if cfg.min_rate_gbps > 0:
        if p.rate_gbps < cfg.min_rate_gbps:
            b.finding(p.name, "IbPortRateLow", f"{p.rate_gbps:g} Gb/s, min_rate_gbps is {cfg.min_rate_gbps:g}")
    elif peers.rate is not None and p.rate_gbps < peers.rate:
        b.finding(
            p.name, "IbPortRateLow",
            f"{p.rate_gbps:g} Gb/s while most of its {peers.active} ACTIVE peers (same model and link layer) "
            f"run at {peers.rate:g} Gb/s",
        )


def judge_counters(b: ObservationBuilder, p: Port, mem: PortMemory, cfg: InfinibandConfig, now: float) -> None:
    """Fatal increases, rates over their windows, flapping, saturation."""
    for counter, reason in FATAL:
        rise, _ = increase(mem.counters.get(counter, []), now, cfg.fatal_window)
        if rise > 0:
            b.finding(
                p.name, reason,
                f"{counter} rose by {rise} within the last {format_duration(cfg.fatal_window)} (now {p.counters[counter]})"
                if counter in p.counters else f"{counter} rose by {rise} within the last {format_duration(cfg.fatal_window)}",
            )
    for counter, reason, limit, window in (
        ("symbol_error", "IbSymbolErrors", cfg.symbol_error_limit, cfg.symbol_error_window),
        ("port_rcv_errors", "IbReceiveErrors", cfg.rcv_error_limit, cfg.rcv_error_window),
        ("link_error_recovery", "IbLinkErrorRecovery", cfg.link_error_recovery_limit, cfg.link_error_recovery_window),
    ):
        rise, seconds = increase(mem.counters.get(counter, []), now, window)
        if limit > 0 and rise > limit:
            b.finding(
                p.name, reason,
                f"{counter} rose by {rise} in {format_duration(seconds)}; limit {limit} per {format_duration(window)}",
            )
    downs = sum(1 for t in mem.downs if t > now - cfg.flap_window)
    if downs >= cfg.flap_threshold:
        b.finding(
            p.name, "IbPortFlapping",
            f"went down {downs} times within {format_duration(cfg.flap_window)} (threshold {cfg.flap_threshold}); "
            f"now {'ACTIVE' if p.active else _state(p)}",
        )
    full = [f"{c} = {p.counters[c]}" for c in counter_windows(cfg) if p.counters.get(c) == (1 << ERROR_COUNTERS[c]) - 1]
    if full:
        b.finding(p.name, "IbCounterSaturated", "at its maximum, increases cannot be seen: " + ", ".join(full))


def judge_count(b: ObservationBuilder, ports: list[Port], cfg: InfinibandConfig) -> None:
    active = sum(p.active for p in ports)
    if cfg.expected_ports and active < cfg.expected_ports:
        idle = [f"{p.name} ({_state(p)})" for p in ports if not p.active]
        b.finding(
            "infiniband", "IbPortsMissing",
            f"{active} of {cfg.expected_ports} expected ports ACTIVE ({len(ports)} present)"
            + ("; not active: " + ", ".join(idle) if idle else ""),
        )
