"""Make this Node match the desired state, one step at a time.

`Reconciler.step(now)` does all the work: it evaluates hysteresis on the
latest store snapshot, persists what changed, runs the policy, and sends the
writes that are needed, in this order: taints (the scheduler acts on them),
conditions, events. It returns the monotonic time it wants to be woken again;
it never sleeps. The actuator thread calls it when woken (a new snapshot, the
kill switch, a timer); the fleet simulation calls it in virtual time.

Nothing is written when nothing changed. The Node is re-read only at start,
on a jittered resync (drift repair: someone removed our taint while the
fault persists) and after a 409. A 429, a 5xx or a connection error makes
the step return at once with the backoff time (see `ratelimit.Gate`).

This module is the loop and its retries; the writers are its parts:
`taint_writer`, `condition_writer`, and the event path (`outbox`), which
share the copy of the Node (`nodecopy`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..catalog import Catalog
from ..findings import Finding, Sample
from ..statedir import Damaged, StateDir, StateFile, flag, obj, seq, text
from ..store import Snapshot
from . import SOURCE
from .adoption import Adoption
from .api import ApiError, KubeApi, Stats, Wait
from .budget import Budget
from .condition_writer import ConditionWriter
from .events import EventRecorder
from .hysteresis import Active, Hysteresis, reports
from .nodecopy import NodeCopy, Once
from .nodes import taints_of, triple
from .outbox import OUTBOX_MAX, Outbox
from .policy import Desired, DesiredTaint, decide, events_for, gates_of, watched_families
from .settings import KubernetesSection
from .taint_writer import TaintWriter

log = logging.getLogger(__name__)

STATE_FILE = "kubernetes.json"
__all__ = ["OUTBOX_MAX", "STATE_FILE", "Reconciler"]


@dataclass(frozen=True, slots=True)
class Saved:
    active: list[Active]
    outbox: list[dict[str, str]]
    slot: bool


OUTBOX_FIELDS = ("type", "reason", "action", "note", "name")


def _parse(raw: Any) -> Saved:
    d = obj(raw)
    if d.get("version") != 1:
        raise Damaged(f"version: expected 1, got {d.get('version')!r}")
    active = [Active.from_json(obj(a, f"active[{i}]")) for i, a in enumerate(seq(d.get("active", []), "active"))]
    outbox = []
    for i, item in enumerate(seq(d.get("outbox", []), "outbox")):
        item = obj(item, f"outbox[{i}]")
        outbox.append({k: text(item[k], f"outbox[{i}].{k}") for k in OUTBOX_FIELDS if k in item or k != "name"})
    return Saved(active, outbox, flag(d.get("slot", False), "slot"))


KUBE_FILE = StateFile(STATE_FILE, _parse)


class Reconciler:
    def __init__(
        self,
        cfg: KubernetesSection,
        node: str,
        state: StateDir,
        *,
        catalog: Catalog,
        api: KubeApi | None,
        dry_run: bool,
        now: float,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.cfg, self.node_name, self.statedir, self.api = cfg, node, state, api
        self.catalog = catalog  # reasons' families and severities: what the policy decides from
        self.dry_run = dry_run or api is None
        self.wall, self.rng = wall, rng or random.Random()
        self.stats = stats or Stats()
        saved = state.load(KUBE_FILE)
        self.adoption = Adoption(cfg.hysteresis, fresh=saved is None)  # nothing known of earlier runs
        saved = saved or Saved([], [], False)
        self.hyst = Hysteresis(cfg.hysteresis, catalog, saved.active)
        self.budget = Budget(api, cfg.budget, node, held=saved.slot, recheck=cfg.resync_interval, rng=self.rng)
        recorder = EventRecorder(api, node, burst=cfg.event_burst, refill=cfg.event_refill, now=now) if api else None
        self.outbox = Outbox(saved.outbox, node, recorder=recorder, stats=self.stats, wall=wall, persist=self._persist)
        self.node = NodeCopy(node)
        self.taints = TaintWriter(cfg, self.node, api=api, budget=self.budget, stats=self.stats, wall=wall,
                                  queue=self.outbox.queue, persist=self._persist)
        self.conditions = ConditionWriter(cfg, self.node, api=api, wall=wall)
        self.paused: bool | None = False if not cfg.kill_switch.name else None
        self.desired = Desired()
        self.latest: Snapshot | None = None
        self.synced_at = 0.0
        self.error: ApiError | None = None
        self._start_at = now + self.rng.uniform(0, cfg.startup_jitter)
        self._resync_at = 0.0
        self._error_wait = 0.0
        self._no_cluster: dict[str, set[tuple[str, ...]]] = {}  # what would be, with no cluster at all
        self._once = Once()

    @property
    def withheld(self) -> list[DesiredTaint]:
        """Budgeted taints not applied for lack of a slot of the budget."""
        return self.taints.withheld

    @property
    def would(self) -> dict[str, set[tuple[str, ...]]]:
        """What a write would do that was not done (dry run, kill switch, budget): kind → (key, value, cause)."""
        if self.api is None:
            return {"taint": set(), "untaint": set(), "condition": set()} | self._no_cluster
        return {**self.taints.would, "condition": self.conditions.would}

    # ------------------------------------------------------------ the step

    def step(self, now: float, snap: Snapshot | None = None) -> float:
        if snap is not None:
            self.latest = snap
        if self.latest is None:
            # Nothing is known yet: acting now would apply an empty desired state and
            # strip the taints of a sick node right after a restart.
            return float("inf")
        self._evaluate(now)
        wake = min(self.hyst.next_deadline() or float("inf"), self.adoption.deadline() or float("inf"))
        if self.api is None:
            self._dry_run_without_cluster()
            return wake
        if now < self._start_at:
            return min(wake, self._start_at)
        try:
            self._sync(now)
        except Wait as w:
            return min(wake, w.until)
        except ApiError as exc:
            return min(wake, self._failed(exc, now))
        self._recovered()
        return min(wake, self._next_periodic())

    def counted(self) -> frozenset[str]:
        """Whose run counts the next step reads (`hysteresis.wake_key`): the hysteresis' pending counts'
        and, while adoption holds, the origins it is still counting."""
        return self.hyst.counting() | self.adoption.counting()

    def _evaluate(self, now: float) -> None:
        assert self.latest is not None
        reps = reports(self.latest, exclude=(SOURCE,))
        transitions, changed = self.hyst.observe(reps, now, self.wall())
        self.adoption.observe(reps, now)
        for t in transitions:
            a = t.finding
            log.log(logging.WARNING if t.kind == "raised" else logging.INFO, "finding %s: %s %s %s (%s)",
                    t.kind, a.check, a.subject, a.reason, a.severity.value)
        self.outbox.queue(events_for(transitions), persist=False)
        if changed:
            self._persist()  # one atomic write: the transitions and their events, before anything acts on them
        families = watched_families(self.latest, self.catalog, exclude=(SOURCE,))
        self.taints.gates = gates_of(families)
        self.desired = decide(self.hyst.active.values(), families, self.cfg, self.catalog)

    def _persist(self) -> None:
        self.statedir.write_json(STATE_FILE, {
            "version": 1, "active": self.hyst.to_json(), "outbox": self.outbox.items, "slot": self.budget.held,
        })

    def _sync(self, now: float) -> None:
        """Taints first (the scheduler acts on them), then conditions, then events."""
        if self.node.stale:  # a 409 told us our copy is old: read the node itself, not the watch cache
            self.node.obj = self.api.read_node(self.node_name)  # type: ignore[union-attr]
            self.node.stale = False
        if self.node.obj is None or now >= self._resync_at:
            self._refresh(now)
        want = self.adoption.keep(self.node.obj, list(self.desired.taints), self.taints)
        self.taints.sync(now, want, self.paused, self.dry_run)
        self.conditions.sync(now, self.desired.conditions, self.dry_run)
        self.outbox.flush(now, self.node.uid(), self.dry_run)
        self.synced_at = self.wall()

    def _refresh(self, now: float) -> None:
        assert self.api is not None
        node, _ = self.api.list_node(self.node_name)
        if node is None:
            raise ApiError(404, f'nodes "{self.node_name}" not found', reason="NotFound")
        self.node.obj = node
        self._resync_at = now + self.cfg.resync_interval * (0.8 + 0.4 * self.rng.random())

    # ------------------------------------------------------------ errors, timers

    def _failed(self, exc: ApiError, now: float) -> float:
        first = self.error is None or (self.error.status, self.error.reason) != (exc.status, exc.reason)
        (log.error if first else log.debug)("kubernetes API: %s", exc)
        self.error = exc
        if exc.retryable:
            self.stats.retry({0: "connection", 401: "unauthorized", 429: "throttled"}.get(exc.status, "server_error"))
            assert self.api is not None
            return self.api.gate.backing_off_until
        self._error_wait = min(self.cfg.resync_interval, max(10.0, self._error_wait * 2))
        if exc.status in (404, 409):
            self.node.obj = None  # read it again next time
        return now + self._error_wait * (0.8 + 0.4 * self.rng.random())

    def _recovered(self) -> None:
        if self.error is not None:
            log.info("kubernetes API: node %s in sync again", self.node_name)
        self.error = None
        self._error_wait = 0.0

    def _next_periodic(self) -> float:
        times = [self._resync_at]
        if self.cfg.condition_heartbeat > 0:
            times.append(self.conditions.heartbeat_at)
        if self.withheld:
            times.append(self.budget.retry_at)
        return min(times)

    def _dry_run_without_cluster(self) -> None:
        shown = (tuple(self.desired.taints), tuple(c for c in self.desired.conditions if c.status == "True"))
        self._no_cluster = {
            "taint": {(t.key, t.effect, "dry_run") for t in self.desired.taints},
            "condition": {(c.type, c.status, "dry_run") for c in self.desired.conditions},
        }
        self.outbox.drain_without_cluster()
        if self._once("no-cluster", shown):
            log.warning("dry run (no cluster): node %s would carry taints %s and conditions %s", self.node_name,
                        [f"{t.key}={t.value}:{t.effect}" for t in shown[0]] or "none",
                        [f"{c.type}={c.status} ({c.reason})" for c in shown[1]] or "none")

    # ------------------------------------------------------------ what it reports

    def findings(self) -> tuple[Finding, ...]:
        out = []
        if self.withheld:
            reason = "TaintBudgetMissing" if self.budget.state == "missing" else "TaintBudgetExhausted"
            keys = ", ".join(f"{t.key}:{t.effect}" for t in self.withheld)
            out.append(self.catalog.finding(SOURCE, "budget", reason, f"withholding {keys}"))
        if self.error is not None:
            out.append(self.catalog.finding(SOURCE, "api", "KubeApiError", str(self.error)[:200]))
        return tuple(out)

    def samples(self, kill_switch: str) -> list[Sample]:
        out = self.stats.samples()
        out.append(Sample("node_health_kube_last_sync_timestamp_seconds", self.synced_at))
        out.append(Sample("node_health_kube_dry_run", 1.0 if self.dry_run else 0.0))
        for state in ("paused", "active", "unknown", "disabled"):
            out.append(Sample("node_health_kube_kill_switch", float(state == kill_switch), (("state", state),)))
        for state in ("idle", "held", "exhausted", "missing", "disabled"):
            out.append(Sample("node_health_kube_budget", float(state == self.budget.state), (("state", state),)))
        for k, _, e in sorted(triple(t) for t in taints_of(self.node.obj) if self.taints.ours(t)):
            out.append(Sample("node_health_kube_taint", 1.0, (("key", k), ("effect", e))))
        for a in sorted(self.hyst.active.values(), key=lambda a: a.key):
            active = (("check", a.check), ("subject", a.subject), ("reason", a.reason), ("severity", a.severity.value))
            out.append(Sample("node_health_kube_active_finding", 1.0, active))
        would = self.would
        for what, name, labels in (("taint", "node_health_would_taint", ("key", "effect", "cause")),
                                   ("untaint", "node_health_would_untaint", ("key", "effect", "cause")),
                                   ("condition", "node_health_would_set_condition", ("type", "status", "cause"))):
            for values in sorted(would[what]):
                out.append(Sample(name, 1.0, tuple(zip(labels, values))))
        return out
