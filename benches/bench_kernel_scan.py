#!/usr/bin/env python3
"""The kernel-log scanner: the fault table against the Xid-only follower, in lines per second.

What the one kernel-log reader does per batch of 4,096 records, timed on
100,000 records at a time (CPU time of the thread, median and minimum of
`--repeat` runs, interleaved):

- ``read``: reading the records from a file of /dev/kmsg records (`agent.kmsg.Kmsg`),
  the same for every subscriber: the baseline of the follower;
- ``xid``: the Xid follower's work on them (`agent.gpu.xid_source.events_from`:
  the NVRM/SXid screen, the facility rule, the native parser);
- ``table``: the fault table's (`agent.kernel.source.messages` + `Table.scan`:
  the facility rule, the combined screen, the pattern that matched);
- ``table-py``: the same with the screen in Python instead (one alternation of
  every pattern, matched against each message: what the native screen
  replaced), for the native/Python decision;
- ``xid+table``: both;
- ``read+xid+table``: the follower's whole path per batch, as `agent run`
  runs it: the batch read with the fault table's screen in the same native
  pass (`Kmsg.read_batch(screen=…)`), then each subscriber's work: the
  records it has not seen (`agent.kmsg.unseen`, its cursor), the Xid events
  added to an `XidStream` (its deduplication), the faults added to a
  `FaultTracker` (`agent.kernel.source.faults`).

``xid``, ``table`` and ``xid+table`` run on the batches as the follower
reads them (`agent.kmsg.RecordBatch`), ``table-py`` on lists of records.

Four logs: ``quiet`` (a busy GPU node's ordinary kernel lines, no fault),
``faults-1%`` (1 % fault lines), ``xid-storm`` (60 % NVRM Xid lines, as
benches/bench_kmsg_storm.py) and ``fault-storm`` (50 % hung-task and
soft-lockup lines). The goal (issue 13): the follower with the full table
keeps up with 100,000 lines a second using under 10 % of one core; the
``% core`` column is the CPU share at that rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile

from _timing import measure

from agent import native
from agent.gpu.xid_source import events_from
from agent.gpu.xid_tracker import XidStream
from agent.kernel.faults import FaultTracker
from agent.kernel.patterns import DEFAULT
from agent.kernel.source import faults, messages
from agent.kmsg import BATCH, Kmsg, Record, RecordBatch, unseen

LINES = 100_000
ORDINARY = [
    "IPv6: ADDRCONF(NETDEV_CHANGE): veth{n:x}: link becomes ready",
    "cni0: port {n}(veth{n:x}) entered forwarding state",
    "device veth{n:x} entered promiscuous mode",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    'audit: type=1400 audit(1700000000.{n}:456): apparmor="DENIED" operation="open" profile="snap.lxd"',
    "mlx5_core 0000:3b:00.0: E-Switch: Total vports 2, per vport: max uc(1024) max mc(16384)",
    "mlx5_core 0000:{n:02x}:00.1: mlx5_cmd_out_err:838:(pid {n}): ACCESS_REG(0x805) op_mod(0x1) failed, status bad resource(0x5), syndrome (0x5a76d7), err(-22)",
    "nvme nvme0: 64/0/0 default/read/poll queues",
    "NVRM: GPU at PCI:0000:3b:00: GPU-6c1b7a44-7a5d-8f0e-3b3c-9d2a1f0e4c11",
    "nvidia-uvm: Loaded the UVM driver, major device number 511.",
    "TCP: request_sock_TCP: Possible SYN flooding on port {n}. Sending cookies.",
    "kauditd_printk_skb: {n} callbacks suppressed",
    "systemd-journald[812]: /dev/kmsg buffer overrun, some messages lost.",
    "Memory cgroup stats for /kubepods/burstable/pod{n:x}:",
    "br-{n:x}: port 1(veth{n:x}) entered blocking state",
]
FAULTS = [
    "INFO: task python3:{n} blocked for more than 122 seconds.",
    "watchdog: BUG: soft lockup - CPU#{c} stuck for 23s! [python3:{n}]",
    "Memory cgroup out of memory: Killed process {n} (python3) total-vm:98765432kB, anon-rss:87654321kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:936",
    "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x{n:x} offset:0x0 grain:32 syndrome:0x0)",
    "nvme nvme1: I/O {n} QID 4 timeout, aborting",
]
XIDS = [
    "NVRM: Xid (PCI:0000:{b:02x}:00): {x}, pid={n}, name=python3, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
]


def make_log(kind: str, rng: random.Random) -> list[str]:
    out = []
    for n in range(LINES):
        r = rng.random()
        if kind == "faults-1%" and r < 0.01 or kind == "fault-storm" and r < 0.5:
            tmpl = FAULTS[n % 2] if kind == "fault-storm" else rng.choice(FAULTS)
        elif kind == "xid-storm" and r < 0.6:
            tmpl = XIDS[0]
        else:
            tmpl = rng.choice(ORDINARY)
        msg = tmpl.format(n=n, c=n % 64, b=0x18 + 0x10 * (n % 8), x=(13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 109, 119)[n % 14])
        out.append(f"{3 if r < 0.5 else 6},{n},{5_000_000 + n * 10},-;{msg}")
    return out


def batches(path: str) -> list[RecordBatch]:
    """The batches the follower reads from `path`, screened for the fault table."""
    k = Kmsg(path)
    try:
        out = []
        while True:
            out.append(k.read_batch(screen=DEFAULT.screen))
            if len(out[-1]) < BATCH:
                return out
    finally:
        k.close()


def run_xid(parts: list[RecordBatch]) -> int:
    context: list[bytes] = []
    return sum(len(events_from(b, context, False, 0.0).events) for b in parts)


def run_table(parts: list[RecordBatch]) -> int:
    found = 0
    for b in parts:
        mine, foreign = faults(DEFAULT, b)
        found += len(mine) + len(foreign)
    return found


_ALTERNATION = re.compile(b"|".join(b"(?:" + p.pattern.encode() + b")" for p in DEFAULT.patterns))


def run_table_python(parts: list[list[Record]]) -> int:
    """The table with a Python screen: the alternation of every pattern on every message, then the first pattern."""
    found = 0
    for b in parts:
        texts = messages(b)
        hits = [i for i, m in enumerate(map(_ALTERNATION.match, texts)) if m is not None]
        found += len([m for m in DEFAULT.scan_regex_only([texts[i] for i in hits])])
    return found


def run_whole(path: str) -> tuple[int, int]:
    """The follower's whole path: read a batch (screened in the same pass), then the
    Xid subscriber's work and the kernel-fault subscriber's, each with its own cursor."""
    stream = XidStream(dedupe_window=10.0, app_hold=300.0, coverage_hold=600.0, overrides={},
                       subject_of=lambda pci, kind: (f"pci-{pci}", "unknown"))
    tracker = FaultTracker(DEFAULT)
    context: list[bytes] = []
    events = found = 0
    k = Kmsg(path)
    try:
        while True:
            batch = k.read_batch(screen=DEFAULT.screen)
            fresh, start = unseen(batch, stream)
            stream.records_read += len(fresh) - start
            for ev in events_from(fresh, context, False, 0.0, start).events:
                stream.add(ev)
                events += 1
            fresh, start = unseen(batch, tracker)
            mine, _ = faults(DEFAULT, fresh, start)
            for _rec, message, pattern in mine:
                tracker.add(pattern, message, 0.0)
                found += 1
            if len(batch) < BATCH:
                return events, found
    finally:
        k.close()


def run_read(path: str) -> int:
    k = Kmsg(path)
    try:
        n = 0
        while True:  # what the follower reads: batches, screened, no record made
            batch = k.read_batch(screen=DEFAULT.screen)
            n += len(batch)
            if len(batch) < BATCH:
                return n
    finally:
        k.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=9, help="runs of each (default 9)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = ap.parse_args()
    if native.IMPLEMENTATION != "native":
        print(f"bench_kernel_scan: native parsers not loaded: {native.describe()}", file=sys.stderr)
        return 2
    rng = random.Random(13)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("quiet", "faults-1%", "xid-storm", "fault-storm"):
            lines = make_log(kind, rng)
            path = os.path.join(tmp, kind)
            with open(path, "w") as fh:
                fh.write("\n".join(lines) + "\n")
            parts = batches(path)
            lists = [list(b) for b in parts]
            fns = {
                "read": lambda p=path: run_read(p),
                "xid": lambda p=parts: run_xid(p),
                "table": lambda p=parts: run_table(p),
                "table-py": lambda p=lists: run_table_python(p),
                "xid+table": lambda p=parts: (run_xid(p), run_table(p)),
                "read+xid+table": lambda p=path: run_whole(p),
            }
            counts = {"records": run_read(path), "xid_events": run_xid(parts), "faults": run_table(parts)}
            assert run_table_python(lists) == counts["faults"], kind
            assert run_whole(path)[1] <= counts["faults"], kind  # kernel-written only
            figs = measure(fns, args.repeat)
            results[kind] = counts | {
                name: {"ms_per_100k": f.median * 1e3 * 100_000 / LINES, "min_ms": f.minimum * 1e3 * 100_000 / LINES,
                       "lines_per_s": LINES / f.median, "core_percent_at_100k": f.median * 100_000 / LINES * 100}
                for name, f in figs.items()
            }
    if args.json:
        print(json.dumps({"repeat": args.repeat, "lines": LINES, "load": os.getloadavg()[0], "logs": results}, indent=2))
        return 0
    print(f"{LINES:,} records a run, CPU time, median of {args.repeat} (load average {os.getloadavg()[0]:.1f})")
    print(f"{'log':12} {'step':14} {'ms/100k':>9} {'min':>7} {'lines/s':>11} {'% core @100k/s':>15}")
    for kind, r in results.items():
        for name in ("read", "xid", "table", "table-py", "xid+table", "read+xid+table"):
            f = r[name]
            print(f"{kind:12} {name:14} {f['ms_per_100k']:9.1f} {f['min_ms']:7.1f} {f['lines_per_s']:11,.0f} {f['core_percent_at_100k']:14.1f}%")
        print(f"{'':12} ({r['records']:,} records, {r['xid_events']:,} Xid events, {r['faults']:,} faults)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
