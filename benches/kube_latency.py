"""Latency from a critical finding to the taint being visible on the (fake) API server.

The real actuator thread against the fake API server over HTTP on loopback:
the store listener hands the snapshot over, the actuator wakes at once and
claims a budget slot, then writes the taint. "Visible" is the moment the fake
server's watch sees the Node carry the taint. Each round then clears the
finding (untaint, slot released) so the next round pays the full path again.

    python benches/kube_latency.py --rounds 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # conftest
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

from fakeapi import FakeApiServer  # noqa: E402
from fakeapi.cluster import Watcher  # noqa: E402
from kube_support import BUDGET_NS, NODE, PREFIX, QUOTA, finding, settings, snapshot, start_actuator  # noqa: E402



def has_taint(obj: dict) -> bool:  # type: ignore[type-arg]
    return any(t["key"].startswith(PREFIX) for t in (obj.get("spec") or {}).get("taints") or [])


def wait_taint(w: Watcher, want: bool, timeout: float = 10.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        kind, obj = w.q.get(timeout=max(0.0, deadline - time.monotonic()))  # type: ignore[misc]
        if has_taint(obj) == want:
            return time.monotonic()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=200)
    a = p.parse_args()
    fake = FakeApiServer()
    fake.start()
    fake.add_node(NODE)
    fake.set_quota(BUDGET_NS, QUOTA, 10)
    # The client-side limit allows 8 requests at once; a fault takes 4 (lease, taint, status, event), so a
    # single fault never waits for it. Rounds back to back would, so the bench raises the refill rate.
    act = start_actuator(fake, tempfile.mkdtemp(), settings(qps=50.0, burst=50))
    w = Watcher("", "nodes", "", NODE)
    fake.cluster.watch(w, str(fake.cluster.rv))
    samples = []
    try:
        act.offer(snapshot([], runs=1))
        time.sleep(0.5)
        while not w.q.empty():
            w.q.get()
        for i in range(a.rounds):
            t0 = time.monotonic()
            act.offer(snapshot([finding("FakeDiskFull")], runs=2 + 2 * i))
            samples.append(wait_taint(w, True) - t0)
            act.offer(snapshot([], runs=3 + 2 * i))
            wait_taint(w, False)
            time.sleep(0.05)  # let the status write and the event of the clear go out
            while not w.q.empty():
                w.q.get()
    finally:
        act.stop()
        fake.stop()
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(round(0.99 * len(samples))) - 1)]
    print(f"rounds={len(samples)} median={statistics.median(samples) * 1000:.1f}ms p99={p99 * 1000:.1f}ms "
          f"min={samples[0] * 1000:.1f}ms max={samples[-1] * 1000:.1f}ms")


if __name__ == "__main__":
    main()
