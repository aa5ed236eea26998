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
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..findings import Finding, Sample, Severity
from ..state import Damaged, StateDir, StateFile, flag, obj, seq, text
from ..store import Snapshot
from . import SOURCE
from .adoption import Adoption
from .api import ApiError, KubeApi, Stats, Wait
from .budget import Budget
from .events import EventRecorder
from .hysteresis import Active, Hysteresis, reports
from .nodes import conditions_of, diff_taints, managed, plan_conditions, plan_taints, taints_of, triple
from .policy import (
    BUDGET_EXEMPT_SUFFIXES,
    Desired,
    DesiredTaint,
    EventSpec,
    budget_event,
    decide,
    events_for,
    gates_of,
    watched_families,
)
from .settings import KubernetesSection

log = logging.getLogger(__name__)

STATE_FILE = "kubernetes.json"
OUTBOX_MAX = 100


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
        api: KubeApi | None,
        dry_run: bool,
        now: float,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.cfg, self.node_name, self.statedir, self.api = cfg, node, state, api
        self.dry_run = dry_run or api is None
        self.wall, self.rng = wall, rng or random.Random()
        self.stats = stats or Stats()
        saved = state.load(KUBE_FILE)
        self.adoption = Adoption(cfg.hysteresis, fresh=saved is None)  # nothing known of earlier runs
        saved = saved or Saved([], [], False)
        self.hyst = Hysteresis(cfg.hysteresis, saved.active)
        self.outbox: list[dict[str, str]] = saved.outbox[-OUTBOX_MAX:]
        self.budget = Budget(api, cfg.budget, node, held=saved.slot, recheck=cfg.resync_interval, rng=self.rng)
        self.events = EventRecorder(api, node, burst=cfg.event_burst, refill=cfg.event_refill, now=now) if api else None
        self.paused: bool | None = False if not cfg.kill_switch.name else None
        self.node: dict[str, Any] | None = None
        self.desired = Desired()
        self.gates: frozenset[str] = frozenset()  # reserved taint keys managed now (preflight)
        self.latest: Snapshot | None = None
        self.withheld: list[DesiredTaint] = []
        self.would: dict[str, set[tuple[str, ...]]] = {"taint": set(), "untaint": set(), "condition": set()}
        self.synced_at = 0.0
        self.error: ApiError | None = None
        self._start_at = now + self.rng.uniform(0, cfg.startup_jitter)
        self._resync_at = 0.0
        self._heartbeat_at = 0.0
        self._stale = False
        self._last_ns = 0
        self._error_wait = 0.0
        self._logged: dict[str, object] = {}

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

    def _evaluate(self, now: float) -> None:
        assert self.latest is not None
        reps = reports(self.latest, exclude=(SOURCE,))
        transitions, changed = self.hyst.observe(reps, now, self.wall())
        self.adoption.observe(reps, now)
        for t in transitions:
            a = t.finding
            log.log(logging.WARNING if t.kind == "raised" else logging.INFO, "finding %s: %s %s %s (%s)",
                    t.kind, a.check, a.subject, a.reason, a.severity.value)
        self._queue(events_for(transitions), persist=False)
        if changed:
            self._persist()  # one atomic write: the transitions and their events, before anything acts on them
        families = watched_families(self.latest, exclude=(SOURCE,))
        self.gates = gates_of(families)
        self.desired = decide(self.hyst.active.values(), families, self.cfg)

    def _queue(self, specs: list[EventSpec], persist: bool = True) -> None:
        for spec in specs:
            self.outbox.append({"type": spec.type, "reason": spec.reason, "action": spec.action, "note": spec.note,
                                "name": self._event_name()})
        if len(self.outbox) > OUTBOX_MAX:
            log.warning("event outbox full: dropping %d oldest events", len(self.outbox) - OUTBOX_MAX)
            del self.outbox[:-OUTBOX_MAX]
        if specs and persist:
            self._persist()

    def _persist(self) -> None:
        self.statedir.write_json(STATE_FILE, {
            "version": 1, "active": self.hyst.to_json(), "outbox": self.outbox, "slot": self.budget.held,
        })

    def _sync(self, now: float) -> None:
        if self._stale:  # a 409 told us our copy is old: read the node itself, not the watch cache
            self.node = self.api.read_node(self.node_name)  # type: ignore[union-attr]
            self._stale = False
        if self.node is None or now >= self._resync_at:
            self._refresh(now)
        self._sync_taints(now)
        self._sync_conditions(now)
        self._flush_events(now)
        self.synced_at = self.wall()

    def _refresh(self, now: float) -> None:
        assert self.api is not None
        node, _ = self.api.list_node(self.node_name)
        if node is None:
            raise ApiError(404, f'nodes "{self.node_name}" not found', reason="NotFound")
        self.node = node
        self._resync_at = now + self.cfg.resync_interval * (0.8 + 0.4 * self.rng.random())

    # ------------------------------------------------------------ taints

    def _sync_taints(self, now: float) -> None:
        want = self.adoption.keep(self.node, list(self.desired.taints), self._ours, self._budgeted, self._gate)
        current = taints_of(self.node)
        self.would["taint"], self.would["untaint"] = set(), set()
        self.withheld = []
        if plan_taints(current, want, self._owns, 0) is not None:
            cause = "dry_run" if self.dry_run else ("kill_switch" if self.paused is not False else "")
            if cause:
                self._would(current, want, cause)
                return
            held = self.budget.held
            want = self._within_budget(now, current, want)
            self._write_taints(now, want)
            if self.budget.held != held:
                self._persist()  # after the taint: a crash in between finds the Lease again (409 AlreadyExists)
        if not self.withheld:
            self._logged.pop("budget", None)
        if not any(t.budgeted for t in self.desired.taints):
            self.budget.idle()
            if not any(self._budgeted(t) for t in taints_of(self.node)) and self.budget.held:
                self.budget.release()
                self._persist()

    def _owns(self, key: str) -> bool:
        return managed(key, self.cfg.taint_prefix, self.gates)

    def _ours(self, t: dict[str, Any]) -> bool:
        """One of the taints this reconciler manages."""
        return self._owns(str(t.get("key", "")))

    def _gate(self, t: dict[str, Any]) -> bool:
        return str(t.get("key", ""))[len(self.cfg.taint_prefix):] in self.gates

    def _budgeted(self, t: dict[str, Any]) -> bool:
        """One of ours that holds a slot of the fleet-wide budget (gates such as preflight do not)."""
        key = str(t.get("key", ""))
        return self._owns(key) and key[len(self.cfg.taint_prefix):] not in BUDGET_EXEMPT_SUFFIXES

    def _once(self, topic: str, value: object) -> bool:
        """True the first time `value` is seen for `topic` (logs once per state change)."""
        if self._logged.get(topic) == value:
            return False
        self._logged[topic] = value
        return True

    def _within_budget(self, now: float, current: list[dict[str, Any]], want: list[DesiredTaint]) -> list[DesiredTaint]:
        if not any(t.budgeted for t in want):
            return want
        if self.budget.ensure(now, self._uid()):
            return want
        present = {str(t.get("key")): t for t in current if self._ours(t)}
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

    def _write_taints(self, now: float, want: list[DesiredTaint]) -> None:
        assert self.api is not None and self.node is not None
        for _attempt in range(self.cfg.conflict_retries):
            plan = plan_taints(taints_of(self.node), want, self._owns, self.wall())
            if plan is None:
                return
            rv = self.node["metadata"]["resourceVersion"]
            try:
                self.node = self.api.patch_node(self.node_name, {"metadata": {"resourceVersion": rv}, "spec": {"taints": plan}})
            except ApiError as exc:
                if exc.status != 409:
                    raise
                self.stats.retry("conflict")
                log.info("taint write conflicted (resourceVersion %s is stale), re-reading the node", rv)
                self._stale = True
                self.node = self.api.read_node(self.node_name)  # fresh: not from the watch cache
                self._stale = False
                continue
            ours = sorted(triple(t) for t in taints_of(self.node) if self._ours(t))
            log.info("taints of node %s now: %s", self.node_name, [f"{k}={v}:{e}" for k, v, e in ours] or "none")
            return
        raise ApiError(409, f"taint write still conflicting after {self.cfg.conflict_retries} fresh reads", reason="Conflict")

    def _would(self, current: list[dict[str, Any]], want: list[DesiredTaint], cause: str) -> None:
        add, remove = diff_taints(current, want, self._owns)
        self.would["taint"] = {(k, e, cause) for k, _, e in add}
        self.would["untaint"] = {(k, e, cause) for k, _, e in remove}
        plan = plan_taints(current, want, self._owns, self.wall())
        if self._once("taints", (cause, str(plan))):
            log.warning("%s: not changing taints of node %s; would PATCH spec.taints to %s (add %s, remove %s)",
                        cause.replace("_", " "), self.node_name, plan, add, remove)

    # ------------------------------------------------------------ conditions, events

    def _sync_conditions(self, now: float) -> None:
        assert self.api is not None
        heartbeat = self.cfg.condition_heartbeat > 0 and now >= self._heartbeat_at
        items = plan_conditions(conditions_of(self.node), self.desired.conditions, self.cfg.condition_prefix,
                                self.wall(), heartbeat)
        self.would["condition"] = set()
        if not items:
            return
        if self.dry_run:
            self.would["condition"] = {(c["type"], c.get("status", "deleted"), "dry_run") for c in items}
            if self._once("conditions", str(items)):
                log.warning("dry run: would PATCH nodes/%s/status conditions %s", self.node_name, items)
            return
        self.node = self.api.patch_node_status(self.node_name, {"status": {"conditions": items}})
        self._heartbeat_at = now + self.cfg.condition_heartbeat
        log.info("conditions of node %s: %s", self.node_name,
                 ", ".join(f"{c['type']}={c.get('status', 'deleted')}" for c in items))

    def _flush_events(self, now: float) -> None:
        while self.outbox:
            item = self.outbox[0]
            spec = EventSpec(item["type"], item["reason"], item["action"], item["note"])
            if self.dry_run or self.events is None:
                log.warning("dry run: would create event %s %s: %s", spec.type, spec.reason, spec.note)
                result = "dry_run"
            else:
                try:
                    name = item.get("name") or self._event_name()
                    result = self.events.send(spec, self._uid(), now, self.wall(), name)
                except ApiError as exc:
                    if exc.retryable:
                        raise
                    log.error("event %s refused, dropping it: %s", spec.reason, exc)
                    result = "failed"
            self.stats.event(result)
            self.outbox.pop(0)
            self._persist()

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
            self.node = None  # read it again next time
        return now + self._error_wait * (0.8 + 0.4 * self.rng.random())

    def _recovered(self) -> None:
        if self.error is not None:
            log.info("kubernetes API: node %s in sync again", self.node_name)
        self.error = None
        self._error_wait = 0.0

    def _next_periodic(self) -> float:
        times = [self._resync_at]
        if self.cfg.condition_heartbeat > 0:
            times.append(self._heartbeat_at)
        if self.withheld:
            times.append(self.budget.retry_at)
        return min(times)

    def _event_name(self) -> str:
        """client-go's <object>.<unix nanoseconds>, kept strictly increasing (one step can queue several)."""
        self._last_ns = max(int(self.wall() * 1e9), self._last_ns + 1)
        return f"{self.node_name}.{self._last_ns:x}"

    def _uid(self) -> str:
        return str(((self.node or {}).get("metadata") or {}).get("uid", ""))

    def _dry_run_without_cluster(self) -> None:
        shown = (tuple(self.desired.taints), tuple(c for c in self.desired.conditions if c.status == "True"))
        self.would["taint"] = {(t.key, t.effect, "dry_run") for t in self.desired.taints}
        self.would["condition"] = {(c.type, c.status, "dry_run") for c in self.desired.conditions}
        while self.outbox:
            item = self.outbox.pop(0)
            log.warning("dry run (no cluster): would create event %s %s: %s", item["type"], item["reason"], item["note"])
            self._persist()
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
            out.append(Finding(SOURCE, "budget", reason, Severity.WARNING, f"withholding {keys}"))
        if self.error is not None:
            out.append(Finding(SOURCE, "api", "KubeApiError", Severity.WARNING, str(self.error)[:200]))
        return tuple(out)

    def samples(self, kill_switch: str) -> list[Sample]:
        out = self.stats.samples()
        out.append(Sample("node_health_kube_last_sync_timestamp_seconds", self.synced_at))
        out.append(Sample("node_health_kube_dry_run", 1.0 if self.dry_run else 0.0))
        for state in ("paused", "active", "unknown", "disabled"):
            out.append(Sample("node_health_kube_kill_switch", float(state == kill_switch), (("state", state),)))
        for state in ("idle", "held", "exhausted", "missing", "disabled"):
            out.append(Sample("node_health_kube_budget", float(state == self.budget.state), (("state", state),)))
        for k, _, e in sorted(triple(t) for t in taints_of(self.node) if self._ours(t)):
            out.append(Sample("node_health_kube_taint", 1.0, (("key", k), ("effect", e))))
        for a in sorted(self.hyst.active.values(), key=lambda a: a.key):
            active = (("check", a.check), ("subject", a.subject), ("reason", a.reason), ("severity", a.severity.value))
            out.append(Sample("node_health_kube_active_finding", 1.0, active))
        for what, name, labels in (("taint", "node_health_would_taint", ("key", "effect", "cause")),
                                   ("untaint", "node_health_would_untaint", ("key", "effect", "cause")),
                                   ("condition", "node_health_would_set_condition", ("type", "status", "cause"))):
            for values in sorted(self.would[what]):
                out.append(Sample(name, 1.0, tuple(zip(labels, values))))
        return out
