"""The GPU engine: `GpuPoller` polls every GPU through NVML and judges it.

Every NVML call that can block (a GPU that fell off the bus can hang the
driver) runs through the check's `Prober`: a hung GPU is reported
(``NvmlCallHung``) and skipped while it stays hung; the other GPUs are still
polled and the check still finishes.

Kept in the state dir (``gpu-poll.json``, per boot): the previous values for
deltas, the lifetime uncorrectable-ECC count when the boot began, the NVLinks
seen up, and every GPU seen this boot (a GPU that vanishes from NVML and the
bus is still expected). ``gpu-inventory.json`` maps PCI address → NVML index
for the Xid source.
"""

from __future__ import annotations

import json
import logging
import os
from functools import partial
from types import ModuleType
from typing import Any

from ..findings import ObservationBuilder
from ..hostpaths import HostPaths
from ..probe import Prober
from ..statedir import StateDir, StateFile, boot_id, integer, number, obj, seq, text, texts
from . import nvml, stack
from .judge import Limits, judge
from .pci import bus_gpus, nvml_candidates
from .reading import Reader
from .settings import GpuConfig, nvml_library
from .stuck import StuckTracker, describe, scan

log = logging.getLogger(__name__)

POLL_STATE = "gpu-poll.json"
INVENTORY = "gpu-inventory.json"


def _gpu_memory(raw: Any, where: str) -> dict[str, Any]:
    """What `judge` keeps of one GPU between runs."""
    d = obj(raw, where)
    for key in ("t", "unc_agg_base", "replay", "fabric_since"):
        if key in d:
            number(d[key], f"{where}.{key}")
    if d.get("cor") is not None:
        number(d["cor"], f"{where}.cor")
    for i, link in enumerate(seq(d.get("links_up", []), f"{where}.links_up")):
        integer(link, f"{where}.links_up[{i}]")
    for link, counters in obj(d.get("nvlink", {}), f"{where}.nvlink").items():
        for name, v in obj(counters, f"{where}.nvlink.{link}").items():
            integer(v, f"{where}.nvlink.{link}.{name}")
    return d


def _parse_poll(raw: Any) -> dict[str, Any]:
    d = obj(raw)
    gpus = {k: _gpu_memory(v, f"gpus.{k}") for k, v in obj(d["gpus"], "gpus").items()}
    hung = {k: integer(v, f"hung.{k}") for k, v in obj(d.get("hung", {}), "hung").items()}
    out: dict[str, Any] = {"boot": text(d["boot"], "boot"), "gpus": gpus, "seen": texts(d["seen"], "seen"), "hung": hung}
    if "fm_since" in d:
        out["fm_since"] = number(d["fm_since"], "fm_since")
    return out


def _parse_inventory(raw: Any) -> dict[str, Any]:
    d = obj(raw)
    index = {k: integer(v, f"index.{k}") for k, v in obj(d["index"], "index").items()}
    return {"boot": text(d["boot"], "boot"), "index": index}


POLL_FILE = StateFile(POLL_STATE, _parse_poll)
INVENTORY_FILE = StateFile(INVENTORY, _parse_inventory)


class GpuPoller:
    """Polls every GPU on each `poll`; keeps the NVML reader and the prober across polls."""

    def __init__(self, paths: HostPaths, state: StateDir, cfg: GpuConfig) -> None:
        self.paths, self.state, self.cfg = paths, state, cfg
        self.prober = Prober("nvml")
        self.reader: Reader | None = None  # made with the NVML session
        self.stuck = StuckTracker()
        self.fabric_reported = False  # a GPU reported its NVLink fabric state at the last poll
        self._written: str | None = None  # the poll state as last written

    def poll(self, b: ObservationBuilder, now: float) -> dict[str, int]:
        """Polls every GPU; returns PCI address → NVML index of those that answered."""
        cfg = self.cfg
        bus = bus_gpus(self.paths)
        candidates = nvml_candidates(bus)
        boot = boot_id(self.paths)
        state = self.state.load(POLL_FILE)
        if state is not None and state["boot"] != boot:
            self.state.ignored(POLL_STATE, f"kept in boot {state['boot'][:64]!r}, this is boot {boot[:64]!r}")
        if state is None or state["boot"] != boot:
            state = {"boot": boot, "gpus": {}, "seen": [], "hung": {}}
            self._written = None  # missing, unreadable or another boot's: written again whatever it holds
        nv, why = self._init(b, state)
        if nv is None and why and not bus and os.path.isdir(self.paths.sys("bus/pci/devices")):
            # No NVML and no NVIDIA GPU on a bus that can be read: no process can be stuck on one. The /proc
            # walk (~65 µs a process) was most of such a poll's CPU (issue 29).
            self.stuck.update([])
            b.sample("node_health_gpu_stuck_processes", 0)
        else:
            self._stuck_processes(b)
        if nv is None:
            if why:
                _unavailable(b, why, candidates, cfg.expected_count)
            self._save(state, {})
            return {}
        b.sample("node_health_nvml_up", 1)
        if self.reader is None or self.reader.nv is not nv:
            self.reader = Reader(nv)
        count = self.prober.call("count", nv.nvmlDeviceGetCount, cfg.call_timeout)
        if count.hung_for is not None:
            self._hung(b, state, "gpus", "nvmlDeviceGetCount", count.hung_for)
            self._save(state, {})
            return {}
        state["hung"].pop("gpus", None)
        if count.error is not None:
            if nvml.code(count.error) in (nvml.UNINITIALIZED, nvml.DRIVER_NOT_LOADED):
                nvml.invalidate()
            b.finding("gpus", "NvmlError", f"nvmlDeviceGetCount: {count.error}")
            return {}
        seen = self._poll_gpus(self.reader, b, int(count.value or 0), state, now)
        # A GPU whose calls hang is still there (its own finding says so): not missing.
        hung = {pci for pci, i in self._last_index(state["boot"]).items() if f"gpu{i}" in state["hung"]}
        _count(b, int(count.value or 0), seen, candidates, state, cfg.expected_count, hung)
        self._around(b, state, now, int(count.value or 0) or len(candidates))
        self._save(state, seen)
        return seen

    def _init(self, b: ObservationBuilder, state: dict[str, Any]) -> tuple[ModuleType | None, str]:
        """pynvml ready for use, or None and why not ("" when nvmlInit hangs:
        a driver that does not answer is reported as a hung call, not as no NVML)."""
        try:
            library = nvml_library(self.paths, self.cfg)
        except nvml.NvmlUnavailable as exc:
            return None, str(exc)
        res = nvml.init_probed(self.prober, library, self.cfg.call_timeout)
        if res.hung_for is not None:
            b.sample("node_health_nvml_up", 0)
            self._hung(b, state, "nvml", "nvmlInit", res.hung_for)
            return None, ""
        state["hung"].pop("nvml", None)
        if res.error is not None:
            return None, str(res.error)
        return res.value, ""

    def _hung(self, b: ObservationBuilder, state: dict[str, Any], subject: str, what: str, hung_for: float) -> None:
        """One more poll in a row in which `what` for `subject` has not returned.
        The count lives in the poll state (per boot), not in the stuck thread,
        which may never come back: it grows while the call stays hung, across
        agent restarts too, and is forgotten when a call for `subject` answers."""
        n = state["hung"][subject] = state["hung"].get(subject, 0) + 1
        b.sample("node_health_nvml_hung_polls", n, subject=subject)
        limit = self.cfg.hung_polls
        if limit and n >= limit:
            b.finding(subject, "GpuUnresponsive", f"{what} has not returned for {hung_for:.0f}s, {n} polls in a row: "
                      "the NVIDIA driver no longer answers for it")
        else:
            of = f" of {limit}" if limit else ""
            b.finding(subject, "NvmlCallHung", f"{what} has not returned for {hung_for:.0f}s ({n}{of} polls in a row)")

    def _stuck_processes(self, b: ObservationBuilder) -> None:
        """Processes in D state on /dev/nvidia*; those seen so on `hung_polls` polls in a row are a fault."""
        res = self.prober.call("stuck-scan", partial(scan, self.paths), self.cfg.call_timeout)
        if not res.ok or res.value is None:
            return  # reading /proc hung or failed: nothing known, tried again next poll
        stuck = self.stuck.update(res.value)
        b.sample("node_health_gpu_stuck_processes", len(stuck))
        limit = self.cfg.hung_polls
        long_stuck = [(s, n) for s, n in stuck if limit and n >= limit]
        if long_stuck:
            b.finding("gpus", "GpuProcessStuck", f"{len(long_stuck)} processes in uninterruptible sleep on NVIDIA "
                      f"devices for {limit} polls or more: {describe(long_stuck)}")

    def _poll_gpus(self, reader: Reader, b: ObservationBuilder, count: int, state: dict[str, Any], now: float) -> dict[str, int]:
        """Reads and judges each GPU; returns PCI address → index of those that answered."""
        cfg = self.cfg
        limits = Limits(cfg.ecc_corrected_rate, cfg.nvlink_error_rate, cfg.pcie_replay_rate, cfg.fabric_manager_grace)
        seen: dict[str, int] = {}
        self.fabric_reported = False
        for i in range(count):
            res = self.prober.call(("gpu", i), partial(reader.read, i), cfg.call_timeout)
            if res.hung_for is not None:
                b.sample("node_health_gpu_up", 0, gpu=str(i))
                self._hung(b, state, f"gpu{i}", "NVML calls for this GPU", res.hung_for)
                continue
            state["hung"].pop(f"gpu{i}", None)
            b.sample("node_health_nvml_hung_polls", 0, subject=f"gpu{i}")
            if res.error is not None:
                b.finding(f"gpu{i}", "NvmlError", f"reading the GPU failed: {type(res.error).__name__}: {res.error}")
                continue
            r = res.value
            assert r is not None
            self.fabric_reported |= r.fabric is not None
            key = r.uuid or r.pci or f"#{i}"
            state["gpus"][key] = judge(r, state["gpus"].get(key, {}), limits, now, b)
            if r.pci:
                seen[r.pci] = i
        return seen

    def _around(self, b: ObservationBuilder, state: dict[str, Any], now: float, gpus: int) -> None:
        """What the GPUs need from the host: Fabric Manager on an NVSwitch system (where
        NVML does not report the fabric itself), nvidia_peermem beside InfiniBand."""
        if gpus and self.cfg.peermem and stack.infiniband_devices(self.paths):
            loaded = stack.peermem_loaded(self.paths)
            b.sample("node_health_nvidia_peermem_loaded", 1 if loaded else 0)
            if not loaded:
                b.finding("gpus", "NvidiaPeermemNotLoaded", "GPUs and InfiniBand devices ("
                          + ", ".join(stack.infiniband_devices(self.paths)[:4]) + ") but nvidia_peermem is not loaded: "
                          "no GPUDirect RDMA (modprobe nvidia_peermem)")
        if not gpus or self.fabric_reported or not stack.nvswitches(self.paths):
            state.pop("fm_since", None)
            return
        running = stack.fabric_manager_running(self.paths)
        b.sample("node_health_fabric_manager_running", 1 if running else 0)
        if running:
            state.pop("fm_since", None)
            return
        since = state["fm_since"] = state.get("fm_since", now)
        if now - since >= self.cfg.fabric_manager_grace:
            b.finding("gpus", "FabricManagerNotRunning", f"NVSwitches on the PCI bus but {stack.FM_UNIT} has not "
                      f"been running for {now - since:.0f}s (and NVML does not report the fabric state)")

    def _last_index(self, boot: str) -> dict[str, int]:
        """PCI address → NVML index of the GPUs that answered earlier this boot."""
        old = self.state.load(INVENTORY_FILE)
        return dict(old["index"]) if old is not None and old["boot"] == boot else {}

    def _save(self, state: dict[str, Any], seen: dict[str, int]) -> None:
        state["seen"] = sorted(set(state.get("seen", [])) | set(seen))
        try:
            # Written only when it changed (issue 29): on a node without a GPU (or NVML) it never does, and
            # each write is two fsyncs, most of a poll's CPU there. A GPU's counters change it at every poll.
            text = json.dumps(state, sort_keys=True)
            if text != self._written:
                self.state.write_json(POLL_STATE, state)
                self._written = text
            if seen:
                old = self.state.load(INVENTORY_FILE)
                index = old["index"] if old is not None and old["boot"] == state["boot"] else {}
                if {**index, **seen} != index:
                    self.state.write_json(INVENTORY, {"boot": state["boot"], "index": {**index, **seen}})
        except OSError as exc:  # selftest as a user without the state dir: deltas start afresh next time
            log.debug("cannot save GPU poll state in %s: %s", self.state.path, exc)


def _count(
    b: ObservationBuilder, count: int, seen: dict[str, int], candidates: list[str], state: dict[str, Any],
    expected_cfg: int, hung: set[str],
) -> None:
    earlier = set(state.get("seen", []))
    expected = expected_cfg or max(len(candidates), len(earlier | set(seen)))
    earlier -= hung
    candidates_answering = [p for p in candidates if p not in hung]
    b.sample("node_health_gpus", count, source="nvml")
    b.sample("node_health_gpus", len(candidates), source="pci_bus")
    b.sample("node_health_gpus", expected, source="expected")
    problems = []
    if count < expected:
        problems.append(f"NVML sees {count} GPUs, {expected} expected")
    absent = [p for p in candidates_answering if p not in seen]
    if absent and seen:  # when NVML answered for none, each GPU's own finding says why
        problems.append("on the PCI bus but not in NVML: " + ", ".join(absent))
    gone = sorted(earlier - set(seen) - set(candidates))
    if gone:
        problems.append("seen earlier this boot, now gone: " + ", ".join(gone))
    if problems:
        b.finding("gpus", "GpuMissing", "; ".join(problems))
    b.subject("gpus", f"{count} GPUs in NVML, {len(candidates)} on the PCI bus, {expected} expected")


def _unavailable(b: ObservationBuilder, why: str, candidates: list[str], expected: int) -> None:
    b.sample("node_health_nvml_up", 0)
    b.sample("node_health_gpus", len(candidates), source="pci_bus")
    on_bus = f"; {len(candidates)} NVIDIA GPUs on the PCI bus" if candidates else "; no NVIDIA GPU on the PCI bus"
    b.finding("nvml", "NvmlUnavailable", why + on_bus)
    if expected and len(candidates) < expected:
        b.finding("gpus", "GpuMissing", f"{len(candidates)} NVIDIA GPUs on the PCI bus, {expected} expected")
