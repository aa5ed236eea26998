"""What NVML readings during a burn mean: the pure part of the NVML watch.

The sampler (agent.burn.nvml_watch) turns NVML calls into `Reading`s and Xid
events; an `Accumulator` per GPU turns them into problems. Only changes
during the burn count (the passive GPU checks report the state the GPU was
already in). Clock-event bits after nvml.h: HwSlowdown 0x8 (temperature,
power brake or fast trigger, ≥2× clock cut), HwThermalSlowdown 0x40,
HwPowerBrakeSlowdown 0x80 (external power brake).
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Fault, Problem, Telemetry
from .verdict import WatchSummary

HW_SLOWDOWN = {0x8: "hardware slowdown", 0x40: "hardware thermal slowdown", 0x80: "hardware power brake"}
HW_SLOWDOWN_MASK = sum(HW_SLOWDOWN)
COUNTERS = (
    "ecc_uncorrected",
    "ecc_corrected",
    "retired_pending",
    "remapped_uncorrectable",
    "remap_pending",
    "remap_failed",
)


@dataclass(frozen=True, slots=True)
class Reading:
    """One poll of one GPU; None where NVML does not support the field."""

    lost: bool = False  # NVML_ERROR_GPU_IS_LOST
    ecc_uncorrected: int | None = None  # volatile total
    ecc_corrected: int | None = None
    retired_pending: bool | None = None  # pre-Ampere page retirement
    remapped_uncorrectable: int | None = None  # Ampere+ row remapping
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    clocks_event_reasons: int | None = None
    power_watts: float | None = None
    sm_clock_mhz: float | None = None
    temperature_c: float | None = None


class Accumulator:
    def __init__(self, throttle_share: float) -> None:
        self.throttle_share = throttle_share
        # first and last value of each counter (counters are read at the start and the end only)
        self._first: dict[str, object] = {}
        self._last: dict[str, object] = {}
        self.samples = 0
        self.throttled = 0
        self.throttle_bits = 0
        self.lost = False
        self.xids: list[int] = []
        self.hung_for: float | None = None
        self._power: list[float] = []
        self._clock: list[float] = []
        self._temp_max: float | None = None

    def add(self, r: Reading) -> None:
        self.lost |= r.lost
        if r.lost:
            return
        for name in COUNTERS:
            value = getattr(r, name)
            if value is not None:
                self._first.setdefault(name, value)
                self._last[name] = value
        self.samples += 1
        if r.clocks_event_reasons is not None and r.clocks_event_reasons & HW_SLOWDOWN_MASK:
            self.throttled += 1
            self.throttle_bits |= r.clocks_event_reasons & HW_SLOWDOWN_MASK
        if r.power_watts is not None:
            self._power.append(r.power_watts)
        if r.sm_clock_mhz is not None:
            self._clock.append(r.sm_clock_mhz)
        if r.temperature_c is not None:
            self._temp_max = max(r.temperature_c, self._temp_max or r.temperature_c)

    def xid(self, code: int) -> None:
        self.xids.append(code)

    def hung(self, seconds: float) -> None:
        self.hung_for = seconds

    def summary(self) -> WatchSummary:
        problems: list[Problem] = []
        if self.lost:
            problems.append(
                Problem(Fault.GPU_LOST, "NVML reports the GPU lost (NVML_ERROR_GPU_IS_LOST) during the burn")
            )
        if self.hung_for is not None:
            problems.append(
                Problem(Fault.GPU_LOST, f"an NVML call on this GPU has not returned for {self.hung_for:.0f}s")
            )
        if self.xids:
            codes = ", ".join(str(x) for x in sorted(set(self.xids)))
            problems.append(Problem(Fault.XID, f"Xid {codes} reported by NVML during the burn"))
        problems += self._counter_problems()
        if self.samples and self.throttled / self.samples > self.throttle_share:
            names = ", ".join(n for bit, n in HW_SLOWDOWN.items() if self.throttle_bits & bit)
            problems.append(
                Problem(
                    Fault.THROTTLE,
                    f"{names} in {self.throttled} of {self.samples} samples under load "
                    f"(more than {self.throttle_share:.0%})",
                )
            )
        return WatchSummary(problems=tuple(problems), telemetry=self._telemetry(), notes=self._notes())

    def _delta(self, name: str) -> int:
        before, after = self._first.get(name), self._last.get(name)
        return max(0, int(after) - int(before)) if before is not None and after is not None else 0  # type: ignore[call-overload]

    def _appeared(self, name: str) -> bool:
        return bool(self._last.get(name)) and not self._first.get(name)

    def _counter_problems(self) -> list[Problem]:
        out = []
        if new_dbe := self._delta("ecc_uncorrected"):
            out.append(Problem(Fault.ECC, f"{new_dbe} new uncorrectable ECC error(s) during the burn"))
        if self._appeared("retired_pending"):
            out.append(Problem(Fault.ECC, "pages pending retirement appeared during the burn (reset or reboot needed)"))
        if new_unc := self._delta("remapped_uncorrectable"):
            out.append(
                Problem(Fault.ROW_REMAP, f"{new_unc} new row(s) remapped for uncorrectable errors during the burn")
            )
        if self._appeared("remap_pending"):
            out.append(Problem(Fault.ROW_REMAP, "a row remap became pending during the burn (GPU reset needed)"))
        if self._appeared("remap_failed"):
            out.append(Problem(Fault.ROW_REMAP, "row remapping failed during the burn"))
        return out

    def _notes(self) -> tuple[str, ...]:
        if not self.samples:
            return () if self.lost else ("no NVML readings during the burn",)
        new_sbe = self._delta("ecc_corrected")
        return (f"{new_sbe} corrected ECC error(s) during the burn",) if new_sbe else ()

    def _telemetry(self) -> Telemetry:
        return Telemetry(
            power_watts_mean=sum(self._power) / len(self._power) if self._power else None,
            sm_clock_hz_mean=sum(self._clock) / len(self._clock) * 1e6 if self._clock else None,
            temperature_max_c=self._temp_max,
            samples=self.samples,
        )
