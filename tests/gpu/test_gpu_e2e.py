"""End to end: `agent run` as a subprocess with the fake NVML and a followed
kernel log file; faults are injected and /metrics is watched."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from agentproc import Agent
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

pytestmark = pytest.mark.slow


def _kmsg_lines(text: str) -> str:
    return "\n".join(x for x in text.splitlines() if "kmsg" in x or "xid" in x or "Xid" in x)[-3000:]


def wait_metric(agent: Agent, pred: Callable[[str], bool], timeout: float = 30.0) -> str:
    """The /metrics text once pred(text) holds."""
    return agent.poll(lambda t: pred(t) and t, "the metric condition", timeout, show=_kmsg_lines)


@pytest.fixture
def run_agent(tmp_path, host, scenario, fake_nvml_lib) -> Iterator[Callable[..., Agent]]:
    agents: list[Agent] = []
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")

    def start(extra: str = "") -> Agent:
        toml = host.toml(str(tmp_path / "state"), f'interval = "1s"\ncall_timeout = "500ms"\nkmsg_path = "{kmsg}"\n{extra}', fake_nvml_lib)
        agents.append(Agent(tmp_path, toml.replace("[agent]\n", "[agent]\njitter = 0.0\n")))
        return agents[-1]

    yield start
    for agent in agents:
        agent.stop()


def finding(check: str, subject: str, reason: str, severity: str) -> str:
    gpu = subject[3:] if subject[3:].isdigit() else ""
    return f'node_health_finding{{check="{check}",gpu="{gpu}",reason="{reason}",severity="{severity}",subject="{subject}"}} 1.0'


def test_agent_run_sees_xids_ecc_and_a_lost_gpu(run_agent, scenario, host, tmp_path) -> None:
    host.add_gpu("0000:18:00")
    host.add_gpu("0000:28:00")
    scenario.set([h100(0), h100(1)])
    agent = run_agent()
    text = wait_metric(agent, lambda t: 'node_health_gpu_up{gpu="1"} 1.0' in t and "node_health_nvml_events_up 1.0" in t)
    assert "node_health_gpu_info{" in text and 'node_health_check_success{check="gpu"} 1.0' in text

    with open(tmp_path / "kmsg", "a") as fh:  # the kernel log first, then NVML's event for the same Xid
        fh.write(f"4,0,{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n")
    scenario.xid(0, 79)
    text = wait_metric(agent, lambda t: finding("xid", "gpu0", "Xid79", "critical") in t
                             and 'node_health_gpu_xid_source_events_total{source="nvml"} 1.0' in t)
    assert 'node_health_gpu_xid_errors_total{gpu="0",xid="79"} 1.0' in text

    scenario.gpu(1, **{"ecc.unc.vol": 2})
    wait_metric(agent, lambda t: finding("gpu", "gpu1", "EccUncorrectable", "critical") in t)
    scenario.gpu(1, lost=1)
    wait_metric(agent, lambda t: finding("gpu", "gpu1", "GpuLost", "critical") in t)


def test_hung_nvml_call_is_reported_and_the_agent_keeps_serving(run_agent, scenario, host) -> None:
    scenario.set([h100(0)])
    agent = run_agent()
    wait_metric(agent, lambda t: 'node_health_gpu_up{gpu="0"} 1.0' in t)
    scenario.set(**{"hang.nvmlDeviceGetTemperature": 120})
    wait_metric(agent, lambda t: 'reason="NvmlCallHung"' in t and 'subject="gpu0"' in t)
    assert agent.get("/healthz")[0] == 200


def test_selftest_includes_the_gpu_check(tmp_path, host, scenario, fake_nvml_lib) -> None:
    scenario.set([h100(0, **{"ecc.unc.vol": 1})])
    cfg = tmp_path / "agent.toml"
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("4,0,5000000,-;NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error (DBE) has been detected.\n")
    cfg.write_text(host.toml(str(tmp_path / "state"), f'kmsg_path = "{kmsg}"\n', fake_nvml_lib))
    res = subprocess.run([sys.executable, "-m", "agent", "selftest", "--config", str(cfg), "--only", "gpu", "--json"],
                         capture_output=True, timeout=60)
    assert res.returncode == 1, res.stderr
    report = json.loads(res.stdout)
    got = {(f["subject"], f["reason"], f["severity"]) for f in report["findings"]}
    assert got == {("gpu0", "EccUncorrectable", "critical"), ("gpu0", "Xid48", "critical")}


def test_selftest_only_xid_names_the_xids_as_the_daemon_exports_them(run_agent, tmp_path, host, scenario) -> None:
    """An alert says check="xid", subject="gpu0", gpu="0": `agent selftest --only xid` on that node is
    accepted and reports the same finding under the same names as the running agent's /metrics."""
    host.add_gpu("0000:18:00")
    scenario.set([h100(0)])
    (tmp_path / "kmsg").write_text("4,0,5000000,-;NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error (DBE) "
                                   "has been detected.\n")
    agent = run_agent()
    wait_metric(agent, lambda t: finding("xid", "gpu0", "Xid48", "critical") in t)
    daemon = {(labels["check"], labels["subject"], labels["reason"], labels["gpu"])
              for labels, value in agent.metrics()["node_health_finding"] if value == 1 and labels["check"] == "xid"}
    res = subprocess.run([sys.executable, "-m", "agent", "selftest", "--config", str(agent.config_path), "--only", "xid",
                          "--json"], capture_output=True, timeout=60)
    assert res.returncode == 1, res.stderr
    report = json.loads(res.stdout)
    assert [c["name"] for c in report["checks"]] == ["gpu"], "xid names the gpu check's Xid stream"
    selftest = {(f["check"], f["subject"], f["reason"], f["subject"][3:]) for f in report["findings"] if f["check"] == "xid"}
    assert daemon == selftest == {("xid", "gpu0", "Xid48", "0")}
    table = subprocess.run([sys.executable, "-m", "agent", "selftest", "--config", str(agent.config_path), "--only", "xid"],
                           capture_output=True, text=True, timeout=60)
    assert any(line.split()[:3] == ["xid", "gpu0", "CRITICAL"] for line in table.stdout.splitlines()), table.stdout


def test_no_nvml_info_finding_and_other_checks_run(tmp_path, host) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(host.toml(str(tmp_path / "state"), 'xid_events = false\n', str(tmp_path / "none" / "libnvidia-ml.so.1")))
    res = subprocess.run([sys.executable, "-m", "agent", "selftest", "--config", str(cfg), "--json"], capture_output=True, timeout=60)
    report = json.loads(res.stdout)
    assert res.returncode == 0, res.stdout
    assert [(f["reason"], f["severity"]) for f in report["findings"] if f["check"] == "gpu"] == [("NvmlUnavailable", "info")]
    assert {c["name"] for c in report["checks"]} >= {"gpu", "disk"}


@pytest.mark.privileged
def test_full_state_dir_is_said_once_retried_and_saved_when_space_returns(tmp_path, host, mount_ns, fake_nvml_lib) -> None:
    """The state dir on a real 1 MiB tmpfs (in a private mount namespace, where
    the agent runs), filled with dd until ENOSPC while Xids arrive."""
    state = mount_ns.tmpfs(tmp_path / "state", "size=1m,mode=700")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    toml = host.toml(state, f'kmsg_path = "{kmsg}"\n', fake_nvml_lib)
    agent = Agent(tmp_path, toml + "[checks.disk]\nenabled = false\n", wrap=mount_ns.cmd([]))
    try:
        wait_metric(agent, lambda t: "node_health_kmsg_up 1.0" in t)
        mount_ns.run(["dd", "if=/dev/zero", f"of={state}/fill", "bs=64k"], check=False)  # stops with ENOSPC
        lines = [f"4,{i},{5_000_000 + i},-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, line {i}\n" for i in range(3)]
        with open(kmsg, "a") as fh:
            fh.write(lines[0])
        wait_metric(agent, lambda t: "node_health_xid_state_save_failing 1.0" in t)
        for line in lines[1:]:  # more events while it fails: each would have been a save (and a log line)
            with open(kmsg, "a") as fh:
                fh.write(line)
        text = wait_metric(agent, lambda t: "node_health_kmsg_records_read_total 3.0" in t
                                 and _value(t, "node_health_xid_state_save_errors_total") >= 3)  # retried with backoff
        assert "node_health_xid_state_save_failing 1.0" in text
        mount_ns.run(["rm", "-f", f"{state}/fill"])
        wait_metric(agent, lambda t: "node_health_xid_state_save_failing 0.0" in t)
        saved = json.loads(mount_ns.run(["cat", f"{state}/xid-stream.json"]).stdout)
        assert saved["stream"]["cursor"] == 2
        assert [n for _, _, n in saved["stream"]["counts"]] == [3]
    finally:
        agent.stop(15)
    said = [json.loads(line)["msg"] for line in agent.logs().splitlines() if "Xid stream state" in line]
    assert len(said) == 2, said
    assert "cannot save the Xid stream state" in said[0] and "No space left on device" in said[0]
    assert "saved the Xid stream state" in said[1] and "again" in said[1]


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0
