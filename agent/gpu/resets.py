"""GPU resets that the remediation ladder verified, as the GPU feature learns of them.

The kernel log never says that a GPU was reset, so an Xid finding whose
action is ``reset_gpu`` would stand until the next boot, and the node's taint
with it, after the reset cured it. The ladder (`agent.remediation`, a layer
above: this module never imports it) calls `record` after a verified reset;
the Xid stream then drops that GPU's ``reset_gpu`` findings whose last event
came before the reset (`agent.gpu.xid_tracker.XidStream.forget_reset`). An
Xid of the same kind after the reset counts again.

``gpu-resets.json`` in the state dir, written atomically: the boot id and
the resets of that boot, each with the GPU's UUID, PCI address and NVML
index and the CLOCK_MONOTONIC time the reset finished (valid for the boot).
A restart reads it back, so the findings do not come back from the kernel
log's backlog; another boot's file is ignored (a reboot starts afresh). A
damaged file is set aside by `StateDir.load` and then forgets those resets:
the findings stand again, which withholds nothing but a release.

Sources in this process learn of a new reset at once through `listen`
(the Xid source registers itself for its state dir while it runs).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..statedir import StateDir, StateFile, number, obj, seq, text
from .pci import normalize

log = logging.getLogger(__name__)

FILE = "gpu-resets.json"
MAX_RESETS = 64  # kept per boot: a loop of resets cannot grow the file


@dataclass(frozen=True, slots=True)
class Reset:
    uuid: str
    pci: str  # normalised (`pci.normalize`); "" when unknown
    gpu: str  # NVML index; "" when unknown
    at: float  # CLOCK_MONOTONIC when the reset finished (this boot)

    def subject(self, subject_of: Callable[[str, int], tuple[str, str]], kind: int) -> str:
        """The finding subject the Xid stream gives this GPU: by PCI address where known, else gpu<index>."""
        if self.pci:
            return subject_of(self.pci, kind)[0]
        return f"gpu{self.gpu}" if self.gpu else ""


def _parse(raw: Any) -> tuple[str, list[Reset]]:
    d = obj(raw)
    out = []
    for i, r in enumerate(seq(d.get("resets", []), "resets")):
        e = obj(r, f"resets[{i}]")
        out.append(Reset(text(e["uuid"], f"resets[{i}].uuid"), text(e.get("pci", ""), f"resets[{i}].pci"),
                         text(e.get("gpu", ""), f"resets[{i}].gpu"), number(e["at"], f"resets[{i}].at")))
    return text(d["boot"], "boot"), out


RESETS_FILE = StateFile(FILE, _parse)

_lock = threading.Lock()
_listeners: dict[str, list[Callable[[Reset], None]]] = {}


def load(state: StateDir, boot: str) -> list[Reset]:
    """The verified resets of boot `boot` (none for another boot's file, or a damaged one)."""
    saved = state.load(RESETS_FILE)
    if saved is None or saved[0] != boot or not boot:
        return []
    return saved[1]


def record(state: StateDir, boot: str, uuid: str, *, pci: str = "", gpu: str = "", at: float) -> Reset:
    """A verified reset of GPU `uuid`: written (atomically, before anyone is told) and told to the listeners."""
    reset = Reset(uuid, normalize(pci) if pci else "", gpu, at)
    with _lock:
        resets = [*load(state, boot), reset][-MAX_RESETS:]
        state.write_json(FILE, {"boot": boot, "resets": [
            {"uuid": r.uuid, "pci": r.pci, "gpu": r.gpu, "at": r.at} for r in resets]})
        listeners = list(_listeners.get(os.path.realpath(state.path), ()))
    for fn in listeners:
        try:
            fn(reset)
        except Exception:  # a listener's failure is its own: the record is written
            log.exception("a GPU reset listener failed")
    return reset


def listen(state_dir: str, fn: Callable[[Reset], None]) -> None:
    with _lock:
        _listeners.setdefault(os.path.realpath(state_dir), []).append(fn)


def unlisten(state_dir: str, fn: Callable[[Reset], None]) -> None:
    with _lock:
        key = os.path.realpath(state_dir)
        fns = _listeners.get(key, [])
        if fn in fns:
            fns.remove(fn)
        if not fns:
            _listeners.pop(key, None)
