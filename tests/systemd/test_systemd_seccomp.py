"""The agent under the shipped unit's system-call filter does all its work.

`SystemCallFilter=` and `SystemCallErrorNumber=EPERM` of
systemd/node-health-agent.service, expanded by `systemd-analyze` and loaded with
libseccomp (tests/support/seccomp_exec.py), wrap real agents: one with NVML (the fake
libnvidia-ml), the boot-time burn (real cuda-bindings workers on the CPU fake
CUDA driver), the disk and network checks and the Kubernetes client against
the fake API server; one keeping traffic rules with iptables-legacy (raw
socket setsockopt) and iptables-nft (netlink) in namespaces of the test's own.
A call the filter refuses would fail a check, the burn or the rules.

What this cannot show is the real NVIDIA driver's own calls: docs/systemd.md
says what they are and why the filter keeps them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import fakelibcuda
import fakenvml
import pytest
from agentproc import Agent, wait_for
from conftest import NO_HOST_KMSG, require_tool
from test_systemd_unit import allowed_syscalls
from traffic_lab import lab, lab_agent, metric, send, until

from fakeapi import FakeApiServer
from kube_support import AGENT_KUBE_CONFIG, NODE, PREFIX, fake, our_taints  # noqa: F401 - fixture

SECCOMP_EXEC = Path(__file__).parent.parent / "support" / "seccomp_exec.py"


@pytest.fixture
def under_the_unit_filter(tmp_path: Path) -> Iterator[list[str]]:
    """The command prefix that runs what follows it under the unit's filter."""
    allowed = tmp_path / "allowed-syscalls"
    allowed.write_text("\n".join(sorted(allowed_syscalls())) + "\n")
    yield [sys.executable, str(SECCOMP_EXEC), str(allowed), "--"]


def test_the_filter_refuses_with_eperm(under_the_unit_filter: list[str], tmp_path: Path) -> None:
    """The wrapper does filter: a call the unit leaves out fails with EPERM (setuid(0) as root would succeed)."""
    code = "import os\ntry:\n    os.setuid(0)\nexcept PermissionError:\n    print('EPERM')\n"
    res = subprocess.run([*under_the_unit_filter, sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "EPERM", res.stderr


def test_nvml_the_burn_disks_network_and_kubernetes_under_the_filter(
    under_the_unit_filter: list[str], fake_gpu_libs: str, fake: FakeApiServer, tmp_path: Path
) -> None:
    scenario = fakenvml.Scenario(str(tmp_path / "nvml-scenario")).set([fakenvml.h100(0), fakenvml.h100(1)])
    env = fakelibcuda.env(fake_gpu_libs, {}) | {"FAKE_NVML_SCENARIO": scenario.path, "NODE_NAME": NODE}
    config = AGENT_KUBE_CONFIG + f"""
[checks.disk]
interval = "1s"
paths = []
[checks.network]
interval = "1s"
interfaces = ["lo"]
[checks.gpu]
interval = "1s"
nvml_library = "{fake_gpu_libs}/libnvidia-ml.so.1"
xid_events = false
""" + fakelibcuda.QUICK_BURN_CONFIG
    kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))
    agent = Agent(tmp_path, config, args=["--kubeconfig", kubeconfig], env=env, wrap=under_the_unit_filter)
    try:
        agent.wait_ready()
        wait_for(lambda: agent.value("node_health_burn_preflight_state", state="passed") == 1, timeout=120,
                 what="the burn passed")  # fmt: skip
        wait_for(lambda: our_taints(fake) == [], timeout=60, what="the preflight taint removed")
        for check in ("disk", "network", "gpu", "burn"):
            wait_for(lambda c=check: (agent.value("node_health_check_runs_total", check=c) or 0) >= 1, what=check)
            assert agent.value("node_health_check_success", check=check) == 1, agent.logs()
        assert agent.value("node_health_nvml_up") == 1
        assert agent.value("node_health_gpus", source="nvml") == 2
        for gpu in ("0", "1"):
            assert agent.value("node_health_burn_gpu_pass", gpu=gpu) == 1, agent.logs()
        # the state dir's filesystem, whatever its mount point here
        assert re.search(rb'node_health_disk_probe_success\{mountpoint="[^"]+"\} 1.0', agent.get("/metrics")[1])
    finally:
        assert agent.stop() == 0, agent.logs()
    assert "Operation not permitted" not in agent.logs()


@pytest.mark.privileged
@pytest.mark.parametrize("backend", ["legacy", "nft"])
def test_traffic_rules_under_the_filter(under_the_unit_filter: list[str], tmp_path: Path, backend: str) -> None:
    require_tool(f"iptables-{backend}")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[agent]\nlog_format = "text"\n[checks.traffic]\nenabled = true\ninterval = "1s"\n'
                   f'backend = "{backend}"\n' + NO_HOST_KMSG)  # fmt: skip
    with lab() as L:
        agent = lab_agent(L.node, tmp_path, cfg, tmp_path / "agent.log", wrap=under_the_unit_filter)
        agent.start()
        try:
            until(agent, "rules in place", lambda s: metric(s, "node_health_traffic_rules_in_place", family="ipv4"))
            send(L.node, L.ns["internet"], "198.51.100.2", 1_000_000)
            until(agent, "counted", lambda s: (metric(s, "node_health_traffic_bytes_total",
                                                        direction="internet-out", family="ipv4") or 0) >= 1_000_000)
        finally:
            agent.stop(20)
            L.node.agent("rules", "remove", "--backend", backend)
