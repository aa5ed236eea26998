"""The ladder: one state machine per node, persisted before every step.

claim a disruption slot → drain (the node, or only the pods holding the
faulty GPU) → reset the GPU and verify it, or reboot and prove it by a new
boot ID → released when the fault is gone; repeated uncured reboots, or an
``rma`` fault, retire the node instead. One fault is handled at a time (the
strongest action first: a reboot cures a GPU that wanted a reset).

Each step is taken only when the mode allows it (``enforce``, the action
listed in ``actions``, no dry run, the kill switch not paused); otherwise
the steps left are exported as would-be with their cause and the exact
targets are logged, and the ladder waits where it is. `tick` never sleeps:
the runner's thread calls it on every new snapshot and every ``interval``.
A cluster call that raises `ApiError`/`Wait` leaves the record as it was;
the next tick tries again.

Clocks: every wait (standing time, settle, overdue, retry, busy, startup
grace) is measured on ``uptime``, the boot clock (CLOCK_BOOTTIME), with the
boot ID it belongs to; the daily cap and the retire window count reboots by
boot ID and boot-clock intervals (`Record.boots`). The wall clock (``clock``)
only stamps what people read, so a wall-clock step changes no decision.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from ..catalog import Catalog
from ..findings import Finding, Sample
from ..gpu import resets as gpu_resets
from ..statedir import StateDir
from .catalog import CHECK
from .cluster import Cluster, Progress
from .faults import EPISODE, RANK, Fault, plan
from .host import Host, Result
from .record import MAX_BOOTS, RECORD_FILE, UNRETIRE, UNRETIRE_FILE, Episode, Reboot, Record, Retired
from .settings import RemediationSection

log = logging.getLogger(__name__)

DAY = 86400.0
REBOOT_RETRY = 600.0  # a reboot command that failed is tried again no sooner (the daily cap counts it)
REBOOT_OVERDUE = 7200.0  # a requested reboot that has not happened by then is reported (never asked for again)
MAX_TRANSITIONS = 12  # steps one tick may take (each one persisted)
STARTUP_GRACE = 120.0  # after a start, a recorded fault not reported yet keeps its first-seen time this long
BOOT_NOTE = 600.0  # the current boot's boot-clock reading is written down at least this often (Record.boots)


def boottime() -> float:
    """CLOCK_BOOTTIME: seconds since this boot, suspend included; never stepped."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class GpuUsers(Protocol):
    """Who holds a GPU (`agent.gpu.attribution` behind `runner.Attribution`)."""

    def pods_on_gpu(self, uuid: str) -> frozenset[str] | None:
        """UIDs of the pods holding the GPU; None: cannot tell (the whole node is drained)."""
        ...

    def processes_on_gpu(self, uuid: str) -> tuple[int, ...] | None:
        """PIDs NVML lists on the GPU; None: cannot tell (no reset)."""
        ...


class Ladder:
    """The ladder of one node.

    Seams (tests and other features replace them): ``host`` (every command on
    the host), ``cluster`` (`Cluster`: drain, disruption slot, retired mark,
    events; an optional ``node_retired() -> bool | None`` reads the retired
    mark back from the Node at the first tick), ``users`` (who holds a GPU),
    ``clock`` (wall time: only for what people read), ``mono``
    (CLOCK_MONOTONIC: when a reset finished, for the Xid stream), ``uptime``
    (CLOCK_BOOTTIME: every wait), and ``go_ahead``: called immediately before
    each host- or cluster-changing command (a drain step, a GPU reset, a
    reboot); it returns None to go on, or the cause that stops it now (the
    runner re-reads the kill switch there; the fleet breaker hooks in too).
    ``paused`` is the kill switch as the runner last read it (None: not known
    yet, wait). `tick(faults)` is the one entry point.
    """

    def __init__(
        self, cfg: RemediationSection, state: StateDir, host: Host, cluster: Cluster, *, catalog: Catalog,
        users: GpuUsers | None = None, dry_run: bool = False, clock: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic, uptime: Callable[[], float] = boottime,
        go_ahead: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.cfg, self.state, self.host, self.cluster, self.catalog = cfg, state, host, cluster, catalog
        self.users, self.dry_run, self.clock, self.mono, self.uptime = users, dry_run, clock, mono, uptime
        self.go_ahead = go_ahead
        self.paused: bool | None = False  # the cluster's kill switch (None: not known yet, wait)
        had_file = os.path.lexists(self.state.file(RECORD_FILE.name))
        loaded = state.load(RECORD_FILE)
        self.rec = loaded or Record()
        # Unreadable (EACCES, EIO: left in place): nothing is done, nothing written, until it reads again.
        self.unreadable = loaded is None and state.problems.get(RECORD_FILE.name, "").startswith("unreadable")
        self.damaged = had_file and loaded is None and not self.unreadable  # set aside: what was done is unknown
        self.suspect: set[str] | None = None  # faults standing when the record was lost (filled at the 1st tick)
        self.first_seen: dict[str, float] = {}
        self.present: dict[str, Fault] = {}
        self.now = 0.0  # boot clock
        self.wall = 0.0
        self.boot = ""
        self._node_read = False  # the Node's retired mark was read (once, at the first tick that could)
        self.would: dict[str, str] = {}  # action -> cause
        self.waiting: dict[str, str] = {}  # on -> message
        self.failed: dict[str, str] = {}  # action -> message (until the episode ends)
        self.counts: dict[tuple[str, str], int] = {}
        self._said: dict[str, str] = {}  # log-once memory
        self._adopted = False  # a slot held before this process started is claimed again once (the cluster side forgot it)
        self._started: float | None = None  # the first tick's time
        self._reported: set[str] = set()  # faults this process has been told of (their clearing is real)
        self._drained_at: float | None = None  # when this process last saw a drain finish (boot clock)

    # ------------------------------------------------------------ the tick

    def tick(self, faults: Sequence[Fault]) -> None:
        self.now, self.wall, self.boot = self.uptime(), self.clock(), self.host.boot_id()
        self.present = {f.key: f for f in faults}
        self.would, self.waiting = {}, {}
        if self.unreadable and not self._reread():
            return
        self._unretire_request()
        self._note_boot()
        self._node_mark()
        self._stood()
        if self.suspect is None:
            self.suspect = set(self.present) if self.damaged else set()
            if self.suspect:
                log.error("remediation record was damaged: nothing is done for the faults standing now (%s)", ", ".join(sorted(self.suspect)))
        self.suspect &= set(self.present)
        if self.suspect:  # a record that could not be read never leads to an action: nothing for those faults
            self._wait("record", f"the remediation record was damaged: nothing is done for {', '.join(sorted(self.suspect))}, "
                       "which stood before it was lost (until it clears)")
        if self.rec.unretire and self._cause("retire") is None:  # observe, dry run, kill switch: not yet
            self.cluster.set_retired(False, "un-retired by an operator (agent remediation unretire)")  # + its event
            log.warning("remediation: the node was un-retired by an operator; reboot history cleared")
            self.rec.unretire = False
            self._save()
        self._remember()
        if self.rec.retired is not None:
            self._retired(self.rec.retired)
            ep = self.rec.episode
            if ep is not None:  # a retirement is final: its slot release is retried until done, nothing else runs
                self._release(ep)
            return
        self._other_boot()
        if self.rec.episode is None:
            self._start()
        self._adopt()
        self._renew()
        for _ in range(MAX_TRANSITIONS):
            ep = self.rec.episode
            if ep is None or not self._advance(ep):
                break

    def _reread(self) -> bool:
        """The record could not be read (EACCES, EIO): read it again; until then nothing acts (it is reported)."""
        loaded = self.state.load(RECORD_FILE)
        if loaded is None and self.state.problems.get(RECORD_FILE.name, "").startswith("unreadable"):
            self._wait("record", f"the remediation record {self.state.file(RECORD_FILE.name)} cannot be read "
                       f"({self.state.problems[RECORD_FILE.name]}): nothing is done until it can")
            return False
        self.unreadable = False
        if loaded is None:  # gone or damaged meanwhile: as at a start with a damaged record
            self.damaged, self.suspect = True, None
        self.rec = loaded or Record()
        return True

    def _unretire_request(self) -> None:
        """`agent remediation unretire` while this agent runs: its request file, applied here and removed."""
        if not os.path.lexists(self.state.file(UNRETIRE)):
            return
        req = self.state.load(UNRETIRE_FILE)
        if req is not None and self.rec.unretired():
            log.warning("remediation: un-retire requested by an operator (agent remediation unretire at %s): "
                        "the retired mark and the reboot history are cleared", _utc(req))
            self._save()
        elif req is not None:
            log.warning("remediation: un-retire requested, but this node is not retired; nothing to do")
        self.state.remove(UNRETIRE)

    def _note_boot(self) -> None:
        """This boot and its boot clock, for the time since a reboot of an earlier boot."""
        if not self.boot:
            return
        if not self.rec.boots or self.rec.boots[-1][0] != self.boot:
            self.rec.boots = [b for b in self.rec.boots if b[0] != self.boot][-(MAX_BOOTS - 1):] + [(self.boot, self.now)]
            self._save()
        elif self.now - self.rec.boots[-1][1] >= BOOT_NOTE:
            self._save()

    def _since(self, boot: str, up: float, wall: float) -> float:
        """Seconds since boot clock `up` of boot `boot`: a lower bound (the time between boots does not count)."""
        if up < 0:  # a record of before boot clocks
            return max(0.0, self.wall - wall)
        if boot == self.boot:
            return max(0.0, self.now - up)
        ids = [b for b, _ in self.rec.boots]
        if boot not in ids:  # forgotten: older than MAX_BOOTS boots; unknown otherwise (counts as now)
            return math.inf if len(ids) >= MAX_BOOTS else 0.0
        i = ids.index(boot)
        later = sum(u for b, u in self.rec.boots[i + 1:] if b != self.boot)
        return max(0.0, self.rec.boots[i][1] - up) + later + self.now

    def _node_mark(self) -> None:
        """The retired mark is read back from the Node once: the cluster says retired, the record not → retired."""
        if self._node_read:
            return
        read = getattr(self.cluster, "node_retired", None)
        on_node = read() if read is not None else None  # ApiError/Wait: tried again at the next tick
        self._node_read = True
        if on_node and self.rec.retired is None and not self.rec.unretire:
            why = ("the Node carries the retired label but the local record does not (lost, damaged or restored): "
                   "retired as the cluster says; un-retire it to return it")
            log.error("node RETIRED: %s", why)
            self.rec.retired = Retired(self.wall, "node", why, command_done=True, powered_off=True,
                                       boot_id=self.boot, up=self.now)
            self._save()

    def _other_boot(self) -> None:
        """An episode of another boot never shortens a wait. Before its act (claim, drain, reset, hold, reboot,
        retire) or after a reset, it is dropped (its slot released): the fault, if it stands here, stands its
        time in this boot first (a cloned disk, a restored state dir, a reboot nobody asked for). After a
        requested reboot ("rebooting": `_rebooting` sees the new boot) it goes on; settle starts again."""
        ep = self.rec.episode
        if ep is None or ep.step_boot == self.boot or ep.step == "rebooting":
            return
        if ep.step in ("settle", "release"):
            log.info("remediation: the record's %s step was timed in another boot; its wait starts again", ep.step)
            self.rec.episode = replace(ep, step_at=self.now, booted_at=self.now, step_boot=self.boot)
            self._save()
            return
        log.warning("remediation: the record's episode for %s (at %s) is of another boot: it starts again in this "
                    "one, after the fault has stood its time here", ep.key, ep.step)
        if ep.slot:
            self.cluster.release_slot(self.now)  # ApiError/Wait: the record is unchanged, tried again
        self.rec.episode = None
        self.failed = {}
        self._save()

    def _stood(self) -> None:
        """First-seen times, from the record: a restart neither resets nor shortens a fault's wait.

        Another boot's times, or a time ahead of the clock (it was set back), start the wait
        again (later, never sooner); so does a missing or damaged record. For `STARTUP_GRACE`
        after the start a recorded fault that is not (yet) reported keeps its time: the checks
        have not all run again; after that, or once this process was told of it and then not, a
        fault that is gone is forgotten."""
        if self._started is None:
            self._started = self.now
        old = self.rec.seen if self.rec.seen_boot == self.boot else {}
        keep = self.now - self._started < STARTUP_GRACE
        self._reported |= set(self.present)  # told of by this process, then not: cleared, not "not run yet"
        seen = {k: t for k, t in old.items() if keep and k not in self.present and k not in self._reported and t <= self.now}
        seen.update({k: old[k] if old.get(k, self.now + 1) <= self.now else self.now for k in self.present})
        if seen != self.rec.seen or self.rec.seen_boot != self.boot:
            self.rec.seen, self.rec.seen_boot = seen, self.boot
            self._save()
        self.first_seen = seen

    def _remember(self) -> None:
        """Reboots the same fault came back after; cures and reboots that left the window."""
        changed = False
        for key in self.present:
            last = next((r for r in reversed(self.rec.reboots) if r.key == key and not r.failed), None)
            if last is not None and not last.back and last.boot_id != self.boot and self._proven(last):
                last.back, changed = True, True
                log.warning("%s came back after the reboot of %s: an uncured reboot", key, _utc(last.at))
        handled = {k: b for k, b in self.rec.handled.items() if k in self.present and b == self.boot}
        resets = {k: b for k, b in self.rec.resets.items() if b == self.boot}
        self.rec.reset_counts = {k: n for k, n in self.rec.reset_counts.items() if k in resets}
        window = self.cfg.retire.window
        reboots = [r for r in self.rec.reboots if self._since(r.boot_id, r.up, r.at) <= window]
        if changed or handled != self.rec.handled or resets != self.rec.resets or len(reboots) != len(self.rec.reboots):
            self.rec.handled, self.rec.resets, self.rec.reboots = handled, resets, reboots
            self._save()

    def _adopt(self) -> None:
        """A slot the record says is held: the cluster side of a new process does not know it (claiming
        one's own Lease again is idempotent), so it can renew it and release it at the end."""
        ep = self.rec.episode
        if self._adopted or ep is None or not ep.slot:
            return
        if not self.cluster.claim_slot(self.now):
            # Taken while the agent was away (its Lease expired: a boot longer than the expiry). What was
            # done stays done; the next disruptive step waits for a slot again.
            log.warning("remediation: the disruption slot held before the restart is gone; claiming one again "
                        "before the next disruptive step")
            self.rec.episode = replace(ep, slot=False)
            self._save()
        self._adopted = True

    def _renew(self) -> None:
        """A held slot is renewed (the cluster side writes its Lease's renewTime every expiry/6); one that
        was taken away is claimed again before the next disruptive step."""
        ep = self.rec.episode
        if ep is None or not ep.slot or ep.step == "release" or self.cluster.renew_slot(self.now):
            return
        log.error("remediation: the disruption slot of %s was taken away (its Lease expired); claiming one again "
                  "before the next disruptive step", ep.key)
        self.rec.episode = replace(ep, slot=False)
        self._save()

    def _proven(self, r: Reboot) -> bool:
        """A reboot entry whose reboot happened (not the one still awaited)."""
        ep = self.rec.episode
        return not (ep is not None and ep.step == "rebooting" and ep.boot_id == r.boot_id == self.boot)

    def _start(self) -> None:
        due = [f for f in self.present.values() if f.key not in self.rec.handled and self._stood_its_time(f)]
        if not due:
            return
        f = min(due, key=lambda f: (-RANK[EPISODE[f.action]], f.key))
        ep = Episode(key=f.key, action=EPISODE[f.action], subject=f.subject, step="claim", started=self.wall,
                     step_at=self.now, uuid=f.uuid, gpu=f.gpu, pci=f.pci, scope="gpu" if f.action == "reset_gpu" else "node",
                     step_boot=self.boot)
        log.warning("remediation: %s (%s) has stood %.0fs: %s", f.key, f.action, self.now - self.first_seen[f.key], f.message)
        if f.action == "reset_gpu" and f.uuid and self._resets(f.uuid) >= self.cfg.gpu_reset.max_per_boot:
            ep.action, ep.scope = "reboot", "node"  # the resets of this GPU in this boot are spent: as a failed reset
            ep.note = f"{f.key}: {self._spent(f.uuid)}"
            log.error("remediation: %s; escalating to a reboot", ep.note)
            self._event("RemediationEscalated", f"{ep.note}; escalating to a reboot", warning=True)
        self.rec.episode = ep
        self._save()

    def _stood_its_time(self, f: Fault) -> bool:
        """The fault has stood its action's `*_after` time in this boot (and was not standing when the record
        was lost): only then is anything done for it, as an episode of its own or by taking one over."""
        after = {"reset_gpu": self.cfg.reset_gpu_after, "reboot": self.cfg.reboot_after,
                 "drain_and_diagnose": self.cfg.drain_after, "rma": self.cfg.rma_after}[f.action]
        return f.key not in (self.suspect or ()) and self.now - self.first_seen[f.key] >= after

    # ------------------------------------------------------------ steps

    def _advance(self, ep: Episode) -> bool:
        """One step; True when it moved on (the next one may run in the same tick)."""
        if ep.step in ("claim", "drain", "reset_gpu", "hold", "reboot", "retire"):
            if ep.key not in self.present:
                return self._end(ep, f"{ep.key} cleared before the {ep.step} step; nothing more to do")
            if self._upgrade(ep):
                return True
        if ep.step in ("drain", "reset_gpu", "reboot") and not ep.slot:
            return self._go(ep, "claim")  # the slot was lost: nothing disruptive without one
        return {
            "claim": self._claim, "drain": self._drain, "reset_gpu": self._reset, "resetting": self._resetting,
            "verify": self._verify, "reboot": self._reboot, "rebooting": self._rebooting, "settle": self._settle,
            "hold": self._hold, "retire": self._retire, "release": self._release,
        }[ep.step](ep)

    def _upgrade(self, ep: Episode) -> bool:
        """A stronger fault arrived before the act: it takes the episode over (a reboot cures a reset fault too)."""
        if ep.step not in ("claim", "drain", "reset_gpu", "hold"):
            return False
        options = [f for f in self.present.values() if self._stood_its_time(f)]  # never sooner than its own time
        if not options:
            return False
        best = min(options, key=lambda f: (-RANK[EPISODE[f.action]], f.key))
        if RANK[EPISODE[best.action]] > RANK[ep.action]:
            log.warning("remediation: %s (%s) takes over from %s (%s)", best.key, best.action, ep.key, ep.action)
            ep.key, ep.action, ep.subject, ep.scope = best.key, EPISODE[best.action], best.subject, "node"
            return self._go(ep, "drain" if ep.step in ("reset_gpu", "hold") else ep.step)
        return False

    def _claim(self, ep: Episode) -> bool:
        if self._blocked(ep, plan(ep.action, "claim")[0]) or not self._fleet_allows("claim"):
            return False
        if not self.cluster.claim_slot(self.now):
            why = self.cluster.slot_wait() or "no disruption slot was granted"
            self._wait("slot", f"{ep.key} waits for a disruption slot: {why}")
            self._event_once("DisruptionSlotWaiting", f"{ep.key} waits for a disruption slot: {why}", warning=True)
            return False
        ep.slot, self._adopted = True, True
        return self._go(ep, "drain")

    def _drain(self, ep: Episode) -> bool:
        if self._blocked(ep, "drain", fresh=True):
            return False
        untainted = self.cluster.taint_withheld()  # never cordoned (tainted) by us: pods would come back
        if untainted:
            self._wait("taint", f"{ep.key}: no drain while the node lacks its taint: {untainted}")
            return False
        if not self._fleet_allows("drain"):
            return False
        only = self._only(ep)
        progress: Progress = self.cluster.drain(self.now, only)
        present = getattr(self.cluster, "present", True)
        if progress.evicted or progress.blocked:
            self._say(f"drain:{ep.key}", f"draining for {ep.key}: {progress.evicted} evicted, "
                      f"blocked by a PodDisruptionBudget: {', '.join(progress.blocked) or 'none'}; "
                      f"remaining: {', '.join(progress.remaining) or 'none'}")
        nxt = {"reset_gpu": "reset_gpu", "reboot": "reboot", "drain_and_diagnose": "hold", "retire": "retire"}[ep.action]
        if progress.done:
            result = "ok"
        elif not progress.timed_out:
            return False
        else:
            # Pods the drain could not move are on the node: nothing disruptive happens over them (on_timeout
            # = "wait" keeps them; "delete" deletes them and the drain finishes), unless the action's
            # force_after (opt-in, off by default) has passed since the drain began.
            left = _pods(progress)
            force = self._force_after(ep.action)
            if ep.action == "drain_and_diagnose" or force <= 0 or self.now - ep.step_at < force:
                more = f"; {ep.action} goes past them {force:.0f}s after the drain began" if force > 0 and ep.action != "drain_and_diagnose" else ""
                self._wait("drain", f"{ep.key}: the drain timed out with pods it could not move still on the node: "
                           f"{left}; nothing disruptive is done while they are here (evictions go on){more}")
                return False
            log.error("drain for %s timed out with %s left; %s goes past them (force_after %.0fs)", ep.key, left, nxt, force)
            result = "forced"
        if present:  # without a cluster nothing was drained: nothing to count or tell
            self._count("drain", result)
            self._event("RemediationDrained", f"{ep.key}: pods evicted ({progress.evicted}, {result}); next: {nxt}")
        self._drained_at = self.now
        return self._go(replace(ep, forced=result == "forced"), nxt)

    def _still_drained(self, ep: Episode) -> bool:
        """Immediately before a reset or a reboot: the drain finished, but the step may have waited since (the
        uptime floor, the daily cap, a busy GPU, the breaker) and a pod that tolerates the taint may have landed.
        One more drain step (the pod watch's set: no request while it is open); anything left on the node sends
        the episode back to its drain, whose timeout and on_timeout apply again. A drain forced past its pods
        (force_after) does not wait for them twice."""
        if ep.forced or self._drained_at == self.now or not getattr(self.cluster, "present", True):
            return True  # forced past its pods, or drained in this very tick
        progress = self.cluster.drain(self.now, self._only(ep))
        if progress.done:
            return True
        msg = (f"{ep.key}: pods are on the node again before the {ep.step.replace('_', ' ')}: {_pods(progress)}; "
               "draining again first")
        log.warning("remediation: %s", msg)
        self._event("RemediationRedrain", msg, warning=True)
        self._go(ep, "drain")
        return False

    def _force_after(self, action: str) -> float:
        return {"reset_gpu": self.cfg.gpu_reset.force_after, "reboot": self.cfg.reboot.force_after,
                "retire": self.cfg.retire.force_after}.get(action, 0.0)

    def _only(self, ep: Episode) -> frozenset[str] | None:
        if ep.scope != "gpu":
            return None
        pods = self.users.pods_on_gpu(ep.uuid) if (self.users and ep.uuid) else None
        if pods is None:
            self._say(f"scope:{ep.key}", f"{ep.key}: which pods hold GPU {ep.uuid or '?'} is unknown; draining the whole node")
            ep.scope = "node"
            self._save()
        return pods

    def _reset(self, ep: Episode) -> bool:
        gr = self.cfg.gpu_reset
        if not ep.uuid:
            return self._escalate(ep, f"the UUID of {ep.subject} is unknown: cannot reset it")
        if self._resets(ep.uuid) >= gr.max_per_boot:
            return self._escalate(ep, self._spent(ep.uuid))
        missing = self.host.reset_unavailable()
        if missing is not None:  # no tool to reset with is a deployment to mend, not a GPU a reboot would cure
            self._wait("reset_gpu", f"GPU {ep.uuid}: {missing}; the reset waits (no reboot in its place)")
            return False
        mig = self.host.gpu_mig(ep.uuid)
        if mig is None and not gr.allow_mig:  # fail closed: what cannot be read is MIG
            return self._escalate(ep, f"the MIG mode of GPU {ep.uuid} cannot be read (nvidia-smi failed or hung): "
                                  "treated as MIG (gpu_reset.allow_mig = false)")
        if mig and not gr.allow_mig:
            return self._escalate(ep, f"GPU {ep.uuid} is in MIG mode (gpu_reset.allow_mig = false)")
        pids = self.users.processes_on_gpu(ep.uuid) if self.users else self.host.gpu_processes(ep.uuid)
        if pids is None or pids:
            what = "NVML's process list is unreadable" if pids is None else f"processes {', '.join(map(str, pids))} use it"
            if self.now - ep.step_at >= gr.busy_timeout:
                return self._escalate(ep, f"GPU {ep.uuid}: {what} after {gr.busy_timeout:.0f}s")
            self._wait("gpu_busy", f"GPU {ep.uuid}: {what}; the reset waits")
            return False
        if self._blocked(ep, "reset_gpu", fresh=True) or not self._fleet_allows("reset_gpu") or not self._still_drained(ep):
            return False
        # Persisted first, with the GPU's one reset of this boot spent: a restart mid-reset verifies the GPU and
        # escalates (whether the reset ran is unknown: never assumed), it never resets twice.
        self.rec.reset_counts[ep.uuid] = self._resets(ep.uuid) + 1
        self.rec.resets[ep.uuid] = self.boot
        ep.boot_id = self.boot
        self._go(ep, "resetting")
        res = self.host.reset_gpu(ep.uuid)
        self._count("reset_gpu", "ok" if res.ok else "failed")
        log.warning("GPU reset of %s for %s: %s", ep.uuid, ep.key, res.detail)
        if not res.ok:
            return self._escalate(ep, f"the reset of GPU {ep.uuid} failed: {res.detail}", failed="reset_gpu")
        self._event("GpuReset", f"{ep.key}: GPU {ep.uuid} reset; verifying")
        ep.reset_at = self.mono()  # the Xids of that GPU before this moment are what the reset cured
        return self._go(ep, "verify")

    def _resets(self, uuid: str) -> int:
        """Resets of this GPU in this boot (verified, failed or of unknown outcome)."""
        return self.rec.reset_counts.get(uuid, 1) if self.rec.resets.get(uuid) == self.boot else 0

    def _spent(self, uuid: str) -> str:
        n = self._resets(uuid)
        return (f"GPU {uuid} was reset {n} time{'s' if n > 1 else ''} in this boot already "
                f"(gpu_reset.max_per_boot = {self.cfg.gpu_reset.max_per_boot})")

    def _resetting(self, ep: Episode) -> bool:
        """Resumed with a reset under way: it may or may not have run. The GPU is verified, and the reset is
        never assumed: the Xid stream is not told (its findings stand), and a fault still there escalates."""
        if ep.boot_id and ep.boot_id != self.boot:
            return self._end(ep, f"the node rebooted while GPU {ep.uuid} was being reset")
        log.warning("resuming: the reset of GPU %s was under way when the agent stopped; verifying the GPU", ep.uuid)
        res = self.host.verify_gpu(ep.uuid, ep.gpu)
        if not res.ok:
            return self._escalate(ep, f"GPU {ep.uuid} failed its verification after an interrupted reset: {res.detail}",
                                  failed="verify")
        if ep.key not in self.present:
            return self._end(ep, f"{ep.key} cleared; GPU {ep.uuid} answers after an interrupted reset ({res.detail})")
        return self._escalate(ep, f"the reset of GPU {ep.uuid} was interrupted (the agent stopped): whether it ran is "
                              f"unknown and {ep.key} still stands")

    def _verify(self, ep: Episode) -> bool:
        res = self.host.verify_gpu(ep.uuid, ep.gpu)
        if not res.ok:
            return self._escalate(ep, f"GPU {ep.uuid} failed its verification after the reset: {res.detail}", failed="verify")
        self.rec.handled[ep.key] = self.boot
        self.rec.resets[ep.uuid] = self.boot
        self._save()  # before the Xid stream is told: back after this, the fault escalates to a reboot
        # Downward, through the state dir: the Xid stream drops that GPU's reset_gpu findings from
        # before the reset (the kernel log never says a reset happened), and the node is released.
        gpu_resets.record(self.state, self.boot, ep.uuid, pci=ep.pci, gpu=ep.gpu, at=ep.reset_at or self.mono())
        return self._end(ep, f"GPU {ep.uuid} reset and verified ({res.detail})", reason="RemediationSucceeded")

    def _escalate(self, ep: Episode, why: str, failed: str = "") -> bool:
        if failed:
            self.failed[failed] = why
        log.error("remediation: %s; escalating %s to a reboot", why, ep.key)
        self._event("RemediationEscalated", f"{ep.key}: {why}; escalating to a reboot", warning=True)
        ep.action, ep.scope, ep.note = "reboot", "node", why[:300]
        return self._go(ep, "drain")

    def _reboot(self, ep: Episode) -> bool:
        rs, uncured = self.cfg.reboot, self._uncured(ep.key)
        if uncured >= self.cfg.retire.after_reboots:
            ep.action = "retire"
            ep.note = f"{uncured} reboots did not cure {ep.key} within {self.cfg.retire.window / DAY:g} days"
            return self._go(ep, "retire")
        if ep.key in (self.suspect or ()):
            self._wait("record", f"the remediation record was damaged: no reboot for {ep.key}, which stood before it was lost")
            return False
        uptime = self.host.uptime()
        if uptime is None or uptime < rs.min_uptime:
            self._wait("uptime", f"uptime {'unknown' if uptime is None else f'{uptime:.0f}s'} is below reboot.min_uptime ({rs.min_uptime:.0f}s)")
            return False
        recent = sum(1 for r in self.rec.reboots if self._since(r.boot_id, r.up, r.at) < DAY)
        if recent >= rs.max_per_day:
            self._wait("daily_cap", f"{recent} reboots in the last 24h of boot time (reboot.max_per_day = {rs.max_per_day})")
            return False
        if self.now < ep.retry_at or self._blocked(ep, "reboot", fresh=True) or not self._fleet_allows("reboot"):
            return False
        if not self.boot:
            self._wait("record", "the boot ID is unreadable: a reboot could not be proven, so none is asked for")
            return False
        if not self._still_drained(ep):
            return False
        # The record first (atomic): the finding, the time, the boot ID. Killed after this line, the
        # agent finds "rebooting" with this boot ID and waits for a new one: never a second request.
        self.rec.reboots.append(Reboot(ep.key, self.wall, self.boot, up=self.now))
        ep.boot_id = self.boot
        self._go(ep, "rebooting")
        log.warning("REBOOTING for %s (%s) via %s", ep.key, ep.note or ep.action, self.host.describe_reboot())
        self._event("RebootRequested", f"{ep.key}: rebooting via {self.cfg.reboot.method}", warning=True)
        res = self.host.reboot()
        self._count("reboot", "ok" if res.ok else "failed")
        if not res.ok:
            self.rec.reboots[-1].failed = True
            self.failed["reboot"] = f"the reboot command failed: {res.detail}; trying again in {REBOOT_RETRY:.0f}s"
            log.error("reboot for %s failed: %s", ep.key, res.detail)
            ep.retry_at = self.now + REBOOT_RETRY
            self._go(ep, "reboot")
        return False

    def _rebooting(self, ep: Episode) -> bool:
        if self.boot and self.boot != ep.boot_id:
            log.warning("rebooted (boot ID %s, was %s) for %s; watching whether it comes back", self.boot, ep.boot_id, ep.key)
            self._event("Rebooted", f"{ep.key}: the node rebooted (new boot ID); watching for {self.cfg.reboot.settle:.0f}s")
            ep.booted_at = self.now
            return self._go(ep, "settle")
        asked = self.rec.reboots[-1].at if self.rec.reboots else self.wall - (self.now - ep.step_at)
        if self.now - ep.step_at >= REBOOT_OVERDUE:
            if ep.slot:  # never renewed forever for a reboot that does not come: the slot goes back, and it says so
                self.cluster.release_slot(self.now)
                self.rec.episode = replace(ep, slot=False)
                self._save()
                msg = (f"{ep.key}: the reboot asked for at {_utc(asked)} has not happened in {REBOOT_OVERDUE:.0f}s; "
                       "the disruption slot is released and the reboot is not asked for again")
                log.error("remediation: %s", msg)
                self._event("RemediationFailed", msg, warning=True)
            self._wait("reboot", f"the reboot asked for at {_utc(asked)} has not happened; it is not asked for again "
                       "(the disruption slot is released)")
        # Before that, a reboot in flight is no wait to report: the step says it (node_health_remediation_step
        # {step="rebooting"}), and RemediationHeld on "reboot" means overdue only.
        return False

    def _settle(self, ep: Episode) -> bool:
        if ep.key in self.present:
            ep.note = f"{ep.key} is back after the reboot"
            ep.action, ep.scope = "reboot", "node"
            return self._go(ep, "drain")
        if self.now - ep.booted_at >= self.cfg.reboot.settle:
            return self._end(ep, f"{ep.key} stayed away {self.cfg.reboot.settle:.0f}s after the reboot", reason="RemediationSucceeded")
        return False

    def _hold(self, ep: Episode) -> bool:
        self._say(f"hold:{ep.key}", f"{ep.key} (drain_and_diagnose): the node stays drained until the fault clears")
        return False

    def _retire(self, ep: Episode) -> bool:
        if self._blocked(ep, "retire", fresh=True) or not self._fleet_allows("retire"):
            return False
        why = ep.note or f"{ep.key} needs hardware (action rma)"
        # the condition, the label and the NodeRetired event (the contract's set_retired)
        self.cluster.set_retired(True, f"{why}: {self.present[ep.key].message if ep.key in self.present else ep.key}")
        self._count("retire", "ok")
        log.error("node RETIRED: %s", why)
        self.rec.retired = Retired(self.wall, ep.key, why, boot_id=self.boot, up=self.now)
        return self._go(ep, "release")

    def _release(self, ep: Episode) -> bool:
        if ep.slot:
            self.cluster.release_slot(self.now)
        self.rec.episode = None
        self.failed = {}
        self._save()
        return False

    def _retired(self, r: Retired) -> None:
        if self.cfg.retire.command and not r.command_done and not self._cause("retire") and self.go_ahead() is None:
            r.command_done = True  # recorded first: run once, even if the agent dies while it runs
            self._save()
            self._ran("retire", self.host.retire_command())
        off = self.cfg.retire.power_off_after
        if (off > 0 and not r.powered_off and self._since(r.boot_id, r.up, r.at) >= off and not self._cause("retire")
                and self.go_ahead() is None):
            r.powered_off = True
            self._save()
            log.error("powering the retired node off (%.0fs after it was retired)", off)
            self._ran("power_off", self.host.power_off())

    def _ran(self, action: str, res: Result) -> None:
        self._count(action, "ok" if res.ok else "failed")
        (log.info if res.ok else log.error)("%s: %s", action, res.detail)
        if not res.ok:
            self.failed[action] = res.detail

    # ------------------------------------------------------------ helpers

    def _go(self, ep: Episode, step: str) -> bool:
        self.rec.episode = replace(ep, step=step, step_at=self.now, step_boot=self.boot)
        self._save()
        return True

    def _end(self, ep: Episode, why: str, reason: str = "RemediationDone") -> bool:
        log.warning("remediation of %s done: %s", ep.key, why)
        if ep.slot:
            self._event(reason, f"{ep.key}: {why}")
        return self._go(ep, "release")

    def _save(self) -> None:
        if self.unreadable:  # never over a record that could not be read
            return
        if self.boot and self.rec.boots and self.rec.boots[-1][0] == self.boot:
            self.rec.boots[-1] = (self.boot, self.now)
        self.state.write_json(RECORD_FILE.name, self.rec.to_json())

    def _uncured(self, key: str) -> int:
        return sum(1 for r in self.rec.reboots if r.key == key and r.back)

    def _cause(self, action: str) -> str | None:
        """Why this action may not be taken now (None: it may)."""
        if self.cfg.mode == "observe":
            return "observe"
        if self.dry_run:
            return "dry_run"
        if self.paused is not False:
            return "kill_switch"
        if action == "drain" and not getattr(self.cluster, "present", True):
            return None  # no cluster: nothing to drain, so nothing to enable
        return None if action in self.cfg.actions else "disabled"

    def _blocked(self, ep: Episode, action: str, fresh: bool = False) -> bool:
        """Whether `action` may not be taken now (its would-be steps exported). `fresh`: it changes the host or
        the cluster next, so `go_ahead` is asked again immediately before it (the kill switch re-read)."""
        cause = self._cause(action)
        if cause is None and fresh:
            cause = self.go_ahead()
        if cause is None:
            return False
        present = getattr(self.cluster, "present", True)
        steps = [a for a in plan(ep.action, ep.step) or (action,) if present or a != "drain"]
        for a in steps:
            self.would[a] = self._cause(a) or cause
        plan_id = f"{ep.key} {ep.action} {ep.step} {ep.scope} {cause}"
        if self._said.get("would") != plan_id:  # the targets are looked up (a pod list) once per plan, not per tick
            self._said["would"] = plan_id
            log.warning("remediation: %s: for %s (%s) the ladder would: %s", cause, ep.key, ep.action, self._targets(ep, steps))
        return True

    def _targets(self, ep: Episode, steps: Sequence[str]) -> str:
        out = []
        for a in steps:
            if a == "drain":
                try:
                    pods = self.cluster.plan_drain(self._only(ep) if ep.scope == "gpu" else None)
                    out.append(f"drain {len(pods)} pods ({', '.join(pods[:20]) or 'none'})")
                except Exception as exc:  # an API error only makes the log line vaguer
                    out.append(f"drain (pods unknown: {exc})")
            elif a == "reset_gpu":
                out.append(f"reset GPU {ep.uuid or ep.subject} (nvidia-smi --gpu-reset -i {ep.uuid or '?'})")
            elif a == "reboot":
                out.append(f"reboot ({self.host.describe_reboot()})")
            elif a == "retire":
                out.append("retire the node" + (f" and run {' '.join(self.cfg.retire.command)}" if self.cfg.retire.command else ""))
        return "; then ".join(out)

    def _fleet_allows(self, step: str) -> bool:
        """The fleet breaker, read again just before the step (agent/kube/breaker.py); False: wait, and say why."""
        why = self.cluster.breaker_check(self.now, step)
        if why:
            self._wait("breaker", why)
            self._event_once("RemediationHeld", why, warning=True)
        return not why

    def _wait(self, on: str, message: str) -> None:
        self.waiting[on] = message
        self._say(f"wait:{on}", message)

    def _say(self, key: str, message: str) -> None:
        if self._said.get(key) != message:
            self._said[key] = message
            log.warning("remediation: %s", message)

    def _event(self, reason: str, message: str, warning: bool = False) -> None:
        try:
            self.cluster.event(reason, message, warning)
        except Exception as exc:  # an event is best effort: never redo a step for it
            log.debug("event %s not sent: %s", reason, exc)

    def _event_once(self, reason: str, message: str, warning: bool = False) -> None:
        if self._said.get(f"event:{reason}") != message:
            self._said[f"event:{reason}"] = message
            self._event(reason, message, warning)

    def _count(self, action: str, result: str) -> None:
        self.counts[(action, result)] = self.counts.get((action, result), 0) + 1

    # ------------------------------------------------------------ what it reports

    @property
    def step(self) -> str:
        if self.rec.retired is not None:
            return "retired"
        ep = self.rec.episode
        if ep is None:
            return "idle"
        return {"resetting": "reset_gpu", "release": "idle"}.get(ep.step, ep.step)

    def findings(self) -> tuple[Finding, ...]:
        out = []
        if "slot" in self.waiting:
            out.append(self.catalog.finding(CHECK, "slot", "DisruptionSlotWaiting", self.waiting["slot"]))
        for on, msg in sorted(self.waiting.items()):
            if on != "slot":
                out.append(self.catalog.finding(CHECK, on, "RemediationHeld", msg))
        for action, msg in sorted(self.failed.items()):
            out.append(self.catalog.finding(CHECK, action, "RemediationFailed", msg))
        if self.rec.retired is not None:
            r = self.rec.retired
            out.append(self.catalog.finding(CHECK, "node", "NodeRetired", f"retired at {_utc(r.at)}: {r.why}"))
        return tuple(out)

    def samples(self) -> list[Sample]:
        mode: str = self.cfg.mode if not self.dry_run else "dry_run"
        if mode == "enforce" and self.paused is not False:
            mode = "paused"
        out = [Sample("node_health_remediation_mode", 1, (("mode", mode),))]
        out.append(Sample("node_health_remediation_step", 1, (("step", self.step),)))
        out += [Sample("node_health_remediation_actions_total", n, (("action", a), ("result", r)))
                for (a, r), n in sorted(self.counts.items())]
        out += [Sample("node_health_remediation_would", 1, (("action", a), ("cause", c))) for a, c in sorted(self.would.items())]
        out += [Sample("node_health_remediation_waiting", 1, (("on", on),)) for on in sorted(self.waiting)]
        out.append(Sample("node_health_remediation_reboots", sum(1 for r in self.rec.reboots if not r.failed)))
        out.append(Sample("node_health_remediation_uncured_reboots", sum(1 for r in self.rec.reboots if r.back)))
        out.append(Sample("node_health_remediation_retired", 1 if self.rec.retired else 0))
        return out


def _pods(p: Progress) -> str:
    """The pods a drain could not move, and those a PodDisruptionBudget refused (with the PDB where known)."""
    pdbs = getattr(p, "pdbs", None)  # pod -> PDB, where the drain's progress names them
    named = [f"{pod} (PodDisruptionBudget {pdbs[pod]})" if isinstance(pdbs, dict) and pod in pdbs else pod
             for pod in dict.fromkeys(p.remaining + p.blocked)]
    blocked = f"; refused by a PodDisruptionBudget: {', '.join(p.blocked[:10])}" if p.blocked else ""
    return (", ".join(named[:10]) or "pods") + (f" and {len(named) - 10} more" if len(named) > 10 else "") + blocked


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
