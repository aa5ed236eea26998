"""One poll of every GPU for `agent.checks.gpu.GpuCheck`.

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

import logging
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..findings import ObservationBuilder
from ..state import StateFile, boot_id, integer, number, obj, seq, text, texts
from . import nvml
from .judge import Limits, judge
from .pci import bus_gpus, nvml_candidates
from .poll import Reader

if TYPE_CHECKING:
    from ..checks.gpu import GpuCheck

log = logging.getLogger(__name__)

POLL_STATE = "gpu-poll.json"
INVENTORY = "gpu-inventory.json"


def _gpu_memory(raw: Any, where: str) -> dict[str, Any]:
    """What `judge` keeps of one GPU between runs."""
    d = obj(raw, where)
    for key in ("t", "unc_agg_base"):
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
    return {"boot": text(d["boot"], "boot"), "gpus": gpus, "seen": texts(d["seen"], "seen")}


def _parse_inventory(raw: Any) -> dict[str, Any]:
    d = obj(raw)
    index = {k: integer(v, f"index.{k}") for k, v in obj(d["index"], "index").items()}
    return {"boot": text(d["boot"], "boot"), "index": index}


POLL_FILE = StateFile(POLL_STATE, _parse_poll)
INVENTORY_FILE = StateFile(INVENTORY, _parse_inventory)


def poll(check: GpuCheck, b: ObservationBuilder, now: float) -> dict[str, int]:
    """Polls every GPU; returns PCI address → NVML index of those that answered."""
    ctx, cfg = check.ctx, check.cfg
    bus = bus_gpus(ctx.paths)
    candidates = nvml_candidates(bus)
    boot = boot_id(ctx.paths)
    state = check.state.load(POLL_FILE)
    if state is None or state["boot"] != boot:
        state = {"boot": boot, "gpus": {}, "seen": []}
    nv, why = _init(check)
    if nv is None:
        _unavailable(b, why, candidates, cfg.expected_count)
        return {}
    b.sample("node_health_nvml_up", 1)
    if check.reader is None or check.reader.nv is not nv:
        check.reader = Reader(nv)
    count = check.prober.call("count", nv.nvmlDeviceGetCount, cfg.call_timeout)
    if not count.ok:
        if count.error is not None and nvml.code(count.error) in (nvml.UNINITIALIZED, nvml.DRIVER_NOT_LOADED):
            nvml.invalidate()
        b.finding("gpus", "NvmlCallHung" if count.hung_for is not None else "NvmlError", f"nvmlDeviceGetCount: {count.error or 'hung'}")
        return {}
    seen = _poll_gpus(check, b, int(count.value or 0), state, now)
    _count(b, int(count.value or 0), seen, candidates, state, cfg.expected_count)
    _save(check, state, seen)
    return seen


def _init(check: GpuCheck) -> tuple[ModuleType | None, str]:
    """pynvml ready for use, or None and why not (nvmlInit itself can hang)."""
    from ..checks.gpu import nvml_library

    try:
        library = nvml_library(check.ctx, check.cfg)
    except nvml.NvmlUnavailable as exc:
        return None, str(exc)
    res = check.prober.call("init", lambda: nvml.init(library), check.cfg.call_timeout)
    if res.hung_for is not None:
        return None, f"nvmlInit has not returned for {res.hung_for:.0f}s"
    if res.error is not None:
        return None, str(res.error)
    return res.value, ""


def _poll_gpus(check: GpuCheck, b: ObservationBuilder, count: int, state: dict[str, Any], now: float) -> dict[str, int]:
    """Reads and judges each GPU; returns PCI address → index of those that answered."""
    cfg = check.cfg
    limits = Limits(cfg.ecc_corrected_rate, cfg.nvlink_error_rate)
    seen: dict[str, int] = {}
    reader: Reader = check.reader
    for i in range(count):
        res = check.prober.call(("gpu", i), partial(reader.read, i), cfg.call_timeout)
        if res.hung_for is not None:
            b.sample("node_health_gpu_up", 0, gpu=str(i))
            b.finding(f"gpu{i}", "NvmlCallHung", f"NVML calls for this GPU have not returned for {res.hung_for:.0f}s")
            continue
        if res.error is not None:
            b.finding(f"gpu{i}", "NvmlError", f"reading the GPU failed: {type(res.error).__name__}: {res.error}")
            continue
        r = res.value
        assert r is not None
        key = r.uuid or r.pci or f"#{i}"
        state["gpus"][key] = judge(r, state["gpus"].get(key, {}), limits, now, b)
        if r.pci:
            seen[r.pci] = i
    return seen


def _count(b: ObservationBuilder, count: int, seen: dict[str, int], candidates: list[str], state: dict[str, Any], expected_cfg: int) -> None:
    earlier = set(state.get("seen", []))
    expected = expected_cfg or max(len(candidates), len(earlier | set(seen)))
    b.sample("node_health_gpus", count, source="nvml")
    b.sample("node_health_gpus", len(candidates), source="pci_bus")
    b.sample("node_health_gpus", expected, source="expected")
    problems = []
    if count < expected:
        problems.append(f"NVML sees {count} GPUs, {expected} expected")
    absent = [p for p in candidates if p not in seen]
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


def _save(check: GpuCheck, state: dict[str, Any], seen: dict[str, int]) -> None:
    state["seen"] = sorted(set(state.get("seen", [])) | set(seen))
    try:
        check.state.write_json(POLL_STATE, state)
        if seen:
            old = check.state.load(INVENTORY_FILE)
            index = old["index"] if old is not None and old["boot"] == state["boot"] else {}
            if {**index, **seen} != index:
                check.state.write_json(INVENTORY, {"boot": state["boot"], "index": {**index, **seen}})
    except OSError as exc:  # selftest as a user without the state dir: deltas start afresh next time
        log.debug("cannot save GPU poll state in %s: %s", check.state.path, exc)
