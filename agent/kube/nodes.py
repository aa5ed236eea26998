"""Pure planning of Node writes: the new taints list and the condition entries.

``spec.taints`` is an atomic list (no patchMergeKey; ``+listType=atomic`` in
k8s.io/api core/v1 types.go): any patch that carries it replaces the whole
list. So the plan is the *complete* new list: every taint outside the agent's
prefix copied unchanged and in its place, ours appended; the write carries the
resourceVersion it was computed from (409 when stale). ``status.conditions``
merges by ``type`` under a strategic-merge patch, so only our own entries are
sent, and the kubelet's conditions are never part of the patch.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any

from .policy import RESERVED_SUFFIXES, DesiredCondition, DesiredTaint

Taint = dict[str, Any]
Owns = Callable[[str], bool]  # is this taint key ours to add, change and remove?


def rfc3339(wall: float) -> str:
    """metav1.Time: whole seconds."""
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(wall: float) -> dt.datetime:
    """metav1.MicroTime for events (eventTime, series.lastObservedTime).

    The API server parses it with exactly six fractional digits
    (RFC3339Micro); the client serialises a datetime with ``isoformat()``,
    which drops the fraction when it is zero, so a whole-second time would be
    refused with 400. Never let the microseconds be zero.
    """
    t = dt.datetime.fromtimestamp(wall, dt.UTC)
    return t if t.microsecond else t.replace(microsecond=1)


def micro_time_str(wall: float) -> str:
    return micro_time(wall).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def taints_of(node: dict[str, Any] | None) -> list[Taint]:
    return list(((node or {}).get("spec") or {}).get("taints") or [])


def conditions_of(node: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list(((node or {}).get("status") or {}).get("conditions") or [])


def managed(key: str, prefix: str, gates: frozenset[str] = frozenset()) -> bool:
    """A taint this reconciler owns: under the prefix, and not a reserved key
    (preflight) unless that gate is on (the burn preflight runs here)."""
    if not key.startswith(prefix):
        return False
    suffix = key[len(prefix):]
    return suffix not in RESERVED_SUFFIXES or suffix in gates


def triple(t: Taint) -> tuple[str, str, str]:
    return (str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))


def plan_taints(current: list[Taint], want: Iterable[DesiredTaint], owns: Owns, wall: float) -> list[Taint] | None:
    """The full new taints list, or None when the node already carries exactly `want`."""
    want = list(want)
    have = {triple(t): t for t in current if owns(str(t.get("key", "")))}
    if set(have) == {(d.key, d.value, d.effect) for d in want}:
        return None
    out = [t for t in current if not owns(str(t.get("key", "")))]
    for d in want:
        existing = have.get((d.key, d.value, d.effect))
        if existing is not None:
            out.append(existing)  # keeps its timeAdded
            continue
        t: Taint = {"key": d.key, "value": d.value, "effect": d.effect}
        if d.effect == "NoExecute":
            t["timeAdded"] = rfc3339(wall)  # tolerationSeconds count from here
        out.append(t)
    return out


def diff_taints(current: list[Taint], want: Iterable[DesiredTaint], owns: Owns) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(to add, to remove) as (key, value, effect)."""
    have = {triple(t) for t in current if owns(str(t.get("key", "")))}
    wanted = {(d.key, d.value, d.effect) for d in want}
    return sorted(wanted - have), sorted(have - wanted)


def plan_conditions(
    current: list[dict[str, Any]], want: Iterable[DesiredCondition], prefix: str, wall: float, heartbeat: bool
) -> list[dict[str, Any]]:
    """Condition entries for a strategic-merge patch of nodes/status; empty: nothing to write."""
    now = rfc3339(wall)
    cur = {str(c.get("type")): c for c in current}
    out: list[dict[str, Any]] = []
    wanted = set()
    for d in want:
        wanted.add(d.type)
        c = cur.get(d.type)
        same = c is not None and (c.get("status"), c.get("reason", ""), c.get("message", "")) == (d.status, d.reason, d.message)
        if same and not heartbeat:
            continue
        kept = c is not None and c.get("status") == d.status and c.get("lastTransitionTime")
        out.append({
            "type": d.type, "status": d.status, "reason": d.reason, "message": d.message,
            "lastHeartbeatTime": now, "lastTransitionTime": c["lastTransitionTime"] if kept and c else now,
        })
    for ctype in sorted(cur):
        if ctype.startswith(prefix) and ctype.endswith("Problem") and ctype not in wanted:
            # A family no longer watched (check disabled): remove our condition
            # rather than leave it stale; SMP delete directive, by merge key.
            out.append({"type": ctype, "$patch": "delete"})
    return out
