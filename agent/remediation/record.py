"""The ladder's memory, one JSON file in the state dir (``remediation.json``).

It is written atomically before every step that changes the host (before a
reset, before a reboot: the finding, the time and the boot ID), so an agent
killed at any point and started again resumes where it was and never asks
for a second reboot for one record. The reboots of the retire window and the
retired mark survive restarts and reboots; so does how long each fault has
stood (its first-seen time, for this boot). The file is read back through
`StateDir.load`: a damaged one is set aside, and the ladder then refuses to
reboot for the faults it finds standing (it cannot tell what it did already).

Times: every wait is on the boot clock (CLOCK_BOOTTIME: seconds since this
boot, never stepped by NTP or an operator), so a time is only meaningful with
the boot it was taken in: ``step_boot`` for the episode's times, ``boot_id``
for a reboot, ``seen_boot`` for first-seen times. How long ago something of an
earlier boot happened is added up from ``boots`` (each boot's last boot-clock
reading the agent wrote down): a lower bound (the time a node was down does
not count), so a cap or a window measured with it holds longer, never
shorter. ``at`` fields named wall are for people (logs, `remediation status`).
Every record the ladder writes loads back (tests/remediation/test_record.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..statedir import Damaged, StateFile, flag, integer, number, obj, seq, text

FILE = "remediation.json"
VERSION = 1
MAX_REBOOTS = 64  # entries kept (the window prunes them first): a bug cannot grow the file
MAX_BOOTS = 64  # boots remembered (for the time since a reboot of an earlier boot)


@dataclass
class Episode:
    """One fault being handled: where the ladder stands."""

    key: str  # "check/subject/reason" of the fault
    action: str  # reset_gpu, reboot, drain_and_diagnose, rma (what the ladder does now: escalation changes it)
    subject: str
    step: str  # one of STEPS
    started: float  # wall time (for people)
    step_at: float  # boot clock when the step began (in boot step_boot)
    uuid: str = ""  # the GPU of a reset_gpu fault
    gpu: str = ""  # its index as NVML numbers it
    pci: str = ""  # its PCI bus id
    scope: str = "node"  # drain scope: node, or gpu (the pods holding uuid)
    slot: bool = False  # a disruption slot is held
    boot_id: str = ""  # the boot a reboot (or a reset) was asked from
    booted_at: float = 0.0  # boot clock when the new boot was seen
    retry_at: float = 0.0  # boot clock: a failed step is tried again no sooner
    reset_at: float = 0.0  # CLOCK_MONOTONIC when the GPU reset finished (Xids before it are what it cured)
    note: str = ""  # why the ladder is where it is (escalations, failures)
    step_boot: str = ""  # the boot step_at, booted_at and retry_at were taken in (another boot's start again)
    forced: bool = False  # the drain ended past pods it could not move (force_after): the act does not wait for them


@dataclass
class Reboot:
    key: str
    at: float  # wall time (for people)
    boot_id: str  # the boot it was asked from
    back: bool = False  # the same fault came back after it (an uncured reboot)
    failed: bool = False  # the reboot command failed: counts against the daily cap, never as a reboot
    up: float = -1.0  # boot clock when it was asked for (-1: a record of before boot clocks: wall time counts)


@dataclass
class Retired:
    at: float  # wall time (for people)
    key: str
    why: str
    command_done: bool = False
    powered_off: bool = False
    boot_id: str = ""  # the boot it was retired in ...
    up: float = -1.0  # ... and the boot clock then (power_off_after counts from it)


@dataclass
class Record:
    episode: Episode | None = None
    reboots: list[Reboot] = field(default_factory=list)
    retired: Retired | None = None
    handled: dict[str, str] = field(default_factory=dict)  # fault key -> boot id: cured by a reset while it stands
    # GPU UUID -> boot id of its reset (verified, failed or of unknown outcome): at most one reset per GPU per
    # boot; another reset fault of that GPU in the same boot escalates to a reboot
    resets: dict[str, str] = field(default_factory=dict)
    reset_counts: dict[str, int] = field(default_factory=dict)  # GPU UUID -> resets in its boot of `resets` (absent: 1)
    unretire: bool = False  # an operator un-retired the node (agent remediation unretire): clear the cluster's mark
    # How long each fault has stood: fault key -> wall time first seen, in the boot `seen_boot`. Persisted so
    # that a restart neither resets nor shortens the wait; another boot's (or a lost record's) starts it again.
    seen: dict[str, float] = field(default_factory=dict)
    seen_boot: str = ""
    boots: list[tuple[str, float]] = field(default_factory=list)  # (boot id, its last boot-clock reading), oldest first

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
            "reset_counts": dict(self.reset_counts),
            "unretire": self.unretire,
            "seen": dict(self.seen),
            "seen_boot": self.seen_boot,
            "boots": [{"boot_id": b, "up": u} for b, u in self.boots[-MAX_BOOTS:]],
        }


_EPISODE_TEXT = ("key", "action", "subject", "step", "uuid", "gpu", "pci", "scope", "boot_id", "note", "step_boot")
_EPISODE_NUM = ("started", "step_at", "booted_at", "retry_at", "reset_at")
# Every step the ladder persists (`Ladder._advance` has one handler for each; test_record.py holds them equal).
STEPS = ("claim", "drain", "reset_gpu", "resetting", "verify", "reboot", "rebooting", "settle", "hold", "retire",
         "release")
ACTIONS = ("reset_gpu", "reboot", "drain_and_diagnose", "retire")


def _episode(raw: Any) -> Episode | None:
    if raw is None:
        return None
    d = obj(raw, "episode")
    kw: dict[str, Any] = {k: text(d.get(k, ""), f"episode.{k}") for k in _EPISODE_TEXT}
    kw.update({k: number(d.get(k, 0.0), f"episode.{k}") for k in _EPISODE_NUM})
    kw["slot"] = flag(d.get("slot", False), "episode.slot")
    kw["forced"] = flag(d.get("forced", False), "episode.forced")
    if kw["step"] not in STEPS:
        raise Damaged(f"episode.step: expected one of {', '.join(STEPS)}, got {kw['step']!r}")
    if kw["action"] not in ACTIONS:
        raise Damaged(f"episode.action: expected one of {', '.join(ACTIONS)}, got {kw['action']!r}")
    if not kw["key"]:
        raise Damaged("episode.key: empty")
    return Episode(**kw)


def _reboot(raw: Any, where: str) -> Reboot:
    d = obj(raw, where)
    return Reboot(text(d["key"], f"{where}.key"), number(d["at"], f"{where}.at"),
                  text(d["boot_id"], f"{where}.boot_id"), flag(d.get("back", False), f"{where}.back"),
                  flag(d.get("failed", False), f"{where}.failed"), number(d.get("up", -1.0), f"{where}.up"))


def _retired(raw: Any) -> Retired | None:
    if raw is None:
        return None
    d = obj(raw, "retired")
    return Retired(number(d["at"], "retired.at"), text(d["key"], "retired.key"), text(d["why"], "retired.why"),
                   flag(d.get("command_done", False), "retired.command_done"),
                   flag(d.get("powered_off", False), "retired.powered_off"), text(d.get("boot_id", ""), "retired.boot_id"),
                   number(d.get("up", -1.0), "retired.up"))


def parse(raw: Any) -> Record:
    d = obj(raw)
    if integer(d.get("version"), "version") != VERSION:
        raise Damaged(f"version: expected {VERSION}, got {d.get('version')!r}")
    reboots = [_reboot(r, f"reboots[{i}]") for i, r in enumerate(seq(d.get("reboots", []), "reboots"))]
    handled = {k: text(v, f"handled.{k}") for k, v in obj(d.get("handled", {}), "handled").items()}
    resets = {k: text(v, f"resets.{k}") for k, v in obj(d.get("resets", {}), "resets").items()}
    counts = {k: integer(v, f"reset_counts.{k}") for k, v in obj(d.get("reset_counts", {}), "reset_counts").items()}
    seen = {k: number(v, f"seen.{k}") for k, v in obj(d.get("seen", {}), "seen").items()}
    boots = [(text(obj(b, f"boots[{i}]").get("boot_id"), f"boots[{i}].boot_id"), number(b.get("up"), f"boots[{i}].up"))
             for i, b in enumerate(seq(d.get("boots", []), "boots"))]
    return Record(_episode(d.get("episode")), reboots, _retired(d.get("retired")), handled, resets,
                  counts, flag(d.get("unretire", False), "unretire"), seen, text(d.get("seen_boot", ""), "seen_boot"),
                  boots)


RECORD_FILE = StateFile(FILE, parse)


# `agent remediation unretire` while the agent runs: a request file the running agent picks up on its next
# tick (it applies it to its own record and deletes the file); the CLI never writes the agent's record then.
UNRETIRE = "remediation-unretire.json"


def _request(raw: Any) -> float:
    d = obj(raw)
    if integer(d.get("version"), "version") != VERSION:
        raise Damaged(f"version: expected {VERSION}, got {d.get('version')!r}")
    return number(d.get("at"), "at")


UNRETIRE_FILE = StateFile(UNRETIRE, _request)
