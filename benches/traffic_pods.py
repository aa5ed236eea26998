"""Per-pod internet accounting: cost per cycle, rule count, render cost, and
the per-packet cost of the rules (one rule per pod address vs an nft set).

    sudo .venv/bin/python benches/traffic_pods.py [--pods 110] [--repeat 30] [--packets 200000]

For each backend, in network namespaces the bench creates (nothing else is
touched):

- cycle: one run of the traffic check (`iptables-save`, native parse, plan,
  tallies, samples) with per-pod accounting off, with `--pods` pods in
  steady state (nothing to change), and with one pod replaced every run
  (churn: two rules deleted, two added, one restore batch / one libiptc
  commit); the first run that installs all of them; the rules of ours;
- render: the per-pod samples of one run as `/metrics` text (the agent's
  renderer, first render and steady state);
- packet: thread CPU time per forwarded 64-byte UDP datagram from a pod to
  the internet peer (the sender's context does the forwarding on veth),
  with no rules of ours, with the internet chains only, with `--pods` per-pod
  rules and the sender's rule first or last in the chain, and (nft only) an
  nftables set with per-element counters in a table of its own instead of
  the per-pod rules.

Medians; the machine is shared and loaded, so compare ratios more than
absolute times.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traffic_scrape import median_ms  # benches/ is on the path: this file's directory

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "support"))


class StaticPods:
    def __init__(self, pods: Sequence[Any]) -> None:
        self._pods, self._gen = list(pods), 0

    def set(self, pods: Sequence[Any]) -> None:
        self._pods, self._gen = list(pods), self._gen + 1

    def pods(self) -> Sequence[Any]:
        return self._pods

    def generation(self) -> int:
        return self._gen


def fake_pod(i: int) -> Any:
    from agent.pods import PodAddr

    return PodAddr("team", f"job-{i:05d}", f"uid-{i}", (f"10.{100 + i // 65025}.{i // 255 % 255}.{i % 255 + 1}",))


def measure_cycle(backend: str, pods: int, repeat: int) -> dict[str, Any]:
    """Runs inside the node namespace."""
    from agent.check import CheckContext
    from agent.checks.traffic import CATALOG, TrafficCheck, TrafficConfig
    from agent.config import defaults
    from agent.findings import Observation
    from agent.hostpaths import HostPaths
    from agent.metrics import TextRenderer
    from agent.store import CheckStatus, Store
    from agent.traffic.settings import PodsSection

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as state:
        off = TrafficCheck(CheckContext(HostPaths(), state, defaults()),
                           TrafficConfig(backend=backend, pods=PodsSection(enabled=False)))
        off.run()
        out["run_off_ms"] = median_ms(off.run, repeat)
    with tempfile.TemporaryDirectory() as state:
        view = StaticPods([fake_pod(i) for i in range(pods)])
        check = TrafficCheck(CheckContext(HostPaths(), state, defaults(), pods=view), TrafficConfig(backend=backend))
        t0 = time.perf_counter()
        obs: Observation = check.run()
        out["install_ms"] = (time.perf_counter() - t0) * 1000
        out["run_steady_ms"] = median_ms(check.run, repeat)
        nxt = [pods]

        def churn() -> None:
            current = list(view.pods())
            view.set([*current[1:], fake_pod(nxt[0])])
            nxt[0] += 1
            check.run()

        out["run_churn_ms"] = median_ms(churn, repeat)
        obs = check.run()
        assert not obs.findings, obs.findings
        out["pod_samples"] = sum(1 for s in obs.samples if s.name.startswith("node_health_pod_traffic_") and
                                 s.name.endswith("_total"))
        only = Observation(tuple(s for s in obs.samples if s.name.startswith("node_health_pod_traffic_")), ())
        store = Store()
        store.set_checks(["traffic"], {"traffic": ()})
        store.update_check("traffic", lambda st: CheckStatus("traffic", observation=only, ok=True, duration=0.01,
                                                             finished_at=time.time(), runs=1, known=st.known))
        renderer = TextRenderer(CATALOG)
        snap = store.snapshot()
        out["render_first_ms"] = median_ms(lambda: TextRenderer(CATALOG).render(snap), repeat)
        out["render_ms"] = median_ms(lambda: renderer.render(snap), repeat)
        out["render_bytes"] = len(renderer.render(snap))
    return out


def ours(node: Any, backend: str) -> int:
    return sum(1 for line in node.save(backend, "-t", "mangle").splitlines()
               if line.startswith("-A") and ("node-health-agent:" in line or "-A NODE-HEALTH-" in line))


def packet_ns(L: Any, packets: int, rounds: int) -> float:
    """Thread CPU ns per 64-byte datagram sent by pod0 to the internet peer (median of rounds)."""
    rx = L.ns["internet"].socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("198.51.100.2", 0))
    tx = L.ns["pod0"].socket(socket.AF_INET, socket.SOCK_DGRAM)
    dst, payload, out = ("198.51.100.2", rx.getsockname()[1]), b"x" * 36, []  # 36 + 8 + 20 = 64 bytes of IP
    with rx, tx:
        for _ in range(rounds):
            t0 = time.thread_time()
            for _ in range(packets):
                tx.sendto(payload, dst)
            out.append((time.thread_time() - t0) / packets * 1e9)
    return statistics.median(out)


def bench(backend: str, pods: int, repeat: int, packets: int) -> dict[str, Any]:
    from traffic_lab import namespaces, pod_lab

    with namespaces("bench") as ns:
        node = ns["bench"]
        res = node.run(sys.executable, __file__, "--inside", backend, "--pods", str(pods), "--repeat", str(repeat),
                       timeout=900)
        r = json.loads(res.stdout.strip().splitlines()[-1])
    # per packet: static entries stand for the pods (the same rules); pod0 is 10.88.1.2
    with pod_lab(1) as L, tempfile.TemporaryDirectory() as tmp:
        def install(static: dict[str, str] | None) -> None:
            cfg = Path(tmp) / "agent.toml"
            body = "" if static is None else "static = {" + ", ".join(f'"{k}" = "{v}"' for k, v in static.items()) + "}\n"
            cfg.write_text(f"[checks.traffic.pods]\nenabled = {'true' if static is not None else 'false'}\n{body}")
            L.node.agent("rules", "install", "--backend", backend, "--config", str(cfg))

        others = {f"p{i:04d}": f"10.99.{i // 250}.{i % 250 + 1}/32" for i in range(pods - 1)}
        rounds = 7
        r["pkt_none_ns"] = packet_ns(L, packets, rounds)
        install(None)
        r["pkt_internet_ns"] = packet_ns(L, packets, rounds)
        install({"a-first": "10.88.1.2/32", **others})
        r["pkt_first_ns"] = packet_ns(L, packets, rounds)
        install({**others, "z-last": "10.88.1.2/32"})
        r["pkt_last_ns"] = packet_ns(L, packets, rounds)
        r["rules"] = ours(L.node, backend)
        if backend == "nft":
            install(None)
            elems = ", ".join([*(v.split("/")[0] for v in others.values()), "10.88.1.2"])
            L.node.run("nft", "-f", "-", stdin=(
                "table ip nha_bench {\n"
                f"  set pods_out {{ type ipv4_addr; counter; elements = {{ {elems} }} }}\n"
                "  chain forward_hook { type filter hook forward priority mangle + 1; "
                "ip daddr != 10.0.0.0/8 ip saddr @pods_out; }\n}\n").encode())
            r["pkt_set_ns"] = packet_ns(L, packets, rounds)
            shown = L.node.run("nft", "list", "set", "ip", "nha_bench", "pods_out").stdout
            assert "10.88.1.2 counter packets" in shown
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=110)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    ap.add_argument("--inside", choices=("legacy", "nft"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        print(json.dumps(measure_cycle(args.inside, args.pods, args.repeat)))
        return
    rows = {b: bench(b, args.pods, args.repeat, args.packets) for b in ("legacy", "nft")}
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{args.pods} pods, median of {args.repeat} runs (cycle) / 7 rounds of {args.packets} datagrams (packet)\n")
    print("| backend | rules of ours | check run, per-pod off | steady | ratio | one pod replaced per run | "
          "first install |")
    print("|---|---|---|---|---|---|---|")
    for b, r in rows.items():
        print(f"| {b} | {r['rules']} | {r['run_off_ms']:.1f} ms | {r['run_steady_ms']:.1f} ms "
              f"| {r['run_steady_ms'] / r['run_off_ms']:.2f}x | {r['run_churn_ms']:.1f} ms | {r['install_ms']:.0f} ms |")
    print("\n| backend | per-pod series | /metrics text | render, first | render, steady |")
    print("|---|---|---|---|---|")
    for b, r in rows.items():
        print(f"| {b} | {r['pod_samples']} | {r['render_bytes'] / 1024:.0f} KiB | {r['render_first_ms']:.2f} ms "
              f"| {r['render_ms']:.2f} ms |")
    print("\n| backend | no rules of ours | internet chains | + per-pod rules, sender first | sender last "
          "| nft set with counters instead |")
    print("|---|---|---|---|---|---|")
    for b, r in rows.items():
        s = f"{r['pkt_set_ns']:.0f} ns" if "pkt_set_ns" in r else "n/a (legacy)"
        print(f"| {b} | {r['pkt_none_ns']:.0f} ns | {r['pkt_internet_ns']:.0f} ns | {r['pkt_first_ns']:.0f} ns "
              f"| {r['pkt_last_ns']:.0f} ns | {s} |")


if __name__ == "__main__":
    main()
