"""Per-second error and drop rates from /proc/net/dev, between two runs."""

from __future__ import annotations

from dataclasses import dataclass

from ..hostpaths import HostPaths, read_bounded
from ..native import NetDevStats, parse_net_dev

# /proc/net/dev grows by ~130 bytes per interface; hosts with thousands of veths stay far below this.
NET_DEV_LIMIT = 4 << 20


def read_net_dev(paths: HostPaths) -> dict[str, NetDevStats]:
    """The counters by interface. Raises OSError or ValueError (past the bound).
    /proc/net is the reading process's network namespace: in a pod, the host's
    interfaces appear only with hostNetwork: true."""
    return {s.name: s for s in parse_net_dev(read_bounded(paths.proc("net/dev"), NET_DEV_LIMIT))}


@dataclass(frozen=True, slots=True)
class Rates:
    seconds: float
    rx_errors: float
    tx_errors: float
    rx_drops: float
    tx_drops: float

    @property
    def errors(self) -> float:
        return self.rx_errors + self.tx_errors

    @property
    def drops(self) -> float:
        return self.rx_drops + self.tx_drops


class RateTracker:
    """Remembers the last counters of each interface and turns the next ones into rates."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int | None, NetDevStats]] = {}

    def update(self, name: str, stats: NetDevStats, now: float, ifindex: int | None = None) -> Rates | None:
        """Rates since the previous update; None on the first one and after a reset:
        a re-created interface (new ifindex) or counters that went backwards (a
        driver reset, or a 32-bit counter that wrapped) start a new baseline."""
        prev = self._last.get(name)
        self._last[name] = (now, ifindex, stats)
        if prev is None:
            return None
        then, old_index, old = prev
        seconds = now - then
        recreated = ifindex is not None and old_index is not None and ifindex != old_index
        if recreated or seconds <= 0 or any(n < o for n, o in zip(stats[1:], old[1:])):
            return None
        return Rates(
            seconds=seconds,
            rx_errors=(stats.rx_errs - old.rx_errs) / seconds,
            tx_errors=(stats.tx_errs - old.tx_errs) / seconds,
            rx_drops=(stats.rx_drop - old.rx_drop) / seconds,
            tx_drops=(stats.tx_drop - old.tx_drop) / seconds,
        )

    def keep(self, names: set[str]) -> None:
        """Forget interfaces no longer seen (memory must not grow with uptime)."""
        for name in set(self._last) - names:
            del self._last[name]
