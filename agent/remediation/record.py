"""The ladder's memory, one JSON file in the state dir (``remediation.json``).

It is written atomically before every step that changes the host (before a
reset, before a reboot: the finding, the time and the boot ID), so an agent
killed at any point and started again resumes where it was and never asks
for a second reboot for one record. The reboots of the retire window and the
retired mark survive restarts and reboots; so does how long each fault has
stood (its first-seen time, for this boot). The file is read back through
`StateDir.load`: a damaged one is set aside, and the ladder then refuses to
reboot for the faults it finds standing (it cannot tell what it did already).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..statedir import Damaged, StateFile, flag, integer, number, obj, seq, text

FILE = "remediation.json"
VERSION = 1
MAX_REBOOTS = 64  # entries kept (the window prunes them first): a bug cannot grow the file


@dataclass
class Episode:
    """One fault being handled: where the ladder stands."""

    key: str  # "check/subject/reason" of the fault
    action: str  # reset_gpu, reboot, drain_and_diagnose, rma (what the ladder does now: escalation changes it)
    subject: str
    step: str  # claim, drain, reset_gpu, resetting, verify, reboot, rebooting, settle, hold, retire
    started: float  # wall time
    step_at: float  # wall time the step began
    uuid: str = ""  # the GPU of a reset_gpu fault
    gpu: str = ""  # its index as NVML numbers it
    pci: str = ""  # its PCI bus id
    scope: str = "node"  # drain scope: node, or gpu (the pods holding uuid)
    slot: bool = False  # a disruption slot is held
    boot_id: str = ""  # the boot a reboot was asked from
    booted_at: float = 0.0  # wall time the new boot was seen
    retry_at: float = 0.0  # a failed step is tried again no sooner
    reset_at: float = 0.0  # CLOCK_MONOTONIC when the GPU reset finished (Xids before it are what it cured)
    note: str = ""  # why the ladder is where it is (escalations, failures)


@dataclass
class Reboot:
    key: str
    at: float
    boot_id: str  # the boot it was asked from
    back: bool = False  # the same fault came back after it (an uncured reboot)
    failed: bool = False  # the reboot command failed: counts against the daily cap, never as a reboot


@dataclass
class Retired:
    at: float
    key: str
    why: str
    command_done: bool = False
    powered_off: bool = False


@dataclass
class Record:
    episode: Episode | None = None
    reboots: list[Reboot] = field(default_factory=list)
    retired: Retired | None = None
    handled: dict[str, str] = field(default_factory=dict)  # fault key -> boot id: cured by a reset while it stands
    # fault key -> boot id of a verified reset for it: back in the same boot, the reset did not cure it (→ reboot)
    resets: dict[str, str] = field(default_factory=dict)
    unretire: bool = False  # an operator un-retired the node (agent remediation unretire): clear the cluster's mark
    # How long each fault has stood: fault key -> wall time first seen, in the boot `seen_boot`. Persisted so
    # that a restart neither resets nor shortens the wait; another boot's (or a lost record's) starts it again.
    seen: dict[str, float] = field(default_factory=dict)
    seen_boot: str = ""

    def unretired(self) -> bool:
        """`agent remediation unretire`: forget the retirement and the reboots that led to it."""
        if self.retired is None:
            return False
        self.retired, self.reboots, self.episode, self.unretire = None, [], None, True
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "episode": asdict(self.episode) if self.episode else None,
            "reboots": [asdict(r) for r in self.reboots[-MAX_REBOOTS:]],
            "retired": asdict(self.retired) if self.retired else None,
            "handled": dict(self.handled),
            "resets": dict(self.resets),
            "unretire": self.unretire,
            "seen": dict(self.seen),
            "seen_boot": self.seen_boot,
        }


_EPISODE_TEXT = ("key", "action", "subject", "step", "uuid", "gpu", "pci", "scope", "boot_id", "note")
_EPISODE_NUM = ("started", "step_at", "booted_at", "retry_at", "reset_at")
STEPS = ("claim", "drain", "reset_gpu", "resetting", "verify", "reboot", "rebooting", "settle", "hold", "retire")


def _episode(raw: Any) -> Episode | None:
    if raw is None:
        return None
    d = obj(raw, "episode")
    kw: dict[str, Any] = {k: text(d.get(k, ""), f"episode.{k}") for k in _EPISODE_TEXT}
    kw.update({k: number(d.get(k, 0.0), f"episode.{k}") for k in _EPISODE_NUM})
    kw["slot"] = flag(d.get("slot", False), "episode.slot")
    if kw["step"] not in STEPS:
        raise Damaged(f"episode.step: expected one of {', '.join(STEPS)}, got {kw['step']!r}")
    if not kw["key"]:
        raise Damaged("episode.key: empty")
    return Episode(**kw)


def _reboot(raw: Any, where: str) -> Reboot:
    d = obj(raw, where)
    return Reboot(text(d["key"], f"{where}.key"), number(d["at"], f"{where}.at"),
                  text(d["boot_id"], f"{where}.boot_id"), flag(d.get("back", False), f"{where}.back"),
                  flag(d.get("failed", False), f"{where}.failed"))


def _retired(raw: Any) -> Retired | None:
    if raw is None:
        return None
    d = obj(raw, "retired")
    return Retired(number(d["at"], "retired.at"), text(d["key"], "retired.key"), text(d["why"], "retired.why"),
                   flag(d.get("command_done", False), "retired.command_done"),
                   flag(d.get("powered_off", False), "retired.powered_off"))


def parse(raw: Any) -> Record:
    d = obj(raw)
    if integer(d.get("version"), "version") != VERSION:
        raise Damaged(f"version: expected {VERSION}, got {d.get('version')!r}")
    reboots = [_reboot(r, f"reboots[{i}]") for i, r in enumerate(seq(d.get("reboots", []), "reboots"))]
    handled = {k: text(v, f"handled.{k}") for k, v in obj(d.get("handled", {}), "handled").items()}
    resets = {k: text(v, f"resets.{k}") for k, v in obj(d.get("resets", {}), "resets").items()}
    seen = {k: number(v, f"seen.{k}") for k, v in obj(d.get("seen", {}), "seen").items()}
    return Record(_episode(d.get("episode")), reboots, _retired(d.get("retired")), handled, resets,
                  flag(d.get("unretire", False), "unretire"), seen, text(d.get("seen_boot", ""), "seen_boot"))


RECORD_FILE = StateFile(FILE, parse)
