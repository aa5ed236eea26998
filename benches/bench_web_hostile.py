"""/metrics and /healthz under hostile clients, beside a quiet baseline, in one run.

For each server mode (plain HTTP, TLS, TLS requiring client certificates),
`agent run` is started on 127.0.0.1 and measured twice: quiet, then while
tests/support/hostile.py (its own process) holds `--connections` hostile
connections, re-opening each one as soon as the agent drops it:

- http and tls: idle keep-alives (one GET /healthz, then silence), slowloris
  (one header byte every `--drip` seconds), silent connections (under TLS:
  never a ClientHello);
- mtls: the same three (idle and slowloris with a valid client certificate)
  and handshakes without a client certificate, over and over.

They come from `--addresses` loopback addresses (127.0.0.2, ...: "a
handful"), so the agent sees other hosts. The legitimate scraper is
127.0.0.250: each scrape a new connection (Prometheus keeps none across an
idle longer than the agent's 5 s), TCP and TLS handshakes included; the
kubelet-like probe is a GET /healthz from 127.0.0.1 to 127.0.0.1, the host
to itself. Reported per mode: median and p99 of each, failures, and what the
agent counted in node_health_http_connections_closed_total.

    python benches/bench_web_hostile.py                # 500 connections, 5 addresses, 200 samples
    python benches/bench_web_hostile.py --json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # conftest
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))
sys.path.insert(0, os.path.dirname(__file__))  # _agent

from _agent import free_port  # noqa: E402
from webcerts import Certs, make_certs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ROOT / "tests" / "support" / "hostile.py"
SCRAPER = "127.0.0.250"


def context(certs: Certs, client: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    if client:
        ctx.load_cert_chain(str(certs.client[0]), str(certs.client[1]))
    return ctx


class Agent:
    def __init__(self, mode: str, certs: Certs, tmp: Path) -> None:
        self.mode, self.certs, self.port = mode, certs, free_port()
        config = tmp / f"{mode}.toml"
        text = ""
        if mode in ("tls", "mtls"):
            text = f'[metrics.tls]\ncert_file = "{certs.server[0]}"\nkey_file = "{certs.server[1]}"\n'
            if mode == "mtls":
                text += f'client_ca_file = "{certs.ca}"\n'
        config.write_text(text)
        state = tmp / f"state-{mode}"
        state.mkdir()
        cmd = [sys.executable, "-m", "agent", "run", "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(state),
               "--config", str(config), "--log-format", "json", "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
        self.ctx = context(certs, mode == "mtls") if mode != "http" else None
        deadline = time.monotonic() + 60
        while self.get("/healthz", "127.0.0.1")[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent not up: {self.proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            time.sleep(0.2)

    def get(self, path: str, source: str) -> tuple[int, float]:
        """(status or 0 on failure, seconds), a new connection each time."""
        t0 = time.perf_counter()
        conn: http.client.HTTPConnection
        if self.ctx is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10, source_address=(source, 0))
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.ctx,
                                               source_address=(source, 0))
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException):
            status = 0
        finally:
            conn.close()
        return status, time.perf_counter() - t0

    def closed(self) -> dict[str, float]:
        status, _ = self.get("/healthz", "127.0.0.1")
        conn: http.client.HTTPConnection
        if self.ctx is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.ctx)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        out = {}
        for line in text.splitlines():
            if line.startswith("node_health_http_connections_closed_total{"):
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                out[reason] = float(line.rsplit(" ", 1)[1])
        return out

    def cpu(self) -> float:
        """utime + stime of the agent, seconds (/proc/<pid>/stat fields 14 and 15)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def measure(agent: Agent, samples: int, interval: float) -> dict[str, object]:
    scrape, health, failed_scrapes, failed_health = [], [], 0, 0
    cpu0, t0, load0 = agent.cpu(), time.monotonic(), os.getloadavg()[0]
    for _ in range(samples):
        code, t = agent.get("/metrics", SCRAPER)
        scrape.append(t)
        failed_scrapes += code != 200
        code, t = agent.get("/healthz", "127.0.0.1")
        health.append(t)
        failed_health += code != 200
        time.sleep(interval)
    return {"scrape": summary(scrape), "healthz": summary(health),
            "failed_scrapes": failed_scrapes, "failed_healthz": failed_health,
            "agent_cpu": round((agent.cpu() - cpu0) / (time.monotonic() - t0), 2),
            "loadavg": round((load0 + os.getloadavg()[0]) / 2, 1)}


def summary(xs: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in xs)
    return {"median_ms": round(statistics.median(ms), 1),
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1), "max_ms": round(ms[-1], 1)}


def kinds(mode: str, n: int) -> list[str]:
    names = ["idle", "slowloris", "silent"] + (["nocert"] if mode == "mtls" else [])
    each = n // len(names)
    return [f"{k}:{each + (1 if i < n - each * len(names) else 0)}" for i, k in enumerate(names)]


def attack(agent: Agent, args: argparse.Namespace) -> subprocess.Popen[str]:
    cmd = ["nice", "-n", str(args.attacker_nice)] if args.attacker_nice else []
    cmd += [sys.executable, str(HOSTILE), "--port", str(agent.port), "--drip", str(args.drip)]
    if agent.mode != "http":
        cmd += ["--tls"]
    if agent.mode == "mtls":
        cmd += ["--cert", str(agent.certs.client[0]), "--key", str(agent.certs.client[1])]
    for k in kinds(agent.mode, args.connections):
        cmd += ["--kind", k]
    for i in range(args.addresses):
        cmd += ["--source", f"127.0.0.{2 + i}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(mode: str, certs: Certs, tmp: Path, args: argparse.Namespace) -> dict[str, object]:
    agent = Agent(mode, certs, tmp)
    try:
        quiet = measure(agent, args.samples, args.interval)
        proc = attack(agent, args)
        assert proc.stderr is not None
        line = proc.stderr.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the attackers did not start: {line} {proc.stderr.read()[-2000:]}")
        time.sleep(args.warmup)
        before = agent.closed()
        hostile = measure(agent, args.samples, args.interval)
        after = agent.closed()
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        counts = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    finally:
        agent.stop()
    return {"mode": mode, "quiet": quiet, "hostile": hostile, "attackers": counts,
            "closed_during": {k: after.get(k, 0) - before.get(k, 0) for k in sorted(after)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=500)
    ap.add_argument("--addresses", type=int, default=5)
    ap.add_argument("--samples", type=int, default=200, help="scrapes (and /healthz) per phase")
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    ap.add_argument("--drip", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=6.0, help="seconds of attack before measuring (past the 5 s deadlines)")
    ap.add_argument("--modes", default="http,tls,mtls")
    ap.add_argument("--attacker-nice", type=int, default=0,
                    help="run the attackers at this nice level (they share this machine's CPUs, unlike pods "
                         "under their own CPU limits or other hosts)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nha-hostile-") as d:
        tmp = Path(d)
        certs = make_certs(tmp / "certs")
        results = [run(m, certs, tmp, args) for m in args.modes.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{args.connections} hostile connections from {args.addresses} addresses, {args.samples} samples a phase, "
          f"attackers at nice {args.attacker_nice}, {os.cpu_count()} CPUs")
    print("| mode | phase | scrape median / p99 / max ms | failed | /healthz median / p99 / max ms | failed "
          "| agent CPU (cores) | load average |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        for phase in ("quiet", "hostile"):
            m: dict[str, dict[str, float]] = r[phase]  # type: ignore[assignment]
            s, h = m["scrape"], m["healthz"]
            print(f"| {r['mode']} | {phase} | {s['median_ms']} / {s['p99_ms']} / {s['max_ms']} | {m['failed_scrapes']} "
                  f"| {h['median_ms']} / {h['p99_ms']} / {h['max_ms']} | {m['failed_healthz']} | {m['agent_cpu']} "
                  f"| {m['loadavg']} |")
    for r in results:
        print(f"{r['mode']}: closed by the agent while measured {r['closed_during']}; attackers {r['attackers']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
