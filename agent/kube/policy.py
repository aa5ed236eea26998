"""Policy: a pure function from active findings to the desired node state.

- **Taints**: one per problem family (``Reason.family``), key
  ``<taint_prefix><family in lowercase>``, value the worst reason, effect the
  strongest among the family's active findings: per ``check/Reason``, then
  ``check``, then ``*/Reason`` override, else the severity default
  (critical → NoSchedule, warning → none). The set of keys is bounded by the
  catalog's families.
- **Conditions**: one per family the agent watches, type
  ``<condition_prefix><Family>Problem``, ``True`` while a finding of the
  family is active (node-problem-detector's convention). Reason and message
  are built from stable parts (reason, subject), never from a finding's
  free-text message, so a changing percentage does not rewrite the Node.
- **Events**: one per transition (raised, cleared).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..catalog import Catalog
from ..findings import Severity
from ..store import Snapshot
from .families import GATE_FAMILIES, family_of
from .hysteresis import Active, Transition
from .settings import KubernetesSection, PolicySection

EFFECT_RANK = {"none": 0, "PreferNoSchedule": 1, "NoSchedule": 2, "NoExecute": 3}
RESERVED_SUFFIXES = frozenset(f.lower() for f in GATE_FAMILIES)  # taint keys only a gate manages
BUDGET_EXEMPT_SUFFIXES = RESERVED_SUFFIXES
MESSAGE_MAX = 256
NOTE_MAX = 1024  # events.k8s.io/v1: "Maximal length of the note is 1kB"


@dataclass(frozen=True, slots=True)
class DesiredTaint:
    key: str
    value: str
    effect: str
    budgeted: bool = True  # needs a slot of the fleet-wide budget


@dataclass(frozen=True, slots=True)
class DesiredCondition:
    type: str
    status: str  # "True" | "False"
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Desired:
    taints: tuple[DesiredTaint, ...] = ()
    conditions: tuple[DesiredCondition, ...] = ()


@dataclass(frozen=True, slots=True)
class EventSpec:
    type: str  # "Warning" | "Normal"
    reason: str
    action: str
    note: str


def taint_key(prefix: str, family: str) -> str:
    return prefix + family.lower()


def condition_type(prefix: str, family: str) -> str:
    return f"{prefix}{family}Problem"


def effect_for(check: str, reason: str, severity: Severity, cfg: PolicySection) -> str:
    for key in (f"{check}/{reason}", check, f"*/{reason}"):
        if key in cfg.overrides:
            return cfg.overrides[key]
    if severity is Severity.CRITICAL:
        return cfg.critical
    if severity is Severity.WARNING:
        return cfg.warning
    return "none"


def gates_of(families: Iterable[str]) -> frozenset[str]:
    """The reserved taint suffixes to manage, given the families being watched."""
    return frozenset(f.lower() for f in families if f in GATE_FAMILIES)


def watched_families(snap: Snapshot, catalog: Catalog, exclude: Iterable[str] = ()) -> frozenset[str]:
    """Families the running checks and sources can report (known findings that can act)."""
    skip = set(exclude)
    reasons = {r for name, st in snap.checks.items() if name not in skip for _, r in st.known}
    reasons |= {r for name, triples in snap.events_known.items() if name not in skip for _, _, r in triples}
    out = set()
    for name in reasons:
        entry = catalog.reasons.get(name)
        if entry is not None and not entry.unknown and entry.severity.rank >= Severity.WARNING.rank:
            out.add(family_of(name, catalog))
    return frozenset(out)


def decide(active: Iterable[Active], families: Iterable[str], cfg: KubernetesSection, catalog: Catalog) -> Desired:
    by_family: dict[str, list[Active]] = {}
    for a in active:
        by_family.setdefault(family_of(a.reason, catalog), []).append(a)
    taints = []
    for family, items in sorted(by_family.items()):
        taint = _taint(family, items, cfg)
        if taint is not None:
            taints.append(taint)
    conditions = [
        _condition(family, by_family.get(family, []), cfg.condition_prefix)
        for family in sorted(set(families) | set(by_family))
    ]
    return Desired(tuple(taints), tuple(conditions))


def _taint(family: str, items: list[Active], cfg: KubernetesSection) -> DesiredTaint | None:
    def order(a: Active) -> tuple[int, int, str, str, str]:
        effect = effect_for(a.check, a.reason, a.severity, cfg.policy)
        return (-EFFECT_RANK[effect], -a.severity.rank, a.reason, a.check, a.subject)

    worst = min(items, key=order)
    if family in GATE_FAMILIES:
        return DesiredTaint(taint_key(cfg.taint_prefix, family), worst.reason, GATE_FAMILIES[family], budgeted=False)
    effect = effect_for(worst.check, worst.reason, worst.severity, cfg.policy)
    if effect == "none":
        return None
    suffix = family.lower()
    return DesiredTaint(taint_key(cfg.taint_prefix, family), worst.reason, effect, suffix not in BUDGET_EXEMPT_SUFFIXES)


def _condition(family: str, items: list[Active], prefix: str) -> DesiredCondition:
    ctype = condition_type(prefix, family)
    if not items:
        return DesiredCondition(ctype, "False", f"No{family}Problem", f"no {family.lower()} problem found")
    items = sorted(items, key=lambda a: (-a.severity.rank, a.reason, a.check, a.subject))
    parts = [f"{a.reason} on {a.subject}" for a in items]
    message = "; ".join(parts)
    if len(message) > MESSAGE_MAX:
        shown: list[str] = []
        for p in parts:
            if len("; ".join(shown + [p])) > MESSAGE_MAX - 16:
                break
            shown.append(p)
        message = "; ".join(shown) + f" (+{len(parts) - len(shown)} more)"
    return DesiredCondition(ctype, "True", items[0].reason, message)


def events_for(transitions: Iterable[Transition]) -> list[EventSpec]:
    out = []
    for t in transitions:
        a = t.finding
        where = f"{a.check} {a.subject}"
        if t.kind == "raised":
            out.append(EventSpec("Warning", a.reason, "Detected", _note(f"{where}: {a.message}")))
        else:
            out.append(EventSpec("Normal", f"{a.reason}Cleared", "Cleared", _note(f"{where}: {a.reason} no longer reported")))
    return out


def _note(text: str) -> str:
    data = text.encode()
    return text if len(data) <= NOTE_MAX else data[: NOTE_MAX - 3].decode(errors="ignore") + "..."


def budget_event(withheld: Iterable[DesiredTaint], missing: bool) -> EventSpec:
    keys = ", ".join(f"{t.key}={t.value}:{t.effect}" for t in withheld)
    if missing:
        return EventSpec("Warning", "TaintBudgetMissing", "WithholdTaint", _note(f"no ResourceQuota caps the budget; not applying {keys}"))
    return EventSpec("Warning", "TaintBudgetExhausted", "WithholdTaint", _note(f"taint budget full; not applying {keys}"))
