"""`agent run` keeps the rules in place and its exported counters monotonic:
across a rule deleted behind its back, across its own restart (rules kept or
re-created meanwhile), and it runs on without CAP_NET_ADMIN."""

from __future__ import annotations

import json

import pytest
from conftest import NO_HOST_KMSG as HERMETIC, require_tool
from agentproc import Agent
from traffic_lab import lab, lab_agent, metric, send, until

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

MB = 1_000_000
INTERVAL = 1.0


def out_bytes(samples: dict) -> float | None:
    return metric(samples, "node_health_traffic_bytes_total", direction="internet-out", family="ipv4")


def runs(samples: dict) -> float:
    return metric(samples, "node_health_check_runs_total", check="traffic") or 0


@pytest.fixture(params=["legacy", "nft"])
def running(request, tmp_path):
    require_tool(f"iptables-{request.param}")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        '[agent]\nlog_format = "text"\n'
        f'[checks.traffic]\nenabled = true\ninterval = "{INTERVAL:g}s"\nbackend = "{request.param}"\n' + HERMETIC
    )
    with lab() as L:
        agent = lab_agent(L.node, tmp_path, cfg, tmp_path / "agent.log")
        agent.start()
        try:
            until(agent, "rules in place", lambda s: metric(s, "node_health_traffic_rules_in_place", family="ipv4"))
            yield L, agent, request.param
        finally:
            agent.stop(20)


def counted_past(agent: Agent, floor: float) -> float:
    return until(agent, f"internet-out past {floor}", lambda s: (out_bytes(s) or 0) >= floor and out_bytes(s))


def test_deleted_rule_is_repaired_and_counter_does_not_go_back(running) -> None:
    L, agent, backend = running
    send(L.node, L.ns["internet"], "198.51.100.2", 2 * MB)
    before = counted_past(agent, 2 * MB)
    at_deletion = runs(agent.samples())
    ipt = f"iptables-{backend}"
    L.node.run(ipt, "-t", "mangle", "-F", "NODE-HEALTH-INTERNET-OUT")  # the count rule (and its counts) gone
    L.node.run(ipt, "-t", "mangle", "-D", "INPUT", "-m", "comment", "--comment", "node-health-agent:internet-in:jump",
               "-j", "NODE-HEALTH-INTERNET-IN")
    samples = until(
        agent, "the repair", lambda s: metric(s, "node_health_traffic_rules_repaired_total", family="ipv4") and s
    )
    # repaired by the run that followed the deletion (the one under way may have read before it)
    assert runs(samples) <= at_deletion + 2
    assert metric(samples, "node_health_traffic_rules_in_place", family="ipv4") == 1
    assert out_bytes(samples) >= before
    rules = json.loads(L.node.agent("rules", "show", "--json", "--backend", backend).stdout)["rules"]
    assert len(rules) == 2
    send(L.node, L.ns["internet"], "198.51.100.2", 1 * MB)
    assert counted_past(agent, before + 1 * MB) >= before + 1 * MB
    assert "repaired the traffic rules for ipv4" in agent.logs()


@pytest.mark.parametrize("recreate", [False, True], ids=["rules kept counting", "rules re-created while down"])
def test_restart_does_not_reset_the_counter(running, recreate: bool) -> None:
    L, agent, backend = running
    send(L.node, L.ns["internet"], "198.51.100.2", 2 * MB)
    before = counted_past(agent, 2 * MB)
    agent.stop(20)
    if recreate:
        L.node.agent("rules", "remove", "--backend", backend)
        L.node.agent("rules", "install", "--backend", backend)
    send(L.node, L.ns["internet"], "198.51.100.2", 1 * MB)
    agent.start()
    first = until(agent, "the first run", lambda s: runs(s) >= 1 and s)
    assert out_bytes(first) >= before + 1 * MB
    assert metric(first, "node_health_traffic_rules_repaired_total", family="ipv4") == 0


@pytest.mark.parametrize("backend", ["legacy", "nft"])
def test_dry_run_once_and_selftest_change_nothing(tmp_path, backend: str) -> None:
    require_tool(f"iptables-{backend}")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[checks.traffic]\nenabled = true\nbackend = "{backend}"\n' + HERMETIC)
    with lab() as L:
        res = L.node.agent("selftest", "--only", "traffic", "--json", "--config", str(cfg), check=False)
        report = json.loads(res.stdout)
        assert [f["reason"] for f in report["findings"]] == ["TrafficRulesNotInPlace"]
        assert report["findings"][0]["message"].startswith("dry run")
        L.node.agent("run", "--once", "--dry-run", "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
        assert json.loads(L.node.agent("rules", "show", "--json", "--backend", backend).stdout)["rules"] == []
        # --once alone is a look too: one pass that leaves no chains behind (nothing would remove them)
        L.node.agent("run", "--once", "--config", str(cfg), "--state-dir", str(tmp_path / "s"), check=False)
        assert json.loads(L.node.agent("rules", "show", "--json", "--backend", backend).stdout)["rules"] == []
        assert not (tmp_path / "s" / "traffic.json").exists()
        # not even an empty table: legacy creates one when it is named (iptables-save -t mangle)
        assert L.node.save("legacy").strip() == ""


def test_without_net_admin_the_agent_runs_on(tmp_path) -> None:
    require_tool("setpriv")
    drop = ("setpriv", "--inh-caps=-all", "--bounding-set=-net_admin")
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[agent]\nlog_format = "text"\n[checks.traffic]\nenabled = true\ninterval = "1s"\n' + HERMETIC)
    with lab() as L:
        report = json.loads(L.node.agent("selftest", "--json", "--config", str(cfg), check=False, prefix=drop).stdout)
        traffic = [f for f in report["findings"] if f["check"] == "traffic"]
        assert [(f["subject"], f["reason"], f["unknown"]) for f in traffic] == [
            ("iptables", "InsufficientPrivilege", True)
        ]
        assert "CAP_NET_ADMIN" in traffic[0]["message"]
        agent = lab_agent(L.node, tmp_path, cfg, tmp_path / "agent.log", wrap=drop)
        agent.start()
        try:
            samples = until(
                agent, "two traffic runs and one of another check",
                lambda s: runs(s) >= 2 and metric(s, "node_health_check_runs_total", check="disk") and s,
            )
            assert metric(samples, "node_health_finding", check="traffic", subject="iptables", gpu="",
                          reason="InsufficientPrivilege", severity="info") == 1
            assert metric(samples, "node_health_check_success", check="traffic") == 1
            assert metric(samples, "node_health_check_success", check="disk") == 1
            assert out_bytes(samples) == 0
        finally:
            agent.stop(20)
        assert "Traceback" not in agent.logs()
        assert json.loads(L.node.agent("rules", "show", "--json").stdout)["rules"] == []
