"""The taint writer: this Node's ``spec.taints`` made to match the desired
taints, within the fleet-wide taint budget.

Only taints under the agent's prefix (and the reserved gates it manages now)
are added, changed or removed; every other taint is copied unchanged (the
list is atomic: see `nodes`). A write carries the resourceVersion it was
planned from; a 409 re-reads the Node itself and plans again, up to
``conflict_retries`` times. A budgeted taint is applied only with a slot of
the budget; without one it is withheld (reported, evented, never applied),
and a taint already present is never removed or changed for lack of a slot.
In a dry run or while the kill switch pauses the agent, nothing is written:
what would be is logged once per change and exported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .api import ApiError, KubeApi, Stats
from .budget import Budget
from .nodecopy import NodeCopy, Once
from .nodes import diff_taints, managed, plan_taints, taints_of, triple
from .policy import BUDGET_EXEMPT_SUFFIXES, DesiredTaint, EventSpec, budget_event
from .settings import KubernetesSection

log = logging.getLogger(__name__)

Would = set[tuple[str, ...]]


class TaintWriter:
    def __init__(
        self,
        cfg: KubernetesSection,
        node: NodeCopy,
        *,
        api: KubeApi | None,
        budget: Budget,
        stats: Stats,
        wall: Callable[[], float],
        queue: Callable[[list[EventSpec]], None],
        persist: Callable[[], None],
    ) -> None:
        self.cfg, self.node, self.api, self.budget, self.stats, self.wall = cfg, node, api, budget, stats, wall
        self._queue, self._persist = queue, persist
        self.gates: frozenset[str] = frozenset()  # reserved taint keys managed now (preflight)
        self.withheld: list[DesiredTaint] = []
        self.would: dict[str, Would] = {"taint": set(), "untaint": set()}
        self._once = Once()

    def sync(self, now: float, desired: tuple[DesiredTaint, ...] | list[DesiredTaint], paused: bool | None,
             dry_run: bool) -> None:
        want = list(desired)
        current = taints_of(self.node.obj)
        self.would["taint"], self.would["untaint"] = set(), set()
        self.withheld = []
        if plan_taints(current, want, self.owns, 0) is not None:
            cause = "dry_run" if dry_run else ("kill_switch" if paused is not False else "")
            if cause:
                self._would(current, want, cause)
                return
            held = self.budget.held
            want = self._within_budget(now, current, want)
            self._write(want)
            if self.budget.held != held:
                self._persist()  # after the taint: a crash in between finds the Lease again (409 AlreadyExists)
        if not self.withheld:
            self._once.forget("budget")
        if not any(t.budgeted for t in desired):
            self.budget.idle()
            if not any(self.budgeted(t) for t in taints_of(self.node.obj)) and self.budget.held:
                self.budget.release()
                self._persist()

    def owns(self, key: str) -> bool:
        return managed(key, self.cfg.taint_prefix, self.gates)

    def ours(self, t: dict[str, Any]) -> bool:
        """One of the taints this writer manages."""
        return self.owns(str(t.get("key", "")))

    def gate(self, t: dict[str, Any]) -> bool:
        """A reserved gate taint (preflight) managed now."""
        return str(t.get("key", ""))[len(self.cfg.taint_prefix):] in self.gates

    def budgeted(self, t: dict[str, Any]) -> bool:
        """One of ours that holds a slot of the fleet-wide budget (gates such as preflight do not)."""
        key = str(t.get("key", ""))
        return self.owns(key) and key[len(self.cfg.taint_prefix):] not in BUDGET_EXEMPT_SUFFIXES

    def _within_budget(self, now: float, current: list[dict[str, Any]], want: list[DesiredTaint]) -> list[DesiredTaint]:
        if not any(t.budgeted for t in want):
            return want
        if self.budget.ensure(now, self.node.uid()):
            return want
        present = {str(t.get("key")): t for t in current if self.ours(t)}
        kept: list[DesiredTaint] = []
        for d in want:
            if not d.budgeted:
                kept.append(d)
            elif d.key in present:  # never changed or removed for lack of a slot
                k, v, e = triple(present[d.key])
                kept.append(DesiredTaint(k, v, e))
            else:
                self.withheld.append(d)
        if self.withheld and self._once("budget", self.budget.state):
            self._queue([budget_event(self.withheld, self.budget.state == "missing")])
        for d in self.withheld:
            self.would["taint"].add((d.key, d.effect, "budget"))
        return kept

    def _write(self, want: list[DesiredTaint]) -> None:
        node = self.node
        assert self.api is not None and node.obj is not None
        for _attempt in range(self.cfg.conflict_retries):
            plan = plan_taints(taints_of(node.obj), want, self.owns, self.wall())
            if plan is None:
                return
            rv = node.obj["metadata"]["resourceVersion"]
            try:
                node.obj = self.api.patch_node(node.name, {"metadata": {"resourceVersion": rv}, "spec": {"taints": plan}})
            except ApiError as exc:
                if exc.status != 409:
                    raise
                self.stats.retry("conflict")
                log.info("taint write conflicted (resourceVersion %s is stale), re-reading the node", rv)
                node.stale = True
                node.obj = self.api.read_node(node.name)  # fresh: not from the watch cache
                node.stale = False
                continue
            ours = sorted(triple(t) for t in taints_of(node.obj) if self.ours(t))
            log.info("taints of node %s now: %s", node.name, [f"{k}={v}:{e}" for k, v, e in ours] or "none")
            return
        raise ApiError(409, f"taint write still conflicting after {self.cfg.conflict_retries} fresh reads", reason="Conflict")

    def _would(self, current: list[dict[str, Any]], want: list[DesiredTaint], cause: str) -> None:
        add, remove = diff_taints(current, want, self.owns)
        self.would["taint"] = {(k, e, cause) for k, _, e in add}
        self.would["untaint"] = {(k, e, cause) for k, _, e in remove}
        plan = plan_taints(current, want, self.owns, self.wall())
        if self._once("taints", (cause, str(plan))):
            log.warning("%s: not changing taints of node %s; would PATCH spec.taints to %s (add %s, remove %s)",
                        cause.replace("_", " "), self.node.name, plan, add, remove)
