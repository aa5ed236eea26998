"""Which findings the ladder acts on, and what it would do for each.

A finding is a fault for the ladder when it is definite (never ``unknown``)
and its action (`Finding.action`, from the catalog's reason) is one that a
step can cure: ``reset_gpu``, ``reboot``, ``drain_and_diagnose`` or ``rma``.
``restart_app`` and ``none`` are the workload's business. A GPU fault's
subject ``gpu<N>`` is joined with ``node_health_gpu_info`` to find the UUID
a reset names (and the PCI address the Xid stream knows the GPU by).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..findings import Finding, Sample
from .catalog import CHECK

ACTED = ("reset_gpu", "reboot", "drain_and_diagnose", "rma")
# What an episode does for each action (rma: the fault needs hardware, so the node is retired).
EPISODE = {"reset_gpu": "reset_gpu", "reboot": "reboot", "drain_and_diagnose": "drain_and_diagnose", "rma": "retire"}
RANK = {"drain_and_diagnose": 1, "reset_gpu": 1, "reboot": 2, "retire": 3}
# The steps (actions of `settings.STEPS`) an episode takes from each of its own steps on.
PLAN = {
    "reset_gpu": ("drain", "reset_gpu"),
    "reboot": ("drain", "reboot"),
    "drain_and_diagnose": ("drain",),
    "retire": ("drain", "retire"),
}
AT = {"claim": 0, "drain": 0, "reset_gpu": 1, "reboot": 1, "retire": 1}


@dataclass(frozen=True, slots=True)
class Fault:
    key: str  # "check/subject/reason"
    action: str  # one of ACTED
    subject: str
    message: str
    gpu: str = ""  # GPU index for a gpu<N> subject
    uuid: str = ""  # its UUID, when node_health_gpu_info names it
    pci: str = ""  # its PCI bus id, likewise


def plan(action: str, step: str) -> tuple[str, ...]:
    """The actions an episode of `action` still has to take from `step`."""
    if step not in AT:
        return ()
    return PLAN[action][AT[step]:]


def gpu_ids(samples: Iterable[Sample]) -> dict[str, tuple[str, str]]:
    """GPU index -> (UUID, PCI bus id), from node_health_gpu_info."""
    out = {}
    for s in samples:
        if s.name == "node_health_gpu_info":
            labels = dict(s.labels)
            if labels.get("gpu") and labels.get("uuid"):
                out[labels["gpu"]] = (labels["uuid"], labels.get("pci_bus_id", ""))
    return out


def faults(findings: Sequence[Finding], samples: Iterable[Sample]) -> list[Fault]:
    acted = [f for f in findings if not f.unknown and f.action in ACTED and f.check != CHECK]
    if not acted:
        return []  # the usual answer, on every check result: the samples are not walked
    ids = gpu_ids(samples)
    out: dict[str, Fault] = {}
    for f in acted:
        action = f.action
        gpu = f.subject[3:] if f.subject.startswith("gpu") and f.subject[3:].isdigit() else ""
        key = f"{f.check}/{f.subject}/{f.reason}"
        uuid, pci = ids.get(gpu, ("", ""))
        out[key] = Fault(key, action, f.subject, f.message, gpu, uuid, pci)
    return [out[k] for k in sorted(out)]
