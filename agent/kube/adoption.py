"""Our taints found on the node when the agent starts with no state of earlier runs.

The hysteresis' active set (kubernetes.json) is what keeps a sick node tainted
across a restart. When that file is absent or was set aside as damaged, the
agent knows nothing of why the node carries its taints; applying the empty
desired state of a first cycle would release a node that may still be sick,
and a warning that needs `raise_cycles` runs would only taint it again later.
So the taints of ours already on the node are kept (adopted) until the checks
have run and told what they will tell: every check and event source reports
definitely (none failed, timed out or not run yet) for
max(raise_cycles, clear_cycles) consecutive runs of each check, or for
max(raise_after, clear_after). From then on the taints follow the findings as
usual, so a node found healthy is released, one still sick stays tainted.
Only the taints on the node when it is first read are adopted; a gate
(preflight) is held only until every check has reported once, since its own
finding says at once whether the burn passed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .hysteresis import ALL, Report
from .nodes import taints_of, triple
from .policy import DesiredTaint
from .settings import HysteresisSection

if TYPE_CHECKING:
    from .taint_writer import TaintWriter

log = logging.getLogger(__name__)


class Adoption:
    def __init__(self, cfg: HysteresisSection, fresh: bool) -> None:
        self.holding = fresh
        self.cycles = max(cfg.raise_cycles, cfg.clear_cycles)
        self.period = max(cfg.raise_after, cfg.clear_after)
        self._base: dict[str, int] = {}  # check -> its run count at the first definite report
        self._since: float | None = None  # monotonic time every origin first reported definitely
        self._logged: tuple[tuple[str, str, str], ...] = ()
        self._adopted: frozenset[str] | None = None  # keys of ours on the node when first read
        self._last: dict[str, int | None] = {}  # each origin's run count at the last observe

    def observe(self, reps: Mapping[str, Report], now: float) -> bool:
        """Count definite runs; True once, when the checks have settled and adoption ends."""
        if not self.holding:
            return False
        self._last = {name: r.run for name, r in reps.items()}
        if not reps or any(ALL in r.held for r in reps.values()):
            self._base.clear()  # a check failed or has not run: count again from its next definite run
            self._since = None
            return False
        if self._since is None:
            self._since = now
        for name, r in reps.items():  # each origin counted from its own first definite run (not all() cut short)
            if r.run is not None:
                self._base.setdefault(name, r.run)
        runs = all(r.run is None or r.run - self._base[name] + 1 >= self.cycles for name, r in reps.items())
        if runs or now - self._since >= self.period:
            self.holding = False
            if self._logged:
                log.info("checks have run since start: adopted taints now follow the findings")
            return True
        return False

    def keep(self, node: dict[str, Any] | None, want: list[DesiredTaint], writer: TaintWriter) -> list[DesiredTaint]:
        """`want` plus the taints of ours that were on the node when it was first
        read, while adoption holds. A gate (preflight) follows its own check as
        soon as every check has reported once: its pass releases the node at once."""
        if not self.holding or node is None:
            return want
        if self._adopted is None:
            self._adopted = frozenset(str(t.get("key", "")) for t in taints_of(node) if writer.ours(t))
        keys = {d.key for d in want}
        kept = [
            t for t in taints_of(node)
            if str(t.get("key", "")) in self._adopted and str(t.get("key", "")) not in keys
            and not (writer.gate(t) and self._since is not None)
        ]
        adopted = tuple(sorted(triple(t) for t in kept))
        if adopted and adopted != self._logged:
            log.warning("node carries taints of ours %s and no state of earlier runs is kept: "
                        "holding them until the checks have run", [f"{k}={v}:{e}" for k, v, e in adopted])
            self._logged = adopted
        return want + [DesiredTaint(*triple(t), budgeted=writer.budgeted(t)) for t in kept]

    def counting(self) -> frozenset[str]:
        """The origins whose next run can move adoption on (`hysteresis.wake_key`): while it holds, those
        not yet seen for `cycles` definite runs since their count began; a check's later runs are no news."""
        if not self.holding:
            return frozenset()
        return frozenset(name for name, run in self._last.items()
                         if run is not None and (name not in self._base or run - self._base[name] + 1 < self.cycles))

    def deadline(self) -> float | None:
        return self._since + self.period if self.holding and self._since is not None else None
