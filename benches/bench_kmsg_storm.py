#!/usr/bin/env python3
"""An Xid storm through the whole kernel-log follower of `agent run`.

Starts `agent run` as a subprocess against a fixture host with 8 NVIDIA GPUs
(fake /sys, the fake libnvidia-ml.so.1 of the tests with 8 H100s when gcc is
there) whose `checks.gpu.kmsg_path` and `checks.kernel.kmsg_path` are one
regular file (or, with --feed fifo, a FIFO): one reader, the Xid follower and
the kernel-fault table subscribed to it, as on a node. Then it appends
--records /dev/kmsg records (default 200,000; 60 % NVRM Xid lines over 8 GPUs
and 14 Xids, the rest ordinary kernel lines; ``--xid-share 0`` for a storm of
ordinary lines) at about --rate records per second (default 100,000), while
another thread scrapes /metrics every --scrape-interval seconds and samples
the agent's RSS. The agent's CPU time is reported as a share of one core at
100,000 records a second.

Goals (issue 17 item 7): every record read within 5 s of the last write, RSS
growth (peak VmRSS during the storm minus VmRSS before it) at most 20 MB,
every scrape during the storm at most 50 ms, and every Xid counted once
(`node_health_gpu_xid_errors_total` sums to the number of Xid lines).
Exit 0 when all four hold, 1 otherwise.

Run from the repository root with the virtual environment active:
``python benches/bench_kmsg_storm.py`` (``--json`` for one JSON object).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # conftest
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

from _agent import Agent, free_port  # noqa: E402

GPUS = [f"0000:{0x18 + 0x10 * i:02x}:00" for i in range(8)]  # the buses of fakenvml.h100(i)
XIDS = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 94)
BODIES = {
    13: "pid=2231, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: "pid=2231, name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3c_8e000000",
    43: "pid=2231, name=python3, Ch 00000010",
    45: "pid=2231, name=python3, Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x1f0000000",
    61: "pid='<unknown>', name=<unknown>, Internal micro-controller breakpoint/warning (0x40d00)",
    62: "Internal micro-controller halt (0x2)",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper Error: uncorrectable error on a row that is already remapped",
    68: "pid=2231, name=python3, NVDEC0 Exception: Invalid params",
    69: "pid=2231, name=python3, Class Error: ChId 0010, Class 0000c7c0, Offset 00000000, Data 00000000",
    74: "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
}
NOISE = (
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "EXT4-fs (md127p3): re-mounted. Quota mode: none.",
    "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
    'audit: type=1400 audit(1422097665.398:66): apparmor="STATUS" operation="profile_replace"',
    "IPv6: ADDRCONF(NETDEV_CHANGE): cali1a2b3c4d5e6: link becomes ready",
)
GOALS = {"catch_up_s": 5.0, "rss_growth_MB": 20.0, "scrape_max_ms": 50.0}


def records(n: int, xid_share: float) -> tuple[list[bytes], int]:
    """`n` kmsg records (one line each, as the tests feed them) and how many are Xid lines."""
    out, xids = [], 0
    for seq in range(n):
        usec = 5_000_000 + seq * 10
        if int((seq + 1) * xid_share) == int(seq * xid_share):  # 0.6: 3 lines of every 5 are Xids
            out.append(f"6,{seq},{usec},-;{NOISE[seq % len(NOISE)]}\n".encode())
            continue
        xid, gpu = XIDS[xids % len(XIDS)], GPUS[(xids // len(XIDS)) % len(GPUS)]
        out.append(f"3,{seq},{usec},-;NVRM: Xid (PCI:{gpu}): {xid}, {BODIES[xid]}\n".encode())
        xids += 1
    return out, xids


def host_tree(root: str) -> tuple[str, str]:
    proc, sysfs = os.path.join(root, "proc"), os.path.join(root, "sys")
    os.makedirs(os.path.join(proc, "sys/kernel/random"))
    with open(os.path.join(proc, "sys/kernel/random/boot_id"), "w") as fh:
        fh.write("6c1f2a3e-bench-4c0b-9a55-000000000001\n")
    for name in ("self/mountinfo", "net/dev"):
        os.makedirs(os.path.dirname(os.path.join(proc, name)), exist_ok=True)
        with open(os.path.join("/proc", name), "rb") as src, open(os.path.join(proc, name), "wb") as dst:
            dst.write(src.read())
    driver = os.path.join(sysfs, "bus/pci/drivers/nvidia")
    os.makedirs(driver)
    for pci in GPUS:
        dev = os.path.join(sysfs, "bus/pci/devices", f"{pci}.0")
        os.makedirs(dev)
        for name, value in (("vendor", "0x10de"), ("class", "0x030200")):
            with open(os.path.join(dev, name), "w") as fh:
                fh.write(value + "\n")
        os.symlink(driver, os.path.join(dev, "driver"))
    return proc, sysfs


def fake_nvml(root: str) -> tuple[str, dict[str, str]]:
    """The fake library with 8 H100s, or ("", {}) without gcc (then NVML is unavailable)."""
    try:
        from fakenvml import Scenario, build, h100
    except ImportError:
        return "", {}
    try:
        lib = build(root)
    except (FileNotFoundError, subprocess.CalledProcessError):
        return "", {}
    scenario = os.path.join(root, "scenario.txt")
    Scenario(scenario).set([h100(i) for i in range(8)])
    return lib, {"FAKE_NVML_SCENARIO": scenario}


@dataclass
class Scrapes:
    """What the scraper thread saw: (start time, seconds, records read, VmRSS kB)."""

    rows: list[tuple[float, float, float, int]] = field(default_factory=list)
    last_text: str = ""


_READ = re.compile(r"^node_health_kmsg_records_read_total (\S+)$", re.M)
_XIDS = re.compile(r"^node_health_gpu_xid_errors_total\{[^}]*\} (\S+)$", re.M)
_KMSG_EVENTS = re.compile(r'^node_health_gpu_xid_source_events_total\{source="kmsg"\} (\S+)$', re.M)


def metric(pattern: re.Pattern[str], text: str) -> float:
    return sum(float(v) for v in pattern.findall(text))


def scraper(agent: Agent, interval: float, stop: threading.Event, out: Scrapes) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        code, body = agent.get("/metrics")
        took = time.monotonic() - t0
        text = body.decode()
        if code == 200:
            out.rows.append((t0, took, metric(_READ, text), agent.status().get("VmRSS", 0)))
            out.last_text = text
        stop.wait(max(0.0, interval - took))


def feed(path: str, lines: list[bytes], rate: float, chunk: int) -> tuple[float, float]:
    """Writes `lines` at about `rate` lines/s in chunks; returns (first, last) write times."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        start = time.monotonic()
        first = last = start
        for i in range(0, len(lines), chunk):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            data = b"".join(lines[i : i + chunk])
            while data:
                data = data[os.write(fd, data) :]
            last = time.monotonic()
            if i == 0:
                first = last
        return first, last
    finally:
        os.close(fd)


def run(args: argparse.Namespace) -> dict[str, object]:
    lines, n_xids = records(args.records, args.xid_share)
    with tempfile.TemporaryDirectory(prefix="nha-storm-") as root:
        proc, sysfs = host_tree(root)
        lib, env = fake_nvml(root) if not args.no_nvml else ("", {})
        kmsg = os.path.join(root, "kmsg")
        if args.feed == "fifo":
            os.mkfifo(kmsg)
        else:
            open(kmsg, "w").close()
        port = free_port()
        cfg = os.path.join(root, "agent.toml")
        with open(cfg, "w") as fh:
            fh.write(
                f'[agent]\nstate_dir = "{root}/state"\n[paths]\nprocfs = "{proc}"\nsysfs = "{sysfs}"\n'
                f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
                "[checks.traffic]\nenabled = false\n[checks.disk]\nenabled = false\n[checks.network]\nenabled = false\n"
                f'[checks.gpu]\nnvml_library = "{lib or root + "/absent/libnvidia-ml.so.1"}"\nkmsg_path = "{kmsg}"\n'
                f'[checks.kernel]\nkmsg_path = "{kmsg}"\n'  # the fault table on the same reader, as on a node
            )
        cmd = [sys.executable, "-m", "agent", "run", "--config", cfg, "--log-format", "json", "--log-level", "warning"]
        log = open(os.path.join(root, "agent.log"), "wb")
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **env})
        agent = Agent(p.pid, f"http://127.0.0.1:{port}")
        try:
            result = measure(args, agent, p, kmsg, lines, n_xids, root)
            result["nvml"] = "fake, 8 H100" if lib else "absent"
            return result
        finally:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()


def measure(
    args: argparse.Namespace, agent: Agent, p: subprocess.Popen[bytes], kmsg: str, lines: list[bytes], n_xids: int, root: str
) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while True:
        if p.poll() is not None:
            with open(os.path.join(root, "agent.log"), "rb") as fh:
                raise RuntimeError(f"agent exited with {p.returncode}: {fh.read().decode()[-2000:]}")
        try:
            code, body = agent.get("/metrics")
            if code == 200 and _READ.search(body.decode()):
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("agent not up after 60 s")
        time.sleep(0.1)
    idle, stop = Scrapes(), threading.Event()
    t = threading.Thread(target=scraper, args=(agent, args.scrape_interval, stop, idle), daemon=True)
    t.start()
    time.sleep(args.settle)
    stop.set()
    t.join()
    rss_before = agent.status()["VmRSS"]
    cpu_before = agent.cpu_seconds()
    threads_before = agent.thread_cpu_seconds()
    scrapes, stop = Scrapes(), threading.Event()
    t = threading.Thread(target=scraper, args=(agent, args.scrape_interval, stop, scrapes), daemon=True)
    t.start()
    first, last = feed(kmsg, lines, args.rate, args.chunk)
    caught = None
    cpu_at_catch_up = agent.cpu_seconds()
    threads_at_catch_up = agent.thread_cpu_seconds()
    give_up = last + args.timeout
    while time.monotonic() < give_up:
        done = [r for r in scrapes.rows if r[2] >= len(lines)]
        if done:
            caught = done[0][0]
            break
        cpu_at_catch_up = agent.cpu_seconds()
        threads_at_catch_up = agent.thread_cpu_seconds()
        time.sleep(0.05)
    cpu = agent.cpu_seconds() - cpu_before if caught is None else cpu_at_catch_up - cpu_before
    if caught is None:
        threads_at_catch_up = agent.thread_cpu_seconds()
    # the busiest thread during the storm: the kernel-log follower (its reading and both subscribers' work)
    follower = max(t - threads_before.get(tid, 0.0) for tid, t in threads_at_catch_up.items())
    stop.set()
    t.join()
    time.sleep(args.settle)
    rss_after = agent.status()["VmRSS"]
    hwm = agent.status()["VmHWM"]
    code, body = agent.get("/metrics")
    text = body.decode()
    storm = [r for r in scrapes.rows if r[0] >= first and (caught is None or r[0] <= caught)]
    lat = sorted(r[1] for r in storm) or [0.0]
    idle_lat = sorted(r[1] for r in idle.rows) or [0.0]
    rss_peak = max([r[3] for r in scrapes.rows] + [rss_after])
    result: dict[str, object] = {
        "records": len(lines),
        "xid_lines": n_xids,
        "feed": args.feed,
        "write_s": round(last - first, 3),
        "write_rate": round(len(lines) / max(last - first, 1e-9)),
        "catch_up_s": None if caught is None else round(max(0.0, caught - last), 3),
        "agent_cpu_s": round(cpu, 2),  # the agent's CPU time (all threads, scrapes included) from the first write to catch-up
        "core_percent_at_100k": round(cpu / (len(lines) / 100_000) * 100, 1),  # that CPU time per 100,000 records
        "follower_cpu_s": round(follower, 2),  # the busiest thread's CPU time over the same span
        "follower_core_percent_at_100k": round(follower / (len(lines) / 100_000) * 100, 1),
        "load_avg": os.getloadavg()[0],
        "records_read": metric(_READ, text),
        "xids_counted": metric(_XIDS, text),
        "kmsg_events": metric(_KMSG_EVENTS, text),
        "scrapes": len(storm),
        "scrape_ms": {
            "median": round(statistics.median(lat) * 1e3, 1),
            "p99": round(lat[max(0, int(len(lat) * 0.99) - 1)] * 1e3, 1),
            "max": round(lat[-1] * 1e3, 1),
        },
        "idle_scrape_ms": {
            "median": round(statistics.median(idle_lat) * 1e3, 1),
            "max": round(idle_lat[-1] * 1e3, 1),
        },
        "rss_MB": {
            "before": round(rss_before / 1024, 1),
            "peak": round(rss_peak / 1024, 1),
            "after": round(rss_after / 1024, 1),
            "hwm": round(hwm / 1024, 1),
        },
    }
    result["rss_growth_MB"] = round((rss_peak - rss_before) / 1024, 1)
    with open(os.path.join(root, "agent.log"), "rb") as fh:
        agent_log = fh.read()
    result["agent_log_lines"] = agent_log.count(b"\n")
    if args.log:
        with open(args.log, "wb") as fh:
            fh.write(agent_log)
    result["ok"] = {
        "catch_up": caught is not None and result["catch_up_s"] <= GOALS["catch_up_s"],  # type: ignore[operator]
        "rss": result["rss_growth_MB"] <= GOALS["rss_growth_MB"],  # type: ignore[operator]
        "scrapes": result["scrape_ms"]["max"] <= GOALS["scrape_max_ms"],  # type: ignore[index]
        "counted": result["records_read"] == len(lines) and result["xids_counted"] == n_xids,
    }
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000, help="kmsg records to write (default 200,000)")
    ap.add_argument("--rate", type=float, default=100_000, help="records per second (default 100,000)")
    ap.add_argument("--xid-share", type=float, default=0.6, help="share of NVRM Xid lines (default 0.6)")
    ap.add_argument("--chunk", type=int, default=1000, help="records per write() (default 1,000: one every 10 ms)")
    ap.add_argument("--feed", choices=("file", "fifo"), default="file", help="kmsg_path is a regular file (default) or a FIFO")
    ap.add_argument("--scrape-interval", type=float, default=0.1, help="seconds between scrapes (default 0.1)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before the storm and after it (default 3)")
    ap.add_argument("--timeout", type=float, default=180.0, help="give up this long after the last write (default 180 s)")
    ap.add_argument("--no-nvml", action="store_true", help="no fake NVML (NVML unavailable in the agent)")
    ap.add_argument("--log", metavar="FILE", help="keep the agent's log (JSON lines) in FILE")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a summary")
    args = ap.parse_args()
    r = run(args)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        ok = r["ok"]
        print(f"{r['records']:,} records ({r['xid_lines']:,} Xid lines) written in {r['write_s']} s "
              f"({r['write_rate']:,}/s, {r['feed']}, NVML {r['nvml']})")
        print(f"  all read {r['catch_up_s']} s after the last write (goal <= 5 s): {'ok' if ok['catch_up'] else 'MISSED'}")  # type: ignore[index]
        s = r["scrape_ms"]
        print(f"  scrapes during the storm: {r['scrapes']}, median {s['median']} ms, p99 {s['p99']} ms, "  # type: ignore[index]
              f"max {s['max']} ms (goal <= 50 ms): {'ok' if ok['scrapes'] else 'MISSED'}")  # type: ignore[index]
        i = r["idle_scrape_ms"]
        print(f"  scrapes before the storm: median {i['median']} ms, max {i['max']} ms")  # type: ignore[index]
        m = r["rss_MB"]
        print(f"  RSS before {m['before']} MB, peak {m['peak']} MB, after {m['after']} MB, HWM {m['hwm']} MB: "  # type: ignore[index]
              f"growth {r['rss_growth_MB']} MB (goal <= 20 MB): {'ok' if ok['rss'] else 'MISSED'}")  # type: ignore[index]
        print(f"  counted: {r['records_read']:,.0f} records read, {r['xids_counted']:,.0f} Xids, "
              f"{r['kmsg_events']:,.0f} kmsg events: {'ok' if ok['counted'] else 'MISSED'}")  # type: ignore[index]
        print(f"  agent CPU from the first write to catch-up: {r['agent_cpu_s']} s, {r['core_percent_at_100k']} % of one core "
              f"at 100,000 records/s; its busiest thread (the follower): {r['follower_cpu_s']} s, "
              f"{r['follower_core_percent_at_100k']} % (load average {r['load_avg']:.1f})")
        print(f"  agent log: {r['agent_log_lines']} lines")
    return 0 if all(r["ok"].values()) else 1  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
