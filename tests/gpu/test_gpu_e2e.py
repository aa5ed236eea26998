"""End to end: `agent run` as a subprocess with the fake NVML and a followed
kernel log file; faults are injected and /metrics is watched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from agentproc import free_port
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

pytestmark = pytest.mark.slow


class Agent:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc, self.port = proc, port

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return r.read().decode()

    def wait_metric(self, pred: Callable[[str], bool], timeout: float = 30.0) -> str:
        deadline, text = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read().decode()  # type: ignore[union-attr]
            try:
                text = self.metrics()
            except OSError:
                text = ""
            if pred(text):
                return text
            time.sleep(0.1)
        raise AssertionError("metric condition not met; last scrape:\n" + "\n".join(x for x in text.splitlines() if "kmsg" in x or "xid" in x or "Xid" in x)[-3000:])


@pytest.fixture
def run_agent(tmp_path, host, scenario, fake_nvml_lib) -> Iterator[Callable[..., Agent]]:
    procs: list[subprocess.Popen[bytes]] = []
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")

    def start(extra: str = "") -> Agent:
        port = free_port()
        cfg = tmp_path / "agent.toml"
        toml = host.toml(str(tmp_path / "state"), f'interval = "1s"\ncall_timeout = "500ms"\nkmsg_path = "{kmsg}"\n{extra}', fake_nvml_lib)
        cfg.write_text(toml.replace("[agent]\n", "[agent]\njitter = 0.0\n") + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "run", "--config", str(cfg), "--log-format", "json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ},
        )
        procs.append(proc)
        return Agent(proc, port)

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def finding(check: str, subject: str, reason: str, severity: str) -> str:
    return f'node_health_finding{{check="{check}",reason="{reason}",severity="{severity}",subject="{subject}"}} 1.0'


def test_agent_run_sees_xids_ecc_and_a_lost_gpu(run_agent, scenario, host, tmp_path) -> None:
    host.add_gpu("0000:18:00")
    host.add_gpu("0000:28:00")
    scenario.set([h100(0), h100(1)])
    agent = run_agent()
    text = agent.wait_metric(lambda t: 'node_health_gpu_up{gpu="1"} 1.0' in t and "node_health_nvml_events_up 1.0" in t)
    assert "node_health_gpu_info{" in text and 'node_health_check_success{check="gpu"} 1.0' in text

    with open(tmp_path / "kmsg", "a") as fh:  # the kernel log first, then NVML's event for the same Xid
        fh.write(f"4,0,{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n")
    scenario.xid(0, 79)
    text = agent.wait_metric(lambda t: finding("xid", "gpu0", "Xid79", "critical") in t
                             and 'node_health_gpu_xid_source_events_total{source="nvml"} 1.0' in t)
    assert 'node_health_gpu_xid_errors_total{gpu="0",xid="79"} 1.0' in text

    scenario.gpu(1, **{"ecc.unc.vol": 2})
    agent.wait_metric(lambda t: finding("gpu", "gpu1", "EccUncorrectable", "critical") in t)
    scenario.gpu(1, lost=1)
    agent.wait_metric(lambda t: finding("gpu", "gpu1", "GpuLost", "critical") in t)


def test_hung_nvml_call_is_reported_and_the_agent_keeps_serving(run_agent, scenario, host) -> None:
    scenario.set([h100(0)])
    agent = run_agent()
    agent.wait_metric(lambda t: 'node_health_gpu_up{gpu="0"} 1.0' in t)
    scenario.set(**{"hang.nvmlDeviceGetTemperature": 120})
    agent.wait_metric(lambda t: 'reason="NvmlCallHung"' in t and 'subject="gpu0"' in t)
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/healthz", timeout=5) as r:
        assert r.status == 200


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
    port = free_port()
    cfg = tmp_path / "agent.toml"
    toml = host.toml(state, f'kmsg_path = "{kmsg}"\n', fake_nvml_lib)
    cfg.write_text(toml + "[checks.disk]\nenabled = false\n" + f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log:
        proc = mount_ns.popen([sys.executable, "-m", "agent", "run", "--config", str(cfg), "--log-format", "json"],
                              stdout=subprocess.DEVNULL, stderr=log)
    agent = Agent(proc, port)  # type: ignore[arg-type]
    try:
        agent.wait_metric(lambda t: "node_health_kmsg_up 1.0" in t)
        mount_ns.run(["dd", "if=/dev/zero", f"of={state}/fill", "bs=64k"], check=False)  # stops with ENOSPC
        lines = [f"4,{i},{5_000_000 + i},-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, line {i}\n" for i in range(3)]
        with open(kmsg, "a") as fh:
            fh.write(lines[0])
        agent.wait_metric(lambda t: "node_health_xid_state_save_failing 1.0" in t)
        for line in lines[1:]:  # more events while it fails: each would have been a save (and a log line)
            with open(kmsg, "a") as fh:
                fh.write(line)
        text = agent.wait_metric(lambda t: "node_health_kmsg_records_read_total 3.0" in t
                                 and _value(t, "node_health_xid_state_save_errors_total") >= 3)  # retried with backoff
        assert "node_health_xid_state_save_failing 1.0" in text
        mount_ns.run(["rm", "-f", f"{state}/fill"])
        agent.wait_metric(lambda t: "node_health_xid_state_save_failing 0.0" in t)
        saved = json.loads(mount_ns.run(["cat", f"{state}/xid-stream.json"]).stdout)
        assert saved["stream"]["cursor"] == 2
        assert [n for _, _, n in saved["stream"]["counts"]] == [3]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    said = [json.loads(line)["msg"] for line in log_path.read_text().splitlines() if "Xid stream state" in line]
    assert len(said) == 2, said
    assert "cannot save the Xid stream state" in said[0] and "No space left on device" in said[0]
    assert "saved the Xid stream state" in said[1] and "again" in said[1]


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0
