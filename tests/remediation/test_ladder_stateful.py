"""The ladder explored, not walked: a hypothesis state machine drives the real
`Ladder` against a simulated host (boot IDs, the reboot and reset seams, MIG
state), a simulated cluster (disruption slots, a drain whose pods a
PodDisruptionBudget may refuse for good, the kill switch, API answers 409,
429, 500 and the client's rate limit on any request) and two clocks: the
wall clock (which an operator or NTP may step by an hour, a day or anything)
and the boot clock (time since boot; it never jumps). The agent is killed
at any seam (a host command, a cluster call, a state write, before or after
its effect) and started again (a new `Ladder` over the same state dir);
reboots happen when asked for (or not: a power cycle), and cure the fault or
not.

Every host-changing act is judged at the moment it happens, against the
simulation's truth (elapsed real time, not the clocks the ladder reads):

- nothing acts in observe, dry run or while the kill switch is paused (the
  switch may flip during the tick's last cluster call);
- a retired node (its Node label set) never drains, resets or reboots again;
- reboots in any 24 h of real time ≤ ``reboot.max_per_day``;
- a drain, a reset or a reboot happens only while this node holds a slot, and
  the slots held never exceed the budget;
- no reboot and no reset while a pod the drain could not move (its PDB
  refuses it) is on the node (``on_timeout = "wait"``, no ``force_after``);
- a fault has stood its ``*_after`` time (real time, this boot) before any
  drain, reset or reboot for it;
- a reset only on a GPU whose MIG state reads "off", at most one per GPU per
  boot, and a reset is recorded as done only when it ran;
- every record the ladder writes loads back (nothing is ever set aside);
- `agent remediation status`, run at any point on the state dir (and on a
  copy whose record is damaged), changes no byte and no name in it.

Bounded for CI: derandomized, no example database, a fixed number of
examples and steps (see `SETTINGS`).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from remediation_support import CATALOG, FakeHost, Users, enforce, fault_list, finding
from remediation_support import settings as rsettings

from agent.cli.main import main as cli_main
from agent.gpu import resets as gpu_resets
from agent.kube.api import ApiError, Wait
from agent.remediation.host import Result
from agent.remediation.ladder import REBOOT_OVERDUE, Ladder
from agent.remediation.record import RECORD_FILE
from agent.remediation.settings import RemediationSection
from agent.statedir import Damaged, StateDir

DAY = 86400.0


def _snapshot(path: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as fh:
                out[name] = fh.read()
        else:
            out[name] = b"<not a file>"
    return out

WALL0 = 1_800_000_000.0
UUID0 = "GPU-aaaa"
DRAIN_TIMEOUT = 300.0
FAULTS = {
    "reboot": finding("XidCritical79", "reboot"),
    "reset": finding("XidCritical48", "reset_gpu"),
    "reset2": finding("XidCritical94", "reset_gpu"),  # another reset-type Xid on the same GPU
    "rma": finding("RowRemapFailure", "rma"),
}
AFTER = {"reboot": 600.0, "reset_gpu": 120.0, "rma": 600.0, "drain_and_diagnose": 600.0}

SETTINGS = settings(
    max_examples=int(os.environ.get("NHA_LADDER_EXAMPLES", "80")),
    stateful_step_count=int(os.environ.get("NHA_LADDER_STEPS", "50")),
    derandomize=True, database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    # NHA_LADDER_NO_SHRINK=1: report the first failing sequence as found (for checking many reverts quickly)
    phases=[Phase.explicit, Phase.generate] if os.environ.get("NHA_LADDER_NO_SHRINK") else list(Phase),
)


class Killed(BaseException):
    """The agent's process died here (SIGKILL): nothing after this point ran."""


@dataclass
class World:
    """The truth the ladder cannot see directly: real time, the boot, the node's pods, the fleet's slots."""

    cfg: RemediationSection
    mode: str  # enforce, observe, dry_run
    real: float = 0.0  # elapsed seconds; never jumps
    skew: float = 0.0  # wall clock = WALL0 + real + skew
    boot_n: int = 1
    boot_start: float = -100_000.0  # real time of the boot (the host has been up for a while)
    present: dict[str, float] = field(default_factory=dict)  # fault name → real time it first appeared in this boot
    paused: bool = False
    pause_in_call: bool = False  # the kill switch flips to paused during the next cluster call
    mig: bool | None = False
    reboot_cmd_ok: bool = True
    verify_ok: bool = True
    pending_reboot: bool = False
    pods: set[str] = field(default_factory=lambda: {"ml/a", "ml/b", "ml/db-0"})  # on this node
    pdb_refuses: bool = False  # ml/db-0's PDB allows no disruption
    budget: int = 1
    others: int = 0  # slots held by other nodes
    held: bool = False  # this node holds a slot
    retired: bool = False  # the Node carries the retired label
    crash_in: int | None = None  # seam calls until the process dies
    crash_at: str = ""  # the seam where the process dies next
    api_error: tuple[int, Any] | None = None  # (cluster calls until it, the error)
    flaky: tuple[int, Any] | None = None  # (every n-th cluster call fails, the error) until the API heals
    calls: int = 0
    fail_on: dict[str, Any] = field(default_factory=dict)  # cluster call → the error its next request gets
    reboots: list[float] = field(default_factory=list)  # real times of reboot commands that ran
    resets: list[tuple[int, str]] = field(default_factory=list)  # (boot, uuid) of resets that ran
    violations: list[str] = field(default_factory=list)
    clean: bool = False  # the last tick ran to its end (no crash, no API error)
    renewed: float = 0.0  # real time this node's Lease was last claimed or renewed (unrenewed, it expires)
    # An episode carried into this boot: "ours" (the ladder's own reboot: a fault back after it goes on at once)
    # or "inherited" (a power cycle mid-episode, another boot's state dir); "" when none
    carried: str = ""
    inherited: list[str] = field(default_factory=list)  # standing-time breaches of an inherited episode

    # ------------------------------------------------------------ clocks

    def wall(self) -> float:
        return WALL0 + self.real + self.skew

    def boot_clock(self) -> float:
        return self.real - self.boot_start

    @property
    def boot_id(self) -> str:
        return f"boot-{self.boot_n}"

    # ------------------------------------------------------------ seams

    def seam(self, where: str) -> None:
        if where == self.crash_at:
            self.crash_at = ""
            raise Killed(where)
        if self.crash_in is not None:
            self.crash_in -= 1
            if self.crash_in <= 0:
                self.crash_in = None
                raise Killed(where)

    def api(self, where: str) -> None:
        self.calls += 1
        if where in self.fail_on:
            raise self.fail_on.pop(where)
        if self.flaky is not None and self.calls % self.flaky[0] == 0:
            raise self.flaky[1]
        if self.api_error is not None:
            n, exc = self.api_error
            if n <= 1:
                self.api_error = None
                raise exc
            self.api_error = (n - 1, exc)
        self.seam(where)

    def answered(self) -> None:
        """A cluster call has done its work: a kill switch set to flip during it is paused from now on."""
        if self.pause_in_call:
            self.pause_in_call, self.paused = False, True

    def violate(self, what: str) -> None:
        self.violations.append(f"real {self.real:.0f}s, wall {self.wall():.0f}, {self.boot_id}: {what}")

    def act(self, kind: str, uuid: str = "") -> None:
        """A host- or cluster-changing act: judged now, against the truth."""
        if self.mode != "enforce":
            self.violate(f"{kind} in {self.mode}")
        if self.paused:
            self.violate(f"{kind} while the kill switch is paused")
        if kind == "set_retired":
            return
        if self.retired:
            self.violate(f"{kind} on a retired node")
        if not self.held:
            self.violate(f"{kind} without a disruption slot")
        if kind in ("reboot", "reset") and "ml/db-0" in self.pods and self.pdb_refuses:
            self.violate(f"{kind} with ml/db-0 on the node, which its PDB refuses to let go (on_timeout wait)")
        if not any(self.real - at >= AFTER[FAULTS[n].action or ""] for n, at in self.present.items()
                   if kind != "reset" or FAULTS[n].action == "reset_gpu"):
            stood = {n: round(self.real - at) for n, at in self.present.items()}
            what = f"{kind} for a fault that has not stood its time (real seconds stood: {stood})"
            if self.carried == "inherited":  # also held alone: test_an_episode_of_another_boot_waits_its_standing_time
                self.inherited.append(what)
                self.violate(what)
            elif self.carried != "ours":  # the fault came back after the ladder's own reboot: on at once, by design
                self.violate(what)
        if kind == "reboot":
            recent = [t for t in self.reboots if self.real - t < DAY]
            if len(recent) >= self.cfg.reboot.max_per_day:
                self.violate(f"reboot #{len(recent) + 1} within 24 h of real time (max_per_day {self.cfg.reboot.max_per_day})")
        if kind == "reset":
            if self.mig is not False:
                self.violate(f"reset of {uuid} whose MIG state reads {self.mig}")
            if (self.boot_n, uuid) in self.resets:
                self.violate(f"a second reset of {uuid} in one boot")

    def faults(self) -> list[Any]:
        return fault_list(*(FAULTS[n] for n in sorted(self.present)))

    def new_boot(self, cures: bool, step: str | None) -> None:
        """A new boot; `step`: the step of the episode the record holds (None: no episode)."""
        if step is not None:
            self.carried = "ours" if step in ("rebooting", "settle") else "inherited"
        self.boot_n += 1
        self.boot_start = self.real
        self.pending_reboot = False
        self.pods = set()  # what ran there went down with it
        self.present = {} if cures else {n: self.real for n in self.present}


class SimHost(FakeHost):
    def __init__(self, world: World) -> None:
        super().__init__(world.cfg)
        self.w = world

    def boot_id(self) -> str:
        return self.w.boot_id

    def uptime(self) -> float | None:
        return self.w.boot_clock()

    def gpu_mig(self, uuid: str) -> bool | None:
        return self.w.mig

    def gpu_processes(self, uuid: str) -> tuple[int, ...] | None:
        return ()

    def reset_gpu(self, uuid: str) -> Result:
        self.w.seam("reset:before")
        self.w.act("reset", uuid)
        self.w.resets.append((self.w.boot_n, uuid))
        self.w.seam("reset:after")
        return Result(True, "sim reset")

    def verify_gpu(self, uuid: str, index: str) -> Result:
        self.w.seam("verify")
        return Result(self.w.verify_ok, "sim verify")

    def reboot(self) -> Result:
        self.w.seam("reboot:before")
        self.w.act("reboot")
        if self.w.reboot_cmd_ok:
            self.w.reboots.append(self.w.real)
            self.w.pending_reboot = True
        self.w.seam("reboot:after")
        return Result(self.w.reboot_cmd_ok, "sim reboot")

    def retire_command(self) -> Result:
        return Result(True, "sim retire command")

    def power_off(self) -> Result:
        return Result(True, "sim power off")


@dataclass(frozen=True)
class SimProgress:
    done: bool
    timed_out: bool
    evicted: int
    blocked: tuple[str, ...]
    remaining: tuple[str, ...]
    pdbs: dict[str, str]


class SimCluster:
    """The contract of `agent.kube.remediate.KubeRemediation`, over `World`."""

    present = True

    def __init__(self, world: World) -> None:
        self.w = world
        self.started: float | None = None
        self.evicted = 0
        self.last: SimProgress | None = None
        self.only: frozenset[str] | None = None

    def plan_drain(self, only_pod_uids: frozenset[str] | None = None) -> list[str]:
        self.w.api("plan_drain")
        self.w.answered()
        return sorted(self.w.pods)

    def drain(self, now: float, only_pod_uids: frozenset[str] | None = None) -> SimProgress:
        self.w.api("drain")
        if (self.last is not None and self.last.done) or only_pod_uids != self.only:
            self.started, self.evicted = None, 0
        self.only = only_pod_uids
        if self.started is None:
            self.started = now
        movable = {p for p in self.w.pods if p != "ml/db-0" or not self.w.pdb_refuses}
        if movable:
            self.w.act("evict")
            self.w.pods -= movable
            self.evicted += len(movable)
        left = tuple(sorted(self.w.pods))
        done = not left
        self.last = SimProgress(done, not done and now - self.started >= DRAIN_TIMEOUT, self.evicted, left, left,
                                {p: "ml/db" for p in left})
        self.w.answered()
        return self.last

    def claim_slot(self, now: float) -> bool:
        self.w.api("claim_slot")
        if not self.w.held and self.w.others + 1 <= self.w.budget:
            self.w.held = True
        if self.w.held:
            self.w.renewed = self.w.real
        self.w.answered()
        return self.w.held

    def renew_slot(self, now: float) -> bool:
        self.w.api("renew_slot")
        if self.w.held:
            self.w.renewed = self.w.real
        self.w.answered()
        return self.w.held

    def slot_wait(self) -> str:
        return "" if self.w.held else "every slot is held by other nodes (sim)"

    def release_slot(self, now: float) -> None:
        self.w.api("release_slot")
        self.w.held = False
        self.started, self.last, self.evicted = None, None, 0
        self.w.answered()

    def breaker_check(self, now: float, step: str) -> str:
        return ""  # the fleet breaker (issue 24) is judged by its own tests; here it never trips

    def taint_withheld(self) -> str:
        return ""

    def node_retired(self) -> bool | None:
        self.w.api("node_retired")
        self.w.answered()
        return self.w.retired

    def set_retired(self, retired: bool, message: str) -> None:
        self.w.api("set_retired")
        if retired:
            self.w.act("set_retired")
        self.w.retired = retired
        self.w.answered()

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.w.api("event")
        self.w.answered()


class SimState(StateDir):
    """The real state dir; a write may be where the process dies, and every record written must load back."""

    def __init__(self, path: str, world: World) -> None:
        super().__init__(path)
        self.w = world

    def write_json(self, name: str, data: Any) -> None:
        self.w.seam(f"write {name}:before")
        if name == RECORD_FILE.name:
            try:
                RECORD_FILE.parse(json.loads(json.dumps(data)))
            except (Damaged, TypeError, ValueError, KeyError) as exc:
                self.w.violate(f"the ladder wrote a record that does not load back: {exc}")
        super().write_json(name, data)
        self.w.seam(f"write {name}:after")


def _kwargs(world: World) -> dict[str, Any]:
    """The clocks and the kill switch, under the names `Ladder` takes them (older ladders took fewer)."""
    params = inspect.signature(Ladder).parameters
    kw: dict[str, Any] = {"clock": world.wall, "mono": world.boot_clock}
    if "uptime" in params:
        kw["uptime"] = world.boot_clock
    if "go_ahead" in params:  # what runner.go_ahead does: the kill switch read again
        kw["go_ahead"] = lambda: None if not world.paused else "kill_switch"
    return kw


class LadderMachine(RuleBasedStateMachine):
    """Every rule; the focused machines below keep the rules that matter to one promise (a deeper search
    for the same number of steps)."""

    FOCUS: frozenset[str] | None = None
    START_FAULTS: tuple[str | None, ...] = (None, *sorted(FAULTS))

    def allows(self, rule_name: str) -> bool:
        return self.w is not None and (self.FOCUS is None or rule_name in self.FOCUS)

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ladder-sm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)  # fsync is cheap there
        self.w: World | None = None
        self.ladder: Ladder | None = None

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ the agent's process

    def start(self) -> None:
        w = self.world
        state = SimState(self.dir, w)
        state.ensure()
        host = SimHost(w)
        users = Users({UUID0: frozenset({"uid-db-0"})}, host)
        self.ladder = Ladder(w.cfg, state, host, SimCluster(w), catalog=CATALOG, users=users,
                             dry_run=w.mode == "dry_run", **_kwargs(w))

    def tick(self) -> None:
        w = self.world
        w.clean = False
        if self.ladder is None:
            try:
                self.start()
            except Killed:
                return
        assert self.ladder is not None
        self.ladder.paused = w.paused  # what the runner does before each tick
        try:
            self.ladder.tick(w.faults())
            w.clean = True
            if self.ladder.rec.episode is None:
                w.carried = ""
        except Killed:
            self.ladder = None  # dead: the next tick starts a new process over the same state dir
        except (ApiError, Wait):
            pass  # the runner logs it and tries again later

    def episode_step(self) -> str | None:
        """The step of the episode in the record on disk (what a new process would resume), None without one."""
        try:
            with open(os.path.join(self.dir, RECORD_FILE.name)) as fh:
                ep = json.load(fh).get("episode")
        except (OSError, ValueError):
            return None
        return str(ep["step"]) if isinstance(ep, dict) else None

    @property
    def world(self) -> World:
        assert self.w is not None
        return self.w

    # ------------------------------------------------------------ setup

    @initialize(mode=st.sampled_from(["enforce", "enforce", "enforce", "observe", "dry_run"]),
                max_per_day=st.sampled_from([1, 2]), budget=st.sampled_from([1, 2]),
                fault=st.data(), pdb_refuses=st.booleans())
    def setup(self, mode: str, max_per_day: int, budget: int, fault: Any = None, pdb_refuses: bool = False) -> None:
        if fault is not None and not isinstance(fault, str):  # drawn: from the faults this machine starts with
            fault = fault.draw(st.sampled_from(self.START_FAULTS))
        timing = {"reboot_after": "10m", "reset_gpu_after": "2m", "rma_after": "10m", "drain_after": "10m",
                  "gpu_reset": {"busy_timeout": "10m"}}
        reboot = {"min_uptime": "30m", "settle": "10m", "max_per_day": max_per_day}
        if mode == "observe":
            cfg = rsettings(mode="observe", actions=["drain", "reset_gpu", "reboot", "retire"], reboot=reboot, **timing)
        else:
            cfg = enforce(reboot=reboot, **timing)
        self.w = World(cfg, mode, budget=budget, pdb_refuses=pdb_refuses)
        for name in (fault or "").split("+"):  # "a+b": both stand from the start
            if name:
                self.w.present[name] = 0.0
        self.start()
        self.tick()

    # ------------------------------------------------------------ time

    @precondition(lambda self: self.allows("advance"))
    @rule(dt=st.sampled_from([1.0, 10.0, 30.0, 60.0, 150.0, 600.0, 1800.0, 3600.0, 4 * 3600.0]))
    def advance(self, dt: float) -> None:
        self.world.real += dt
        self.tick()

    @precondition(lambda self: self.allows("time_passes"))
    @rule(dt=st.sampled_from([300.0, 600.0, 900.0, 1800.0]))
    def time_passes(self, dt: float) -> None:
        """(Time is what the ladder waits on: a second rule for it makes a long wait as likely as an interruption.)"""
        self.world.real += dt
        self.tick()

    @precondition(lambda self: self.allows("run_for"))
    @rule(ticks=st.integers(2, 15))
    def run_for(self, ticks: int) -> None:
        """Minutes pass, one tick a minute (as the runner's interval would have it)."""
        for _ in range(ticks):
            self.world.real += 60.0
            self.tick()

    @precondition(lambda self: self.allows("step_wall_clock"))
    @rule(step=st.one_of(st.sampled_from([3600.0, -3600.0, DAY, -DAY, 8 * DAY]),
                         st.floats(-30 * DAY, 30 * DAY, allow_nan=False)))
    def step_wall_clock(self, step: float) -> None:
        self.world.skew += step
        self.tick()

    # ------------------------------------------------------------ faults and the host

    @precondition(lambda self: self.allows("fault_appears"))
    @rule(name=st.sampled_from(sorted(FAULTS)))
    def fault_appears(self, name: str) -> None:
        self.world.present.setdefault(name, self.world.real)
        self.tick()

    @precondition(lambda self: self.allows("fault_clears"))
    @rule(name=st.sampled_from(sorted(FAULTS)))
    def fault_clears(self, name: str) -> None:
        self.world.present.pop(name, None)
        self.tick()

    @precondition(lambda self: self.allows("the_reboot_happens") and self.w is not None and self.w.pending_reboot)
    @rule(cures=st.booleans(), after=st.sampled_from([30.0, 300.0]))
    def the_reboot_happens(self, cures: bool, after: float) -> None:
        w = self.world
        w.real += after
        w.new_boot(cures, self.episode_step())
        self.ladder = None
        self.tick()

    @precondition(lambda self: self.allows("power_cycle"))
    @rule(cures=st.booleans())
    def power_cycle(self, cures: bool) -> None:
        """A reboot nobody asked for (power, an operator): a new boot."""
        self.world.real += 120.0
        self.world.new_boot(cures, self.episode_step())
        self.ladder = None
        self.tick()

    @precondition(lambda self: self.allows("mig_state"))
    @rule(mig=st.sampled_from([False, True, None]))
    def mig_state(self, mig: bool | None) -> None:
        self.world.mig = mig

    @precondition(lambda self: self.allows("reboot_command"))
    @rule(ok=st.booleans())
    def reboot_command(self, ok: bool) -> None:
        self.world.reboot_cmd_ok = ok

    @precondition(lambda self: self.allows("verification"))
    @rule(ok=st.booleans())
    def verification(self, ok: bool) -> None:
        self.world.verify_ok = ok

    # ------------------------------------------------------------ the agent's process

    @precondition(lambda self: self.allows("crash_soon"))
    @rule(n=st.integers(1, 8))
    def crash_soon(self, n: int) -> None:
        """The process dies at the n-th seam from now (a command, a cluster call, a state write)."""
        self.world.crash_in = n
        self.tick()

    @precondition(lambda self: self.allows("crash_at"))
    @rule(where=st.sampled_from(["reset:before", "reset:after", "reboot:before", "reboot:after", "verify",
                                 f"write {RECORD_FILE.name}:after", "drain", "release_slot", "set_retired"]))
    def crash_at_seam(self, where: str) -> None:
        """The process dies at this seam the next time it gets there."""
        self.world.crash_at = where
        self.tick()

    @precondition(lambda self: self.allows("restart"))
    @rule()
    def restart(self) -> None:
        self.ladder = None
        self.tick()

    @precondition(lambda self: self.allows("foreign_record"))
    @rule()
    def foreign_record(self) -> None:
        """The state dir of another boot (a cloned disk, a restored backup): an episode well under way."""
        w = self.world
        path = os.path.join(self.dir, RECORD_FILE.name)
        try:
            with open(path) as fh:
                raw = json.load(fh)
        except (OSError, ValueError):
            return
        if not w.present:
            return
        name = sorted(w.present)[0]
        key = f"{FAULTS[name].check}/{FAULTS[name].subject}/{FAULTS[name].reason}"
        action = {"reset_gpu": "reset_gpu", "reboot": "reboot", "rma": "retire"}[FAULTS[name].action or "reboot"]
        step = "reboot" if action == "reboot" else "drain"
        raw["episode"] = {"key": key, "action": action, "subject": FAULTS[name].subject, "step": step,
                          "started": w.wall() - DAY, "step_at": w.wall() - DAY, "uuid": UUID0, "gpu": "0", "pci": "",
                          "scope": "node", "slot": False, "boot_id": "boot-elsewhere", "booted_at": 0.0,
                          "retry_at": 0.0, "reset_at": 0.0, "note": "", "step_boot": "boot-elsewhere"}
        raw["seen"], raw["seen_boot"] = {key: w.wall() - DAY}, "boot-elsewhere"
        with open(path, "w") as fh:
            json.dump(raw, fh)
        w.carried = "inherited"
        self.ladder = None
        self.tick()

    @precondition(lambda self: self.allows("operator_reads_status"))
    @rule(damaged=st.booleans())
    def operator_reads_status(self, damaged: bool) -> None:
        """An SRE runs `agent remediation status` (item 2) at any point, on the live state dir, or on a copy
        of it whose record is damaged (cut in half): not a byte and not a name of the state dir changes."""
        path = self.dir
        if damaged:
            path = tempfile.mkdtemp(prefix="ladder-sm-copy-", dir=os.path.dirname(self.dir))
            shutil.copytree(self.dir, path, dirs_exist_ok=True)
            rec = os.path.join(path, RECORD_FILE.name)
            with open(rec, "rb") as fh:
                body = fh.read() if os.path.exists(rec) else b'{"version": 1, "episode": {"key": "x"}}'
            with open(rec, "wb") as fh:
                fh.write(body[: len(body) // 2])
        try:
            before = _snapshot(path)
            with contextlib.redirect_stdout(io.StringIO()):
                rc = cli_main(["remediation", "status", "--state-dir", path])
            assert _snapshot(path) == before, "`remediation status` changed the state dir"
            assert rc == (1 if damaged else 0), f"`remediation status` exit {rc}"
        finally:
            if damaged:
                shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------ the cluster

    @precondition(lambda self: self.allows("api_error_soon"))
    @rule(status=st.sampled_from([409, 429, 500, 0]), n=st.integers(1, 4))
    def api_error_soon(self, status: int, n: int) -> None:
        """The n-th cluster request from now fails (0: the client's own rate limit, `Wait`)."""
        exc: Exception = Wait(0.0) if status == 0 else ApiError(status, f"injected {status}", reason="Injected")
        self.world.api_error = (n, exc)
        self.tick()

    @precondition(lambda self: self.allows("api_flaky"))
    @rule(status=st.sampled_from([409, 429, 500, 0]), every=st.integers(2, 4))
    def api_flaky(self, status: int, every: int) -> None:
        """From now on every n-th cluster request fails, until the API heals."""
        exc: Exception = Wait(0.0) if status == 0 else ApiError(status, f"flaky {status}", reason="Injected")
        self.world.flaky = (every, exc)
        self.tick()

    @precondition(lambda self: self.allows("api_error_on"))
    @rule(call=st.sampled_from(["drain", "claim_slot", "renew_slot", "release_slot", "set_retired", "node_retired",
                                "event"]), status=st.sampled_from([409, 429, 500, 0]))
    def api_error_on(self, call: str, status: int) -> None:
        """The next request of this kind fails (the slot's release at retirement, the retired label, ...)."""
        exc: Exception = Wait(0.0) if status == 0 else ApiError(status, f"injected {status}", reason="Injected")
        self.world.fail_on[call] = exc
        self.tick()

    @precondition(lambda self: self.allows("api_heals"))
    @rule()
    def api_heals(self) -> None:
        self.world.flaky = None
        self.tick()

    @precondition(lambda self: self.allows("kill_switch"))
    @rule(paused=st.booleans())
    def kill_switch(self, paused: bool) -> None:
        self.world.paused = paused
        self.tick()

    @precondition(lambda self: self.allows("kill_switch_flips_during_the_next_call"))
    @rule()
    def kill_switch_flips_during_the_next_call(self) -> None:
        self.world.pause_in_call = True
        self.tick()

    @precondition(lambda self: self.allows("pdb"))
    @rule(refuses=st.booleans())
    def pdb(self, refuses: bool) -> None:
        self.world.pdb_refuses = refuses
        self.tick()

    @precondition(lambda self: self.allows("pods_scheduled"))
    @rule()
    def pods_scheduled(self) -> None:
        if not self.world.retired:
            self.world.pods |= {"ml/a", "ml/db-0"}

    @precondition(lambda self: self.allows("other_nodes_hold"))
    @rule(others=st.integers(0, 2))
    def other_nodes_hold(self, others: int) -> None:
        w = self.world
        w.others = min(others, w.budget - (1 if w.held else 0))

    @precondition(lambda self: self.allows("slot_expired"))
    @rule()
    def slot_expired(self) -> None:
        """This node's Lease expired (not renewed in time) and another node took the slot."""
        w = self.world
        if w.held:
            w.held, w.others = False, min(w.budget, w.others + 1)

    # ------------------------------------------------------------ invariants

    @invariant()
    def no_violation(self) -> None:
        if self.w is not None:
            assert not self.w.violations, "\n".join(self.w.violations)

    @invariant()
    def slots_within_the_budget(self) -> None:
        if self.w is not None:
            assert self.w.others + (1 if self.w.held else 0) <= self.w.budget

    @invariant()
    def every_record_loads_back(self) -> None:
        if self.w is None:
            return
        names = os.listdir(self.dir)
        aside = [n for n in names if ".bad" in n]
        assert not aside, f"the record was set aside: {aside}"
        if RECORD_FILE.name in names:
            with open(os.path.join(self.dir, RECORD_FILE.name)) as fh:
                RECORD_FILE.parse(json.load(fh))

    @invariant()
    def a_reset_is_never_assumed(self) -> None:
        """What the ladder counts as cured by a reset (its `handled`, the Xid stream's reset file) ran in this boot."""
        if self.w is None or self.ladder is None:
            return
        w = self.w
        told = [r.uuid for r in gpu_resets.load(StateDir(self.dir), w.boot_id)]
        cured = [k for k, b in self.ladder.rec.handled.items() if b == w.boot_id]
        if told or cured:
            assert (w.boot_n, UUID0) in w.resets, f"reset recorded as done in {w.boot_id} ({told}, {cured}) but none ran"

    @invariant()
    def a_retired_node_gives_its_slot_back(self) -> None:
        """A retirement is final: its slot's release is retried until done (a clean tick releases it)."""
        w = self.w
        if w is not None and w.clean and self.ladder is not None and self.ladder.rec.retired is not None:
            assert not w.held, "retired, and the disruption slot is still held after a tick without errors"

    @invariant()
    def an_overdue_reboot_gives_its_slot_back(self) -> None:
        """Asked for, never happened: past the overdue time the slot is released, or at least no longer
        renewed (a record replaced meanwhile by another boot's knows no slot: its Lease, unrenewed, expires
        and another node reclaims it; docs/remediation.md, Known limits)."""
        w = self.w
        if w is None or not w.clean or not w.pending_reboot or not w.reboots:
            return
        if w.real - w.reboots[-1] > REBOOT_OVERDUE + 3600.0 and w.boot_clock() > w.real - w.reboots[-1]:
            assert not (w.held and w.renewed > w.reboots[-1] + REBOOT_OVERDUE + 3600.0), (
                f"slot still held and renewed {w.real - w.reboots[-1]:.0f}s after a reboot that never happened")


TIME = frozenset({"advance", "time_passes", "run_for"})


class RetireMachine(LadderMachine):
    """Retirement and the records around it (issue 23 item 1): interrupted, refused, restarted, rebooted."""

    FOCUS = TIME | {"crash_soon", "crash_at", "restart", "api_error_soon", "api_error_on", "api_flaky", "api_heals", "power_cycle",
                    "the_reboot_happens", "fault_appears", "fault_clears", "reboot_command"}
    START_FAULTS: tuple[str | None, ...] = ("rma", "reboot")


class PdbMachine(LadderMachine):
    """A PodDisruptionBudget that refuses, under on_timeout = "wait" (item 3)."""

    FOCUS = TIME | {"pdb", "pods_scheduled", "crash_soon", "restart", "api_error_soon", "the_reboot_happens",
                    "fault_appears", "fault_clears"}
    START_FAULTS: tuple[str | None, ...] = ("reboot", "reset", "rma")


class ClockMachine(LadderMachine):
    """Wall-clock steps of an hour, a day, a week or anything (item 6)."""

    FOCUS = TIME | {"step_wall_clock", "fault_appears", "fault_clears", "the_reboot_happens", "power_cycle",
                    "restart", "crash_soon", "reboot_command"}
    START_FAULTS: tuple[str | None, ...] = ("reboot", "reset", "rma")


class FailClosedMachine(LadderMachine):
    """MIG unreadable, the kill switch flipped mid-tick, deaths mid-reset and mid-reboot, several reset Xids (item 7)."""

    FOCUS = TIME | {"mig_state", "kill_switch", "kill_switch_flips_during_the_next_call", "crash_soon", "crash_at", "restart",
                    "verification", "fault_appears", "fault_clears", "the_reboot_happens", "reboot_command",
                    "other_nodes_hold", "slot_expired"}
    START_FAULTS: tuple[str | None, ...] = ("reset", "reset+reset2", "reboot")  # two reset-type Xids on one GPU


TestLadderStateful = LadderMachine.TestCase
TestLadderStateful.settings = SETTINGS
FOCUSED = settings(SETTINGS, max_examples=int(os.environ.get("NHA_LADDER_FOCUSED_EXAMPLES", "40")))
TestRetireStateful = RetireMachine.TestCase
TestRetireStateful.settings = FOCUSED
TestPdbStateful = PdbMachine.TestCase
TestPdbStateful.settings = FOCUSED
TestClockStateful = ClockMachine.TestCase
TestClockStateful.settings = FOCUSED
TestFailClosedStateful = FailClosedMachine.TestCase
TestFailClosedStateful.settings = FOCUSED


def test_the_simulation_can_fail() -> None:
    """The judge is not blind: a reboot while paused, without a slot, is reported."""
    w = World(enforce(), "enforce", paused=True)
    w.present["reboot"] = -1000.0
    w.act("reboot")
    assert any("paused" in v for v in w.violations) and any("slot" in v for v in w.violations)


pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")


def test_an_episode_of_another_boot_waits_its_standing_time() -> None:
    """A cloned disk or a restored state dir: the record holds an episode of another boot, at its reboot step. The
    fault, 1 s old in this boot, must stand `reboot_after` (10 min) here before any drain or reboot."""
    m = LadderMachine()
    try:
        m.setup(mode="enforce", max_per_day=2, budget=1)
        m.fault_appears(name="reboot")
        m.foreign_record()
        m.advance(dt=1.0)
        w = m.world
        assert not w.violations
        assert not w.inherited and not w.reboots, w.inherited
    finally:
        m.teardown()
