"""`agent run` end to end on a bare-metal host (no cluster): an Xid 79 (action
reboot) in the kernel log, fake programs on PATH, a boot ID file the test
changes as a real boot would. The Kubernetes side's end to end is drain's
fake API server (tests/kube)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from agentproc import NO_TRAFFIC, Agent, wait_for
from fakebins import FakeBins, FakeProc
from fakenvml import h100
from fakenvml.fixtures import HostTree, fake_nvml_lib, scenario  # noqa: F401 - fixtures

XID79 = (
    "6,1000,5000000,-;NVRM: GPU at PCI:0000:3b:00: GPU-6c1b7a44-7a5d-8f0e-3b3c-9d2a1f0e4c11\n"
    "4,1001,5000100,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
)


class Host:
    def __init__(self, tmp: Path) -> None:
        self.bins = FakeBins(tmp)
        self.proc = FakeProc(tmp)
        self.root = tmp / "root"
        self.root.mkdir()
        (tmp / "sys").mkdir()
        self.sys = tmp / "sys"
        self.kmsg(XID79)

    def kmsg(self, text: str) -> None:
        (self.root / "kmsg").write_text(text)

    def config(self, remediation: str) -> str:
        return f"""
[paths]
procfs = "{self.proc.root}"
sysfs = "{self.sys}"
rootfs = "{self.root}"
[checks.disk]
enabled = false
[checks.network]
enabled = false
[checks.burn]
enabled = false
[checks.gpu]
interval = "1s"
nvml_library = "/no-driver/libnvidia-ml.so.1"
kmsg_path = "/kmsg"
[remediation]
interval = "1s"
reboot_after = "0s"
{remediation}
""" + NO_TRAFFIC

    def boot(self, boot_id: str) -> None:
        """What a reboot does to what the agent reads: a new boot ID, a fresh uptime, a new kernel log."""
        self.proc.boot(boot_id)
        self.proc.uptime(5.0)
        self.kmsg("")


ENFORCE = """mode = "enforce"
actions = ["reboot", "retire"]
[remediation.reboot]
settle = "2s"
"""


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def host_tree(tmp: Path) -> HostTree:
    return HostTree(str(tmp / "nvml-host"))  # its own boot ID, PCI devices, this machine's mountinfo


def agent(tmp: Path, host: Host, remediation: str, args: tuple[str, ...] = ()) -> Agent:
    env = {"PATH": host.bins.env_path(), "KUBERNETES_SERVICE_HOST": "", "KUBECONFIG": ""}
    return Agent(tmp, host.config(remediation), args=args, env=env)


def step(a: Agent) -> str | None:
    for labels, v in a.metrics().get("node_health_remediation_step", []):
        if v == 1:
            return labels["step"]
    return None


def test_reboot_fault_reboots_once_survives_a_kill_and_is_released_after_the_new_boot(tmp_path, host):
    a = agent(tmp_path, host, ENFORCE)
    try:
        a.wait_ready()
        wait_for(lambda: host.bins.calls("systemctl") == [["reboot"]], what="systemctl reboot")
        a.poll(lambda _: step(a) == "rebooting", what="step rebooting")
        os.kill(a.agent_pid(), signal.SIGKILL)  # killed while the reboot is under way
        a.proc.wait()
        a._log.close()
        a.start()
        a.wait_ready()
        ticks = a.value("node_health_check_runs_total", check="gpu") or 0
        wait_for(lambda: (a.value("node_health_check_runs_total", check="gpu") or 0) >= ticks + 3, what="3 more runs")
        assert step(a) == "rebooting" and host.bins.calls("systemctl") == [["reboot"]], a.logs()
    finally:
        a.stop()
    host.boot("22222222-2222-2222-2222-222222222222")
    a.start()
    try:
        a.wait_ready()
        a.poll(lambda _: step(a) == "idle", what="released after the settle time")
        assert host.bins.calls("systemctl") == [["reboot"]]
        assert a.value("node_health_remediation_reboots") == 1
        assert a.value("node_health_remediation_uncured_reboots") == 0
        assert "rebooted (boot ID 22222222" in a.logs()
    finally:
        assert a.stop() == 0, a.logs()


def test_the_same_fault_after_two_reboots_retires_without_a_third(tmp_path, host):
    a = agent(tmp_path, host, ENFORCE.replace('settle = "2s"', 'settle = "2s"\nmin_uptime = "0s"'), )
    try:
        for n, boot in enumerate(("22222222-0000-0000-0000-000000000000", "33333333-0000-0000-0000-000000000000"), 1):
            a.wait_ready()
            wait_for(lambda n=n: len(host.bins.calls("systemctl")) == n, what=f"reboot {n}")
            a.stop()
            host.boot(boot)
            host.kmsg(XID79)  # the same fault is back after the boot
            a.start()
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_retired") == 1, what="retired")
        assert len(host.bins.calls("systemctl")) == 2
        assert a.value("node_health_remediation_uncured_reboots") == 2
        assert a.value("node_health_finding", check="remediation", subject="node", reason="NodeRetired",
                       severity="critical") == 1
    finally:
        assert a.stop() == 0, a.logs()


@pytest.mark.parametrize(
    ("remediation", "args", "cause"),
    [
        pytest.param("", (), "observe", id="observe by default"),
        pytest.param(ENFORCE, ("--dry-run",), "dry_run", id="--dry-run"),
        pytest.param('mode = "enforce"\nactions = ["drain"]', (), "disabled", id="reboot not enabled"),
    ],
)
def test_nothing_runs_and_the_would_metric_says_why(tmp_path, host, remediation, args, cause):
    a = agent(tmp_path, host, remediation, args)
    try:
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_would", action="reboot", cause=cause) == 1, what="would reboot")
        assert host.bins.calls() == []
        assert "systemctl reboot" in a.logs()
    finally:
        assert a.stop() == 0, a.logs()


def test_reset_gpu_fault_resets_that_uuid_with_persistence_toggled_and_is_released(tmp_path, host, scenario, fake_nvml_lib):
    """A pending row remap (action reset_gpu) seen through the fake NVML: the UUID comes from
    node_health_gpu_info, the reset from the fake nvidia-smi; no reboot."""
    nvml_host = host_tree(tmp_path)
    nvml_host.add_gpu("0000:18:00")
    scenario.set([h100(0, remapped="0 0 1 0")])
    bins = FakeBins(tmp_path / "reset")
    remediation = f"""
[remediation]
mode = "enforce"
actions = ["reset_gpu", "reboot"]
interval = "1s"
reset_gpu_after = "0s"
[remediation.gpu_reset]
nvidia_smi = "{bins.path('nvidia-smi')}"
verify_burn = "0s"
"""
    toml = nvml_host.toml(str(tmp_path / "state"), 'interval = "1s"\n', fake_nvml_lib)
    toml = toml.replace("[checks.gpu]", "[checks.burn]\nenabled = false\n[checks.gpu]") + remediation
    a = Agent(tmp_path, toml, env={"PATH": bins.env_path()})
    try:
        a.wait_ready()
        uuid = "GPU-00000000-1111-2222-3333-444455556666"
        wait_for(lambda: ["--gpu-reset", "-i", uuid] in bins.calls("nvidia-smi"), timeout=60, what="the reset")
        a.poll(lambda _: a.value("node_health_remediation_actions_total", action="reset_gpu", result="ok") == 1,
               what="reset counted")
        a.poll(lambda _: step(a) == "idle", what="released")
        acts = [c for c in bins.calls("nvidia-smi") if not any(x.startswith("--query") for x in c)]
        assert acts[:3] == [["-i", uuid, "-pm", "0"], ["--gpu-reset", "-i", uuid], ["-i", uuid, "-pm", "1"]]
        assert ["-q", "-i", uuid] in acts and bins.calls("systemctl") == []
    finally:
        assert a.stop() == 0, a.logs()


def test_unretire_from_outside_while_agent_run_holds_the_state_dir(tmp_path, host):
    """As in the DaemonSet (kubectl exec into the running agent's pod): `agent remediation unretire` while
    `agent run` holds the state dir's lock asks the running agent, which clears its own record; exit 0."""
    import json
    import subprocess
    import sys

    state = tmp_path / "state"
    state.mkdir()
    (state / "remediation.json").write_text(json.dumps({
        "version": 1, "retired": {"at": 1.8e9, "key": "gpu/gpu0/XidCritical79", "why": "2 reboots did not cure it",
                                  "command_done": True},
        "reboots": [{"key": "gpu/gpu0/XidCritical79", "at": 1.8e9, "boot_id": "b-1", "back": True}]}))
    host.kmsg("")  # the GPU was replaced: no fault now
    a = agent(tmp_path, host, ENFORCE)
    try:
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_retired") == 1, what="retired from the record")
        p = subprocess.run([sys.executable, "-m", "agent", "remediation", "unretire", "--state-dir", str(state),
                            "--wait", "60"], capture_output=True, text=True, timeout=90, env={**os.environ})
        assert p.returncode == 0 and "un-retired by the running agent" in p.stdout, (p.stdout, p.stderr, a.logs())
        a.poll(lambda _: a.value("node_health_remediation_retired") == 0, what="not retired")
        assert a.value("node_health_remediation_reboots") == 0 and step(a) == "idle"
        assert not (state / "remediation-unretire.json").exists()
        assert "un-retire requested by an operator" in a.logs()
    finally:
        assert a.stop() == 0, a.logs()
    status = subprocess.run([sys.executable, "-m", "agent", "remediation", "status", "--state-dir", str(state)],
                            capture_output=True, text=True, timeout=60)
    assert json.loads(status.stdout)["retired"] is None and host.bins.calls("systemctl") == []
