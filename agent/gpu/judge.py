"""From one `GpuReading` (and what the previous poll remembered) to samples and
findings. Pure: the check feeds it readings, the tests feed it tables.

Deltas (corrected-ECC rate, NVLink counters) are taken against the previous
poll's values, which the check keeps in the state dir, so a restart of the
agent does not lose them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..findings import ObservationBuilder, Severity
from .reading import FABRIC_COMPLETED, FABRIC_IN_PROGRESS, HEALTH_LIMITED, HEALTH_UNHEALTHY, GpuReading
from .xid_catalog import RECOVERY_ACTIONS

# Clock event reasons (nvml.h nvmlClocksEventReason*): the hardware ones are health signals.
GPU_IDLE = 0x1
HW_SLOWDOWN, HW_THERMAL_SLOWDOWN, HW_POWER_BRAKE_SLOWDOWN = 0x8, 0x40, 0x80
CLOCK_REASONS = {
    "gpu_idle": GPU_IDLE,
    "sw_power_cap": 0x4,
    "hw_slowdown": HW_SLOWDOWN,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": HW_THERMAL_SLOWDOWN,
    "hw_power_brake_slowdown": HW_POWER_BRAKE_SLOWDOWN,
}
HW_REASONS = {"hw_slowdown": HW_SLOWDOWN, "hw_thermal_slowdown": HW_THERMAL_SLOWDOWN, "hw_power_brake_slowdown": HW_POWER_BRAKE_SLOWDOWN}


@dataclass(frozen=True, slots=True)
class Limits:
    ecc_corrected_per_hour: float
    nvlink_errors_per_second: float
    pcie_replays_per_minute: float = 0.0
    fabric_grace: float = 0.0  # seconds a fabric that is not trained is given (Fabric Manager starting)


def judge(r: GpuReading, prev: dict[str, Any], limits: Limits, now: float, b: ObservationBuilder) -> dict[str, Any]:
    """Adds samples and findings for GPU `r`; returns what the next poll needs."""
    gpu, subject = str(r.index), f"gpu{r.index}"
    b.sample("node_health_gpu_up", 0 if r.lost else 1, gpu=gpu)
    if r.lost:
        b.finding(subject, "GpuLost", "NVML reports GPU_IS_LOST: the GPU has fallen off the bus or is inaccessible")
        return prev
    b.sample("node_health_gpu_info", 1, gpu=gpu, uuid=r.uuid, pci_bus_id=r.bus_id, model=r.name, serial=r.serial)
    dt = now - prev["t"] if "t" in prev else 0.0
    state: dict[str, Any] = {"t": now}
    _ecc(r, prev, state, limits, dt, b)
    _memory(r, b)
    _thermal(r, b)
    _pcie(r, b)
    _nvlink(r, prev, state, limits, dt, b)
    _recovery(r, b)
    _persistence(r, b)
    _replay(r, prev, state, limits, dt, b)
    _fabric(r, prev, state, limits, now, b)
    if r.errors:
        b.finding(subject, "NvmlError", "; ".join(r.errors[:5]))
    temp = f", {r.temperature}°C" if r.temperature is not None else ""
    na = f", {len(r.unsupported)} fields not applicable" if r.unsupported else ""
    b.subject(subject, f"{r.name or 'GPU'} {r.pci}{temp}{na}")
    return state


def _ecc(r: GpuReading, prev: dict[str, Any], state: dict[str, Any], limits: Limits, dt: float, b: ObservationBuilder) -> None:
    gpu, subject = str(r.index), f"gpu{r.index}"
    for (kind, scope), v in r.ecc.items():
        b.sample("node_health_gpu_ecc_errors_total", v, gpu=gpu, error_type=kind, scope=scope)
    vol, agg = r.ecc.get(("uncorrected", "volatile")), r.ecc.get(("uncorrected", "aggregate"))
    if agg is not None:
        state["unc_agg_base"] = prev.get("unc_agg_base", agg)  # the lifetime count when this boot began
    if vol:
        b.finding(subject, "EccUncorrectable", f"{vol} uncorrectable ECC errors since the driver loaded")
    elif vol is None and agg is not None and agg > state["unc_agg_base"]:
        b.finding(subject, "EccUncorrectable", f"{agg - state['unc_agg_base']} new uncorrectable ECC errors this boot")
    cor = r.ecc.get(("corrected", "volatile"), r.ecc.get(("corrected", "aggregate")))
    if cor is None:
        return
    state["cor"] = cor
    last = prev.get("cor")
    if last is not None and dt > 0:
        delta = cor - last if cor >= last else cor  # the volatile count restarts when the driver reloads
        rate = delta * 3600.0 / dt
        if limits.ecc_corrected_per_hour and rate > limits.ecc_corrected_per_hour:
            b.finding(subject, "EccCorrectedRate", f"{delta} corrected ECC errors in {dt:.0f}s ({rate:.0f}/h)")


def _memory(r: GpuReading, b: ObservationBuilder) -> None:
    gpu, subject = str(r.index), f"gpu{r.index}"
    if r.remapped is not None:
        corr, unc, pending, failure = r.remapped
        b.sample("node_health_gpu_remapped_rows", corr, gpu=gpu, kind="correctable")
        b.sample("node_health_gpu_remapped_rows", unc, gpu=gpu, kind="uncorrectable")
        b.sample("node_health_gpu_row_remap_pending", 1 if pending else 0, gpu=gpu)
        b.sample("node_health_gpu_row_remap_failed", 1 if failure else 0, gpu=gpu)
        if failure:
            b.finding(subject, "RowRemapFailure", f"row remapping failed ({unc} uncorrectable rows remapped)")
        elif pending:
            b.finding(subject, "RowRemapPending", "a row remap is pending: the GPU needs a reset to activate it")
    for cause, n in r.retired.items():
        b.sample("node_health_gpu_retired_pages", n, gpu=gpu, cause=cause)
    if r.retired_pending is not None:
        b.sample("node_health_gpu_retired_pages_pending", 1 if r.retired_pending else 0, gpu=gpu)
        if r.retired_pending:
            b.finding(subject, "RetiredPagesPending", "pages are pending retirement: the GPU needs a reset or reboot")


def _thermal(r: GpuReading, b: ObservationBuilder) -> None:
    gpu, subject = str(r.index), f"gpu{r.index}"
    t = r.temperature
    if t is not None:
        b.sample("node_health_gpu_temperature_celsius", t, gpu=gpu)
    for name, limit in (("slowdown", r.slowdown), ("shutdown", r.shutdown)):
        if limit is not None:
            b.sample("node_health_gpu_temperature_threshold_celsius", limit, gpu=gpu, threshold=name)
    if t is not None and r.shutdown and t >= r.shutdown:
        b.finding(subject, "GpuTemperatureShutdown", f"{t}°C, at or above the shutdown threshold {r.shutdown}°C")
    elif t is not None and r.slowdown and t >= r.slowdown:
        b.finding(subject, "GpuTemperatureSlowdown", f"{t}°C, at or above the slowdown threshold {r.slowdown}°C")
    if r.clocks_event is None:
        return
    b.sample("node_health_gpu_clock_event_reasons", r.clocks_event, gpu=gpu)
    for name, bit in CLOCK_REASONS.items():
        b.sample("node_health_gpu_clock_event_active", 1 if r.clocks_event & bit else 0, gpu=gpu, reason=name)
    hw = [name for name, bit in HW_REASONS.items() if r.clocks_event & bit]
    if hw:
        b.finding(subject, "GpuHwSlowdown", f"clocks cut by {', '.join(hw)} (reasons 0x{r.clocks_event:x})")


def _pcie(r: GpuReading, b: ObservationBuilder) -> None:
    gpu, subject = str(r.index), f"gpu{r.index}"
    p = r.pcie
    for which, key in (("current", "gen"), ("max", "gen_max")):
        if key in p:
            b.sample("node_health_gpu_pcie_link_generation", p[key], gpu=gpu, which=which)
    for which, key in (("current", "width"), ("max", "width_max")):
        if key in p:
            b.sample("node_health_gpu_pcie_link_width", p[key], gpu=gpu, which=which)
    # An idle GPU lowers its link speed (and may lower its width) to save power
    # (nvidia-smi: "may be reduced when the GPU is not in use";
    # https://github.com/NVIDIA/open-gpu-kernel-modules/issues/731): judge the link only when busy.
    busy = r.clocks_event is not None and not r.clocks_event & GPU_IDLE
    if not busy:
        return
    low = []
    if p.get("gen", 0) and p.get("gen_max", 0) and p["gen"] < p["gen_max"]:
        low.append(f"gen {p['gen']} of {p['gen_max']}")
    if p.get("width", 0) and p.get("width_max", 0) and p["width"] < p["width_max"]:
        low.append(f"x{p['width']} of x{p['width_max']}")
    if low:
        b.finding(subject, "PcieLinkDegraded", "PCIe link degraded under load: " + ", ".join(low))


def _nvlink(r: GpuReading, prev: dict[str, Any], state: dict[str, Any], limits: Limits, dt: float, b: ObservationBuilder) -> None:
    gpu, subject = str(r.index), f"gpu{r.index}"
    was_up = set(prev.get("links_up", []))
    last: dict[str, dict[str, int]] = prev.get("nvlink", {})
    state["links_up"] = sorted(was_up | {k for k, v in r.nvlink.items() if v.up})
    state["nvlink"] = {str(k): v.counters for k, v in r.nvlink.items()}
    down, noisy = [], []
    for link, s in r.nvlink.items():
        b.sample("node_health_gpu_nvlink_up", 1 if s.up else 0, gpu=gpu, link=str(link))
        for counter, v in s.counters.items():
            b.sample("node_health_gpu_nvlink_errors_total", v, gpu=gpu, link=str(link), counter=counter)
        if not s.up and link in was_up:
            down.append(str(link))
        before = last.get(str(link))
        if before is None or dt <= 0:
            continue
        delta = {c: v - before.get(c, v) for c, v in s.counters.items() if v >= before.get(c, v)}
        rate = (delta.get("crc_flit", 0) + delta.get("crc_data", 0) + delta.get("replay", 0)) / dt
        if delta.get("recovery", 0) > 0 or rate > limits.nvlink_errors_per_second:
            noisy.append(f"link {link}: +{delta.get('recovery', 0)} recovery, {rate:.1f} CRC/replay errors/s")
    if down:
        b.finding(subject, "NvLinkDown", f"NVLink {', '.join(down)} down (was up earlier this boot)")
    if noisy:
        b.finding(subject, "NvLinkErrors", "; ".join(noisy[:4]))


def _recovery(r: GpuReading, b: ObservationBuilder) -> None:
    if r.recovery_action is None:
        return
    b.sample("node_health_gpu_recovery_action", r.recovery_action, gpu=str(r.index))
    if r.recovery_action == 0:
        return
    name, action, sev = RECOVERY_ACTIONS.get(r.recovery_action, (f"unknown ({r.recovery_action})", "drain_and_diagnose", None))
    b.finding(
        f"gpu{r.index}", "GpuRecoveryAction", f"NVML recovery action: {name}", severity=sev, action=action
    )


def _persistence(r: GpuReading, b: ObservationBuilder) -> None:
    # Off, the driver tears the GPU's state down whenever no client holds it and
    # sets it up again for the next (seconds per CUDA start); nvidia-persistenced
    # turns it on at boot, so it reads off for a moment after a reboot (gpud#431):
    # a warning, which the state's hysteresis lets pass.
    if r.persistence is None:
        return
    b.sample("node_health_gpu_persistence_mode", r.persistence, gpu=str(r.index))
    if not r.persistence:
        b.finding(f"gpu{r.index}", "GpuPersistenceModeOff", "persistence mode is off (nvidia-persistenced not running?)")


def _replay(r: GpuReading, prev: dict[str, Any], state: dict[str, Any], limits: Limits, dt: float, b: ObservationBuilder) -> None:
    if r.pcie_replay is None:
        return
    # The series node_health_gpu_pcie_replay_total is the telemetry check's (one emitter per series);
    # this one only judges the rate.
    state["replay"] = r.pcie_replay
    last = prev.get("replay")
    if last is None or dt <= 0 or not limits.pcie_replays_per_minute:
        return
    delta = r.pcie_replay - last if r.pcie_replay >= last else r.pcie_replay  # the count restarts with the driver
    rate = delta * 60.0 / dt
    if rate > limits.pcie_replays_per_minute:
        b.finding(f"gpu{r.index}", "PcieReplayRate", f"{delta} PCIe replays in {dt:.0f}s ({rate:.1f}/min)")


FABRIC_STATES = {1: "not started", 2: "in progress", 3: "completed"}


def _fabric(r: GpuReading, prev: dict[str, Any], state: dict[str, Any], limits: Limits, now: float, b: ObservationBuilder) -> None:
    f = r.fabric
    if f is None:
        return
    gpu, subject = str(r.index), f"gpu{r.index}"
    b.sample("node_health_gpu_fabric_state", f.state, gpu=gpu)
    if f.state == FABRIC_COMPLETED:
        if f.status != 0:
            b.finding(subject, "GpuFabricUnhealthy", f"NVLink fabric training completed with NVML error {f.status}")
        elif f.health == HEALTH_UNHEALTHY:
            b.finding(subject, "GpuFabricUnhealthy", "the NVLink fabric reports this GPU unhealthy (health summary)")
        elif f.health == HEALTH_LIMITED:
            # It still works, at reduced bandwidth: not a reboot's worth, a look's.
            b.finding(subject, "GpuFabricUnhealthy", "the NVLink fabric runs at limited capacity (health summary)",
                      severity=Severity.WARNING, action="drain_and_diagnose")
        return
    # Not trained yet: Fabric Manager has not started (NOT_STARTED) or is training
    # (IN_PROGRESS). Normal for a while after boot; past the grace, CUDA cannot run here.
    since = state["fabric_since"] = prev.get("fabric_since", now)
    if now - since >= limits.fabric_grace:
        what = "training has not finished" if f.state == FABRIC_IN_PROGRESS else "Fabric Manager has not trained it"
        b.finding(subject, "FabricManagerNotRunning",
                  f"NVLink fabric state {FABRIC_STATES.get(f.state, f.state)} for {now - since:.0f}s: {what}")
