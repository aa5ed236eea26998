#!/usr/bin/env python3
"""What each feature of `agent run` costs at idle, in CPU and RSS, beside node_exporter (issue 29).

Starts, at the same time and for the same window, node_exporter (its default collectors, on a
loopback port) and one `agent run` per variant: the embedded defaults (no cluster), then the same
with one check turned off, and (unless --no-kube) the defaults connected to the tests' fake API
server (the client, the actuator, the pod watch), with the checks that read pods off (no pod watch).
Every process is scraped every --scrape-interval seconds. CPU is utime + stime from /proc/<pid>/stat
(CPU-seconds the process used, not wall time: waiting for a CPU on a loaded machine does not count);
RSS is VmRSS at the end. A feature's cost is "defaults" minus "defaults without it".

--baseline DIR adds "<variant> @ baseline" for each variant: the same config run by the agent of another
checkout (say `git archive <commit> | tar -x -C DIR`, with agent/_native copied in), in the same window,
for before/after figures.

The processes run side by side, so --runs N repeats the whole window N times (the table gives each
run). With --threads, the agent of the defaults reports each long-lived thread (named through
benches/_threadnames.py, loaded as sitecustomize): wake-ups per second (voluntary context switches)
and CPU. Each check runs in a thread of its own, kept between its runs (check-<name>, its first 15
bytes), so the table gives each check's CPU and wake-ups too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from typing import Any

from _agent import CLK_TCK, free_port, running_agent

CHECKS = ("disk", "network", "infiniband", "gpu", "gpu_telemetry", "gpu_pods", "kernel", "traffic", "burn")
POD_READERS = ("gpu_pods",)  # checks with needs_pods (agent.registry); traffic's pod rules are in [checks.traffic.pods]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def proc_cpu(pid: int, children: bool = False) -> float:
    """utime + stime (fields 14, 15); `children`: of the children it waited for (cutime + cstime, 16, 17:
    the traffic check's iptables-nft-save, for one)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    i = 13 if children else 11
    return (int(fields[i]) + int(fields[i + 1])) / CLK_TCK


def proc_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def threads(pid: int) -> dict[int, tuple[str, int, float]]:
    """tid → (name, voluntary context switches, CPU seconds)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                vol = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except (OSError, StopIteration):
            continue
        out[int(tid)] = (name, vol, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return out


def variants(tmp: str, kube: bool) -> dict[str, str | None]:
    def write(name: str, text: str) -> str:
        path = os.path.join(tmp, name.replace(" ", "_").replace("/", "_") + ".toml")
        with open(path, "w") as fh:
            fh.write(text)
        return path

    out: dict[str, str | None] = {"defaults": None}
    for check in CHECKS:
        out[f"without {check}"] = write(f"no-{check}", f"[checks.{check}]\nenabled = false\n")
    if kube:
        sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "support")]
        from fakeapi import FakeApiServer

        fake = FakeApiServer()
        fake.start()
        fake.add_node(os.environ.setdefault("NODE_NAME", "bench-node"))
        kc = fake.kubeconfig(os.path.join(tmp, "kubeconfig"))
        head = f'[kubernetes]\nkubeconfig = "{kc}"\nstartup_jitter = "0s"\n'
        out["defaults + cluster"] = write("kube", head)
        off = "".join(f"[checks.{c}]\nenabled = false\n" for c in POD_READERS)
        out["defaults + cluster, no pod watch (gpu_pods off)"] = write("kube-nopods", head + off)
    return out


class NodeExporter:
    def __init__(self, binary: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid, self.url = self.proc.pid, f"http://127.0.0.1:{self.port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(self.url + "/metrics", timeout=5).read()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("node_exporter did not answer")

    def get(self, path: str) -> tuple[int, bytes]:
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            return resp.status, resp.read()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def one_run(configs: dict[str, str | None], exporter: str | None, seconds: float, warmup: float, scrape: float,
            with_threads: bool, roots: dict[str, str] | None = None) -> dict[str, Any]:
    with ExitStack() as stack:
        procs: dict[str, Any] = {}
        if exporter:
            ne = NodeExporter(exporter)
            stack.callback(ne.close)
            procs["node_exporter"] = ne
        for name, cfg in configs.items():
            procs[name] = stack.enter_context(running_agent(cfg, timeout=180, root=(roots or {}).get(name)))
        time.sleep(warmup)
        cpu0 = {n: proc_cpu(p.pid) for n, p in procs.items()}
        kids0 = {n: proc_cpu(p.pid, children=True) for n, p in procs.items()}
        th0 = threads(procs["defaults"].pid) if with_threads else {}
        wall0 = time.monotonic()
        scrapes = 0
        while (left := wall0 + seconds - time.monotonic()) > 0:
            if scrape > 0:
                for p in procs.values():
                    p.get("/metrics")
                scrapes += 1
                time.sleep(max(0.0, min(scrape - (time.monotonic() - wall0) % scrape, left)))
            else:
                time.sleep(left)
        wall = time.monotonic() - wall0
        out: dict[str, Any] = {"window_s": wall, "scrapes": scrapes, "procs": {}}
        for n, p in procs.items():
            out["procs"][n] = {"cpu_s": proc_cpu(p.pid) - cpu0[n], "children_cpu_s": proc_cpu(p.pid, True) - kids0[n],
                               "rss_kB": proc_rss_kb(p.pid)}
        if with_threads:
            th1 = threads(procs["defaults"].pid)
            out["threads"] = [
                {"thread": name, "wakeups_per_s": (vol - th0[tid][1]) / wall, "cpu_s": cpu - th0[tid][2]}
                for tid, (name, vol, cpu) in sorted(th1.items()) if tid in th0
            ]
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=150.0, help="measured window (default 150)")
    ap.add_argument("--warmup", type=float, default=40.0, help="seconds after start before the window (default 40)")
    ap.add_argument("--scrape-interval", type=float, default=15.0, help="scrape every process this often (default 15)")
    ap.add_argument("--runs", type=int, default=3, help="windows, one after the other (default 3)")
    ap.add_argument("--only", nargs="*", metavar="VARIANT", help="variants to run (defaults always runs)")
    ap.add_argument("--no-kube", action="store_true", help="no cluster variants (no fake API server)")
    ap.add_argument("--threads", action="store_true", help="wake-ups and CPU of each long-lived thread of the defaults")
    ap.add_argument("--node-exporter", default=shutil.which("node_exporter") or shutil.which("prometheus-node-exporter"),
                    help="node_exporter binary (default: from PATH)")
    ap.add_argument("--baseline", metavar="DIR", help="also run each variant from the checkout in DIR, side by side")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    args = ap.parse_args()
    if args.threads:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(tempfile.gettempdir(), "nha-threadnames"), os.environ.get("PYTHONPATH", "")])
        os.makedirs(os.path.join(tempfile.gettempdir(), "nha-threadnames"), exist_ok=True)
        shutil.copy(os.path.join(HERE, "_threadnames.py"),
                    os.path.join(tempfile.gettempdir(), "nha-threadnames", "sitecustomize.py"))
    with tempfile.TemporaryDirectory(prefix="nha-cost-") as tmp:
        configs = variants(tmp, not args.no_kube)
        if args.only:
            configs = {k: v for k, v in configs.items() if k == "defaults" or k in args.only}
        roots = {}
        if args.baseline:  # each variant again, from the other checkout
            for name, cfg in list(configs.items()):
                configs[f"{name} @ baseline"] = cfg
                roots[f"{name} @ baseline"] = os.path.abspath(args.baseline)
        runs = [one_run(configs, args.node_exporter, args.seconds, args.warmup, args.scrape_interval, args.threads, roots)
                for _ in range(args.runs)]
    if args.json:
        print(json.dumps({"runs": runs}, indent=2))
        return 0
    names = list(runs[0]["procs"])
    print(f"{len(runs)} run(s) of {runs[0]['window_s']:.0f} s, {runs[0]['scrapes']} scrapes each, processes side by side")
    print("| process | CPU s per run | % of a core (mean) | × node_exporter (per run) | children's CPU s | VmRSS MB "
          "| feature's cost: CPU % / RSS MB |")
    print("|---|---|---|---|---|---|---|")
    base = {"cpu": [r["procs"]["defaults"]["cpu_s"] / r["window_s"] for r in runs],
            "rss": sum(r["procs"]["defaults"]["rss_kB"] for r in runs) / len(runs) / 1024}
    for n in names:
        cpu = [r["procs"][n]["cpu_s"] for r in runs]
        share = sum(c / r["window_s"] for c, r in zip(cpu, runs, strict=True)) / len(runs) * 100
        rss = sum(r["procs"][n]["rss_kB"] for r in runs) / len(runs) / 1024
        ratio = ", ".join(f"{r['procs'][n]['cpu_s'] / r['procs']['node_exporter']['cpu_s']:.2f}"
                          if "node_exporter" in r["procs"] and r["procs"]["node_exporter"]["cpu_s"] else "-" for r in runs)
        cost = ""
        if n.endswith("@ baseline"):
            pass  # compare it with its own variant's row
        elif n.startswith("without "):
            d_cpu = (sum(base["cpu"]) - sum(c / r["window_s"] for c, r in zip(cpu, runs, strict=True))) / len(runs) * 100
            cost = f"{d_cpu:+.3f} / {base['rss'] - rss:+.1f}"
        elif n.startswith("defaults +"):
            d_cpu = (sum(c / r["window_s"] for c, r in zip(cpu, runs, strict=True)) - sum(base["cpu"])) / len(runs) * 100
            cost = f"{d_cpu:+.3f} / {rss - base['rss']:+.1f} (added)"
        kids = " ".join(f"{r['procs'][n].get('children_cpu_s', 0):.2f}" for r in runs)
        print(f"| {n} | {' '.join(f'{c:.2f}' for c in cpu)} | {share:.3f} | {ratio} | {kids} | {rss:.1f} | {cost} |")
    if args.threads:
        print("\n| thread (defaults) | wake-ups/s per run | CPU s per run |\n|---|---|---|")
        rows: dict[str, list[tuple[float, float]]] = {}
        for r in runs:
            for t in r["threads"]:
                rows.setdefault(t["thread"], []).append((t["wakeups_per_s"], t["cpu_s"]))
        for name, vals in rows.items():
            print(f"| {name} | {' '.join(f'{w:.2f}' for w, _ in vals)} | {' '.join(f'{c:.2f}' for _, c in vals)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
