"""End to end: `agent run` as a subprocess against the fake API server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from agentproc import Agent, free_port

from fakeapi import FakeApiServer
from kube_support import AGENT_KUBE_CONFIG, NODE, PREFIX, fake, wait_for  # noqa: F401 - fixture


@pytest.fixture
def agent_run(fake: FakeApiServer, tmp_path: Any) -> Iterator[Any]:
    agents: list[Agent] = []

    def start(config: str, *args: str, prefix: tuple[str, ...] = ()) -> Agent:
        agent = Agent(tmp_path, config, args, env={"NODE_NAME": NODE}, wrap=prefix, log_format="text")
        agents.append(agent)
        agent.poll(lambda text: True, "/metrics")  # answering (or failing at once if the agent exits)
        return agent

    yield start
    for agent in agents:
        agent.stop()


def _disk_runs(agent: Agent) -> int:
    return int(agent.value("node_health_check_runs_total", check="disk") or 0)


# Checks that would otherwise watch this machine's GPUs, firewall and burn state stay off:
# each test turns on only what it drives.
BASE = AGENT_KUBE_CONFIG + """
[checks.gpu]
enabled = false
[checks.traffic]
enabled = false
[checks.burn]
enabled = false
"""


def test_agent_run_syncs_with_the_cluster_and_stops_cleanly(fake: FakeApiServer, agent_run: Any, tmp_path: Any) -> None:
    kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))
    no_checks = BASE + "[checks.disk]\nenabled = false\n[checks.network]\nenabled = false\n"
    agent = agent_run(no_checks, "--kubeconfig", kubeconfig)
    wait_for(lambda: 'node_health_kube_kill_switch{state="active"} 1.0' in agent.text(), timeout=20)
    text = agent.text()
    assert "node_health_kube_dry_run 0.0" in text
    assert 'node_health_kube_requests_total{code="200",resource="nodes",verb="list"} 1.0' in text
    assert fake.writes() == [], "no check watches a problem family: nothing to write"
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=15) == 0


def test_agent_run_without_a_cluster_is_a_dry_run(agent_run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    agent = agent_run(BASE)
    wait_for(lambda: "node_health_kube_dry_run 1.0" in agent.text(), timeout=20)


def test_a_bad_kubeconfig_is_one_line_and_exit_2(tmp_path: Any) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("not: [a kubeconfig")
    res = subprocess.run([sys.executable, "-m", "agent", "run", "--kubeconfig", str(bad), "--state-dir", str(tmp_path / "s"),
                          "--listen", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"agent: {bad}: cannot load the cluster credentials")


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(x) for x in fh.read().split()]


@pytest.fixture
def full_disk_ns(tmp_path: Any) -> Iterator[tuple[str, int]]:
    """A mount + PID namespace holding a 4 MiB tmpfs at a unique path; yields (path, a PID inside)."""
    from conftest import require_tool

    for tool in ("unshare", "nsenter"):
        require_tool(tool)
    mnt = tmp_path / f"nha-disk-{os.getpid()}-{time.monotonic_ns()}"
    mnt.mkdir()
    holder = subprocess.Popen(["unshare", "-m", "-p", "-f", "--mount-proc", "sh", "-c",
                               f'mount -t tmpfs -o size=4m nha-test "{mnt}" && exec sleep 600'])
    try:
        wait_for(lambda: _children(holder.pid) != [])
        inside = _children(holder.pid)[0]
        wait_for(lambda: str(mnt) in open(f"/proc/{inside}/mountinfo").read())
        yield str(mnt), inside
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.privileged
def test_a_disk_filling_up_taints_the_node_and_a_killed_agent_keeps_it(
        fake: FakeApiServer, agent_run: Any, tmp_path: Any, full_disk_ns: tuple[str, int]) -> None:
    """A tmpfs fills up → the real disk check reports DiskFull → taint, condition, event; the agent is
    SIGKILLed and started again → the taint stays and no event is sent twice."""
    mnt, inside = full_disk_ns
    kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))
    config = BASE + f"""
[checks.disk]
interval = "1s"
paths = ["{mnt}"]
include_state_dir = false
critical_free_percent = 50.0
warning_free_percent = 60.0
[checks.network]
enabled = false
"""
    # The agent runs in the namespaces of the tmpfs (the disk check reads the host's mount table from
    # /proc/1/mountinfo: there, the holder's); loopback is shared with the fake API server.
    enter = ("nsenter", "-t", str(inside), "-m", "-p", "--")
    agent = agent_run(config, "--kubeconfig", kubeconfig, prefix=enter)
    wait_for(lambda: fake.log(verbs=("patch",)) != [], timeout=30)  # healthy: the condition is written once
    assert [t for t in fake.node(NODE)["spec"].get("taints", []) if t["key"].startswith(PREFIX)] == []
    subprocess.run([*enter, "dd", "if=/dev/zero", f"of={mnt}/fill", "bs=1M", "count=3"], capture_output=True)
    wait_for(lambda: any(t["key"] == PREFIX + "disk" for t in fake.node(NODE)["spec"].get("taints", [])), timeout=30)
    wait_for(lambda: "DiskFull" in [e["reason"] for e in fake.events()], timeout=10)
    events = len(fake.events())
    for pid in _children(agent.proc.pid):  # the agent itself (nsenter forked it into the PID namespace)
        os.kill(pid, signal.SIGKILL)
    agent.proc.wait(timeout=10)
    restarted = time.monotonic()
    agent = agent_run(config, "--kubeconfig", kubeconfig, prefix=enter)
    wait_for(lambda: 'node_health_kube_taint{effect="NoSchedule",key="node-health-agent/disk"} 1.0' in agent.text(),
             timeout=30)
    # Positive proof that time passed with the agent at work: three more runs of the disk check.
    first = _disk_runs(agent)
    wait_for(lambda: _disk_runs(agent) >= first + 3, timeout=30)  # three disk check runs after the restart
    assert any(t["key"] == PREFIX + "disk" for t in fake.node(NODE)["spec"].get("taints", []))
    assert len(fake.events()) == events, "no event sent twice"
    assert [r for r in fake.writes(since=restarted) if r.path.endswith(NODE)] == [], "the node needed no change"
