"""The Xid event source: the kernel log follower and the NVML event waiter,
two threads feeding one `XidStream`, pushed to the daemon as they happen.

State file ``xid-stream.json``: the boot id and the stream's state (kmsg
cursor, active findings, counters), written atomically after every event, and
every few seconds while only the cursor moves. Started in the same boot, the
follower skips what it already processed; after a reboot it starts afresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import native
from ..findings import Finding, ObservationBuilder, Sample
from ..sources import Emit
from ..statedir import StateDir, StateFile, boot_id, obj, text
from .catalog import CATALOG
from .kmsg import Kmsg, KmsgError, Record
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
RETRY_OPEN = 30.0
_live: set[str] = set()  # state dirs with a running source in this process
_MARKERS = (b"NVRM", b"SXid")


class GpuIndex:
    """PCI address → NVML index: the GPU check's inventory of this boot, else the
    position among the NVIDIA GPUs on the PCI bus (NVML's order)."""

    def __init__(self, ctx: CheckContext, known: dict[str, int] | None = None) -> None:
        self.ctx = ctx
        self._map: dict[str, int] = dict(known or {})
        self._loaded = 0.0

    def __call__(self, pci: str, kind: int) -> tuple[str, str]:
        from ..parsers.xid import KIND_SXID

        if kind == KIND_SXID:
            return f"nvswitch-{pci or 'unknown'}", "unknown"
        if pci and pci not in self._map and time.monotonic() - self._loaded > 5:
            self._reload()
        if pci in self._map:
            return f"gpu{self._map[pci]}", str(self._map[pci])
        return (f"pci-{pci}" if pci else "gpu"), "unknown"

    def _reload(self) -> None:
        self._loaded = time.monotonic()
        inv = StateDir(self.ctx.state_dir).load(INVENTORY_FILE)
        if inv is not None and inv["boot"] == boot_id(self.ctx.paths) and inv["index"]:
            self._map = dict(inv["index"])
        else:
            self._map = {pci: i for i, pci in enumerate(bus_gpus(self.ctx.paths))}


def new_stream(ctx: CheckContext, cfg: GpuConfig, known: dict[str, int] | None = None) -> XidStream:
    return XidStream(
        dedupe_window=cfg.dedupe_window,
        app_hold=cfg.app_xid_hold,
        coverage_hold=cfg.coverage_lost_hold,
        overrides=cfg.severity_overrides(),
        subject_of=GpuIndex(ctx, known),
    )


def events_from(records: list[Record], context: list[bytes], backlog: bool, now: float) -> list[Event]:
    """Parsed events of kmsg records. `context` carries the last NVRM lines across
    calls, for the messages that the driver splits over several records."""
    out = []
    for rec in records:
        if not any(m in rec.message for m in _MARKERS):
            continue
        lines = [*context, rec.message]
        context[:] = lines[-2:]
        at = rec.usec / 1e6 if backlog and rec.usec is not None else now
        for x in native.parse_xid(b"\n".join(lines)):
            if x.line == len(lines) - 1:
                out.append(Event("kmsg", x.kind, x.xid, normalize(x.pci), x.message, at, backlog))
    return out


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
        _live.add(self.ctx.state_dir)
        self._publish()
        for target, name in ((self._follow, "xid-kmsg"), (self.nvml.run, "xid-nvml")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self.stop_event.set()
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
        ]
        self._emit(findings, samples)

    def _save(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and (not self._dirty or now - self._saved_at < SAVE_EVERY):
            return
        try:
            self.state.write_json(STATE_FILE, {"boot": self.boot, "stream": self.stream.to_json()})
            self._dirty, self._saved_at = False, now
        except OSError as exc:
            log.error("cannot save the Xid stream state in %s: %s", self.state.path, exc)

    # ------------------------------------------------------------ kernel log

    def _follow(self) -> None:
        while not self.stop_event.is_set():
            try:
                k = Kmsg(self.ctx.paths.root(self.cfg.kmsg_path))
            except KmsgError as exc:
                reason = "InsufficientPrivilege" if exc.privilege else "KmsgUnavailable"
                log.debug("kernel log: %s", exc)
                self.set_status("kmsg", CATALOG.finding(CHECK, "kmsg", reason, str(exc)), up=0.0)
                self.stop_event.wait(RETRY_OPEN)
                continue
            self.set_status("kmsg", None, up=1.0)
            try:
                self._read(k)
            finally:
                k.close()

    def _read(self, k: Kmsg) -> None:
        backlog, context = True, list[bytes]()
        while not self.stop_event.is_set():
            records = list(k.read_available())
            with self.lock:
                fresh = [r for r in records if r.seq is None or self.stream.record_seq(r.seq)]
                self.stream.records_read += len(records)
                self._dirty = self._dirty or bool(records)
            events = events_from(fresh, context, backlog, time.monotonic())
            backlog = False
            with self.lock:
                changed = self.stream.expire()
                for ev in events:
                    changed = self.stream.add(ev) or changed
                self._save(force=changed)
                if changed or records:
                    self._publish()
            k.wait(1.0)


def scan_once_unless_live(ctx: CheckContext, cfg: GpuConfig, b: ObservationBuilder, known: dict[str, int]) -> None:
    """`agent selftest` / `agent run --once`: the current boot's kernel log, once,
    into the GPU check's observation (the daemon's source does this continuously)."""
    if ctx.state_dir in _live or not cfg.xid_events:
        return
    try:
        k = Kmsg(ctx.paths.root(cfg.kmsg_path))
    except KmsgError as exc:
        b.finding("kmsg", "InsufficientPrivilege" if exc.privilege else "KmsgUnavailable", str(exc))
        return
    try:
        records = list(k.read_available())
    finally:
        k.close()
    stream = new_stream(ctx, cfg, known)
    for r in records:
        if r.seq is not None:
            stream.record_seq(r.seq)
    for ev in events_from(records, [], True, time.monotonic()):
        stream.add(ev)
    for f in stream.findings():
        if f.reason != "KmsgCoverageLost":  # a one-shot scan of a wrapped ring is not a gap in following
            b.finding(f.subject, f.reason, f.message, severity=f.severity, unknown=f.unknown)
    first = next((r.seq for r in records if r.seq is not None), None)
    older = f" (records before seq {first} already overwritten)" if first else ""
    b.subject("kmsg", f"{len(records)} kernel log records of this boot scanned{older}, {sum(stream.counts.values())} Xids")

