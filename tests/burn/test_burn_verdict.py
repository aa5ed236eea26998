"""Cross-GPU verdicts: stragglers against the node median, expected figures
per model, digests compared within a group, NVML problems on the right GPU."""

from __future__ import annotations

import pytest

from agent.burn.model import Fault, GpuInfo, GpuOutcome, Problem
from agent.burn.verdict import Thresholds, WatchSummary, decide, digest_outliers, median_floor, stragglers

H100 = "NVIDIA H100 80GB HBM3"
T = 1e12


@pytest.mark.parametrize(
    ("values", "fraction", "slow"),
    [
        pytest.param(
            {0: 700, 1: 710, 2: 705, 3: 500}, 0.85, {3}, id="one slow of four (even count: median of the middle two)"
        ),
        pytest.param({0: 700, 1: 710, 2: 705}, 0.85, set(), id="all close"),
        pytest.param({0: 700}, 0.85, set(), id="a single GPU has no peers"),
        pytest.param({0: 700, 1: 300}, 0.85, {1}, id="two GPUs: median is their mean, 505; 300 < 429"),
        pytest.param({0: 700, 1: 600}, 0.85, set(), id="two GPUs within the fraction of their mean"),
        pytest.param({0: 700, 1: 710, 2: 705, 3: 500}, 0.0, set(), id="fraction 0 turns it off"),
        pytest.param({0: 100, 1: 100, 2: 100, 3: 100, 4: 100, 5: 100, 6: 100, 7: 84}, 0.85, {7}, id="84 below 85"),
        pytest.param(
            {0: 100, 1: 100, 2: 100, 3: 100, 4: 100, 5: 100, 6: 100, 7: 85}, 0.85, set(), id="exactly at floor"
        ),
        pytest.param({0: 100, 1: 10, 2: 10}, 0.85, set(), id="median 10: the fast one is no straggler"),
    ],
)
def test_stragglers(values: dict[int, float], fraction: float, slow: set[int]) -> None:
    assert set(stragglers(values, fraction)) == slow


@pytest.mark.parametrize(
    ("values", "fraction", "floor"),
    [
        pytest.param([1.0, 3.0], 0.5, 1.0, id="even"),
        pytest.param([1.0, 2.0, 9.0], 0.5, 1.0, id="odd"),
        pytest.param([5.0], 0.5, None, id="one value"),
        pytest.param([], 0.5, None, id="none"),
        pytest.param([1.0, 3.0], 0.0, None, id="off"),
    ],
)
def test_median_floor(values: list[float], fraction: float, floor: float | None) -> None:
    assert median_floor(values, fraction) == floor


def _o(i: int, digest: str = "aa", group: str = "g", flops: float | None = 700 * T, **kw: object) -> GpuOutcome:
    return GpuOutcome(i, gemm_flops=flops, memory_bandwidth=3000e9, digest=digest, group=group, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("outcomes", "bad"),
    [
        pytest.param([_o(0), _o(1), _o(2)], set(), id="all agree"),
        pytest.param([_o(0), _o(1), _o(2, "bb")], {2}, id="the odd one out fails"),
        pytest.param([_o(0), _o(1, "bb")], {0, 1}, id="a tie of two: both fail, we cannot tell which is wrong"),
        pytest.param([_o(0), _o(1), _o(2, "bb"), _o(3, "bb")], {0, 1, 2, 3}, id="two against two"),
        pytest.param([_o(0), _o(1, "bb", compute_errors=3)], {1}, id="a tie broken: one GPU's own checks failed"),
        pytest.param(
            [_o(0), _o(1, "bb", problems=(Problem(Fault.COMPUTE_MISMATCH, "C[1,2] = 9, the host computes 8"),))],
            {1},
            id="a tie broken by the host reference",
        ),
        pytest.param(
            [_o(0, compute_errors=1), _o(1, "bb", compute_errors=1)], {0, 1}, id="both convicted: both fail"
        ),
        pytest.param(
            [_o(0), _o(1), _o(2, "bb"), _o(3, "bb", compute_errors=1)], {2, 3}, id="the convicted do not vote"
        ),
        pytest.param([_o(0), _o(1, "bb", group="other model")], set(), id="different groups are not compared"),
        pytest.param([_o(0), _o(1, "")], set(), id="no digest (the GEMM did not run) is not compared"),
        pytest.param([_o(0)], set(), id="one GPU"),
    ],
)
def test_digest_outliers(outcomes: list[GpuOutcome], bad: set[int]) -> None:
    assert set(digest_outliers(outcomes)) == bad


def _gpus(n: int, name: str = H100) -> list[GpuInfo]:
    return [GpuInfo(i, uuid=f"GPU-{i}", name=name) for i in range(n)]


def test_decide_passes_healthy_gpus_and_carries_telemetry_and_notes() -> None:
    from agent.burn.model import Telemetry

    watch = {
        0: WatchSummary(telemetry=Telemetry(power_watts_mean=690.0, samples=3), notes=("2 corrected ECC error(s)",))
    }
    [v0, v1] = decide(_gpus(2), {0: _o(0), 1: _o(1)}, watch, Thresholds())
    assert (v0.status, v1.status) == ("pass", "pass")
    assert v0.telemetry.power_watts_mean == 690.0 and "2 corrected ECC error(s)" in v0.notes
    assert v0.name == H100 and v0.uuid == "GPU-0"


def test_decide_fails_the_straggler_with_its_numbers() -> None:
    outs = {i: _o(i) for i in range(7)} | {7: _o(7, flops=400 * T)}
    verdicts = decide(_gpus(8), outs, {}, Thresholds(straggler_fraction=0.85))
    assert [v.index for v in verdicts if v.status == "fail"] == [7]
    [p] = verdicts[7].problems
    assert p.fault is Fault.SLOW_GEMM and "400.0 TFLOP/s" in p.message and "700.0" in p.message


def test_stragglers_are_judged_per_model() -> None:
    gpus = [GpuInfo(0, name=H100), GpuInfo(1, name=H100), GpuInfo(2, name="NVIDIA A100-SXM4-80GB")]
    outs = {0: _o(0), 1: _o(1), 2: _o(2, flops=250 * T, group="a100")}
    assert all(v.status == "pass" for v in decide(gpus, outs, {}, Thresholds()))


@pytest.mark.parametrize(
    ("expected", "fails"),
    [
        pytest.param({H100: 600.0}, False, id="above the floor"),
        pytest.param({H100: 800.0}, True, id="below the floor"),
        pytest.param({"NVIDIA A100-SXM4-80GB": 800.0}, False, id="another model's floor does not apply"),
        pytest.param({}, False, id="none configured"),
    ],
)
def test_expected_figure_per_model(expected: dict[str, float], fails: bool) -> None:
    [v] = decide(_gpus(1), {0: _o(0)}, {}, Thresholds(expected_gemm_tflops=expected))
    assert (v.status == "fail") is fails
    if fails:
        assert v.problems[0].fault is Fault.SLOW_GEMM and "expected 800" in v.problems[0].message


def test_expected_memory_bandwidth() -> None:
    [v] = decide(_gpus(1), {0: _o(0)}, {}, Thresholds(expected_memory_gbps={H100: 3500.0}))
    assert v.status == "fail" and v.problems[0].fault is Fault.SLOW_MEMORY


def test_watch_problem_fails_only_its_gpu() -> None:
    watch = {2: WatchSummary(problems=(Problem(Fault.XID, "Xid 79 reported by NVML during the burn"),))}
    verdicts = decide(_gpus(4), {i: _o(i) for i in range(4)}, watch, Thresholds())
    assert [v.status for v in verdicts] == ["pass", "pass", "fail", "pass"]
    assert "GPU 2 (NVIDIA H100 80GB HBM3, GPU-2): xid: Xid 79" in verdicts[2].summary()


def test_untested_gpu_is_unknown_unless_something_failed_it() -> None:
    outs = {0: GpuOutcome(0, ran=False, notes=("MIG mode is on",)), 1: GpuOutcome(1, ran=False)}
    watch = {1: WatchSummary(problems=(Problem(Fault.GPU_LOST, "lost"),))}
    v0, v1, v2 = decide(_gpus(3), outs, watch, Thresholds())
    assert (v0.status, v1.status, v2.status) == ("unknown", "fail", "unknown")
    assert v2.notes == ("no result from the backend",)


def test_failed_gpus_are_left_out_of_the_median() -> None:
    outs = {0: _o(0), 1: _o(1), 2: GpuOutcome(2, problems=(Problem(Fault.TIMEOUT, "hung"),))}
    verdicts = decide(_gpus(3), outs, {}, Thresholds())
    assert [v.status for v in verdicts] == ["pass", "pass", "fail"]
    assert [p.fault for p in verdicts[2].problems] == [Fault.TIMEOUT]
