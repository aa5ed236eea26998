"""Which gRPC client for the kubelet PodResources List: memory and start-up.

Each variant runs in a fresh interpreter (so that nothing is imported twice)
against the fake kubelet (tests/support/fakekubelet.py, a real grpcio server
on a unix socket) with 8 pods of one GPU each, and reports the RSS growth of
importing the client and of making the first List call, the import time and
the time of one call (after the first). Variants whose library is not
installed are skipped (grpclib is not in the test extras:
``pip install grpclib`` to measure it).

    python benches/bench_podresources.py [--runs 7] [--json]

Then one run of the gpu_pods engine (`agent.gpu.pods.GpuPodsMonitor.run`):
8 fake H100s with 4 processes each (the fake NVML), their owners read from
/proc, and a List of 8 pods from the fake kubelet (in a process of its own,
so that its CPU does not count): CPU time of this process (every thread:
NVML calls run in the prober's), median of `--runs` x 20 runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))

from fakekubelet import FakeKubelet  # noqa: E402

PRELUDE = """
import os, socket, struct, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
sock = sys.argv[1]
base = rss()
t0 = time.perf_counter()
"""

VARIANTS = {
    "h2 + hand-decoded protobuf (chosen)": """
from agent.gpu import podresources
import h2.connection, h2.config, h2.events
t1 = time.perf_counter(); imported = rss()
call = lambda: podresources.list_pods(sock)
""",
    "grpcio, raw bytes + hand-decoded protobuf": """
import grpc
from agent.gpu import podresources
t1 = time.perf_counter(); imported = rss()
ch = grpc.insecure_channel("unix:" + sock)
method = ch.unary_unary("/v1.PodResourcesLister/List")
call = lambda: podresources.decode_list_response(method(b"", timeout=5))
""",
    "grpcio + protobuf runtime (as generated code imports it)": """
import grpc
from google.protobuf import descriptor, descriptor_pool, symbol_database
from google.protobuf.internal import builder
from agent.gpu import podresources
t1 = time.perf_counter(); imported = rss()
ch = grpc.insecure_channel("unix:" + sock)
method = ch.unary_unary("/v1.PodResourcesLister/List")
call = lambda: podresources.decode_list_response(method(b"", timeout=5))
""",
    "grpclib (asyncio, h2), raw codec": """
import asyncio
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.encoding.base import CodecBase
from agent.gpu import podresources
t1 = time.perf_counter(); imported = rss()
class Raw(CodecBase):
    __content_subtype__ = "proto"
    def encode(self, message, message_type): return message
    def decode(self, data, message_type): return data
async def unary():
    ch = Channel(path=sock, codec=Raw())
    try:
        async with ch.request("/v1.PodResourcesLister/List", Cardinality.UNARY_UNARY, bytes, bytes) as st:
            await st.send_message(b"", end=True)
            return await st.recv_message()
    finally:
        ch.close()
call = lambda: podresources.decode_list_response(asyncio.run(unary()))
""",
}

EPILOGUE = """
pods = call()
assert len(pods) == 8, pods
called = rss()
t2 = time.perf_counter()
for _ in range(20):
    call()
t3 = time.perf_counter()
print(json.dumps({"import_rss": imported - base, "call_rss": called - imported, "total_rss": called - base,
                  "import_ms": (t1 - t0) * 1e3, "call_ms": (t3 - t2) / 20 * 1e3}))
"""

NEEDS = {
    "h2 + hand-decoded protobuf (chosen)": "h2",
    "grpcio, raw bytes + hand-decoded protobuf": "grpc",
    "grpcio + protobuf runtime (as generated code imports it)": "google.protobuf",
    "grpclib (asyncio, h2), raw codec": "grpclib",
}


def available(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # google.protobuf without google
        return False


def run(variant: str, sock: str) -> dict[str, float]:
    code = "import json\n" + PRELUDE + VARIANTS[variant] + EPILOGUE
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code, sock], capture_output=True, text=True, env=env, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{variant}: {out.stderr.strip()[-400:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def engine_cpu(runs: int, tmp: str) -> float:
    """Median CPU seconds (all threads of this process) of one GpuPodsMonitor.run."""
    import time

    from fakenvml import Scenario, build, h100

    from agent.findings import ObservationBuilder
    from agent.gpu import nvml
    from agent.gpu.catalog import CATALOG
    from agent.gpu.pods import GpuPodsMonitor
    from agent.gpu.settings import GpuConfig, GpuPodsConfig
    from agent.hostpaths import HostPaths

    lib = build(tmp)
    os.environ["FAKE_NVML_SCENARIO"] = scen = os.path.join(tmp, "scenario")
    me = os.getpid()  # real PIDs with a readable /proc/<pid>/cgroup
    Scenario(scen).set([h100(i, procs=" ".join(f"{me}:{1 << 30}" for _ in range(4))) for i in range(8)])
    nvml.invalidate()
    sock = os.path.join(tmp, "k.sock")
    pods = [("ml", f"train-{i}", {"main": [("nvidia.com/gpu", [h100(i)["uuid"]])]}) for i in range(8)]
    code = f"import sys, time; sys.path.insert(0, {os.path.join(ROOT, 'tests', 'support')!r}); from fakekubelet import FakeKubelet; k = FakeKubelet({sock!r}, {pods!r}).start(); time.sleep(3600)"
    server = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        monitor = GpuPodsMonitor(HostPaths(), GpuPodsConfig(pod_resources_socket=sock), GpuConfig(nvml_library=lib))
        samples = []
        for _ in range(runs * 20):
            b = ObservationBuilder("gpu_pods", CATALOG)
            start = time.process_time()
            monitor.run(b)
            samples.append(time.process_time() - start)
            obs = b.build()
        assert sum(s.name == "node_health_gpu_allocation" for s in obs.samples) == 8, obs
        return statistics.median(samples)
    finally:
        server.kill()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pods = [("ml", f"train-{i}", {"main": [("nvidia.com/gpu", [f"GPU-{i:08x}-1111-2222-3333-444455556666"])]}) for i in range(8)]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, FakeKubelet(os.path.join(tmp, "kubelet.sock"), pods) as kubelet:
        todo = [v for v in VARIANTS if available(NEEDS[v])]
        samples: dict[str, list[dict[str, float]]] = {v: [] for v in todo}
        for _ in range(args.runs):  # interleaved, so that every variant meets the same moments of a noisy machine
            for v in todo:
                samples[v].append(run(v, kubelet.path))
        for v, runs in samples.items():
            results[v] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        cpu = engine_cpu(args.runs, tmp)
    if args.json:
        print(json.dumps({"clients": results, "gpu_pods_run_cpu_s": cpu}, indent=2))
        return
    print(f"median of {args.runs} fresh interpreters ({sys.version.split()[0]})")
    print("| client | RSS: import | RSS: first call | RSS total | import ms | call ms |")
    print("|---|---|---|---|---|---|")
    for v, r in results.items():
        mb = 1 << 20
        print(f"| {v} | {r['import_rss'] / mb:.1f} MB | {r['call_rss'] / mb:.1f} MB | {r['total_rss'] / mb:.1f} MB "
              f"| {r['import_ms']:.0f} | {r['call_ms']:.2f} |")
    print(f"\none gpu_pods run (8 GPUs x 4 processes, 8 pods): {cpu * 1e3:.2f} ms CPU (median)")


if __name__ == "__main__":
    main()
