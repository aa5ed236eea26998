"""The kernel check in `agent run`: a fault in the followed log on /metrics,
and, on the real /dev/kmsg, a kernel-facility record the test makes the
kernel print (a bridge port in a network namespace of its own) raising an
operator's pattern while the same text written by a process does not, with
one reader of /dev/kmsg for the whole agent."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from agentproc import Agent, wait_for
from netns_helpers import netns

HUNG = "INFO: task python3:4242 blocked for more than 122 seconds."
OOPS = "BUG: kernel NULL pointer dereference, address: 0000000000000008"


def _finding(agent: Agent, subject: str, reason: str, severity: str) -> float | None:
    return agent.value("node_health_finding", check="kernel-log", subject=subject, reason=reason, severity=severity)


def test_agent_run_raises_a_fault_from_the_followed_log_on_metrics(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(f"3,1,5000000,-;{HUNG}\n")
    agent = Agent(tmp_path, f'[checks.kernel]\ninterval = "1s"\nkmsg_path = "{kmsg}"\nedac = false\n')
    try:
        agent.wait_ready()
        wait_for(lambda: agent.value("node_health_kernel_faults_total", fault="hung_task") == 1, what="the backlog's hung task")
        assert _finding(agent, "kernel_oops", "KernelOops", "critical") == 0  # known: exported at 0 from start
        with open(kmsg, "a") as fh:
            fh.write(f"0,2,6000000,-;{OOPS}\n12,3,6000100,-;watchdog: BUG: soft lockup - CPU#1 stuck for 23s! [x:1]\n")
        wait_for(lambda: _finding(agent, "kernel_oops", "KernelOops", "critical") == 1, what="the oops on /metrics")
        assert agent.value("node_health_kernel_faults_not_kernel_total") == 1
        assert agent.value("node_health_kernel_faults_total", fault="soft_lockup") == 0
        assert agent.value("node_health_kube_active_finding", check="kernel-log", subject="kernel_oops",
                           reason="KernelOops", severity="critical") == 1  # counts at once: critical
    finally:
        assert agent.stop() == 0, agent.logs()
    # A restart in the same boot: nothing counted twice, the oops still active (until reboot).
    agent = Agent(tmp_path, f'[checks.kernel]\ninterval = "1s"\nkmsg_path = "{kmsg}"\nedac = false\n')
    try:
        agent.wait_ready()
        wait_for(lambda: _finding(agent, "kernel_oops", "KernelOops", "critical") == 1, what="the oops after a restart")
        assert agent.value("node_health_kernel_faults_total", fault="hung_task") == 1
    finally:
        assert agent.stop() == 0, agent.logs()


def _kmsg_fds(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/kmsg"
        except OSError:
            pass
    return n


@pytest.mark.privileged
def test_real_kernel_record_raises_a_pattern_and_a_forged_one_does_not(tmp_path: Path) -> None:
    with open("/proc/sys/kernel/printk_devkmsg") as fh:
        if fh.read().strip() == "off":
            pytest.skip("kernel.printk_devkmsg=off drops writes to /dev/kmsg")
    tag = uuid.uuid4().hex[:6]
    bridge, forged = f"nhk{tag}", f"nhf{tag}"
    # br_info(): "<bridge>: port <n>(<dev>) entered blocking state", KERN_INFO from the bridge driver.
    config = f"""
[checks.gpu]
nvml_library = "/no-driver/libnvidia-ml.so.1"
[checks.kernel]
edac = false
[checks.kernel.patterns.bridge_{tag}]
pattern = '{bridge}: port \\d+\\(\\S+\\) entered blocking state'
severity = "warning"
[checks.kernel.patterns.forged_{tag}]
pattern = '{forged}: port \\d+\\(\\S+\\) entered blocking state'
severity = "critical"
"""
    agent = Agent(tmp_path, config)
    try:
        agent.wait_ready()
        wait_for(lambda: agent.value("node_health_kernel_log_up") == 1 and agent.value("node_health_kmsg_up") == 1,
                 what="both features following /dev/kmsg")
        assert _kmsg_fds(agent.agent_pid()) == 1  # one reader for the Xid follower and the fault table
        with open("/dev/kmsg", "w") as fh:  # a process's record: facility user, whatever it says
            fh.write(f"{forged}: port 1(veth0) entered blocking state\n")
        with netns() as ns:
            ns.ip("link", "add", bridge, "type", "bridge")
            ns.ip("link", "add", f"v{tag}", "type", "veth", "peer", "name", f"p{tag}")
            ns.ip("link", "set", f"v{tag}", "master", bridge)
            ns.ip("link", "set", bridge, "up")
            ns.ip("link", "set", f"v{tag}", "up")
            wait_for(lambda: agent.value("node_health_finding", check="kernel-log", subject=f"bridge_{tag}",
                                         reason="KernelLogPattern", severity="warning") == 1,
                     what="the kernel's bridge record as a finding")
        assert agent.value("node_health_kernel_faults_total", fault=f"forged_{tag}") == 0
        assert (agent.value("node_health_kernel_faults_not_kernel_total") or 0) >= 1
        assert agent.value("node_health_finding", check="kernel-log", subject=f"forged_{tag}",
                           reason="KernelLogPattern", severity="critical") is None
        assert "written by a process" in agent.logs()
    finally:
        assert agent.stop() == 0, agent.logs()
