"""EDAC memory-error counts: ``/sys/devices/system/edac/mc/mc<N>/``.

Per memory controller ``ce_count``, ``ue_count``, ``ce_noinfo_count`` and
``ue_noinfo_count``; per DIMM ``dimm<K>/`` (or ``rank<K>/``) with
``dimm_ce_count``, ``dimm_ue_count`` and ``dimm_label``; on older drivers
per chip-select row ``csrow<M>/ce_count`` and ``ue_count``
(drivers/edac/edac_mc_sysfs.c; node_exporter's edac collector reads the
same). The counts start at 0 when the driver loads (each boot) and when root
writes ``reset_counters``.

Judgement: any uncorrected error counted this boot is `EdacUncorrectable`
(critical, until the counts are reset, i.e. the reboot); corrected errors
at or above ``edac_ce_per_day`` within 24 h on one DIMM (or on a controller
without per-DIMM counts) are `EdacCorrectedRate` (warning; LBNL NHC drains
at more than 9 a DIMM a day). The 24 h window is kept in ``edac.json`` in the
state dir, per boot id, so a restart neither forgets it nor starts it over.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..findings import ObservationBuilder
from ..hostpaths import HostPaths, read_text
from ..statedir import StateDir, StateFile, boot_id, integer, number, obj, seq, text

log = logging.getLogger(__name__)

DAY = 86400.0
KEEP_EVERY = 600.0  # seconds between two samples kept in the window (145 a day at most)
STATE_FILE = "edac.json"
_MC = re.compile(r"mc\d+")
_UNIT = re.compile(r"(dimm|rank|csrow)\d+")


@dataclass
class Controller:
    name: str  # mc0
    counts: dict[str, int]  # ce, ue, ce_noinfo, ue_noinfo (those present)
    units: dict[str, dict[str, int]] = field(default_factory=dict)  # dimm3 -> {ce, ue}
    labels: dict[str, str] = field(default_factory=dict)  # dimm3 -> "CPU_SrcID#0_Ha#0_Chan#0_DIMM#0"

    @property
    def ue(self) -> int:
        return self.counts.get("ue", 0) + self.counts.get("ue_noinfo", 0)


def _count(path: str) -> int | None:
    raw = read_text(path)
    return int(raw) if raw is not None and raw.isdigit() else None


def read_controllers(paths: HostPaths) -> list[Controller]:
    base = paths.sys("devices", "system", "edac", "mc")
    try:
        names = sorted((n for n in os.listdir(base) if _MC.fullmatch(n)), key=lambda n: int(n[2:]))
    except OSError:
        return []
    out = []
    for name in names:
        mc = os.path.join(base, name)
        counts = {k: v for k in ("ce", "ue", "ce_noinfo", "ue_noinfo") if (v := _count(os.path.join(mc, f"{k}_count"))) is not None}
        c = Controller(name, counts)
        try:
            units = sorted(n for n in os.listdir(mc) if _UNIT.fullmatch(n))
        except OSError:
            units = []
        for unit in units:
            prefix = "" if unit.startswith("csrow") else "dimm_"
            got = {k: v for k in ("ce", "ue") if (v := _count(os.path.join(mc, unit, f"{prefix}{k}_count"))) is not None}
            if got:
                c.units[unit] = got
                label = read_text(os.path.join(mc, unit, "dimm_label")) if prefix else None
                if label:
                    c.labels[unit] = label
        out.append(c)
    return out


def _parse(raw: Any) -> tuple[str, dict[str, list[tuple[float, int]]]]:
    d = obj(raw)
    series = {}
    for key, points in obj(d["series"]).items():
        pairs = [seq(p, "point") for p in seq(points, "series")]
        series[text(key, "series")] = [(number(p[0], "time"), integer(p[1], "count")) for p in pairs]
    return text(d["boot"], "boot"), series


EDAC_FILE = StateFile(STATE_FILE, _parse)


class EdacMonitor:
    def __init__(self, paths: HostPaths, state: StateDir, ce_per_day: float, clock: Callable[[], float] = time.time) -> None:
        self.paths, self.state, self.ce_per_day, self.clock = paths, state, ce_per_day, clock
        self.boot = ""
        self.series: dict[str, list[tuple[float, int]]] = {}  # "mc0/dimm3" -> (unix time, ce count), oldest first
        self._changed = self._save_failed = False

    def run(self, b: ObservationBuilder, dry_run: bool = False) -> None:
        controllers = read_controllers(self.paths)
        if not controllers:
            b.subject("edac", "no EDAC memory controllers (no EDAC driver for this platform loaded)")
            return
        self._load()
        now = self.clock()
        for c in controllers:
            self._controller(b, c, now)
        if self._changed and not dry_run:
            self._save()

    def _save(self) -> None:
        """Written when a point was added or dropped (at most every KEEP_EVERY per DIMM); a failed
        write is logged once and tried again at the next run: the window lives on in memory."""
        try:
            self.state.write_json(STATE_FILE, {"boot": self.boot, "series": {k: [list(p) for p in v] for k, v in self.series.items()}})
        except OSError as exc:
            if not self._save_failed:
                log.error("cannot save the EDAC window in %s: %s (logged once until it works again)", self.state.path, exc.strerror or exc)
            self._save_failed = True
            return
        self._save_failed = self._changed = False

    def _controller(self, b: ObservationBuilder, c: Controller, now: float) -> None:
        for kind, n in c.counts.items():
            b.sample("node_health_edac_errors_total", n, controller=c.name, type=kind)
        for unit, got in c.units.items():
            for kind, n in got.items():
                b.sample("node_health_edac_dimm_errors_total", n, controller=c.name, dimm=unit, type=kind)
        if c.ue:
            where = ", ".join(f"{u} ({c.labels.get(u, '')})".replace(" ()", "") for u, got in c.units.items() if got.get("ue"))
            b.finding(c.name, "EdacUncorrectable", f"{c.ue} uncorrected memory errors on {c.name} this boot" + (f": {where}" if where else ""))
        ce_units = {u: got["ce"] for u, got in c.units.items() if "ce" in got} or {"": c.counts.get("ce", 0)}
        for unit, ce in ce_units.items():
            key = f"{c.name}/{unit}" if unit else c.name
            added = self._window(key, ce, now)
            if self.ce_per_day and added >= self.ce_per_day:
                label = f" ({c.labels[unit]})" if unit in c.labels else ""
                b.finding(key, "EdacCorrectedRate", f"{added} corrected memory errors on {key}{label} within 24 h "
                          f"(threshold checks.kernel.edac_ce_per_day = {self.ce_per_day:g})")
        b.subject(c.name, f"{c.counts.get('ce', 0)} corrected, {c.ue} uncorrected memory errors this boot")

    def _window(self, key: str, count: int, now: float) -> int:
        """Corrected errors added within the last 24 h (as far as this boot's samples reach)."""
        old = self.series.get(key, [])
        points = [p for p in old if p[0] >= now - DAY and p[1] <= count]  # a drop: counters reset
        if not points or now - points[-1][0] >= KEEP_EVERY:  # at most one a KEEP_EVERY: bounded
            points.append((now, count))
        self._changed = self._changed or points != old
        self.series[key] = points
        return count - points[0][1]

    def _load(self) -> None:
        boot = boot_id(self.paths)
        if boot == self.boot:
            return
        self.boot, self.series = boot, {}
        saved = self.state.load(EDAC_FILE)
        if saved is not None and saved[0] == boot:
            self.series = saved[1]
