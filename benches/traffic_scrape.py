"""Cost of one traffic counter scrape with our rules among many foreign rules.

    sudo .venv/bin/python benches/traffic_scrape.py [--rules 5000] [--repeat 50]

For each backend it makes a network namespace, loads `--rules` kube-proxy-
style rules into its mangle table (quoted comments, as kube-proxy writes
them) plus ours, and measures, inside the namespace:

- parse: the `iptables-save -c -t mangle` dump parsed natively and by the
  Python twin (medians, and their ratio);
- scrape: the whole read as the check does it (run iptables-save, parse,
  pick our rules out), per backend;
- run: one full run of the traffic check when everything is in place.

Only namespaces the bench creates are touched. Medians of `--repeat` runs;
the machine this ran on is shared, so compare ratios more than absolute times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def measure(backend: str, repeat: int) -> dict[str, Any]:
    """Runs inside the namespace."""
    from agent import native
    from agent.check import CheckContext
    from agent.checks.traffic import TrafficCheck, TrafficConfig
    from agent.config import defaults
    from agent.hostpaths import HostPaths
    from agent.traffic.detect import backend_named
    from agent.traffic.rule_sync import read

    be = backend_named(backend)
    dump = be.save("ipv4")
    twin = native.PYTHON_TWINS["iptables_save"]
    assert native.parse_iptables_save(dump) == twin(dump)
    ctx = CheckContext(HostPaths(), "/nonexistent", defaults(), dry_run=True)
    check = TrafficCheck(ctx, TrafficConfig(backend=backend))
    check.run()
    return {
        "dump_bytes": len(dump),
        "dump_lines": dump.count(b"\n"),
        "native_ms": median_ms(lambda: native.parse_iptables_save(dump), repeat),
        "python_ms": median_ms(lambda: twin(dump), repeat),
        "save_ms": median_ms(lambda: be.save("ipv4"), repeat),
        "scrape_ms": median_ms(lambda: read(be, "ipv4"), repeat),
        "run_ms": median_ms(check.run, repeat),
        "parsers": native.describe(),
    }


def bench(backend: str, rules: int, repeat: int) -> dict[str, Any]:
    from traffic_lab import kube_mangle, namespaces

    with namespaces("bench") as ns:
        node = ns["bench"]
        node.run(f"iptables-{backend}-restore", "--noflush", stdin=kube_mangle(rules).encode())
        node.run(sys.executable, "-m", "agent", "rules", "install", "--backend", backend)
        res = node.run(sys.executable, __file__, "--inside", backend, "--repeat", str(repeat), timeout=600)
        return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--inside", choices=("legacy", "nft"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        print(json.dumps(measure(args.inside, args.repeat)))
        return
    print(f"{args.rules} foreign rules in mangle, median of {args.repeat} runs\n")
    print("| backend | dump | parse native | parse Python | ratio | iptables-save | whole scrape | check run |")
    print("|---|---|---|---|---|---|---|---|")
    for backend in ("legacy", "nft"):
        r = bench(backend, args.rules, args.repeat)
        print(
            f"| {backend} | {r['dump_lines']} lines, {r['dump_bytes'] / 1024:.0f} KiB | {r['native_ms']:.2f} ms "
            f"| {r['python_ms']:.2f} ms | {r['python_ms'] / r['native_ms']:.0f}x | {r['save_ms']:.1f} ms "
            f"| {r['scrape_ms']:.1f} ms | {r['run_ms']:.1f} ms |"
        )
    print(f"\nparsers: {r['parsers']}")


if __name__ == "__main__":
    main()
