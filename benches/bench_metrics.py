#!/usr/bin/env python3
"""`/metrics` render time with about 2,000 series (goal: 5 ms or less).

Builds a `Store` as a busy GPU node would fill it (8 GPUs, 64 NICs, 64 block
devices, 10 mounts, traffic rules, and the known findings of each at 0, a few
of them active), then times, per scrape:

- `served`: what /metrics sends for the text format, `AgentRegistry.text()`
  (the agent's own formatter, byte for byte prometheus_client's), in steady
  state: series keep their subjects from one scrape to the next, values are
  formatted anew each time;
- `served, first`: the same with nothing kept from an earlier render (the
  first scrape, or one after every subject changed);
- `generate_latest`: `prometheus_client.exposition.generate_latest` over
  `agent.metrics.build_registry(store)` (the library's formatter; what
  OpenMetrics scrapes still cost);
- `collector`: the agent's collector alone (`render_families`).

The synthetic metric names are declared in a catalog module made here, so the
real catalog is not touched.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from _timing import measure
from prometheus_client.exposition import generate_latest

from agent.catalog import Catalog, MetricSpec, Reason
from agent.findings import Finding, Observation, Sample, Severity
from agent.metrics import TextRenderer, build_registry, render_families
from agent.store import CheckStatus, Store

# (check, metric, labels per series) of a GPU node; the numbers of subjects are realistic ones.
GPUS = [str(i) for i in range(8)]
NICS = (
    [f"enp{i}s0f{j}np{j}" for i in range(16) for j in range(2)]
    + [f"ib{i}" for i in range(8)]
    + [f"veth{i:04x}" for i in range(24)]
)
BLOCK = (
    [f"nvme{i}n1" for i in range(8)]
    + [f"nvme{i}n1p{p}" for i in range(2) for p in (1, 2, 3)]
    + [f"dm-{i}" for i in range(50)]
)
MOUNTS = [
    "/",
    "/var/lib/node-health-agent",
    "/raid",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/boot/efi",
    "/mnt/nfs/home",
    "/mnt/lustre",
    "/tmp",
    "/run",
]
FAMILIES: dict[str, tuple[str, str, list[dict[str, str]]]] = {}


def _family(check: str, name: str, kind: str, series: list[dict[str, str]]) -> None:
    FAMILIES[name] = (check, kind, series)


for m in (
    "temperature_celsius",
    "memory_temperature_celsius",
    "power_watts",
    "power_limit_watts",
    "utilization_ratio",
    "memory_utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "sm_clock_hertz",
    "memory_clock_hertz",
    "pcie_replay_total",
    "pcie_link_width",
    "pcie_link_generation",
    "nvlink_up_links",
    "throttle_reasons",
    "fan_ratio",
    "energy_joules",
    "persistence_mode",
    "retired_pages_pending",
    "remapped_rows_pending",
):
    _family("gpu", f"node_health_bench_gpu_{m}", "gauge", [{"gpu": g} for g in GPUS])
for m in ("ecc_errors_total", "retired_pages_total"):
    _family(
        "gpu",
        f"node_health_bench_gpu_{m}",
        "counter",
        [
            {"gpu": g, "type": t}
            for g in GPUS
            for t in ("volatile_sbe", "volatile_dbe", "aggregate_sbe", "aggregate_dbe")
        ],
    )
_family(
    "gpu",
    "node_health_bench_gpu_xid_total",
    "counter",
    [{"gpu": g, "xid": x} for g in GPUS for x in ("13", "31", "43", "48", "63", "74", "79", "94", "95")],
)
for m in (
    "receive_bytes_total",
    "transmit_bytes_total",
    "receive_errors_total",
    "transmit_errors_total",
    "receive_drops_total",
    "transmit_drops_total",
    "receive_packets_total",
    "transmit_packets_total",
):
    _family("network", f"node_health_bench_nic_{m}", "counter", [{"interface": n} for n in NICS])
for m in ("up", "carrier", "speed_bytes"):
    _family("network", f"node_health_bench_nic_{m}", "gauge", [{"interface": n} for n in NICS])
for m in (
    "reads_completed_total",
    "writes_completed_total",
    "read_bytes_total",
    "written_bytes_total",
    "io_time_seconds_total",
    "io_in_progress",
):
    _family("disk", f"node_health_bench_block_{m}", "gauge", [{"device": d} for d in BLOCK])
for m in ("free_bytes", "size_bytes", "free_inodes", "inodes", "writable", "read_only"):
    _family("disk", f"node_health_bench_fs_{m}", "gauge", [{"mountpoint": p} for p in MOUNTS])
_family(
    "traffic",
    "node_health_bench_traffic_bytes_total",
    "counter",
    [{"rule": f"rule{r}", "direction": d} for r in range(20) for d in ("in", "out")],
)
_family(
    "traffic",
    "node_health_bench_traffic_packets_total",
    "counter",
    [{"rule": f"rule{r}", "direction": d} for r in range(20) for d in ("in", "out")],
)

KNOWN: dict[str, list[tuple[str, str]]] = {
    "gpu": [(f"gpu{g}", r) for g in GPUS for r in [f"BenchGpu{k}" for k in range(20)]],
    "network": [(n, r) for n in NICS for r in ("BenchLinkDown", "BenchCarrierLost", "BenchErrorRate")],
    "disk": [
        (p, r)
        for p in MOUNTS
        for r in (
            "BenchDiskFull",
            "BenchInodesFull",
            "BenchReadOnly",
            "BenchNotMounted",
            "BenchIoErrors",
            "BenchProbeHung",
        )
    ],
    "traffic": [("iptables", "BenchRulesMissing")],
    "kmsg": [("kmsg", "BenchKernelOops")],
}
REASONS = tuple(
    Reason(r, Severity.CRITICAL if "Down" in r or "Gpu1" in r else Severity.WARNING, "bench")
    for r in sorted({r for v in KNOWN.values() for _, r in v})
)
METRICS = tuple(
    MetricSpec(name, kind, f"bench series {name}", tuple(series[0])) for name, (_, kind, series) in FAMILIES.items()
)

CATALOG = Catalog.declare(REASONS, METRICS)

def synthetic_store() -> Store:
    store = Store()
    checks = sorted({c for c, _, _ in FAMILIES.values()} | set(KNOWN))
    store.set_checks(checks, {c: tuple(KNOWN.get(c, ())) for c in checks})
    for c in checks:
        samples = tuple(
            Sample(name, float(hash((name, i)) % 10**9), tuple(labels.items()))
            for name, (check, _, series) in FAMILIES.items() if check == c
            for i, labels in enumerate(series)
        )  # fmt: skip
        active = tuple(
            Finding(c, subject, reason, CATALOG.reason(reason).severity, "bench finding")
            for subject, reason in KNOWN.get(c, ())[::37]
        )  # fmt: skip
        status = CheckStatus(
            c, observation=Observation(samples, active), ok=True, duration=0.012, finished_at=time.time(), runs=42
        )
        store.update_check(c, lambda st, status=status: replace(status, known=st.known))
    return store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=30, help="batches (default 30)")
    ap.add_argument("--timer", choices=("cpu", "wall"), default="cpu", help="thread CPU time (default) or wall time")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = ap.parse_args()
    store = synthetic_store()
    registry = build_registry(store, CATALOG)
    body = generate_latest(registry)
    series = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
    assert registry.text().startswith(TextRenderer(CATALOG).render(store.snapshot()).encode())
    figs = measure(
        {
            "served": registry.text,
            "served, first": lambda: TextRenderer(CATALOG).render(store.snapshot()),
            "generate_latest": lambda: generate_latest(registry),
            "collector": lambda: render_families(store.snapshot(), CATALOG),
        },
        args.repeat,
        args.timer,
    )
    result = {
        "series": series,
        "bytes": len(body),
        "ms": {name: {"median": f.median * 1e3, "min": f.minimum * 1e3} for name, f in figs.items()},
        "goal_ms": 5.0,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"timer: {args.timer}, {args.repeat} batches; {series} series, {len(body)} bytes per scrape")
    print(f"{'per scrape':18} {'median ms':>9} {'min ms':>8}")
    for name, fig in figs.items():
        print(f"{name:18} {fig.ms()}")
    print("goal: 5 ms or less")
    return 0


if __name__ == "__main__":
    sys.exit(main())
