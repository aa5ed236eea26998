"""The kernel-fault event source: a subscriber of the one kernel-log follower
(`agent.kmsg_follower`) that matches every kernel record against the fault
table and pushes its findings as they happen.

Only the kernel's records count: a record whose syslog facility is not
``kern`` was written by a process (`agent.kmsg`), so a line that reads
``BUG: soft lockup`` in it is no fault; it is counted in
``node_health_kernel_faults_not_kernel_total`` and the first one is logged.

State file ``kernel-log.json``: the boot id and the tracker (cursor, counts,
recent matches, active findings), written after a batch that changed them
(at most once a second while a storm keeps the batches full) and every few
seconds while only the cursor moves. A restart in the same boot resumes after
the last record processed; a reboot starts afresh.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .. import kmsg_follower
from ..findings import Finding, ObservationBuilder, Sample
from ..kmsg import BATCH, KmsgError, Record, RecordBatch, facility_name, read_once, unseen
from ..sources import Emit
from ..statedir import StateDir, StateFile, boot_id, obj, text
from .catalog import CATALOG, FaultPattern
from .faults import CHECK, FaultTracker, check_saved
from .patterns import Table, message_of

if TYPE_CHECKING:
    from ..check import CheckContext
    from .settings import KernelConfig

log = logging.getLogger(__name__)

STATE_FILE = "kernel-log.json"
SAVE_EVERY, STORM_SAVE_EVERY = 5.0, 1.0
_live: set[str] = set()  # state dirs with a running source in this process


def _parse(raw: Any) -> tuple[str, dict[str, Any]]:
    d = obj(raw)
    return text(d["boot"], "boot"), check_saved(d["faults"])


KERNEL_LOG_FILE = StateFile(STATE_FILE, _parse)


Fault = tuple[Record, bytes, FaultPattern]  # a record, the message matched, the pattern that matched it


def messages(records: Sequence[Record]) -> list[bytes]:
    """The message of each record; a line without a kmsg header (a file of dmesg text) has its prefix cut off."""
    return [r.message if r.prio is not None else message_of(r.message) for r in records]


def faults(table: Table, records: Sequence[Record], start: int = 0) -> tuple[list[Fault], list[Fault]]:
    """The records from `start` on that a pattern matches: those the kernel
    wrote, and those a process wrote. A `RecordBatch` whose records all have a
    kmsg header gives the screen's candidates from its own pass, so only they
    become records; anything else is screened here."""
    if isinstance(records, RecordBatch) and records.sequential and table.screened_only:
        indices, entries = records.screened(table.screen, start)
        recs = records.at(indices)
        found = [(recs[j], recs[j].message, p) for j, p in table.confirm_screened(entries, [r.message for r in recs])]
    else:
        rest = records[start:] if start else records
        texts = messages(rest)
        found = [(rest[m.index], texts[m.index], m.pattern) for m in table.scan(texts)]
    mine: list[Fault] = []
    foreign: list[Fault] = []
    for f in found:
        (mine if f[0].from_kernel else foreign).append(f)
    return mine, foreign


class KernelLogSource:
    name = CHECK

    def __init__(self, ctx: CheckContext, cfg: KernelConfig) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.table: Table = cfg.table()
        self.state = StateDir(ctx.state_dir)
        self.tracker = FaultTracker(self.table)
        self.kmsg_screen = self.table.screen if self.table.screened_only else b""  # the follower screens for us
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.path = ""
        self.boot = ""
        self.up = 0.0
        self.status: Finding | None = None
        self._emit: Emit | None = None
        self._dirty = False
        self._saved_at = 0.0
        self._save_failed = False
        self._foreign_logged = False

    def known_findings(self) -> Iterable[tuple[str, str]]:
        for p in self.table.patterns:
            # the faults that stay until a reboot, and every pattern with a reason an operator named:
            # exported at 0 from start ([metrics] findings_at_zero says for which severities)
            if p.hold is None or p.reason not in CATALOG.reasons:
                yield (p.name, p.reason)

    def start(self, emit: Emit) -> None:
        self._emit = emit
        self.boot = boot_id(self.ctx.paths)
        saved = self.state.load(KERNEL_LOG_FILE)
        if saved is not None and saved[0] == self.boot:
            self.tracker.load_json(saved[1])
        _live.add(self.ctx.state_dir)
        self._publish()
        self.path = self.ctx.paths.root(self.cfg.kmsg_path)
        kmsg_follower.subscribe(self.path, self)

    def stop(self) -> None:
        self.stopped.set()
        kmsg_follower.unsubscribe(self.path, self)
        _live.discard(self.ctx.state_dir)
        with self.lock:
            self._save(force=True)

    # ------------------------------------------------------------ agent.kmsg_follower calls these

    def kmsg_failed(self, exc: KmsgError) -> None:
        reason = "InsufficientPrivilege" if exc.privilege else "KernelLogUnavailable"
        self._set_status(CATALOG.finding(CHECK, "kmsg", reason, str(exc)), 0.0)

    def kmsg_opened(self) -> None:
        self._set_status(None, 1.0)

    def kmsg_next_due(self) -> float | None:
        """When to be called without records: a held fault ends, or the cursor's save is due."""
        with self.lock:
            due = self.tracker.next_expiry()
            if self._dirty:
                save = self._saved_at + SAVE_EVERY
                due = save if due is None else min(due, save)
        return due

    def kmsg_records(self, records: Sequence[Record], backlog: bool) -> None:
        if self.stopped.is_set():
            return
        with self.lock:
            fresh, start = unseen(records, self.tracker)
        found, spoofed = faults(self.table, fresh, start)
        now = time.monotonic()
        with self.lock:
            changed = self.tracker.expire()
            for rec, message, pattern in found:
                at = rec.usec / 1e6 if backlog and rec.usec is not None else now
                changed = self.tracker.add(pattern, message, at) or changed
            if spoofed:
                self.tracker.not_kernel += len(spoofed)
                changed = True
            self._dirty = self._dirty or bool(records)
            caught_up = len(records) < BATCH
            self._save(force=changed and (caught_up or now - self._saved_at >= STORM_SAVE_EVERY))
            if changed:
                self._publish()
        if spoofed and not self._foreign_logged:
            self._foreign_logged = True
            rec, _, pattern = spoofed[0]
            log.warning(
                "kernel log record %s was written by a process (syslog facility %s), not by the kernel: it looks like "
                "a kernel fault (%s) but is none; such records are only counted in "
                "node_health_kernel_faults_not_kernel_total (this is logged once): %s",
                rec.seq, facility_name(rec.facility or 0), pattern.name,
                rec.message[:200].decode("utf-8", "replace"),
            )

    # ------------------------------------------------------------ publishing and state

    def _set_status(self, finding: Finding | None, up: float) -> None:
        with self.lock:
            self.status, self.up = finding, up
            self._publish()

    def _publish(self) -> None:
        if self._emit is None:
            return
        findings = self.tracker.findings() + ([self.status] if self.status else [])
        samples = self.tracker.samples() + [Sample("node_health_kernel_log_up", self.up)]
        self._emit(findings, samples)

    def _save(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and (not self._dirty or now - self._saved_at < SAVE_EVERY):
            return
        data = {"boot": self.boot, "faults": self.tracker.to_json()}
        try:
            self.state.write_bytes(STATE_FILE, json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
        except OSError as exc:
            if not self._save_failed:
                log.error("cannot save the kernel-fault state in %s: %s (logged once until it works again)",
                          self.state.path, exc.strerror or exc)
            self._save_failed = True
            self._saved_at = now  # retried after SAVE_EVERY, not at every batch
            return
        if self._save_failed:
            log.warning("saved the kernel-fault state in %s again", self.state.path)
        self._save_failed, self._dirty, self._saved_at = False, False, now


def scan_once_unless_live(ctx: CheckContext, cfg: KernelConfig, b: ObservationBuilder) -> None:
    """`agent selftest` / `agent run --once`: the current boot's kernel log,
    once, into the kernel check's observation (the daemon's source does this
    continuously)."""
    if ctx.state_dir in _live or not cfg.log_faults:
        return
    try:
        records = read_once(ctx.paths.root(cfg.kmsg_path))
    except KmsgError as exc:
        b.add(CATALOG.finding(CHECK, "kmsg", "InsufficientPrivilege" if exc.privilege else "KernelLogUnavailable", str(exc)))
        return
    tracker = FaultTracker(cfg.table())
    found, spoofed = faults(tracker.table, records)
    for rec, message, pattern in found:
        tracker.add(pattern, message, rec.usec / 1e6 if rec.usec is not None else time.monotonic())
    for f in tracker.findings():
        b.add(f)  # check="kernel-log", as the daemon's source reports it
    ignored = f", {len(spoofed)} written by processes ignored" if spoofed else ""
    b.subject("kernel-log", f"{len(records)} kernel log records scanned, {sum(tracker.counts.values())} faults{ignored}")
