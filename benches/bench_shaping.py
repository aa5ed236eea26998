"""Cost of internet egress shaping (docs/traffic.md, Shaping).

    sudo .venv/bin/python benches/bench_shaping.py [--pods 110] [--repeat 5] [--seconds 5]

In the shaping lab of the tests (a node namespace, one uplink to a fabric namespace that routes on to a
cluster and an internet peer; tests/support/traffic_lab.py), with the nft backend:

- cycle: one run of the traffic check with `--pods` shaped pods on the node (110: kubelet's default
  max-pods): the first run (110 classes, leaves and CLASSIFY rules installed) and the median of
  `--repeat` steady runs (all in place: read back and compared, nothing changed);
- unshaped throughput: what an unshaped pod sends to the cluster peer through the uplink (4 TCP flows,
  medians of half-second samples, summed) with the kernel's default root on the uplink and with the
  agent's HTB root in place (unshaped packets take its direct queue, under its lock).

Only namespaces the bench creates are touched. The machine this runs on is shared: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "support"))

from conftest import NO_HOST_KMSG  # noqa: E402
from netns_helpers import runner  # noqa: E402
from traffic_lab import measure, shape_lab  # noqa: E402

ANNOTATION = "node-health-agent/internet-egress-bandwidth"


def pods(n: int) -> list[dict]:
    """n shaped pods: pod-a's real address first, the others made-up addresses the node never sees."""
    out = [{"namespace": "bench", "name": "pod-a", "uid": "uid-pod-a", "ips": ["10.88.1.2"],
            "annotations": {ANNOTATION: "50M"}}]
    out += [{"namespace": "bench", "name": f"p{i}", "uid": f"uid-{i:04d}", "ips": [f"10.89.{i // 250}.{i % 250 + 1}"],
             "annotations": {ANNOTATION: f"{10 + i}M"}} for i in range(n - 1)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=110)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    out: dict[str, object] = {"pods": args.pods}
    with tempfile.TemporaryDirectory() as tmp, shape_lab() as L:
        cfg = Path(tmp, "agent.toml")
        cfg.write_text('[checks.traffic]\nenabled = true\nbackend = "nft"\n[checks.traffic.shaping]\nenabled = true\n'
                       + NO_HOST_KMSG)
        pods_file = Path(tmp, "pods.json")
        pods_file.write_text("[]")
        flows = [("pod-b", "cluster")] * 4
        with runner(L.node, str(cfg), str(Path(tmp, "state")), args=["traffic", str(pods_file)]) as r:
            r.run()
            out["unshaped_default_root_mbit"] = round(sum(measure(L, flows, args.seconds)) / 1e6)
            pods_file.write_text(json.dumps(pods(args.pods)))
            t0 = time.perf_counter()
            res = r.run()
            out["first_run_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            assert not res.data["findings"], res.data["findings"]
            out["classes"] = L.classes().count("class htb 4e48:")
            steady = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                r.run()
                steady.append(time.perf_counter() - t0)
            out["steady_run_ms"] = round(statistics.median(steady) * 1000, 1)
            out["unshaped_htb_root_mbit"] = round(sum(measure(L, flows, args.seconds)) / 1e6)
            out["unshaped_ratio_htb_vs_default"] = round(
                out["unshaped_htb_root_mbit"] / max(1, out["unshaped_default_root_mbit"]), 2)  # type: ignore[operator]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
