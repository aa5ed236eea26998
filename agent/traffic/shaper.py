"""Internet-only egress shaping, the engine the traffic keeper runs each cycle (docs/traffic.md, Shaping).

Each run, with shaping enabled: the pods' limits (`agent.traffic.shaping`),
then on each uplink our root HTB qdisc (taking over the kernel's default root
only), a class and fair-queueing leaf per shaped pod, added or changed before
the keeper puts the CLASSIFY rules in place (`begin`), and classes no pod
needs any more deleted after the rules are gone (`end`), with the root given
back when no shaped pod is left. What is found wrong (a class someone deleted,
a rate changed) is put back on the next run.

With shaping disabled nothing of tc is touched, unless the state file says the
agent took a root qdisc over (shaping was on before): that root is given back
once, and the file removed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..findings import ObservationBuilder, Severity
from ..pods import PodView
from ..statedir import Damaged, StateDir, StateFile, integer, obj
from .rules import SubChain
from .settings import ShapingConfig
from .shaping import Limit, assign, limits, subchain
from .tc import ClassState, DeviceState, Tc, TcError
from .tools import ErrorLog

log = logging.getLogger(__name__)

SUBJECT = "shaping"
STATE_FILE = "traffic-shaping.json"
VERSION = 1


def _parse(raw: Any) -> dict[str, int]:
    d = obj(raw)
    if d.get("version") != VERSION:
        raise Damaged(f"version: expected {VERSION}, got {d.get('version')!r}")
    return {name: integer(major, f"roots.{name}") for name, major in obj(d.get("roots", {}), "roots").items()}


ROOTS_FILE = StateFile(STATE_FILE, _parse)


@dataclass
class _Device:
    name: str
    state: DeviceState | None = None
    problem: str = ""
    stats: dict[int, ClassState] = field(default_factory=dict)


class Shaper:
    def __init__(self, cfg: ShapingConfig, pods: PodView | None, state_dir: str | None, dry_run: bool) -> None:
        self.cfg, self.view, self.dry_run = cfg, pods, dry_run
        self.major = cfg.qdisc_major
        self._state = StateDir(state_dir) if state_dir else None
        self.roots: dict[str, int] | None = None  # device -> major of the roots we hold (the state file)
        self.minors: dict[str, int] | None = None  # pod uid -> class minor; None until seeded from the rules
        self.wanted: list[Limit] = []
        self.devices: dict[str, _Device] = {}
        self.leaf = ""  # leaf kind the kernel took last
        self.reported: set[str] = set()
        self.errors = ErrorLog(log, "shaping")
        self._tc: Tc | None = None  # one netlink socket from begin to end of a run

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    def known_findings(self) -> list[tuple[str, str]]:
        return [(SUBJECT, "TrafficShapingNotInstalled")] if self.enabled else []

    # ------------------------------------------------------------ before the rules

    def begin(self, b: ObservationBuilder, seed: Callable[[], Mapping[str, int]]) -> dict[str, list[SubChain]]:
        """Classes in place for the pods to shape; the sub-chains the keeper's rules must hold (none when
        disabled: then the keeper removes the chain)."""
        if self.roots is None:
            self.roots = self._load()
        self.reported = set()  # subjects with a TrafficShapingNotInstalled finding this run
        if not self.enabled:
            return {}
        if self.minors is None:
            self.minors = dict(seed())
        pods = self.view.pods() if self.view is not None else None
        if pods is not None:
            wanted, invalid = limits(pods, self.cfg)
            for bad in invalid:
                b.finding(f"{bad.namespace}/{bad.pod}", "TrafficShapingAnnotationInvalid", bad.why)
            minors, left = assign(wanted, self.minors, self.major)
            for lim in left:
                b.finding(f"{lim.namespace}/{lim.pod}", "TrafficShapingNotInstalled",
                          f"no class id left on {self.major:x}: for this pod; it is not shaped")
            self.wanted = [w for w in wanted if w.uid in minors]
            self.minors = minors
        # pods unknown (watch down): keep shaping as it was, never "no pods"
        self._devices(b, add=True)
        return {f: [subchain(f, self.wanted, self.minors, self.major)] for f in ("ipv4", "ipv6")}

    # ------------------------------------------------------------ after the rules

    def end(self, b: ObservationBuilder) -> None:
        """Classes no pod needs deleted, roots with nothing to shape given back; metrics."""
        if self.roots is None:
            return
        if not self.enabled:
            if self.roots and not self.dry_run:
                self._give_back_all()
            return
        try:
            self._devices(b, add=False)
        finally:
            self.close()
        self._export(b)

    # ------------------------------------------------------------ tc

    def close(self) -> None:
        """Close the run's netlink socket (begin opens it, end closes it; the keeper calls this in any case)."""
        if self._tc is not None:
            tc, self._tc = self._tc, None
            tc.__exit__(None, None, None)

    def _devices(self, b: ObservationBuilder, *, add: bool) -> None:
        assert self.roots is not None and self.minors is not None
        try:
            if self._tc is None:
                self._tc = Tc()
            tc = self._tc
            names = list(self.cfg.interfaces) or tc.default_route_devices()
            if not names and self.wanted:
                self._problem(b, SUBJECT, "no default route and no shaping.interfaces configured: "
                              "nothing to shape on")
                return
            for gone in [n for n in self.roots if n not in names]:
                if not add and not self.dry_run:
                    self._give_back(tc, gone)
            self.devices = {n: self.devices.get(n) or _Device(n) for n in names}
            for dev in self.devices.values():
                try:
                    self._device(tc, dev, add=add)
                    dev.problem = ""
                except TcError as exc:
                    dev.problem = str(exc)
        except TcError as exc:
            self._problem(b, SUBJECT, str(exc))
            return
        for dev in self.devices.values():
            if dev.problem:
                self._problem(b, dev.name, dev.problem)
            elif add:
                self.errors.recovered(dev.name)
                b.subject(dev.name, self._detail(dev))
        self.errors.recovered(SUBJECT)

    def _device(self, tc: Tc, dev: _Device, *, add: bool) -> None:
        assert self.roots is not None and self.minors is not None
        index = tc.index(dev.name)
        if index is None:
            raise TcError(f"no interface {dev.name} on this host")
        if add:
            dev.state = None
        if not add and dev.state is not None and dev.state.index == index:
            state = dev.state  # as begin left it: only our rules changed since
        else:
            state = tc.read(index, self.major)
        dev.state, dev.stats = state, dict(state.classes)
        if not self.leaf:  # after a restart: the leaf kind our classes already have
            self.leaf = next((c.leaf for c in state.classes.values() if c.leaf), "")
        wanted = {self.minors[w.uid]: w for w in self.wanted}
        if add:
            if not wanted:
                return
            if not state.ours(self.major):
                if state.root is not None and not state.root.default:
                    raise TcError(f"the root qdisc of {dev.name} ({state.root.kind} {state.root.handle >> 16:x}:) "
                                  "is not the kernel's default nor ours: it is left alone and nothing is shaped there")
                if self.dry_run:
                    return
                self._remember(dev.name, self.major)
                tc.take_root(index, self.major)
                log.info("shaping: took over the root qdisc of %s (was the kernel's %s)", dev.name,
                         state.root.kind if state.root else "none")
                state = tc.read(index, self.major)
            changed = False
            for minor, lim in sorted(wanted.items()):
                have = state.classes.get(minor)
                if have is not None and have.rate == have.ceil == _rounded(lim.bits) and (have.leaf or not self.leaf):
                    continue
                if self.dry_run:
                    continue
                tc.set_class(index, self.major, minor, lim.bits, exists=have is not None)
                self.leaf = tc.set_leaf(index, self.major, minor)
                changed = True
                what = "added" if have is None else "repaired" if have.rate == _rounded(lim.bits) else "changed"
                (log.info if what != "repaired" else log.warning)(
                    "shaping: %s class %x:%x on %s for %s/%s at %d bit/s", what, self.major, minor, dev.name,
                    lim.namespace, lim.pod, lim.bits)
            if changed:
                state = tc.read(index, self.major)
            dev.state, dev.stats = state, dict(state.classes)
            return
        if not state.ours(self.major) or self.dry_run:
            return
        for minor in sorted(set(state.classes) - set(wanted)):
            tc.delete_class(index, self.major, minor)
            log.info("shaping: deleted class %x:%x on %s (no pod needs it)", self.major, minor, dev.name)
        if not wanted:
            self._give_back(tc, dev.name)

    def _give_back(self, tc: Tc, name: str) -> None:
        assert self.roots is not None
        major = self.roots.get(name, self.major)
        index = tc.index(name)
        if index is not None:
            state = tc.read(index, major)
            if state.ours(major):
                tc.give_back(index, major)
                log.info("shaping: gave the root qdisc of %s back to the kernel (nothing to shape there)", name)
        if name in self.roots:
            del self.roots[name]
            self._save()

    def _give_back_all(self) -> None:
        """Shaping was turned off: give back what the state file says we hold."""
        assert self.roots is not None
        try:
            with Tc() as tc:
                for name in list(self.roots):
                    self._give_back(tc, name)
        except TcError as exc:
            self.errors.error(SUBJECT, f"shaping is disabled but a root qdisc of ours could not be given back: {exc}")

    # ------------------------------------------------------------ state file

    def _load(self) -> dict[str, int]:
        if self._state is None:
            return {}
        saved = self._state.load(ROOTS_FILE)
        return dict(saved) if saved is not None else {}

    def _remember(self, name: str, major: int) -> None:
        assert self.roots is not None
        if self.roots.get(name) != major:
            self.roots[name] = major
            self._save()

    def _save(self) -> None:
        if self._state is None or self.roots is None:
            return
        try:
            if not self.roots:
                try:
                    os.unlink(self._state.file(STATE_FILE))
                except FileNotFoundError:
                    pass
                return
            self._state.ensure()
            self._state.write_json(STATE_FILE, {"version": VERSION, "roots": dict(sorted(self.roots.items()))})
        except OSError as exc:
            self.errors.error("save", f"cannot write {STATE_FILE} to the state dir: {exc}")

    # ------------------------------------------------------------ output

    def _detail(self, dev: _Device) -> str:
        n = len(self.wanted)
        leaf = self.leaf or "pfifo (the kernel has neither fq_codel nor fq)"
        return f"{n} pod{'s' if n != 1 else ''} shaped (htb {self.major:x}:, leaf {leaf})" if n else "no pod shaped"

    def _export(self, b: ObservationBuilder) -> None:
        assert self.minors is not None
        for lim in self.wanted:
            labels = {"namespace": lim.namespace, "pod": lim.pod}
            b.sample("node_health_pod_egress_limit_bytes_per_second", lim.bits / 8, **labels)
            minor = self.minors[lim.uid]
            found = [d.stats[minor] for d in self.devices.values() if minor in d.stats]
            if found:
                b.sample("node_health_pod_egress_shaped_bytes_total", sum(c.bytes for c in found), **labels)
                b.sample("node_health_pod_egress_dropped_packets_total",
                         sum(c.leaf_drops if c.leaf else c.drops for c in found), **labels)

    def _problem(self, b: ObservationBuilder, subject: str, message: str) -> None:
        if subject in self.reported:  # once per run, though begin and end both look
            return
        self.reported.add(subject)
        b.finding(subject, "TrafficShapingNotInstalled", message,
                  severity=Severity.INFO if self.dry_run else None)
        self.errors.error(subject, f"shaping {subject}: {message}")


def _rounded(bits: int) -> int:
    """The rate as the kernel keeps it: bytes per second."""
    return bits // 8 * 8
