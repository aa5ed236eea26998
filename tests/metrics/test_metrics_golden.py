"""Golden file: `agent run` on a fixture host tree, its /metrics compared with
tests/golden/metrics.txt (values that depend on this machine or on time are
masked). Any metric added, renamed, relabelled or dropped shows here.

To refresh after an intended change (the run then skips, as it compared
nothing; refused under CI=true, see conftest.pytest_configure):
    NHA_UPDATE_GOLDEN=1 python -m pytest tests/metrics/test_metrics_golden.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from agentproc import Agent, wait_for
from conftest import update_requested
from disktree import HostTree
from ibtree import CX6DX, IbTree

GOLDEN = Path(__file__).parent.parent / "golden" / "metrics.txt"
NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 123456789  654321    0    0    0     0          0         0 123456789  654321    0    0    0     0       0          0
"""
# An Xid 79 of the 570+ driver, and the GPU's own line before it (raw /dev/kmsg records).
KMSG = (
    "6,1000,5000000,-;NVRM: GPU at PCI:0000:3b:00: GPU-6c1b7a44-7a5d-8f0e-3b3c-9d2a1f0e4c11\n"
    "4,1001,5000100,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    "3,1002,5000200,-;mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count\n"
)
# Values that depend on this machine, on time or on how many runs happened.
MASKED = re.compile(
    r"^(node_health_(start_time_seconds|scheduler_last_tick_timestamp_seconds"
    r"|check_(duration_seconds|last_run_timestamp_seconds|runs_total)"
    r"|disk_(size|free|available)_bytes|disk_files(_free)?|disk_probe_duration_seconds"
    r"|kmsg_records_read_total|http_requests_total|\w+_timestamp_seconds)\b)"
)


def fixture_host(tmp: Path) -> tuple[HostTree, str]:
    host = HostTree(tmp / "host")
    host.mount("/")
    (host.proc / "net").mkdir()
    (host.proc / "net" / "dev").write_text(NET_DEV)
    host.diskstats((host.dev, "vda", 1000, 2000, 0, 500))
    (host.proc / "sys/kernel/random").mkdir(parents=True)
    (host.proc / "sys/kernel/random/boot_id").write_text("0f6d5ad1-1a4e-4a3c-9a8e-2c1e2b3c4d5e\n")
    gpu = host.sys / "bus/pci/devices/0000:3b:00.0"
    gpu.mkdir(parents=True)
    (gpu / "vendor").write_text("0x10de\n")
    (gpu / "class").write_text("0x030200\n")
    ib = IbTree(host.root, sys=host.sys, proc=host.proc)  # one NDR port, one RoCE port
    ib.node(1)
    ib.device("mlx5_1", CX6DX, link_layer="Ethernet", rate="100 Gb/sec (4X EDR)")
    mc = host.sys / "devices/system/edac/mc/mc0"
    (mc / "dimm0").mkdir(parents=True)
    for name, value in (("ce_count", "3"), ("ue_count", "0"), ("ce_noinfo_count", "0"), ("ue_noinfo_count", "0"),
                        ("dimm0/dimm_ce_count", "3"), ("dimm0/dimm_ue_count", "0"), ("dimm0/dimm_label", "CPU_SrcID#0_MC#0_Chan#0_DIMM#0")):
        (mc / name).write_text(value + "\n")
    (host.root / "kmsg").write_text(KMSG)  # host paths in the config resolve under paths.rootfs
    config = f"""
[paths]
procfs = "{host.proc}"
sysfs = "{host.sys}"
rootfs = "{host.root}"
[checks.disk]
interval = "1s"
paths = ["/"]
include_state_dir = false
[checks.network]
interval = "1s"
interfaces = ["lo"]
[checks.gpu]
interval = "1s"
nvml_library = "/no-driver/libnvidia-ml.so.1"
kmsg_path = "/kmsg"
[checks.kernel]
interval = "1s"
kmsg_path = "/kmsg"
[checks.traffic]
enabled = false
[checks.infiniband]
interval = "1s"
[checks.burn]
interval = "1s"
"""
    return host, config


def normalize(text: str) -> str:
    """Mask machine- and time-dependent values; sort samples within each family."""
    out: list[str] = []
    samples: list[str] = []
    for line in text.splitlines():
        if line.startswith("process_") or line.startswith(("# HELP process_", "# TYPE process_")):
            continue
        if line.startswith("#"):
            out.extend(sorted(samples))
            samples = []
            out.append(line)
            continue
        line = re.sub(r'python="[^"]*"', 'python="<v>"', line)
        if MASKED.match(line):
            line = line.rsplit(" ", 1)[0] + " <v>"
        samples.append(line)
    out.extend(sorted(samples))
    return "\n".join(out) + "\n"


def test_metrics_on_a_fixture_host_match_the_golden_file(tmp_path: Path) -> None:
    _, config = fixture_host(tmp_path)
    agent = Agent(tmp_path, config, env={"NODE_NAME": "golden-node", "KUBERNETES_SERVICE_HOST": ""})
    try:
        agent.wait_ready()
        for check in ("disk", "network", "infiniband", "gpu", "kernel", "burn"):  # two runs each: rates and deltas are settled
            wait_for(lambda c=check: (agent.value("node_health_check_runs_total", check=c) or 0) >= 2, what=check)
        wait_for(lambda: agent.value("node_health_gpu_xid_errors_total", gpu="unknown", xid="79") is not None
                 or b'xid="79"' in agent.get("/metrics")[1], what="the Xid from the followed log")
        wait_for(lambda: agent.value("node_health_kernel_faults_total", fault="mlx5_fatal") == 1, what="the mlx5 fault")
        wait_for(lambda: agent.value("node_health_burn_preflight_state", state="pending") == 0, what="preflight settled")
        # ... and the Kubernetes side has synced after it (its samples lag the burn's by one reconcile)
        wait_for(lambda: agent.value("node_health_would_set_condition", cause="dry_run", status="False",
                                     type="NodeHealthPreflightProblem") == 1, what="the preflight condition cleared")
        text = normalize(agent.get("/metrics")[1].decode())
    finally:
        assert agent.stop() == 0, agent.logs()
    if update_requested("NHA_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
        pytest.skip(f"{GOLDEN} rewritten from this run: review its diff, then run without NHA_UPDATE_GOLDEN")
    assert text == GOLDEN.read_text(), "metrics changed: NHA_UPDATE_GOLDEN=1 python -m pytest tests/metrics/test_metrics_golden.py"
