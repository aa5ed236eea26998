"""GPU benchmarks (figures in docs/gpu.md):

  1. the native vs the Python Xid parser on 100,000 kernel log lines;
  2. the CPU cost of one NVML poll of 8 GPUs (the fake libnvidia-ml.so.1);
  3. the CPU cost of one telemetry poll of 8 GPUs (goal ≤ 10 ms);
  4. the latency from an Xid line appended to the followed log to the finding;
  5. /metrics latency of `agent run` with 8 fake GPUs, before and while every
     NVML field-values call hangs (goal: the p99 does not move).

Run: ``python benches/bench_gpu.py`` (needs gcc for the fake NVML). Timings
on a shared machine are noisy: medians and ratios, not single runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # conftest
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))
sys.path.insert(0, os.path.dirname(__file__))  # _agent

from fakenvml import Scenario, build, h100  # noqa: E402

from agent import native  # noqa: E402
from agent.check import CheckContext  # noqa: E402
from agent.config import parse  # noqa: E402
from agent.hostpaths import HostPaths  # noqa: E402
from agent.parsers import xid as twin  # noqa: E402

LINES = [
    b"[ 1843.308145] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    b"[ 1843.400000] usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    b"[ 1843.500000] EXT4-fs (md127p3): re-mounted. Quota mode: none.",
    b"[ 1843.600000] mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
    b"[ 1843.700000] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    b"[ 1843.800000] audit: type=1400 audit(1422097665.398:66): apparmor=\"STATUS\" operation=\"profile_replace\"",
    b"[ 1843.900000] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt",
    b"[ 1844.000000] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x56:1474)",
    b"[ 1844.100000] systemd[1]: Started session-4.scope.",
    b"[ 1844.200000] NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
]


def median_time(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def bench_parser() -> None:
    assert native.IMPLEMENTATION == "native", native.describe()
    noise = [line for line in LINES if b"NVRM" not in line and b"SXid" not in line]
    events = [line for line in LINES if line not in noise]
    mixes = {
        "2% NVIDIA events (a busy node's log)": [events[i % len(events)] if i % 50 == 0 else noise[i % len(noise)] for i in range(100_000)],
        "60% NVIDIA events (an Xid storm)": [LINES[i % len(LINES)] for i in range(100_000)],
    }
    for name, lines in mixes.items():
        data = b"\n".join(lines)
        assert native.parse_xid(data) == twin.parse(data)
        n = median_time(lambda: native.parse_xid(data), 21)
        p = median_time(lambda: twin.parse(data), 7)
        print(f"parser, 100,000 lines, {name}: native {n * 1e3:.1f} ms, python {p * 1e3:.1f} ms, ratio {p / n:.1f}x")


def context(tmp: str, lib: str, extra: str = "") -> tuple[CheckContext, object]:
    proc = os.path.join(tmp, "proc")
    os.makedirs(os.path.join(proc, "sys/kernel/random"), exist_ok=True)
    with open(os.path.join(proc, "sys/kernel/random/boot_id"), "w") as fh:
        fh.write("bench\n")
    cfg = parse(f'[paths]\nprocfs = "{proc}"\nsysfs = "{tmp}/sys"\n[checks.gpu]\nnvml_library = "{lib}"\n{extra}', "bench")
    state = os.path.join(tmp, "state")
    os.makedirs(state, exist_ok=True)
    return CheckContext(HostPaths(procfs=proc, sysfs=f"{tmp}/sys"), state, cfg), cfg.checks["gpu"]


def bench_poll(tmp: str, lib: str) -> None:
    from agent.checks.gpu import GpuCheck

    Scenario(os.environ["FAKE_NVML_SCENARIO"]).set([h100(i) for i in range(8)])
    ctx, cfg = context(tmp, lib, "xid_events = false\n")
    check = GpuCheck(ctx, cfg)
    check.run()  # first poll discovers NVLinks and thresholds
    cpu, wall = [], []
    for _ in range(30):
        c0, w0 = time.process_time(), time.perf_counter()
        obs = check.run()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    assert not obs.findings, obs.findings
    print(f"NVML poll of 8 GPUs (18 NVLinks each, {len(obs.samples)} samples): "
          f"CPU {statistics.median(cpu) * 1e3:.1f} ms, wall {statistics.median(wall) * 1e3:.1f} ms (median of 30)")


def bench_telemetry(tmp: str, lib: str) -> None:
    from agent.checks.gpu_telemetry import GpuTelemetryCheck

    Scenario(os.environ["FAKE_NVML_SCENARIO"]).set([h100(i) for i in range(8)])
    ctx, _ = context(tmp, lib, "xid_events = false\n")
    check = GpuTelemetryCheck(ctx, ctx.config.checks["gpu_telemetry"])  # type: ignore[attr-defined]
    check.run()  # the first poll counts NVLinks and takes the first GPM sample
    cpu, wall = [], []
    for _ in range(50):
        c0, w0 = time.process_time(), time.perf_counter()
        obs = check.run()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    assert not obs.findings, obs.findings
    print(f"telemetry poll of 8 GPUs (18 NVLinks each, GPM, {len(obs.samples)} samples): "
          f"CPU {statistics.median(cpu) * 1e3:.1f} ms (min {min(cpu) * 1e3:.1f}), wall {statistics.median(wall) * 1e3:.1f} ms (median of 50)")


def bench_scrape_during_hang(tmp: str, lib: str, scrapes: int) -> None:
    from _agent import running_agent

    scenario = Scenario(os.environ["FAKE_NVML_SCENARIO"]).set([h100(i) for i in range(8)])
    config = os.path.join(tmp, "hang.toml")
    with open(config, "w") as fh:
        fh.write(f'[checks.gpu]\ninterval = "2s"\nnvml_library = "{lib}"\nxid_events = false\n'
                 '[checks.gpu_telemetry]\ninterval = "1s"\ncall_timeout = "500ms"\n[checks.traffic]\nenabled = false\n')

    def scrape_times(agent, n: int) -> list[float]:  # type: ignore[no-untyped-def]
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            code, _ = agent.get("/metrics")
            out.append(time.perf_counter() - t0)
            assert code == 200
            time.sleep(0.01)
        return sorted(out)

    def until(agent, text: bytes) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 60
        while text not in agent.get("/metrics")[1]:
            assert time.monotonic() < deadline, text
            time.sleep(0.2)

    with running_agent(config) as agent:
        until(agent, b'node_health_gpu_power_watts{gpu="7"}')
        before = scrape_times(agent, scrapes)
        scenario.set(**{"hang.nvmlDeviceGetFieldValues": 600})
        until(agent, b'node_health_gpu_telemetry_up{gpu="7"} 0.0')
        during = scrape_times(agent, scrapes)
        hung = b'node_health_gpu_telemetry_up{gpu="7"} 0.0' in agent.get("/metrics")[1]
    for name, lat in (("before the hang", before), ("while NVML hangs", during)):
        print(f"/metrics with 8 fake GPUs, {name}: median {statistics.median(lat) * 1e3:.1f} ms, "
              f"p99 {lat[int(len(lat) * 0.99) - 1] * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms ({len(lat)} scrapes)")
    print(f"  telemetry still hung after the scrapes: {hung}")


def bench_latency(tmp: str, lib: str) -> None:
    from agent.gpu.xid_source import XidSource

    Scenario(os.environ["FAKE_NVML_SCENARIO"]).set([])
    log = os.path.join(tmp, "kmsg")
    open(log, "w").close()
    ctx, cfg = context(tmp, lib, f'kmsg_path = "{log}"\napp_xid_hold = "1h"\n')
    seen = threading.Condition()
    counts = {"n": 0.0}

    def emit(findings, samples) -> None:  # type: ignore[no-untyped-def]
        with seen:
            counts["n"] = sum(s.value for s in samples if s.name == "node_health_gpu_xid_errors_total")
            seen.notify_all()

    src = XidSource(ctx, cfg)
    src.start(emit)
    lat = []
    try:
        for i in range(200):
            with open(log, "a") as fh:
                t0 = time.perf_counter()
                fh.write(f"4,{i},{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, bench\n")
            with seen:
                assert seen.wait_for(lambda i=i: counts["n"] >= i + 1, 10)
            lat.append(time.perf_counter() - t0)
    finally:
        src.stop()
    lat.sort()
    print(f"Xid line appended to the followed file -> finding: median {statistics.median(lat) * 1e3:.1f} ms, "
          f"p99 {lat[int(len(lat) * 0.99) - 1] * 1e3:.1f} ms (200 lines)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("parser", "poll", "telemetry", "latency", "hang"), help="run one benchmark")
    ap.add_argument("--scrapes", type=int, default=300, help="scrapes before and during the hang (default 300)")
    args = ap.parse_args()
    if args.only in (None, "parser"):
        bench_parser()
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp)
        os.environ["FAKE_NVML_SCENARIO"] = os.path.join(tmp, "scenario.txt")
        for name, fn in (("poll", bench_poll), ("telemetry", bench_telemetry), ("latency", bench_latency)):
            if args.only in (None, name):
                fn(tmp, lib)
        if args.only in (None, "hang"):
            bench_scrape_during_hang(tmp, lib, args.scrapes)


if __name__ == "__main__":
    main()
