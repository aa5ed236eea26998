"""The ladder and the fleet breaker (issue 24): the breaker is asked before the claim and again just before
each host-changing step, and a tripped breaker holds the ladder where it is; no drain without our taint."""

from __future__ import annotations

from remediation_support import Clock, FakeCluster, FakeHost, enforce, fault_list, finding, make, value

from agent.remediation.cluster import NoCluster

REBOOT = finding("XidCritical79", "reboot")
RESET = finding("XidCritical48", "reset_gpu")
RMA = finding("RowRemapFailure", "rma")
TRIPPED = "the fleet breaker is tripped: 31 nodes were disrupted within 6 h (tripped by node-7 at ...)"


def test_a_tripped_breaker_stops_the_claim_and_says_why(tmp_path):
    cfg = enforce(reboot={"min_uptime": "0s"})
    cluster, host = FakeCluster(tripped=TRIPPED), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=Clock())
    for _ in range(3):
        ladder.tick(fault_list(REBOOT))
    assert cluster.count("claim") == 0 and cluster.count("drain") == 0 and host.count("reboot") == 0
    assert ladder.step == "claim" and cluster.breaker_steps == ["claim"] * 3
    (held,) = [f for f in ladder.findings() if f.subject == "breaker"]
    assert held.reason == "RemediationHeld" and "fleet breaker is tripped" in held.message
    assert value(ladder, "node_health_remediation_waiting", on="breaker") == 1
    assert [e[0] for e in cluster.events] == ["RemediationHeld"], "said once"
    cluster.tripped = ""  # a person reset it
    ladder.tick(fault_list(REBOOT))
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1 and cluster.breaker_steps[3:] == ["claim", "drain", "reboot"]


def test_the_breaker_is_read_again_just_before_the_reboot(tmp_path):
    """Tripped while this node drains: the reboot does not happen; the slot stays held, nothing more is done."""
    cfg = enforce(reboot={"min_uptime": "0s"})
    cluster, host = FakeCluster(drain_steps=2), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=Clock())
    ladder.tick(fault_list(REBOOT))
    assert ladder.step == "drain"
    cluster.tripped = TRIPPED
    ladder.tick(fault_list(REBOOT))
    assert ladder.step == "drain" and host.count("reboot") == 0 and cluster.count("drain") == 1
    cluster.tripped = ""
    ladder.tick(fault_list(REBOOT))
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1


def test_the_breaker_is_read_before_a_gpu_reset_and_a_retirement(tmp_path):
    cfg = enforce(reboot={"min_uptime": "0s"})
    cluster, host = FakeCluster(), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=Clock())
    orig = cluster.breaker_check

    def trip_at(step: str):
        def check(now: float, s: str) -> str:
            orig(now, s)
            return TRIPPED if s == step else ""
        return check

    cluster.breaker_check = trip_at("reset_gpu")
    for _ in range(3):
        ladder.tick(fault_list(RESET))
    assert host.count("reset_gpu") == 0 and "reset_gpu" in cluster.breaker_steps
    rma_dir = tmp_path / "rma"
    rma_dir.mkdir()
    cluster2 = FakeCluster()
    cluster2.breaker_check = lambda now, s: TRIPPED if s == "retire" else ""
    ladder2 = make(rma_dir, cfg, cluster=cluster2, host=FakeHost(cfg), clock=Clock())
    for _ in range(3):
        ladder2.tick(fault_list(RMA))
    assert cluster2.count("set_retired") == 0 and ladder2.step == "retire"


def test_no_drain_while_the_node_lacks_its_taint(tmp_path):
    """Withheld by the taint budget (or the kill switch): no cordon, no drain; the ladder waits and says why."""
    cfg = enforce(reboot={"min_uptime": "0s"})
    why = "the taint budget withholds node-health-agent/gpu (every slot is held): the node is schedulable"
    cluster, host = FakeCluster(untainted=why), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=Clock())
    for _ in range(3):
        ladder.tick(fault_list(REBOOT))
    assert cluster.count("drain") == 0 and host.count("reboot") == 0 and ladder.step == "drain"
    (held,) = [f for f in ladder.findings() if f.subject == "taint"]
    assert held.reason == "RemediationHeld" and "no drain while the node lacks its taint" in held.message and why in held.message
    cluster.untainted = ""
    ladder.tick(fault_list(REBOOT))
    ladder.tick(fault_list(REBOOT))
    assert cluster.count("drain") >= 1 and host.count("reboot") == 1


def test_no_cluster_no_breaker(tmp_path):
    cfg = enforce(reboot={"min_uptime": "0s"})
    host = FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=NoCluster(), host=host, clock=Clock())  # type: ignore[arg-type]
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1
