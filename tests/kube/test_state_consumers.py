"""The parts of the agent that read a state file, each started on one of the
wrong shape: a JSON list where an object is expected made the Kubernetes
reconciler and the Xid source raise AttributeError at start (the agent
crash-looped and the node went unmonitored); the GPU check failed every run."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures
from kube_support import NODE, PREFIX, fake, make_reconciler, settings, wait_for  # noqa: F401 - fixtures
from test_kube_daemon import BASE, agent_run  # noqa: F401 - fixture

from agent import statedir as state
from agent.checks.gpu import GpuCheck
from agent.gpu.xid_source import XidSource


def set_aside(directory: str | Path, name: str) -> list[str]:
    return [e for e in os.listdir(directory) if e.startswith(f"{name}.bad-")]


def test_kubernetes_state_that_is_a_list(fake: Any, tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    (sd / "kubernetes.json").write_text('[{"version": 1, "active": []}]')
    rec = make_reconciler(fake, str(tmp_path), settings(), state=str(sd))  # was: AttributeError: 'list' ... 'get'
    assert rec.hyst.active == {} and rec.outbox.items == [] and not rec.budget.held
    assert set_aside(sd, "kubernetes.json") and state.rejected()["kubernetes.json"] >= 1


@pytest.mark.parametrize("content", [
    pytest.param([{"boot": "b", "stream": {}}], id="a list"),
    pytest.param({"boot": "b", "stream": []}, id="stream is a list"),
    pytest.param({"boot": "b", "stream": {"active": [["gpu0", "Xid79"]]}}, id="active row cut short"),
])
def test_xid_stream_state_of_the_wrong_shape(gpu_context: Any, host: Any, scenario: Any, content: Any, tmp_path: Path) -> None:
    scenario.set([])
    (tmp_path / "kmsg").write_text("")
    ctx, cfg = gpu_context(f'kmsg_path = "{tmp_path / "kmsg"}"\n')
    Path(ctx.state_dir, "xid-stream.json").write_text(json.dumps(content).replace('"b"', json.dumps(host.reboot())))
    src = XidSource(ctx, cfg)
    try:
        src.start(lambda findings, samples: None)  # was: AttributeError / ValueError at start
        assert src.stream.cursor is None and src.stream.active == {}
    finally:
        src.stop()
    assert set_aside(ctx.state_dir, "xid-stream.json")


def test_gpu_poll_state_that_is_a_list(gpu_context: Any, host: Any, scenario: Any) -> None:
    host.add_gpu("0000:18:00")
    scenario.set([h100(0)])
    ctx, cfg = gpu_context()
    for name in ("gpu-poll.json", "gpu-inventory.json"):
        Path(ctx.state_dir, name).write_text('[{"boot": "b"}]')
    obs = GpuCheck(ctx, cfg).run()  # was: AttributeError in every run: CheckFailed
    assert not [f for f in obs.findings if f.reason in ("GpuMissing", "NvmlError")], obs.findings
    assert set_aside(ctx.state_dir, "gpu-poll.json") and set_aside(ctx.state_dir, "gpu-inventory.json")
    assert json.loads(Path(ctx.state_dir, "gpu-poll.json").read_text())["seen"] == ["0000:18:00"]


def test_agent_starts_on_a_damaged_kubernetes_state_and_keeps_the_taint(fake: Any, agent_run: Any, tmp_path: Path) -> None:
    """`agent run` used to exit at start with AttributeError (a crash loop, the node
    unmonitored); now it comes up, and the node keeps the taint it carried."""
    taint = {"key": PREFIX + "disk", "value": "DiskFull", "effect": "NoSchedule"}
    fake.edit_node(NODE, lambda n: n["spec"].update(taints=[taint]))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "kubernetes.json").write_text('[{"version": 1, "active": []}]')
    config = BASE + textwrap.dedent("""
        [checks.network]
        enabled = false
        [checks.disk]
        paths = ["/"]
        include_state_dir = false
        write_probe = false
        interval = "1s"
        warning_free_percent = 0.0
        critical_free_percent = 0.0
        inodes_warning_free_percent = 0.0
        inodes_critical_free_percent = 0.0
        [kubernetes.hysteresis]
        clear_cycles = 1000
        clear_after = "1h"
    """)
    agent = agent_run(config, "--kubeconfig", fake.kubeconfig(str(tmp_path / "kubeconfig")))
    wait_for(lambda: 'node_health_check_runs_total{check="disk"} 5.0' in agent.text(), timeout=60)
    text = agent.text()
    assert 'node_health_state_file_rejected_total{file="kubernetes.json"} 1.0' in text
    assert set_aside(tmp_path / "state", "kubernetes.json")
    assert [t for t in fake.node(NODE)["spec"]["taints"] if t["key"] == taint["key"]] == [taint], \
        "five clean runs of the disk check, fewer than clear_cycles: the node is not released"
