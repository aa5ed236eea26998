"""What the InfiniBand check remembers across runs and restarts (``infiniband.json`` in the state dir).

- the devices and ports seen, and which ports were ever ACTIVE (kept across reboots: an HCA
  that does not come back after a reboot is exactly the fault to catch);
- per port, this boot: when its current down spell began, the times it went down (for flap
  counting over ``flap_window``), and a short history of the judged error counters;
- the counter files that failed with EINVAL this boot (never read again until the next boot).

Counter histories are (time, value) pairs in wall-clock seconds, thinned to about one pair per
twelfth of the counter's window, so a 1 h window keeps ~13 pairs whatever the interval. A value
below the previous one is a reset (driver reload, ``perfquery -x``, device reset): the history
starts again from it, never a negative increase. A new boot id, or a clock that went back, starts
every history again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..statedir import StateFile, flag, integer, number, obj, seq, text, texts

STATE_FILE = "infiniband.json"
MAX_DOWNS = 64  # down events kept per port: far above any flap_threshold worth setting


@dataclass
class PortMemory:
    ever_active: bool = False
    last_active: bool | None = None
    down_since: float | None = None
    downs: list[float] = field(default_factory=list)
    counters: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def forget_boot(self) -> None:
        self.last_active, self.down_since = None, None
        self.downs.clear()
        self.counters.clear()

    def as_json(self) -> dict[str, Any]:
        return {
            "ever_active": self.ever_active,
            "last_active": self.last_active,
            "down_since": self.down_since,
            "downs": self.downs,
            "counters": {k: [list(p) for p in v] for k, v in self.counters.items()},
        }


@dataclass
class Memory:
    boot: str = ""
    devices: dict[str, list[int]] = field(default_factory=dict)  # seen, across boots
    ports: dict[str, PortMemory] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)  # EINVAL counter files, this boot

    def begin(self, boot: str, now: float) -> None:
        """A new boot, or a clock that went back behind what is stored: start every window again."""
        if boot != self.boot or now < self.latest():
            self.boot = boot
            self.skipped.clear()
            for p in self.ports.values():
                p.forget_boot()

    def latest(self) -> float:
        times = [t for p in self.ports.values() for h in p.counters.values() for t, _ in h[-1:]]
        times += [t for p in self.ports.values() for t in p.downs[-1:]]
        return max(times, default=0.0)

    def port(self, name: str) -> PortMemory:
        return self.ports.setdefault(name, PortMemory())

    def substance(self) -> Any:
        """What a restart must not lose: all of it but the times of readings that repeat the value
        before them (those only say "unchanged", which the next reading says again)."""
        def values(h: list[tuple[float, int]]) -> list[int]:
            return [v for i, (_, v) in enumerate(h) if i == 0 or v != h[i - 1][1]]

        ports = {
            k: (p.ever_active, p.last_active, p.down_since, tuple(p.downs),
                {c: values(h) for c, h in p.counters.items()})
            for k, p in self.ports.items()
        }
        return (self.boot, self.devices, sorted(self.skipped), ports)

    def as_json(self) -> dict[str, Any]:
        return {
            "boot": self.boot,
            "devices": self.devices,
            "ports": {k: v.as_json() for k, v in sorted(self.ports.items())},
            "skipped": sorted(self.skipped),
        }


# ---------------------------------------------------------------- counter windows


def record(history: list[tuple[float, int]], now: float, value: int, keep: float) -> int:
    """Add a reading; returns the increase since the previous one (0 after a reset).
    Pairs closer than keep/12 to the one before the newest replace the newest."""
    if history and value < history[-1][1]:
        history[:] = [(now, value)]
        return 0
    step = value - history[-1][1] if history else 0
    if len(history) >= 2 and now - history[-2][0] < keep / 12:
        history[-1] = (now, value)
    else:
        history.append((now, value))
    while len(history) >= 2 and history[1][0] <= now - keep:
        del history[0]
    return step


def increase(history: list[tuple[float, int]], now: float, window: float) -> tuple[int, float]:
    """The increase over the window and the seconds it was measured over: from the newest
    reading at or before its start (or the oldest there is: never extrapolated) to the last."""
    if not history:
        return 0, 0.0
    base = history[0]
    for pair in history:
        if pair[0] > now - window:
            break
        base = pair
    return history[-1][1] - base[1], history[-1][0] - base[0]


# ---------------------------------------------------------------- the state file


def _port(raw: Any, where: str) -> PortMemory:
    d = obj(raw, where)
    down_since = d.get("down_since")
    last = d.get("last_active")
    counters: dict[str, list[tuple[float, int]]] = {}
    for name, pairs in obj(d.get("counters", {}), f"{where}.counters").items():
        hist = []
        for i, pair in enumerate(seq(pairs, f"{where}.counters.{name}")):
            t, v = seq(pair, f"{where}.counters.{name}[{i}]")
            hist.append((number(t, f"{where}.counters.{name}[{i}][0]"), integer(v, f"{where}.counters.{name}[{i}][1]")))
        counters[name] = hist
    return PortMemory(
        ever_active=flag(d.get("ever_active", False), f"{where}.ever_active"),
        last_active=None if last is None else flag(last, f"{where}.last_active"),
        down_since=None if down_since is None else number(down_since, f"{where}.down_since"),
        downs=[number(t, f"{where}.downs[{i}]") for i, t in enumerate(seq(d.get("downs", []), f"{where}.downs"))],
        counters=counters,
    )


def _parse(raw: Any) -> Memory:
    d = obj(raw)
    devices = {
        name: [integer(p, f"devices.{name}[{i}]") for i, p in enumerate(seq(ports, f"devices.{name}"))]
        for name, ports in obj(d["devices"], "devices").items()
    }
    ports = {name: _port(v, f"ports.{name}") for name, v in obj(d["ports"], "ports").items()}
    return Memory(text(d["boot"], "boot"), devices, ports, set(texts(d.get("skipped", []), "skipped")))


MEMORY_FILE = StateFile(STATE_FILE, _parse)
