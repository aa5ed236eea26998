"""The NVML watch: what readings during a burn mean (tables), and the real
pynvml on a host without a driver (this machine): nothing crashes, the burn
is told plainly that nothing was watched."""

from __future__ import annotations

import pytest

from agent.burn.model import Fault
from agent.burn.watch import Accumulator, Reading

BASE: dict[str, object] = {
    "ecc_uncorrected": 0,
    "ecc_corrected": 3,
    "retired_pending": False,
    "remapped_uncorrectable": 2,
    "remap_pending": False,
    "remap_failed": False,
}
LOAD: dict[str, object] = {"clocks_event_reasons": 0, "power_watts": 690.0, "sm_clock_mhz": 1980, "temperature_c": 70}


def run(readings: list[Reading], share: float = 0.1, xids: tuple[int, ...] = (), hung: float | None = None):
    acc = Accumulator(share)
    for r in readings:
        acc.add(r)
    for x in xids:
        acc.xid(x)
    if hung is not None:
        acc.hung(hung)
    return acc.summary()


def start_load_end(end: dict[str, object], load: dict[str, object] | None = None, n: int = 10) -> list[Reading]:
    return [Reading(**BASE), *[Reading(**(load or LOAD)) for _ in range(n)], Reading(**(BASE | end))]


@pytest.mark.parametrize(
    ("readings", "faults"),
    [
        pytest.param(start_load_end({}), [], id="quiet burn"),
        pytest.param(start_load_end({"ecc_uncorrected": 2}), [Fault.ECC], id="new uncorrectable ECC"),
        pytest.param(start_load_end({"ecc_corrected": 9}), [], id="corrected ECC is a note, not a fault"),
        pytest.param(start_load_end({"retired_pending": True}), [Fault.ECC], id="pages pending retirement appeared"),
        pytest.param(
            start_load_end({"remapped_uncorrectable": 3}), [Fault.ROW_REMAP], id="new uncorrectable remapped row"
        ),
        pytest.param(start_load_end({"remap_pending": True}), [Fault.ROW_REMAP], id="remap became pending"),
        pytest.param(start_load_end({"remap_failed": True}), [Fault.ROW_REMAP], id="remap failed"),
        pytest.param(
            [Reading(**(BASE | {"remap_pending": True})), Reading(**LOAD), Reading(**(BASE | {"remap_pending": True}))],
            [],
            id="pending before the burn is the passive check's finding, not ours",
        ),
        pytest.param(
            [Reading(), Reading(**LOAD), Reading()],
            [],
            id="counters not supported (consumer GPU): nothing",
        ),
        pytest.param(
            [Reading(**BASE), Reading(lost=True)],
            [Fault.GPU_LOST],
            id="GPU lost during the burn",
        ),
    ],
)
def test_counter_changes(readings: list[Reading], faults: list[Fault]) -> None:
    assert [p.fault for p in run(readings).problems] == faults


@pytest.mark.parametrize(
    ("reasons", "share", "fails"),
    [
        pytest.param([0x8] * 2 + [0] * 8, 0.1, True, id="HW slowdown in 2 of 10 samples"),
        pytest.param([0x8] + [0] * 9, 0.1, False, id="1 of 10 is not more than 10%"),
        pytest.param([0x40] * 5 + [0] * 5, 0.1, True, id="HW thermal slowdown"),
        pytest.param([0x80] * 10, 0.1, True, id="power brake all along"),
        pytest.param([0x4] * 10, 0.1, False, id="SW power cap is normal under full load"),
        pytest.param([0x20] * 10, 0.1, False, id="SW thermal slowdown is not a hardware fault"),
        pytest.param([0x1] * 10, 0.1, False, id="idle"),
        pytest.param([0x8] * 10, 1.0, False, id="share 1.0 turns it off"),
    ],
)
def test_throttle_share(reasons: list[int], share: float, fails: bool) -> None:
    readings = [Reading(**(LOAD | {"clocks_event_reasons": r})) for r in reasons]
    problems = run(readings, share).problems
    assert [p.fault for p in problems] == ([Fault.THROTTLE] if fails else [])


def test_throttle_message_names_the_bits() -> None:
    readings = [Reading(**(LOAD | {"clocks_event_reasons": 0x8 | 0x80})) for _ in range(4)]
    [p] = run(readings).problems
    assert "hardware slowdown" in p.message and "hardware power brake" in p.message and "4 of 4" in p.message


def test_xids_and_hang() -> None:
    s = run(start_load_end({}), xids=(79, 79, 48), hung=12.0)
    assert [p.fault for p in s.problems] == [Fault.GPU_LOST, Fault.XID]
    assert "Xid 48, 79" in s.problems[1].message and "12s" in s.problems[0].message


def test_telemetry() -> None:
    readings = [Reading(**(LOAD | {"power_watts": w, "temperature_c": t})) for w, t in ((600.0, 60), (700.0, 75))]
    t = run(readings).telemetry
    assert (t.power_watts_mean, t.sm_clock_hz_mean, t.temperature_max_c, t.samples) == (650.0, 1980e6, 75, 2)


def test_no_readings_is_said() -> None:
    assert run([]).notes == ("no NVML readings during the burn",)
    assert "3 corrected" in run(start_load_end({"ecc_corrected": 6})).notes[0]


def test_real_pynvml_without_a_driver() -> None:
    import pynvml

    from agent.burn.model import GpuInfo
    from agent.burn.nvml_watch import NvmlInventory, NvmlWatch

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this host has an NVIDIA driver")
    assert NvmlInventory().gpus() is None
    assert NvmlInventory().processes() is None
    watch = NvmlWatch(throttle_share=0.1, interval=0.05)
    watch.start([GpuInfo(0)])
    [summary] = watch.stop(timeout=5).values()
    assert summary.problems == () and "NVML is not available" in " ".join(summary.notes)
