"""Benchmark of the GPU burn (needs an NVIDIA GPU and node-health-agent[gpu]).

    python benches/burn.py [--gpu 0] [--seconds 20] [--matrix-size 16384] [--repeat 3] [--json]

1. Burn throughput against plain cuBLAS on the same GPU, side by side: the
   same BF16 GEMM (16384³ by default) in a bare loop, then in the burn's loop
   (GEMM + digest + on-device compare), alternated `--repeat` times so that
   warm-up and heat affect both alike; medians and the ratio (goal ≥ 0.90).
2. The memory pattern test's bandwidth (bytes written + read per second).
3. Power, SM clock and temperature from NVML during each phase.
4. The agent's own overhead during a real `Runner.burn` on all GPUs: CPU
   seconds and peak RSS of the agent process (the workers are children and
   counted apart).

Each part runs in its own process (`--part`), so the comparison's CUDA
context does not count as the agent's memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from agent.burn.cublas import Cublas
from agent.burn.cuda import Device, ptr, u64
from agent.burn.gpuburn import SEED_A, SEED_B, Burn


def _setup(gpu: int) -> None:
    # Before CUDA initialises: this process sees exactly one GPU, counted like nvidia-smi.
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)


def _watch(gpu: int) -> Any:
    from agent.burn.model import GpuInfo
    from agent.burn.nvml_watch import NvmlWatch

    w = NvmlWatch(throttle_share=1.0, interval=0.25)
    w.start([GpuInfo(gpu)])
    return w


def _telemetry(watch: Any) -> dict[str, Any]:
    [s] = watch.stop(timeout=5).values()
    t = s.telemetry
    return {
        "power_w": t.power_watts_mean,
        "sm_clock_mhz": t.sm_clock_hz_mean / 1e6 if t.sm_clock_hz_mean else None,
        "temp_max_c": t.temperature_max_c,
        "problems": [p.message for p in s.problems],
    }


def plain_gemm(dev: Any, blas: Any, n: int, seconds: float) -> float:
    """FLOP/s of back-to-back cuBLAS GEMMs, nothing else on the stream."""
    burn = _burn(dev, blas)
    a, b, c = dev.alloc(2 * n * n), dev.alloc(2 * n * n), dev.alloc(4 * n * n)
    burn._launch("nha_fill_bf16", ptr(a), u64(n * n), u64(SEED_A))
    burn._launch("nha_fill_bf16", ptr(b), u64(n * n), u64(SEED_B))
    blas.gemm_bf16(n, a, b, c)  # warm-up: cuBLAS picks its kernel
    dev.sync()
    done, batch, t0 = 0, 1, time.monotonic()
    while time.monotonic() < t0 + seconds:
        t = time.monotonic()
        for _ in range(batch):
            blas.gemm_bf16(n, a, b, c)
        dev.sync()
        done += batch
        batch = max(1, min(batch * 4, int(batch * 0.5 / max(time.monotonic() - t, 1e-6))))
    elapsed = time.monotonic() - t0
    for p in (a, b, c):
        dev.free(p)
    return 2.0 * n**3 * done / elapsed


def _burn(dev: Any, blas: Any) -> Any:
    return Burn(dev, blas, lambda _event: None)


def side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    _setup(args.gpu)
    dev = Device(0)
    blas = Cublas(dev.stream_handle())
    rows: dict[str, list[Any]] = {"plain": [], "burn": [], "memory": [], "t_plain": [], "t_burn": [], "t_memory": []}
    for _ in range(args.repeat):
        w = _watch(args.gpu)
        rows["plain"].append(plain_gemm(dev, blas, args.matrix_size, args.seconds))
        rows["t_plain"].append(_telemetry(w))
        b, w = _burn(dev, blas), _watch(args.gpu)
        b.gemm(args.matrix_size, args.seconds)
        rows["t_burn"].append(_telemetry(w))
        rows["burn"].append(b.result.gemm_flops)
        assert b.result.compute_errors == 0 and not b.result.reference_errors, b.result
        w = _watch(args.gpu)
        b.memory(0.85, args.seconds / 2)
        rows["t_memory"].append(_telemetry(w))
        rows["memory"].append(b.result.memory_bandwidth)
    plain, burned = statistics.median(rows["plain"]), statistics.median(rows["burn"])
    return {
        "device": dev.name(),
        "matrix_size": args.matrix_size,
        "plain_tflops_median": plain / 1e12,
        "burn_tflops_median": burned / 1e12,
        "burn_over_plain": burned / plain,
        "memory_gbps_median": statistics.median(rows["memory"]) / 1e9,
        "runs": rows,
    }


def agent_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """The agent process during a real burn of every GPU (workers are children)."""
    from agent.burn.model import BurnPlan
    from agent.burn.runner import Runner, Settings
    from agent.hostpaths import HostPaths

    runner = Runner(Settings(plan=BurnPlan(seconds=args.seconds, matrix_size=args.matrix_size)), HostPaths())
    found = runner.discover()
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    report = runner.burn(found)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "gpus": len(report.gpus),
        "status": report.status,
        "wall_s": wall,
        "agent_cpu_s": cpu,
        "agent_cpu_share": cpu / wall,
        "agent_max_rss_mib": after.ru_maxrss / 1024,
        "workers_cpu_s": children.ru_utime + children.ru_stime,
        "worker_max_rss_mib": children.ru_maxrss / 1024,  # the largest worker
        "per_gpu": [
            {
                "gpu": g.index,
                "status": g.status,
                "tflops": (g.gemm_flops or 0) / 1e12,
                "memory_gbps": (g.memory_bandwidth or 0) / 1e9,
                "power_w": g.telemetry.power_watts_mean,
                "sm_clock_mhz": (g.telemetry.sm_clock_hz_mean or 0) / 1e6,
                "problems": [p.message for p in g.problems],
            }
            for g in report.gpus
        ],
    }


def report(out: dict[str, Any], args: argparse.Namespace) -> None:
    s = out["side_by_side"]
    print(f"{s['device']}, {s['matrix_size']}³ BF16 GEMM, medians of {args.repeat}:")
    print(
        f"  plain cuBLAS {s['plain_tflops_median']:.1f} TFLOP/s, burn {s['burn_tflops_median']:.1f} TFLOP/s, "
        f"ratio {s['burn_over_plain']:.3f} (goal ≥ 0.90)"
    )
    print(f"  memory test {s['memory_gbps_median']:.0f} GB/s")
    for phase in ("t_plain", "t_burn", "t_memory"):
        t = s["runs"][phase][-1]
        print(f"  {phase[2:]:7s} power {t['power_w']} W, SM clock {t['sm_clock_mhz']} MHz, max {t['temp_max_c']} °C")
    o = out["agent_overhead"]
    print(
        f"agent during a {args.seconds:.0f}s burn of {o['gpus']} GPU(s): {o['agent_cpu_s']:.2f} CPU s "
        f"({o['agent_cpu_share']:.1%} of one core), peak RSS {o['agent_max_rss_mib']:.0f} MiB; "
        f"workers {o['workers_cpu_s']:.1f} CPU s, largest {o['worker_max_rss_mib']:.0f} MiB RSS; result {o['status']}"
    )


def _part(args: argparse.Namespace, part: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--part",
        part,
        "--gpu",
        str(args.gpu),
        "--seconds",
        str(args.seconds),
        "--matrix-size",
        str(args.matrix_size),
        "--repeat",
        str(args.repeat),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", type=int, default=0, help="GPU for the side-by-side comparison (nvidia-smi index)")
    p.add_argument("--seconds", type=float, default=20.0, help="per phase and repetition")
    p.add_argument("--matrix-size", type=int, default=16384)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--part", choices=("all", "side", "overhead"), default="all")
    args = p.parse_args()
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
    except OSError:
        print("benches/burn.py needs an NVIDIA GPU and driver (libcuda.so.1 not found)", file=sys.stderr)
        return 2
    if args.part != "all":
        part = side_by_side(args) if args.part == "side" else agent_overhead(args)
        json.dump(part, sys.stdout, default=str)
        return 0
    out = {"side_by_side": _part(args, "side"), "agent_overhead": _part(args, "overhead")}
    if args.json:
        json.dump(out, sys.stdout, indent=2, default=str)
        print()
        return 0
    report(out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
