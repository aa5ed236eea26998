"""From what the backend measured and what NVML saw to a verdict per GPU.

Cross-GPU checks live here, because only here are all GPUs known at once:

- digests: cuBLAS gives bitwise-identical results for the same inputs "on
  GPUs with the same architecture and the same number of SMs" while one
  stream is active (https://docs.nvidia.com/cuda/cublas/#results-reproducibility),
  so GPUs are compared within a group (model, SM count, matrix size). Only
  GPUs that passed their own checks (no iteration mismatch, host reference
  matched) vote: the majority digest among them is the reference and a GPU
  that differs fails; a tie fails every GPU in it (we cannot tell which one
  computed wrong);
- stragglers: a GPU below `straggler_fraction` of the median of its group
  (same model) fails as slow; a single GPU has no peers to be compared with;
- expected figures per model, where configured, are floors.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .model import Fault, GpuInfo, GpuOutcome, GpuVerdict, Problem, Status, Telemetry


@dataclass(frozen=True, slots=True)
class Thresholds:
    straggler_fraction: float = 0.85  # 0 turns the node-median comparison off
    expected_gemm_tflops: Mapping[str, float] = field(default_factory=dict)  # model name → floor
    expected_memory_gbps: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WatchSummary:
    problems: tuple[Problem, ...] = ()
    telemetry: Telemetry = field(default_factory=Telemetry)
    notes: tuple[str, ...] = ()


def median_floor(values: Sequence[float], fraction: float) -> float | None:
    """The slowest acceptable value: `fraction` of the median; None when there
    is nothing to compare with (fewer than two values, or the check is off)."""
    if fraction <= 0 or len(values) < 2:
        return None
    return fraction * statistics.median(values)


def stragglers(values: Mapping[int, float], fraction: float) -> dict[int, tuple[float, float]]:
    """GPU index → (its value, the node median) for each GPU below `fraction` × median."""
    floor = median_floor(list(values.values()), fraction)
    if floor is None:
        return {}
    med = statistics.median(values.values())
    return {i: (v, med) for i, v in values.items() if v < floor}


def digest_outliers(outcomes: Iterable[GpuOutcome]) -> dict[int, str]:
    """GPU index → message for GPUs whose first-iteration digest disagrees with their group."""
    groups: dict[str, list[GpuOutcome]] = {}
    for o in outcomes:
        if o.digest:
            groups.setdefault(o.group, []).append(o)
    out: dict[int, str] = {}
    for members in groups.values():
        if len({o.digest for o in members}) < 2:
            continue
        # A GPU already convicted by its own checks has an untrustworthy digest:
        # it does not vote (so one good GPU beside one bad one is not a tie).
        voters = [o for o in members if not _own_compute_fault(o)] or members
        ranked = Counter(o.digest for o in voters).most_common()
        top = ranked[0][1]
        winners = [d for d, n in ranked if n == top]
        for o in members:
            if len(winners) == 1 and o.digest == winners[0]:
                continue
            others = sorted(m.index for m in members if m.digest != o.digest)
            out[o.index] = (
                f"GEMM result digest {o.digest[:16]} differs from GPU(s) {', '.join(map(str, others))} "
                "given the same inputs"
            )
    return out


def _own_compute_fault(o: GpuOutcome) -> bool:
    return o.compute_errors > 0 or any(p.fault is Fault.COMPUTE_MISMATCH for p in o.problems)


def _slow(gpus: Mapping[int, GpuInfo], outcomes: Mapping[int, GpuOutcome], th: Thresholds) -> dict[int, list[Problem]]:
    out: dict[int, list[Problem]] = {}
    specs = (
        (Fault.SLOW_GEMM, "gemm_flops", th.expected_gemm_tflops, 1e12, "TFLOP/s"),
        (Fault.SLOW_MEMORY, "memory_bandwidth", th.expected_memory_gbps, 1e9, "GB/s"),
    )
    for fault, attr, expected, unit, label in specs:
        by_model: dict[str, dict[int, float]] = {}
        for i, o in outcomes.items():
            value = getattr(o, attr)
            if value is not None:
                by_model.setdefault(gpus[i].name, {})[i] = value
        for model, values in by_model.items():
            for i, (v, med) in stragglers(values, th.straggler_fraction).items():
                out.setdefault(i, []).append(
                    Problem(
                        fault,
                        f"{v / unit:.1f} {label} is below {th.straggler_fraction:.0%} of the node median "
                        f"{med / unit:.1f} {label} for {model or 'this model'}",
                    )
                )
            floor = expected.get(model)
            if floor is None:
                continue
            for i, v in values.items():
                if v < floor * unit:
                    out.setdefault(i, []).append(
                        Problem(fault, f"{v / unit:.1f} {label} is below the expected {floor:g} {label} for {model}")
                    )
    return out


def decide(
    gpus: Sequence[GpuInfo],
    outcomes: Mapping[int, GpuOutcome],
    watched: Mapping[int, WatchSummary],
    th: Thresholds,
) -> list[GpuVerdict]:
    """One verdict per GPU in `gpus`: fail on any problem, unknown when the GPU
    was not tested (and nothing else failed it), pass otherwise."""
    info = {g.index: g for g in gpus}
    tested = {i: o for i, o in outcomes.items() if o.ran and i in info}
    digests = digest_outliers(tested.values())
    slow = _slow(info, tested, th)
    verdicts = []
    for g in gpus:
        o = outcomes.get(g.index) or GpuOutcome(g.index, ran=False, notes=("no result from the backend",))
        w = watched.get(g.index, WatchSummary())
        problems = list(o.problems)
        if g.index in digests:
            problems.append(Problem(Fault.COMPUTE_MISMATCH, digests[g.index]))
        problems += slow.get(g.index, [])
        problems += w.problems
        status: Status = "fail" if problems else ("pass" if o.ran else "unknown")
        verdicts.append(
            GpuVerdict(
                index=g.index,
                status=status,
                name=g.name,
                uuid=g.uuid,
                gemm_flops=o.gemm_flops,
                memory_bandwidth=o.memory_bandwidth,
                compute_errors=o.compute_errors,
                memory_errors=o.memory_errors,
                problems=tuple(problems),
                notes=o.notes + w.notes,
                telemetry=w.telemetry,
            )
        )
    return verdicts
