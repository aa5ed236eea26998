"""Counters that only go up, whatever happens to the rules that count.

A count rule starts at zero whenever it is created, and ``iptables -Z`` zeroes
it in place. The exported value is ``base + last``: ``last`` is what the
current rule said when last read, ``base`` what the rules before it had
counted when they were last read. When the rule is a new one (another
generation in its comment: we rebuilt it, or ``agent rules install`` did
while the agent was down) or went backwards (zeroed), ``last`` moves into
``base``. Traffic counted between our last read and the rule's end is lost;
nothing is counted twice.

Both numbers are written to the state directory (atomically) after every run
that changed them, so a restart continues from the last exported value: a
rule that kept counting meanwhile just reads higher; one re-created meanwhile
has another generation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..statedir import Damaged, StateDir, StateFile, integer, obj

log = logging.getLogger(__name__)

STATE_FILE = "traffic.json"
VERSION = 1


@dataclass(slots=True)
class Tally:
    gen: str | None = None  # generation of the count rule last read; None: never read
    packets: int = 0  # that rule's counters when last read
    bytes: int = 0
    base_packets: int = 0  # counted by earlier rules
    base_bytes: int = 0

    @property
    def total_packets(self) -> int:
        return self.base_packets + self.packets

    @property
    def total_bytes(self) -> int:
        return self.base_bytes + self.bytes

    def observe(self, gen: str, packets: int, nbytes: int) -> bool:
        """Take a reading; True when it shows a new or zeroed rule."""
        reset = self.gen is not None and (gen != self.gen or packets < self.packets or nbytes < self.bytes)
        if reset:
            self.base_packets += self.packets
            self.base_bytes += self.bytes
        self.gen, self.packets, self.bytes = gen, packets, nbytes
        return reset

    def as_json(self) -> dict[str, Any]:
        """The saved form (what `dataclasses.asdict` gives, a tenth of its cost: a node with 110 pods saves ~450)."""
        return {"gen": self.gen, "packets": self.packets, "bytes": self.bytes, "base_packets": self.base_packets,
                "base_bytes": self.base_bytes}

    @classmethod
    def from_json(cls, raw: Any) -> Tally | None:
        if not isinstance(raw, dict):
            return None
        nums = {k: raw.get(k) for k in ("packets", "bytes", "base_packets", "base_bytes")}
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in nums.values()):
            return None
        gen = raw.get("gen")
        if gen is not None and not isinstance(gen, str):
            return None
        return cls(gen, **nums)  # type: ignore[arg-type]


def _parse(raw: Any) -> tuple[dict[str, Tally], dict[str, int]]:
    d = obj(raw)
    if d.get("version") != VERSION:
        raise Damaged(f"version: expected {VERSION}, got {d.get('version')!r}")
    tallies: dict[str, Tally] = {}
    for key, value in obj(d.get("tallies", {}), "tallies").items():
        tally = Tally.from_json(value)
        if tally is None:
            raise Damaged(f"tallies.{key}: expected gen and four counts of zero or more")
        tallies[key] = tally
    repairs = {}
    for family, n in obj(d.get("repairs", {}), "repairs").items():
        if integer(n, f"repairs.{family}") < 0:
            raise Damaged(f"repairs.{family}: expected zero or more, got {n}")
        repairs[family] = n
    return tallies, repairs


TRAFFIC_FILE = StateFile(STATE_FILE, _parse)


class Tallies:
    """Every (direction, family) tally and the repair counts, persisted in the state dir."""

    def __init__(self, state_dir: str | None) -> None:
        self._state = StateDir(state_dir) if state_dir else None
        self.tallies: dict[str, Tally] = {}
        self.repairs: dict[str, int] = {}
        self._written: Any = None
        if self._state is not None:
            saved = self._state.load(TRAFFIC_FILE)
            if saved is not None:
                self.tallies, self.repairs = saved
                self._written = self._json()

    def get(self, direction: str, family: str) -> Tally:
        return self.named(f"{direction}/{family}")

    def named(self, name: str) -> Tally:
        """Any rule's tally by name (per-pod rules: `agent.traffic.perpod.tally_key`)."""
        return self.tallies.setdefault(name, Tally())

    def forget(self, names: Iterable[str]) -> None:
        """Drop the tallies of rules that are gone for good (a pod that left the node)."""
        for name in names:
            self.tallies.pop(name, None)

    def repaired(self, family: str) -> None:
        self.repairs[family] = self.repairs.get(family, 0) + 1

    def _json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "tallies": {k: v.as_json() for k, v in sorted(self.tallies.items())},
            "repairs": dict(sorted(self.repairs.items())),
        }

    def save(self) -> None:
        """Write the file if anything changed since it was read or last written."""
        data = self._json()
        if self._state is None or data == self._written:
            return
        self._state.ensure()
        self._state.write_json(STATE_FILE, data)
        self._written = data
