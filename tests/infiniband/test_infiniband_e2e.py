"""`agent run` on a fixture sysfs root: the InfiniBand check's findings reach /metrics with the
catalog's severity, survive a restart of the process (state dir), and `agent selftest` shows them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentproc import Agent
from conftest import require_root
from ibtree import DOWN, POLLING, IbTree

from agent.infiniband.sysfs import COUNTERS


def _config(tree: IbTree) -> str:
    return f"""
[paths]
procfs = "{tree.proc}"
sysfs = "{tree.sys}"
[checks.infiniband]
interval = "1s"
[checks.disk]
enabled = false
[checks.network]
enabled = false
[checks.kernel]
enabled = false
[checks.burn]
enabled = false
[checks.gpu]
enabled = false
"""


def _finding(agent: Agent, subject: str, reason: str) -> float | None:
    return agent.value("node_health_finding", check="infiniband", subject=subject, reason=reason)


def test_a_port_that_goes_down_under_agent_run(tmp_path: Path) -> None:
    require_root()  # CAP_DAC_OVERRIDE: the restricted port's counter files open, then fail with EINVAL
    tree = IbTree(tmp_path / "host")
    tree.node(8)
    tree.restrict("mlx5_7", 1)
    agent = Agent(tmp_path, _config(tree), env={"KUBERNETES_SERVICE_HOST": ""})
    try:
        agent.wait_ready()
        agent.poll(lambda _: agent.value("node_health_infiniband_ports", state="active") == 8, "8 active ports")
        assert _finding(agent, "mlx5_3/1", "IbLinkDowned") == 0  # known findings are exported at 0
        assert agent.value("node_health_infiniband_skipped_files", device="mlx5_7") == len(COUNTERS)
        assert agent.value("node_health_infiniband_port_active", device="mlx5_7") == 1
        assert agent.value("node_health_infiniband_port_errors_total", device="mlx5_7", counter="symbol_error") is None
        tree.set("mlx5_3", 1, state=DOWN, phys_state=POLLING)
        tree.bump("mlx5_3", 1, link_downed=1)
        agent.poll(lambda _: _finding(agent, "mlx5_3/1", "IbLinkDowned") == 1, "IbLinkDowned")
        assert agent.value("node_health_finding", subject="mlx5_3/1", reason="IbLinkDowned", severity="critical") == 1
        assert agent.value("node_health_finding", subject="mlx5_3/1", reason="IbPortDown", severity="warning") == 1
        assert agent.value("node_health_infiniband_port_errors_total", device="mlx5_3", counter="link_downed") == 1
        assert agent.stop() == 0, agent.logs()
        agent.start()  # the increase is in the state dir: still within fatal_window after the restart
        agent.wait_ready()
        agent.poll(lambda _: _finding(agent, "mlx5_3/1", "IbLinkDowned") == 1, "IbLinkDowned after a restart")
    finally:
        assert agent.stop() == 0, agent.logs()
    assert agent.logs().count("failed with EINVAL") == len(COUNTERS)  # once per file, restart included
    state = json.loads((tmp_path / "state/infiniband.json").read_text())
    assert state["ports"]["mlx5_3/1"]["down_since"] is not None


def test_selftest_shows_the_ports_and_exits_1_on_a_port_down(tmp_path: Path) -> None:
    tree = IbTree(tmp_path / "host")
    tree.node(8)
    cfg = tmp_path / "agent.toml"
    cfg.write_text(_config(tree) + "[checks.traffic]\nenabled = false\n")
    cmd = [sys.executable, "-m", "agent", "selftest", "--json", "--config", str(cfg)]
    ok = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    (check,) = [c for c in json.loads(ok.stdout)["checks"] if c["name"] == "infiniband"]
    assert check["subjects"]["mlx5_0/1"] == "ACTIVE, 400 Gb/s, InfiniBand"
    tree.set("mlx5_5", 1, state=DOWN, phys_state=POLLING)
    bad = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stderr
    found = [(f["subject"], f["reason"], f["severity"]) for f in json.loads(bad.stdout)["findings"] if f["check"] == "infiniband"]
    assert found == [("mlx5_5/1", "IbPortDown", "warning")]
