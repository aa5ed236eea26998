"""The Xid event source: the kernel log follower and the NVML event waiter,
two threads feeding one `XidStream`, pushed to the daemon as they happen.

State file ``xid-stream.json``: the boot id and the stream's state (kmsg
cursor, active findings, counters), written atomically after every batch of
records with events (at most once a second while a storm keeps the follower
reading full batches), and every few seconds while only the cursor moves. A
write that fails (a full disk) is logged once and retried with a backoff.
Started in the same boot, the follower skips what it already processed;
after a reboot it starts afresh. The resets the remediation ladder verified
(``gpu-resets.json``, `agent.gpu.resets`) drop that GPU's ``reset_gpu``
findings, at once and again at every start.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import kmsg_follower, native
from ..findings import Finding, ObservationBuilder, Sample
from ..kmsg import BATCH, KERNEL, KmsgError, Record, RecordBatch, facility_name, read_once, unseen
from ..parsers.xid import KIND_SXID, KIND_XID
from ..sources import Emit
from ..statedir import StateDir, StateFile, boot_id, obj, text
from . import resets
from .catalog import CATALOG
from .nvmlevents import NvmlEvents
from .pci import bus_gpus, normalize
from .poller import INVENTORY_FILE
from .xid_tracker import CHECK, Event, XidStream, check_saved

if TYPE_CHECKING:
    from ..check import CheckContext
    from .settings import GpuConfig

log = logging.getLogger(__name__)

STATE_FILE = "xid-stream.json"


def _parse(raw: Any) -> tuple[str, dict[str, Any]]:
    d = obj(raw)
    return text(d["boot"], "boot"), check_saved(d["stream"])


XID_FILE = StateFile(STATE_FILE, _parse)
SAVE_EVERY = 5.0  # seconds between saves while only the cursor advances
SAVE_RETRY, SAVE_RETRY_MAX = 1.0, 30.0  # backoff after a failed save (seconds)
STORM_SAVE_EVERY = 1.0  # seconds between saves while full batches of records keep coming
_live: set[str] = set()  # state dirs with a running source in this process


class GpuIndex:
    """PCI address → NVML index: the GPU check's inventory of this boot, else the
    position among the NVIDIA GPUs on the PCI bus (NVML's order)."""

    def __init__(self, ctx: CheckContext, known: dict[str, int] | None = None) -> None:
        self.ctx = ctx
        self._map: dict[str, int] = dict(known or {})
        self._names: dict[int, tuple[str, str]] = {}
        self._loaded = 0.0

    def __call__(self, pci: str, kind: int) -> tuple[str, str]:
        if kind == KIND_SXID:
            return f"nvswitch-{pci or 'unknown'}", "unknown"
        index = self._map.get(pci)
        if index is None and pci and time.monotonic() - self._loaded > 5:
            self._reload()
            index = self._map.get(pci)
        if index is not None:
            return self._names.get(index) or self._names.setdefault(index, (f"gpu{index}", str(index)))
        return (f"pci-{pci}" if pci else "gpu"), "unknown"

    def _reload(self) -> None:
        self._loaded = time.monotonic()
        inv = StateDir(self.ctx.state_dir).load(INVENTORY_FILE)
        if inv is not None and inv["boot"] == boot_id(self.ctx.paths) and inv["index"]:
            self._map = dict(inv["index"])
        else:
            self._map = {pci: i for i, pci in enumerate(bus_gpus(self.ctx.paths))}


def forget_reset(stream: XidStream, reset: resets.Reset) -> bool:
    """Drops what a verified reset cured (`XidStream.forget_reset`); True when a finding went."""
    subject = reset.subject(stream.subject_of, KIND_XID)
    gone = stream.forget_reset(subject, reset.at) if subject else []
    if gone:
        log.warning("GPU %s (%s) was reset and verified by the remediation ladder: %s cleared", reset.uuid, subject,
                    ", ".join(gone))
    return bool(gone)


def new_stream(ctx: CheckContext, cfg: GpuConfig, known: dict[str, int] | None = None) -> XidStream:
    return XidStream(
        dedupe_window=cfg.dedupe_window,
        app_hold=cfg.app_xid_hold,
        coverage_hold=cfg.coverage_lost_hold,
        overrides=cfg.severity_overrides(),
        subject_of=GpuIndex(ctx, known),
    )


_pci_cache: dict[str, str] = {}


def _normalize(pci: str) -> str:
    """`normalize`, remembered: a storm repeats a handful of addresses."""
    out = _pci_cache.get(pci)
    if out is None:
        if len(_pci_cache) >= 1024:
            _pci_cache.clear()
        out = _pci_cache[pci] = normalize(pci)
    return out


class Batch(NamedTuple):
    events: list[Event]
    foreign: list[tuple[Record, int]]  # (record, events in it) of NVIDIA-looking records a process wrote


def nvidia(records: Sequence[Record], start: int = 0) -> list[Record]:
    """The records from `start` on whose message names the NVIDIA driver: a
    `RecordBatch` knows them from its own pass; anything else is looked through."""
    if isinstance(records, RecordBatch):
        return records.at(records.nvidia_from(start))
    return [r for r in (records[start:] if start else records) if b"NVRM" in r.message or b"SXid" in r.message]


def events_from(records: Sequence[Record], context: list[bytes], backlog: bool, now: float, start: int = 0) -> Batch:
    """Parsed events of kmsg records (from `start` on), all of them in one call
    of the parser. `context` carries the last NVRM lines across calls, for the
    messages that the driver splits over several records. Records whose
    facility is not the kernel's (`Record.from_kernel`) are no events and never
    context: they come back in `Batch.foreign`."""
    mine: list[Record] = []
    foreign: list[Record] = []
    for rec in nvidia(records, start):
        (mine if rec.prio is None or rec.prio >> 3 == KERNEL else foreign).append(rec)
    out: list[Event] = []
    if mine:
        lines = [*context, *(r.message for r in mine)]
        skip = len(context)
        context[:] = lines[-2:]
        for x in native.parse_xid(b"\n".join(lines)):
            if x.line >= skip:
                rec = mine[x.line - skip]
                at = rec.usec / 1e6 if backlog and rec.usec is not None else now
                out.append(Event("kmsg", x.kind, x.xid, _normalize(x.pci), x.message, at, backlog))
    found = []
    if foreign:
        per_line = Counter(x.line for x in native.parse_xid(b"\n".join(r.message for r in foreign)))
        found = [(rec, per_line[i]) for i, rec in enumerate(foreign) if per_line[i]]
    return Batch(out, found)


class XidSource:
    name = CHECK

    def __init__(self, ctx: CheckContext, cfg: GpuConfig) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.state = StateDir(ctx.state_dir)
        self.stream = new_stream(ctx, cfg)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.status: dict[str, Finding] = {}
        self.up = {"kmsg": 0.0, "nvml": 0.0}
        self._emit: Emit | None = None
        self._threads: list[threading.Thread] = []
        self._dirty = False
        self._saved_at = 0.0
        self._foreign_logged = False
        self._save_failing, self._save_errno, self._save_errors = False, 0, 0
        self._backoff = self._retry_at = 0.0
        self._need = 0
        self._context: list[bytes] = []  # the last NVRM lines, for messages split over records
        self._kmsg = ""
        self.nvml = NvmlEvents(self)

    def known_findings(self) -> Iterable[tuple[str, str]]:
        yield ("kmsg", "KmsgCoverageLost")
        for i in range(len(bus_gpus(self.ctx.paths))):
            for xid in (48, 79, 95, 119, 120):
                yield (f"gpu{i}", f"Xid{xid}")

    def start(self, emit: Emit) -> None:
        self._emit = emit
        self.boot = boot_id(self.ctx.paths)
        saved = self.state.load(XID_FILE)
        if saved is not None and saved[0] == self.boot:
            self.stream.load_json(saved[1])
        for r in resets.load(self.state, self.boot):  # a kmsg backlog read again must not bring them back
            forget_reset(self.stream, r)
        resets.listen(self.ctx.state_dir, self.gpu_reset)
        _live.add(self.ctx.state_dir)
        self._publish()
        self._kmsg = self.ctx.paths.root(self.cfg.kmsg_path)
        kmsg_follower.subscribe(self._kmsg, self)
        t = threading.Thread(target=self.nvml.run, name="xid-nvml", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self.stop_event.set()
        resets.unlisten(self.ctx.state_dir, self.gpu_reset)
        kmsg_follower.unsubscribe(self._kmsg, self)
        for t in self._threads:
            t.join(2.0)  # a thread stuck inside NVML is a daemon thread: left behind
        self._threads = []
        _live.discard(self.ctx.state_dir)
        with self.lock:
            self._save(force=True)

    # ------------------------------------------------------------ shared with the NVML thread

    def add(self, events: list[Event]) -> None:
        with self.lock:
            changed = False
            for ev in events:
                changed = self.stream.add(ev) or changed
            if changed:
                self._save(force=True)
                self._publish()
        if changed and self._kmsg:
            kmsg_follower.kick(self._kmsg)  # a new hold may end before the follower's current wait does

    def gpu_reset(self, reset: resets.Reset) -> None:
        """The ladder verified a reset of a GPU (agent.gpu.resets tells, on the ladder's thread)."""
        with self.lock:
            if forget_reset(self.stream, reset):
                self._save(force=True)
                self._publish()

    def set_status(self, key: str, finding: Finding | None, up: float | None = None) -> None:
        with self.lock:
            if up is not None:
                self.up[key] = up
            old = self.status.get(key)
            if finding is None:
                self.status.pop(key, None)
            else:
                self.status[key] = finding
            if old != finding or up is not None:
                self._publish()

    def _publish(self) -> None:
        if self._emit is None:
            return
        findings = self.stream.findings() + list(self.status.values())
        samples = self.stream.samples() + [
            Sample("node_health_kmsg_up", self.up["kmsg"]),
            Sample("node_health_nvml_events_up", self.up["nvml"]),
            Sample("node_health_xid_state_save_failing", 1.0 if self._save_failing else 0.0),
            Sample("node_health_xid_state_save_errors_total", self._save_errors),
        ]
        self._emit(findings, samples)

    def _save(self, force: bool = False) -> None:
        """Writes the state after events (`force`) or every `SAVE_EVERY` while
        only the cursor moves. After a failed write, retries with a backoff
        (`SAVE_RETRY` doubling to `SAVE_RETRY_MAX`) and, when the disk was
        full, as soon as statvfs shows room for the file again; the failure is
        logged once and exported as a gauge and a counter."""
        now = time.monotonic()
        if self._save_failing:
            if now < self._retry_at and not self._room_again():
                return
        elif not force and (not self._dirty or now - self._saved_at < SAVE_EVERY):
            return
        data = json.dumps({"boot": self.boot, "stream": self.stream.to_json()}, sort_keys=True, separators=(",", ":")).encode()
        try:
            self.state.write_bytes(STATE_FILE, data)
        except OSError as exc:
            self._save_errors += 1
            self._need = len(data)
            self._backoff = min(self._backoff * 2, SAVE_RETRY_MAX) if self._save_failing else SAVE_RETRY
            self._retry_at = now + self._backoff
            self._dirty = True
            if not self._save_failing:
                self._save_failing, self._save_errno = True, exc.errno or 0
                log.error(
                    "cannot save the Xid stream state in %s: %s; retrying every %g to %g s and as soon as there is room "
                    "(logged once; node_health_xid_state_save_failing is 1 meanwhile). A restart before then counts this "
                    "boot's Xids again.",
                    self.state.path, exc.strerror or exc, SAVE_RETRY, SAVE_RETRY_MAX,
                )
            self._publish()
            return
        if self._save_failing:
            log.warning("saved the Xid stream state in %s again, after %d failed attempts", self.state.path, self._save_errors)
            self._save_failing = False
            self._publish()
        self._dirty, self._saved_at = False, now

    def _room_again(self) -> bool:
        """After ENOSPC/EDQUOT: whether the filesystem has room for the file (and an inode) again."""
        if self._save_errno not in (errno.ENOSPC, errno.EDQUOT):
            return False
        try:
            st = os.statvfs(self.state.path)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= self._need + st.f_frsize and (st.f_favail > 0 or st.f_files == 0)

    # ------------------------------------------------------------ kernel log (agent.kmsg_follower calls these)

    def kmsg_failed(self, exc: KmsgError) -> None:
        reason = "InsufficientPrivilege" if exc.privilege else "KmsgUnavailable"
        self.set_status("kmsg", CATALOG.finding(CHECK, "kmsg", reason, str(exc)), up=0.0)

    def kmsg_opened(self) -> None:
        self._context = []
        self.set_status("kmsg", None, up=1.0)

    def kmsg_next_due(self) -> float | None:
        """When to be called without records: a held finding ends, the cursor's save is due, or (while
        saves fail) the next look for room, every second as before (issue 29)."""
        with self.lock:
            due = self.stream.next_expiry()
            if self._save_failing:
                save: float | None = time.monotonic() + 1.0
            elif self._dirty:
                save = self._saved_at + SAVE_EVERY
            else:
                save = None
        if save is not None:
            due = save if due is None else min(due, save)
        return due

    def kmsg_records(self, records: Sequence[Record], backlog: bool) -> None:
        if self.stop_event.is_set():
            return
        with self.lock:
            fresh, start = unseen(records, self.stream)
            self.stream.records_read += len(fresh) - start  # a reopen for a late subscriber re-reads the ring: not twice
            self._dirty = self._dirty or bool(records)
        batch = events_from(fresh, self._context, backlog, time.monotonic(), start)
        if batch.foreign:
            self._foreign(batch.foreign)
        caught_up = len(records) < BATCH
        with self.lock:
            changed = self.stream.expire() or bool(batch.foreign)
            add = self.stream.add
            for ev in batch.events:
                changed = add(ev) or changed
            # After events, at once; in a storm (full batches back to back) at most every STORM_SAVE_EVERY.
            self._save(force=changed and (caught_up or time.monotonic() - self._saved_at >= STORM_SAVE_EVERY))
            if changed or records:
                self._publish()

    def _foreign(self, found: list[tuple[Record, int]]) -> None:
        """NVIDIA lines that a process wrote to /dev/kmsg: counted, logged once."""
        with self.lock:
            self.stream.not_kernel += sum(n for _, n in found)
        if not self._foreign_logged:
            self._foreign_logged = True
            rec = found[0][0]
            log.warning(
                "kernel log record %s was written by a process (syslog facility %s), not by the kernel: NVIDIA lines "
                "from processes are no Xids and no findings, only counted in node_health_kmsg_not_kernel_events_total "
                "(this is logged once): %s",
                rec.seq, facility_name(rec.facility or 0), rec.message[:200].decode("utf-8", "replace"),
            )


def scan_once_unless_live(ctx: CheckContext, cfg: GpuConfig, b: ObservationBuilder, known: dict[str, int]) -> None:
    """`agent selftest` / `agent run --once`: the current boot's kernel log, once,
    into the GPU check's observation (the daemon's source does this continuously);
    its findings keep the source's name (``check="xid"``), as the daemon exports them."""
    if ctx.state_dir in _live or not cfg.xid_events:
        return
    try:
        records = read_once(ctx.paths.root(cfg.kmsg_path))
    except KmsgError as exc:
        b.add(CATALOG.finding(CHECK, "kmsg", "InsufficientPrivilege" if exc.privilege else "KmsgUnavailable", str(exc)))
        return
    stream = new_stream(ctx, cfg, known)
    for r in records:
        if r.seq is not None:
            stream.record_seq(r.seq)
    batch = events_from(records, [], True, time.monotonic())
    for ev in batch.events:
        stream.add(ev)
    for reset in resets.load(StateDir(ctx.state_dir), boot_id(ctx.paths)):
        forget_reset(stream, reset)
    for f in stream.findings():
        if f.reason != "KmsgCoverageLost":  # a one-shot scan of a wrapped ring is not a gap in following
            b.add(f)  # check="xid", as the daemon's source reports it
    first = next((r.seq for r in records if r.seq is not None), None)
    older = f" (records before seq {first} already overwritten)" if first else ""
    foreign = sum(n for _, n in batch.foreign)
    spoofed = f", {foreign} NVIDIA lines written by processes ignored" if foreign else ""
    b.subject("kmsg", f"{len(records)} kernel log records of this boot scanned{older}, {sum(stream.counts.values())} Xids{spoofed}")

