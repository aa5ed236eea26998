"""Moving the pods off this node through the Eviction API, one step at a time.

`Drainer.step(now)` never sleeps: it reads the node's pods (``fieldSelector=
spec.nodeName=<node>``, the only pods it ever reads), sends the evictions that
are due and returns a
`DrainProgress`; the caller calls it again until ``done`` (or decides what
``timed_out`` means for it). Every request passes the drain's rate limit
(`KubeApi`'s gate), which may raise `Wait`; what was done before stays done.

Where the pods come from: while the agent's one pod watch is open
(`agent.kube.podwatch`, running because a check reads pods), from it, at every
step and without a request (it keeps, per pod, exactly the fields read here:
`podwatch.drain_record`); otherwise, and whenever the watch is down, a LIST at
most every ``poll_interval``. A pod this drain evicted counts as terminating
from the 201 on, whatever a watch event still in flight says.

What is never evicted, as ``kubectl drain --ignore-daemonsets`` does
(kubectl ``pkg/drain/filters.go``): DaemonSet pods (their controller would
put them straight back, and the agent is one), mirror pods of static pods
(annotation ``kubernetes.io/config.mirror``: the kubelet owns them),
finished pods (Succeeded/Failed), and pods of the skipped namespaces
(``kube-system`` and the agent's own by default). A pod already terminating
is waited for, not evicted again, until its grace period has passed; one
still listed after that (a kubelet that does not stop it) no longer holds
the drain up and is logged.

The answers of kube-apiserver's eviction subresource (``pkg/registry/core/
pod/storage/eviction.go``): 201 evicted; 429 with the ``DisruptionBudget``
cause (the budget allows no disruption now, or its status is stale) → that
pod is tried again after a jittered, doubling wait (``retry_interval`` up to
``retry_max``, never below the server's ``retryAfterSeconds``); 500 "more
than one PodDisruptionBudget" never succeeds and is reported as blocked;
404 → gone. A 409 Conflict is not proof of anything: kube-apiserver answers
it for a UID precondition that failed (a same-named replacement: the pod we
meant is gone) and also when concurrent evictions kept updating the same
PDB through all of its retries (a multi-node drain wave: the pod is still
there and still protected). So a 409 forces a fresh read of the node's pods
(the next step lists again, or reads the open pod watch) and tries that pod
again later: it is gone only when that read no longer shows its UID. The
progress names the pods a budget refused and the PDB that refused each
(``blocked``, ``pdbs``), so the ladder can say why it holds. At ``timeout``
the namespace's policy decides: ``wait`` keeps trying evictions, ``delete``
deletes the pod with its own grace period (PDBs no longer hold).
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .api import ApiError, KubeApi
from .settings import DrainSection

log = logging.getLogger(__name__)

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
DEFAULT_GRACE = 30  # core/v1 terminationGracePeriodSeconds default
GRACE_SLACK = 30.0  # seconds past a pod's grace period before it counts as stuck
RESULTS = ("evicted", "blocked", "gone", "deleted", "forbidden", "conflict")


@dataclass(frozen=True)
class DrainProgress:
    done: bool  # no evictable pod left on the node (of the selected ones)
    timed_out: bool  # drain timeout passed with pods left ('wait' namespaces keep them)
    evicted: int  # evictions accepted (201) in this drain so far
    blocked: tuple[str, ...]  # "ns/name" refused by a PDB (429) at the last attempt
    remaining: tuple[str, ...]  # "ns/name" still present and evictable
    # "ns/pod" → "ns/pdb": the PodDisruptionBudget that refused each `blocked` pod, where its answer names it
    pdbs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    uid: str
    grace: int  # spec.terminationGracePeriodSeconds
    terminating: float | None  # deletionGracePeriodSeconds when a deletion has started, else None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Pod:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        grace = spec.get("terminationGracePeriodSeconds")
        terminating = None
        if meta.get("deletionTimestamp"):
            terminating = float(meta.get("deletionGracePeriodSeconds") or 0)
        return cls(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")),
                   DEFAULT_GRACE if grace is None else int(grace), terminating)


def skip_reason(obj: dict[str, Any], skip_namespaces: frozenset[str]) -> str | None:
    """Why a pod on the node is never evicted, or None."""
    meta = obj.get("metadata") or {}
    if meta.get("namespace") in skip_namespaces:
        return "namespace"
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror"
    if any(o.get("kind") == "DaemonSet" and o.get("controller") for o in meta.get("ownerReferences") or []):
        return "daemonset"
    if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "finished"
    return None


@dataclass
class _Retry:
    at: float = 0.0
    failures: int = 0


@dataclass
class _Drain:
    """One drain, from its first step until `Drainer.reset`."""

    deadline: float
    evicted: int = 0
    retries: dict[str, _Retry] = field(default_factory=dict)  # by uid
    stopping: dict[str, tuple[float, float]] = field(default_factory=dict)  # uid → (seen terminating at, grace)
    deleted: set[str] = field(default_factory=set)  # uids deleted at the timeout
    blocked: dict[str, str] = field(default_factory=dict)  # ref → the server's message
    pods: list[Pod] | None = None  # the last list, updated by our own evictions
    listed_at: float = float("-inf")
    budget_of: dict[str, str] = field(default_factory=dict)  # uid → "ns/pdb" that refused it
    budgets: dict[str, _Retry] = field(default_factory=dict)  # "ns/pdb" → when to try its pods again
    refused_by: dict[str, str] = field(default_factory=dict)  # ref → "ns/pdb" named by its last refusal

    def due(self, pod: Pod, now: float) -> bool:
        """A pod is tried when its own wait and its budget's have passed: one refusal by a PDB
        holds back every pod known to be under it, not only the one refused."""
        budget = self.budgets.get(self.budget_of.get(pod.uid, ""))
        return now >= self.retries.setdefault(pod.uid, _Retry()).at and (budget is None or now >= budget.at)


class Drainer:
    def __init__(
        self, api: KubeApi, node: str, cfg: DrainSection, *, own_namespace: str, rng: random.Random | None = None,
        watched: Callable[[], list[dict[str, Any]] | None] | None = None,
    ) -> None:
        self.api, self.node, self.cfg = api, node, cfg
        self.watched = watched or (lambda: None)  # the node's pods from the pod watch while it is open, else None
        self.skip = frozenset((*cfg.skip_namespaces, own_namespace) if own_namespace else cfg.skip_namespaces)
        self.rng = rng or random.Random()
        self.results: Counter[str] = Counter()  # evictions by result, for the metric
        self.remaining = 0  # pods the current drain still waits for, for the metric
        self._drain: _Drain | None = None
        self._logged: dict[str, str] = {}

    # ------------------------------------------------------------ what it would do

    def plan(self, only: frozenset[str] | None = None) -> list[str]:
        """The pods a drain would evict now ("ns/name"); one list request, nothing written."""
        items = self.watched()
        return [p.ref for p in self._evictable(self.api.list_pods_on(self.node) if items is None else items, only)]

    def _evictable(self, items: list[dict[str, Any]], only: frozenset[str] | None) -> list[Pod]:
        out = []
        for obj in items:
            pod = Pod.of(obj)
            if (only is None or pod.uid in only) and pod.terminating is None and skip_reason(obj, self.skip) is None:
                out.append(pod)
        return sorted(out, key=lambda p: p.ref)

    # ------------------------------------------------------------ the step

    def step(self, now: float, only: frozenset[str] | None = None) -> DrainProgress:
        """One step of the drain (started by the first call); may raise `Wait` or a retryable `ApiError`."""
        d = self._drain
        if d is None:
            d = self._drain = _Drain(deadline=now + self.cfg.timeout)
            log.warning("draining node %s: evicting its pods (timeout %gs)", self.node, self.cfg.timeout)
        timed_out = now >= d.deadline
        watched = self.watched()
        if watched is not None:  # the pod watch is open: its set is current and costs no request
            d.pods = self._selected(d, watched, only, now)
        elif d.pods is None or (now >= d.listed_at + self.cfg.poll_interval and self._waiting(d, now)):
            items = self.api.list_pods_on(self.node)
            d.listed_at = now
            d.pods = self._selected(d, items, only, now)
        for pod in [p for p in d.pods if p.terminating is None]:
            if d.due(pod, now) or (timed_out and self.cfg.policy_for(pod.namespace) == "delete" and pod.uid not in d.deleted):
                self._act(d, pod, now, timed_out)
        return self._progress(d, now, timed_out)

    def reset(self) -> None:
        """Forget the drain (finished, or abandoned: the node is healthy again)."""
        self._drain = None
        self.remaining = 0
        self._logged.clear()

    def _waiting(self, d: _Drain, now: float) -> bool:
        """Whether a list can tell something new: a pod is terminating, or one is due for an eviction
        (while every pod waits on its budget's backoff, listing again would only cost a request)."""
        return any(p.terminating is not None or d.due(p, now) for p in d.pods or [])

    def _selected(self, d: _Drain, items: list[dict[str, Any]], only: frozenset[str] | None, now: float) -> list[Pod]:
        out = []
        for obj in items:
            pod = Pod.of(obj)
            if only is not None and pod.uid not in only or skip_reason(obj, self.skip) is not None:
                continue
            if pod.terminating is None and pod.uid in d.stopping:  # evicted or deleted by us: its deletion started
                pod = Pod(pod.namespace, pod.name, pod.uid, pod.grace, d.stopping[pod.uid][1])
            if pod.terminating is not None:
                d.stopping.setdefault(pod.uid, (now, pod.terminating))
            out.append(pod)
        return sorted(out, key=lambda p: p.ref)

    def _act(self, d: _Drain, pod: Pod, now: float, timed_out: bool) -> None:
        delete = timed_out and self.cfg.policy_for(pod.namespace) == "delete"
        if delete:
            d.deleted.add(pod.uid)  # attempted: later tries wait their turn like evictions
        try:
            if delete:
                self.api.delete_pod(pod.namespace, pod.name, pod.uid, pod.grace)
            else:
                self.api.evict_pod(pod.namespace, pod.name, pod.uid)
        except ApiError as exc:
            self._refused(d, pod, exc, now)
            return
        result = "deleted" if delete else "evicted"
        budget = d.budgets.get(d.budget_of.get(pod.uid, ""))
        if budget is not None:
            budget.at = now  # that budget had room: its next pod may go at once (maxUnavailable > 1)
        self.results[result] += 1
        d.evicted += 0 if delete else 1
        d.blocked.pop(pod.ref, None)
        d.refused_by.pop(pod.ref, None)
        self._stopping(d, pod, now)
        log.info("%s pod %s (drain of node %s)", result, pod.ref, self.node)

    def _refused(self, d: _Drain, pod: Pod, exc: ApiError, now: float) -> None:
        if exc.status == 404:  # gone
            self.results["gone"] += 1
            d.pods = [p for p in d.pods or [] if p.uid != pod.uid]
            d.blocked.pop(pod.ref, None)
            return
        if exc.status == 409:
            # A failed UID precondition (replaced: gone) or a PDB update that kept conflicting with
            # concurrent evictions (still there, still protected). Only a fresh read tells them apart:
            # the next step lists again (or reads the watch); the pod is tried again after a wait.
            self.results["conflict"] += 1
            d.listed_at = float("-inf")
            self._retry_later(d, pod, now, exc.retry_after, at_most=False)
            self._log_once(pod.ref, "conflict", "eviction of %s answered 409 (%s): reading the pod again before "
                           "another try", pod.ref, exc.message)
            return
        if exc.budget_refusal:
            self.results["blocked"] += 1
            d.blocked[pod.ref] = exc.message
            self._retry_later(d, pod, now, exc.retry_after, at_most=exc.status == 500)
            name = _budget_name(exc)
            if name:
                key = f"{pod.namespace}/{name}"
                d.budget_of[pod.uid] = key
                d.budgets[key] = d.retries[pod.uid]
                d.refused_by[pod.ref] = key
            self._log_once(pod.ref, "blocked", "eviction of %s refused: %s", pod.ref, _cause(exc))
            return
        if exc.status in (400, 403, 422):  # RBAC, the admission policy, a budget in a state only a human fixes
            self.results["forbidden"] += 1
            d.blocked[pod.ref] = exc.message
            details = (exc.body or {}).get("details") or {} if isinstance(exc.body, dict) else {}
            if exc.status == 403 and details.get("kind") == "poddisruptionbudget" and details.get("name"):
                d.refused_by[pod.ref] = f"{pod.namespace}/{details['name']}"
            self._retry_later(d, pod, now, None, at_most=True)
            self._log_once(pod.ref, "forbidden", "eviction of %s not allowed: %s", pod.ref, exc)
            return
        raise exc  # overload, 5xx, connection: the gate backs off; the caller tries again

    def _retry_later(self, d: _Drain, pod: Pod, now: float, retry_after: float | None, *, at_most: bool) -> None:
        r = d.retries.setdefault(pod.uid, _Retry())
        r.failures += 1
        wait = self.cfg.retry_max if at_most else min(self.cfg.retry_max, self.cfg.retry_interval * 2 ** (r.failures - 1))
        r.at = now + max(retry_after or 0.0, wait * self.rng.uniform(0.8, 1.2))

    def _stopping(self, d: _Drain, pod: Pod, now: float) -> None:
        d.stopping[pod.uid] = (now, float(pod.grace))
        d.pods = [p if p.uid != pod.uid else Pod(p.namespace, p.name, p.uid, p.grace, float(p.grace)) for p in d.pods or []]

    def _progress(self, d: _Drain, now: float, timed_out: bool) -> DrainProgress:
        evictable = [p.ref for p in d.pods or [] if p.terminating is None]
        waiting = []
        for p in d.pods or []:
            if p.terminating is None:
                continue
            seen, grace = d.stopping.get(p.uid, (now, p.terminating))
            if now <= seen + grace + GRACE_SLACK:
                waiting.append(p.ref)
            else:
                self._log_once(p.ref, "stuck", "pod %s is still on node %s %ds past its grace period",
                               p.ref, self.node, int(now - seen - grace))
        self.remaining = len(evictable) + len(waiting)
        blocked = tuple(sorted(r for r in d.blocked if r in evictable))
        done = not evictable and not waiting
        if done:
            self._log_once("", "done", "node %s drained: %d pods evicted", self.node, d.evicted)
        pdbs = {r: d.refused_by[r] for r in blocked if r in d.refused_by}
        return DrainProgress(done, timed_out and not done, d.evicted, blocked, tuple(evictable), pdbs)

    def _log_once(self, ref: str, state: str, msg: str, *args: Any) -> bool:
        if self._logged.get(ref) == state:
            return False
        self._logged[ref] = state
        log.warning(msg, *args)
        return True


def _budget_name(exc: ApiError) -> str:
    """The PDB named in the DisruptionBudget cause ("The disruption budget <name> needs ..." / "... is still being processed")."""
    m = _BUDGET.search(_cause(exc))
    return m[1] if m else ""


_BUDGET = re.compile(r"The disruption budget (\S+) (?:needs|is still)")


def _cause(exc: ApiError) -> str:
    causes = ((exc.body or {}).get("details") or {}).get("causes") or [] if isinstance(exc.body, dict) else []
    return "; ".join(str(c.get("message")) for c in causes) or exc.message
