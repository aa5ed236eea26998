"""End to end: `agent run` follows a fake kernel log (a file of /dev/kmsg records) and an
operator's named pattern raises its own reason on the Node condition and the taint of the
fake API server; a reload that changes the pattern takes effect, an invalid one is refused
and the running patterns keep working."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentproc import Agent

from fakeapi import FakeApiServer
from kube_support import AGENT_KUBE_CONFIG, NODE, PREFIX, fake, wait_for  # noqa: F401 - fixture

CONDITION = "NodeHealthKernelProblem"


def _config(kmsg: Path, patterns: str) -> str:
    return AGENT_KUBE_CONFIG + f"""
[metrics]
findings_at_zero = "all"
[checks.gpu]
enabled = false
[checks.traffic]
enabled = false
[checks.burn]
enabled = false
[checks.disk]
enabled = false
[checks.network]
enabled = false
[checks.kernel]
kmsg_path = "{kmsg}"
edac = false
""" + patterns


GSP = """
[checks.kernel.patterns.gsp_timeout]
pattern = 'NVRM: GPU\\d+ GSP RPC timeout'
reason = "GspRpcTimeout"
severity = "critical"
hold = "boot"
"""
# the reload: the same name, now also another wording, and a second pattern of its own
GSP_AND_FABRIC = """
[checks.kernel.patterns.gsp_timeout]
pattern = 'NVRM: GPU\\d+ GSP RPC (?:timeout|hang)'
reason = "GspRpcTimeout"
severity = "critical"
hold = "boot"
[checks.kernel.patterns.fabric_lost]
pattern = 'nvidia-fabricmanager: lost connection'
reason = "FabricManagerLost"
severity = "critical"
hold = "boot"
"""


class Log:
    """A /dev/kmsg stand-in: records appended with the kernel's header, stamped now (this boot)."""

    def __init__(self, path: Path) -> None:
        self.path, self.seq = path, 0
        path.write_text("")

    def add(self, message: str) -> None:
        self.seq += 1
        with open(self.path, "a") as fh:
            fh.write(f"3,{self.seq},{int(time.monotonic() * 1e6)},-;{message}\n")


@pytest.fixture
def started(fake: FakeApiServer, tmp_path: Path) -> Iterator[Any]:
    agents: list[Agent] = []

    def start(config: str) -> Agent:
        kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))
        agent = Agent(tmp_path, config, ("--kubeconfig", kubeconfig), env={"NODE_NAME": NODE}, log_format="text")
        agents.append(agent)
        agent.wait_ready()
        return agent

    yield start
    for agent in agents:
        assert agent.stop() == 0, agent.logs()


def _condition(fake: FakeApiServer) -> tuple[str, str] | None:
    for c in fake.node(NODE)["status"].get("conditions", []):
        if c["type"] == CONDITION:
            return c["status"], c["reason"]
    return None


def _taint(fake: FakeApiServer) -> str | None:
    for t in fake.node(NODE)["spec"].get("taints", []):
        if t["key"] == PREFIX + "kernel":
            return str(t.get("value"))
    return None


def _finding(agent: Agent, subject: str, reason: str) -> float | None:
    return agent.value("node_health_finding", check="kernel-log", subject=subject, reason=reason, severity="critical")


def test_a_named_pattern_raises_its_reason_on_the_node_and_a_reload_changes_it(
        fake: FakeApiServer, started: Any, tmp_path: Path) -> None:
    log = Log(tmp_path / "kmsg")
    agent = started(_config(log.path, GSP))
    # known before it matches: exported at 0 (findings_at_zero = "all"), the family watched
    wait_for(lambda: _finding(agent, "gsp_timeout", "GspRpcTimeout") == 0, timeout=20)
    wait_for(lambda: _condition(fake) == ("False", "NoKernelProblem"), timeout=20)
    log.add("NVRM: GPU3 GSP RPC timeout")
    wait_for(lambda: _condition(fake) == ("True", "GspRpcTimeout"), timeout=20)
    assert _taint(fake) == "GspRpcTimeout"
    assert _finding(agent, "gsp_timeout", "GspRpcTimeout") == 1
    wait_for(lambda: "GspRpcTimeout" in [e["reason"] for e in fake.events()], timeout=20)

    # A reload that changes the pattern and adds one: the new wording and the new reason count.
    agent.write_config(_config(log.path, GSP_AND_FABRIC))
    agent.signal(signal.SIGHUP)
    wait_for(lambda: agent.value("node_health_config_reloads_total", result="success") == 1, timeout=20)
    wait_for(lambda: _finding(agent, "fabric_lost", "FabricManagerLost") == 0, timeout=20)
    log.add("nvidia-fabricmanager: lost connection to GPU 2")
    log.add("NVRM: GPU5 GSP RPC hang")
    wait_for(lambda: _finding(agent, "fabric_lost", "FabricManagerLost") == 1, timeout=20)
    wait_for(lambda: agent.value("node_health_kernel_faults_total", fault="gsp_timeout") == 2, timeout=20)
    wait_for(lambda: "FabricManagerLost" in [e["reason"] for e in fake.events()], timeout=20)
    assert _condition(fake) is not None and _condition(fake) == ("True", "FabricManagerLost")  # reasons sort: F < G

    # An invalid reload (a reason that is another feature's) is refused: the running patterns stay.
    agent.write_config(_config(log.path, GSP_AND_FABRIC.replace('"FabricManagerLost"', '"DiskReadOnly"')))
    agent.signal(signal.SIGHUP)
    wait_for(lambda: agent.value("node_health_config_reloads_total", result="failure") == 1, timeout=20)
    assert "DiskReadOnly" in agent.logs() and "keeping the running config" in agent.logs()
    log.add("NVRM: GPU6 GSP RPC hang")
    wait_for(lambda: agent.value("node_health_kernel_faults_total", fault="gsp_timeout") == 3, timeout=20)
    assert _finding(agent, "fabric_lost", "FabricManagerLost") == 1
