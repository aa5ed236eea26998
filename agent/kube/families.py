"""Problem families: what a finding reason maps to on the node (one taint key
and one condition type per family), and which families are gates."""

from __future__ import annotations

import re

from ..catalog import Catalog

# Gates: problem families that hold a node back until something passed, not
# faults. `Preflight` is the boot-time GPU burn (agent/burn): its taint
# `<prefix>preflight` (NoSchedule) may be registered by the kubelet
# (--register-with-taints) so no pod lands before the agent starts; the agent
# adds it while the burn is pending or failed and removes it once the burn
# passed. A gate acts at once (no hysteresis), needs no budget slot (it is
# not a fleet-wide fault), and its key is managed only while the family is
# watched: with the burn disabled, a registered preflight taint is left alone.
GATE_FAMILIES = {"Preflight": "NoSchedule"}


def family_of(reason: str, catalog: Catalog) -> str:
    entry = catalog.reasons.get(reason)
    family = entry.family if entry is not None else "Agent"
    return re.sub(r"[^A-Za-z0-9]", "", family) or "Agent"


def is_gate(reason: str, catalog: Catalog) -> bool:
    return family_of(reason, catalog) in GATE_FAMILIES
