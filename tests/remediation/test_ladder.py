"""The ladder's table on fakes: each scenario of issue 12, step by step."""

from __future__ import annotations

import json

import pytest
from remediation_support import (
    Clock,
    FakeCluster,
    FakeHost,
    Users,
    enforce,
    fault_list,
    finding,
    make,
    settings,
    value,
)

from agent.catalog import Catalog
from agent.kube.api import ApiError
from agent.remediation.cluster import NoCluster

REBOOT = finding("XidCritical79", "reboot")
RESET = finding("XidCritical48", "reset_gpu")
RESET1 = finding("XidCritical48", "reset_gpu", subject="gpu1")
RMA = finding("RowRemapFailure", "rma")
DIAG = finding("NvLinkDown", "drain_and_diagnose")


def record(tmp) -> dict:
    return json.loads((tmp / "remediation.json").read_text())


def test_reboot_fault_drains_reboots_once_and_releases_after_the_new_boot(tmp_path):
    cfg = enforce(reboot={"min_uptime": "0s", "settle": "10m"})
    cluster, clock = FakeCluster(drain_steps=2), Clock()
    host = FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    faults = fault_list(REBOOT)
    ladder.tick(faults)
    assert cluster.calls[:2] == [("claim",), ("drain", None)]
    assert host.count("reboot") == 0 and ladder.step == "drain"
    ladder.tick(faults)
    assert host.count("reboot") == 1 and ladder.step == "rebooting"
    rec = record(tmp_path)
    assert rec["episode"]["boot_id"] == "boot-1" and rec["reboots"][0]["key"] == "gpu/gpu0/XidCritical79"
    for _ in range(3):  # the reboot takes its time: never asked for twice
        clock.t += 60
        ladder.tick(faults)
    assert host.count("reboot") == 1
    host.booted("boot-2")
    clock.t += 30
    ladder.tick([])  # the fault did not come back
    assert ladder.step == "settle" and cluster.held
    clock.t += 601
    ladder.tick([])
    assert ladder.step == "idle" and not cluster.held and cluster.count("release") == 1
    assert [e[0] for e in cluster.events] == ["RemediationDrained", "RebootRequested", "Rebooted", "RemediationSucceeded"]
    assert value(ladder, "node_health_remediation_uncured_reboots") == 0
    assert value(ladder, "node_health_remediation_reboots") == 1


def test_reset_gpu_with_a_process_drains_only_its_pod_then_resets_that_uuid(tmp_path):
    cfg = enforce()
    cluster, host = FakeCluster(), FakeHost(enforce())
    host.pids["GPU-aaaa"] = (4242,)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, users=Users({"GPU-aaaa": frozenset({"uid-b"})}))
    faults = fault_list(RESET)
    ladder.tick(faults)
    assert ("drain", ("uid-b",)) in cluster.calls and ladder.step == "reset_gpu"
    assert host.count("reset_gpu") == 0 and value(ladder, "node_health_remediation_waiting", on="gpu_busy") == 1
    host.pids["GPU-aaaa"] = ()  # the pod's process is gone
    ladder.tick(faults)
    assert ("reset_gpu", "GPU-aaaa") in host.calls and ("verify", "GPU-aaaa") in host.calls
    assert host.count("reboot") == 0 and ladder.step == "idle" and not cluster.held
    ladder.tick(faults)  # a finding that still stands after the verified reset: handled, no second reset
    assert host.count("reset_gpu") == 1 and cluster.count("claim") == 1


def test_a_verified_reset_is_told_to_the_gpu_feature_and_a_fault_back_after_it_escalates(tmp_path):
    """The reset is recorded for agent.gpu (by UUID, PCI address and the time it finished), which drops
    that GPU's reset_gpu Xid findings; the same fault back in this boot means the reset did not cure it."""
    from agent.gpu import resets
    from agent.statedir import StateDir

    cfg, clock = enforce(), Clock()
    cluster, host = FakeCluster(), FakeHost(cfg)
    told = []
    resets.listen(str(tmp_path), told.append)
    try:
        ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock, users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
        ladder.tick(fault_list(RESET))
    finally:
        resets.unlisten(str(tmp_path), told.append)
    assert told == [resets.Reset("GPU-aaaa", "0000:18:00", "0", clock.t)]
    assert resets.load(StateDir(str(tmp_path)), "boot-1") == told and resets.load(StateDir(str(tmp_path)), "boot-2") == []
    ladder.tick([])  # the Xid stream dropped the finding: released
    assert ladder.step == "idle" and host.count("reboot") == 0
    clock.t += 60
    ladder.tick(fault_list(RESET))  # the same Xid again, after the reset
    assert host.count("reset_gpu") == 1 and host.count("reboot") == 1, "not a second reset: a reboot"
    assert "RemediationEscalated" in [e[0] for e in cluster.events]
    host.booted("boot-2")
    host.up = 99_999.0
    clock.t += 86_400
    ladder.tick([])
    clock.t += 601  # settled: the reboot cured it
    ladder.tick([])
    assert ladder.step == "idle"
    ladder.tick(fault_list(RESET))  # in another boot a reset fault is a reset fault again
    assert host.count("reset_gpu") == 2


@pytest.mark.parametrize("failing", ["reset", "verify"])
def test_a_failed_reset_or_verification_escalates_to_a_reboot_after_a_full_drain(tmp_path, failing):
    cfg = enforce()
    cluster, host = FakeCluster(), FakeHost(cfg)
    host.reset_ok = failing != "reset"
    host.verify_ok = failing != "verify"
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
    ladder.tick(fault_list(RESET))
    assert host.count("reset_gpu") == 1 and host.count("reboot") == 1
    assert cluster.calls.count(("drain", ("uid-a",))) == 1 and ("drain", None) in cluster.calls
    assert "RemediationEscalated" in [e[0] for e in cluster.events]
    assert any(f.reason == "RemediationFailed" for f in ladder.findings())


def test_the_same_fault_after_two_reboots_retires_the_node_and_no_third_reboot(tmp_path):
    cfg = enforce(retire={"command": ["/bin/true"], "power_off_after": "1h"})
    cluster, host, clock = FakeCluster(), FakeHost(cfg), Clock()
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    faults = fault_list(REBOOT)
    for boot in ("boot-2", "boot-3"):
        ladder.tick(faults)
        host.booted(boot)
        host.up = 99_999.0
        clock.t += 3600 * 13  # within the daily cap
        ladder.tick(faults)  # back after the reboot
    assert host.count("reboot") == 2
    ladder.tick(faults)
    assert host.count("reboot") == 2 and cluster.retired and ladder.step == "retired"
    assert not cluster.held and host.count("retire_command") == 1
    assert value(ladder, "node_health_remediation_uncured_reboots") == 2
    assert value(ladder, "node_health_remediation_retired") == 1
    assert [f.reason for f in ladder.findings()] == ["NodeRetired"]
    clock.t += 3601
    ladder.tick(faults)
    ladder.tick(faults)
    assert host.count("power_off") == 1 and host.count("retire_command") == 1 and host.count("reboot") == 2


@pytest.mark.parametrize(
    ("cfg", "dry_run", "paused", "cause"),
    [
        pytest.param(settings(), False, False, "observe", id="observe mode (the default)"),
        pytest.param(enforce(), True, False, "dry_run", id="dry run"),
        pytest.param(enforce(), False, True, "kill_switch", id="kill switch paused"),
        pytest.param(enforce(), False, None, "kill_switch", id="kill switch unknown"),
        pytest.param(enforce("reset_gpu"), False, False, "disabled", id="drain not enabled"),
    ],
)
def test_nothing_is_done_where_the_mode_forbids_and_every_step_is_exported(tmp_path, cfg, dry_run, paused, cause):
    cluster = FakeCluster()
    host = FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, dry_run=dry_run)
    ladder.paused = paused
    for _ in range(3):
        ladder.tick(fault_list(REBOOT))
    assert cluster.calls == [] and host.calls == []
    assert value(ladder, "node_health_remediation_would", action="drain", cause=cause) == 1
    expected_reboot_cause = "disabled" if cause == "disabled" else cause
    assert value(ladder, "node_health_remediation_would", action="reboot", cause=expected_reboot_cause) == 1


def test_observe_logs_the_exact_targets(tmp_path, caplog):
    caplog.set_level("WARNING")
    ladder = make(tmp_path, settings(), users=Users({"GPU-aaaa": frozenset({"uid-c"})}))
    ladder.tick(fault_list(RESET))
    line = next(r.getMessage() for r in caplog.records if "would" in r.getMessage())
    assert "drain 1 pods (ml/c)" in line and "nvidia-smi --gpu-reset -i GPU-aaaa" in line
    assert value(ladder, "node_health_remediation_would", action="reset_gpu", cause="observe") == 1


def test_enabled_drain_but_not_reboot_drains_then_waits(tmp_path):
    cluster, host = FakeCluster(), FakeHost(enforce("drain"))
    ladder = make(tmp_path, enforce("drain"), cluster=cluster, host=host)
    ladder.tick(fault_list(REBOOT))
    assert cluster.count("drain") == 1 and host.count("reboot") == 0 and ladder.step == "reboot"
    assert value(ladder, "node_health_remediation_would", action="reboot", cause="disabled") == 1


def test_unknown_and_unremediated_findings_are_never_acted_on(tmp_path):
    cluster, host = FakeCluster(), FakeHost(enforce())
    ladder = make(tmp_path, enforce(), cluster=cluster, host=host)
    for _ in range(3):
        ladder.tick(fault_list(finding("XidCritical79", "reboot", unknown=True), finding("Xid13", "restart_app"),
                               finding("GpuHot", "none")))
    assert cluster.calls == [] and host.calls == [] and ladder.step == "idle"


def test_a_finding_must_stand_its_time(tmp_path):
    clock, cluster = Clock(), FakeCluster()
    ladder = make(tmp_path, enforce(reboot_after="10m"), cluster=cluster, clock=clock)
    ladder.tick(fault_list(REBOOT))
    clock.t += 599
    ladder.tick(fault_list(REBOOT))
    assert cluster.calls == []
    clock.t += 1
    ladder.tick(fault_list(REBOOT))
    assert cluster.count("claim") == 1


def test_min_uptime_and_the_daily_cap_hold_a_reboot(tmp_path):
    cfg = enforce(reboot={"min_uptime": "30m", "max_per_day": 1})
    host, clock = FakeHost(cfg), Clock()
    host.up = 600.0
    ladder = make(tmp_path, cfg, host=host, clock=clock)
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 0 and value(ladder, "node_health_remediation_waiting", on="uptime") == 1
    assert [f.reason for f in ladder.findings()] == ["RemediationHeld"]
    host.up = 1800.0
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1
    host.booted("boot-2")
    host.up = 99_999.0
    clock.t += 3600
    ladder.tick(fault_list(REBOOT))  # back, but one reboot in the last 24h already
    assert host.count("reboot") == 1 and value(ladder, "node_health_remediation_waiting", on="daily_cap") == 1
    clock.t += 86_400
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 2


def test_no_slot_means_waiting_with_one_finding_one_event_one_metric(tmp_path):
    cluster = FakeCluster(slots=0)
    ladder = make(tmp_path, enforce(), cluster=cluster)
    ladder.tick(fault_list(REBOOT))
    ladder.tick(fault_list(REBOOT))
    assert cluster.count("drain") == 0 and [f.reason for f in ladder.findings()] == ["DisruptionSlotWaiting"]
    assert "held by other nodes (fake)" in ladder.findings()[0].message, "the cluster side's reason is in it"
    assert [e[0] for e in cluster.events] == ["DisruptionSlotWaiting"]
    assert [dict(s.labels) for s in ladder.samples() if s.name == "node_health_remediation_waiting"] == [{"on": "slot"}]
    cluster.slots = 1
    ladder.tick(fault_list(REBOOT))
    assert cluster.count("drain") == 1


def test_an_api_error_leaves_the_step_where_it_was(tmp_path):
    cluster = FakeCluster(fail=ApiError(503, "unavailable"))
    ladder = make(tmp_path, enforce(), cluster=cluster)
    with pytest.raises(ApiError):
        ladder.tick(fault_list(REBOOT))
    assert ladder.step == "drain"
    cluster.fail = None
    ladder.tick(fault_list(REBOOT))
    assert ladder.step == "rebooting"


def test_rma_drains_and_retires_without_a_reboot(tmp_path):
    cluster, host = FakeCluster(), FakeHost(enforce())
    ladder = make(tmp_path, enforce(), cluster=cluster, host=host)
    ladder.tick(fault_list(RMA))
    assert cluster.retired and host.count("reboot") == 0 and ladder.step == "retired"
    assert cluster.calls[-1] == ("release",)


def test_drain_and_diagnose_holds_the_node_until_the_fault_clears(tmp_path):
    cluster, host = FakeCluster(), FakeHost(enforce())
    ladder = make(tmp_path, enforce(), cluster=cluster, host=host)
    ladder.tick(fault_list(DIAG))
    ladder.tick(fault_list(DIAG))
    assert ladder.step == "hold" and cluster.held and host.calls == []
    ladder.tick([])
    assert ladder.step == "idle" and not cluster.held


def test_a_reboot_fault_takes_over_a_reset_that_waits(tmp_path):
    cfg = enforce()
    host, cluster = FakeHost(cfg), FakeCluster()
    host.pids["GPU-aaaa"] = (7,)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, users=Users({"GPU-aaaa": frozenset()}))
    ladder.tick(fault_list(RESET))
    assert ladder.step == "reset_gpu"
    ladder.tick(fault_list(RESET, REBOOT))
    assert host.count("reboot") == 1 and host.count("reset_gpu") == 0 and ("drain", None) in cluster.calls


def test_mig_and_a_busy_gpu_past_its_timeout_escalate(tmp_path):
    cfg = enforce(gpu_reset={"busy_timeout": "5m"})
    host, clock = FakeHost(cfg), Clock()
    host.mig["GPU-bbbb"] = True
    ladder = make(tmp_path, cfg, host=host, clock=clock)
    ladder.tick(fault_list(RESET1))
    assert host.count("reset_gpu") == 0 and host.count("reboot") == 1
    host2 = FakeHost(cfg)
    host2.pids["GPU-aaaa"] = None  # NVML cannot tell: never reset blind
    ladder2 = make(tmp_path / "b", cfg, host=host2, clock=clock)
    ladder2.tick(fault_list(RESET))
    assert host2.count("reset_gpu") == 0 and host2.count("reboot") == 0
    clock.t += 301
    ladder2.tick(fault_list(RESET))
    assert host2.count("reset_gpu") == 0 and host2.count("reboot") == 1


def test_one_gpu_at_a_time(tmp_path):
    cfg = enforce()
    host, cluster = FakeHost(cfg), FakeCluster()
    host.pids["GPU-aaaa"] = (1,)
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, users=Users({}))
    ladder.tick(fault_list(RESET, RESET1))
    assert host.count("reset_gpu") == 0  # gpu0's episode waits; gpu1 is not touched meanwhile
    host.pids["GPU-aaaa"] = ()
    ladder.tick(fault_list(RESET, RESET1))
    assert [c[1] for c in host.calls if c[0] == "reset_gpu"] == ["GPU-aaaa"]
    ladder.tick(fault_list(RESET, RESET1))
    assert [c[1] for c in host.calls if c[0] == "reset_gpu"] == ["GPU-aaaa", "GPU-bbbb"]


def test_bare_metal_needs_no_drain_and_no_budget(tmp_path):
    cfg = enforce("reboot")
    host = FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=NoCluster(), host=host)  # type: ignore[arg-type]
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1


def test_a_damaged_record_never_causes_a_reboot(tmp_path):
    (tmp_path / "remediation.json").write_text('{"version": 1, "episode": {"key": 3}}')
    cfg = enforce()
    host, cluster = FakeHost(cfg), FakeCluster()
    ladder = make(tmp_path, cfg, host=host, cluster=cluster)
    for _ in range(3):
        ladder.tick(fault_list(REBOOT, RMA))
    assert host.calls == [] and cluster.calls == [], "no action at all for the faults that stood when it was lost"
    assert value(ladder, "node_health_remediation_waiting", on="record") == 1
    assert list(tmp_path.glob("remediation.json.bad-*"))
    ladder.tick([])  # once that fault cleared, a new one is handled as usual
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1


def test_an_unreadable_boot_id_never_reboots(tmp_path):
    cfg = enforce()
    host = FakeHost(cfg)
    host.boot = ""
    ladder = make(tmp_path, cfg, host=host)
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 0


def test_catalog_declares_what_the_ladder_emits(tmp_path):
    ladder = make(tmp_path, enforce(retire={"command": []}))
    ladder.tick(fault_list(RMA))
    cat: Catalog = ladder.catalog
    for s in ladder.samples():
        assert cat.sample_problem(s) is None


def test_bare_metal_observe_exports_the_reboot_and_no_drain(tmp_path):
    host = FakeHost(settings())
    ladder = make(tmp_path, settings(), cluster=NoCluster(), host=host)  # type: ignore[arg-type]
    ladder.tick(fault_list(REBOOT))
    assert value(ladder, "node_health_remediation_would", action="reboot", cause="observe") == 1
    assert value(ladder, "node_health_remediation_would", action="drain", cause="observe") is None
    assert host.calls == []


def test_a_failed_reboot_command_is_retried_later_and_counts_once(tmp_path):
    cfg = enforce()
    host, clock = FakeHost(cfg), Clock()
    host.reboot_ok = False
    ladder = make(tmp_path, cfg, host=host, clock=clock)
    faults = fault_list(REBOOT)
    ladder.tick(faults)
    ladder.tick(faults)
    assert host.count("reboot") == 1 and [f.reason for f in ladder.findings()] == ["RemediationFailed"]
    host.reboot_ok = True
    clock.t += 601
    ladder.tick(faults)
    assert host.count("reboot") == 2 and ladder.step == "rebooting"
    host.booted("boot-2")
    ladder.tick(faults)  # back after the one reboot that happened
    assert value(ladder, "node_health_remediation_uncured_reboots") == 1
    assert value(ladder, "node_health_remediation_reboots") == 1


def test_a_held_slot_is_renewed_and_one_taken_away_is_claimed_again_before_the_next_step(tmp_path):
    cfg = enforce()
    cluster, host = FakeCluster(drain_steps=2), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host)
    ladder.tick(fault_list(REBOOT))
    assert ladder.step == "drain" and cluster.held and cluster.renewals == 0
    cluster.held = False  # its Lease expired and another node took the slot
    ladder.tick(fault_list(REBOOT))
    assert cluster.renewals == 1 and host.count("reboot") == 0, "no reboot without a slot"
    assert [f.reason for f in ladder.findings()] == ["DisruptionSlotWaiting"] and ladder.step == "claim"
    cluster.slots = 1
    ladder.tick(fault_list(REBOOT))
    assert cluster.held and host.count("reboot") == 1


def test_a_slot_gone_while_the_agent_was_away_is_claimed_again(tmp_path):
    cfg = enforce("drain", "reboot")
    cluster = FakeCluster(drain_steps=5)
    make(tmp_path, cfg, cluster=cluster).tick(fault_list(REBOOT))
    assert record(tmp_path)["episode"]["slot"] is True
    cluster2, host = FakeCluster(slots=0), FakeHost(cfg)  # a new process; the slot went to another node meanwhile
    ladder = make(tmp_path, cfg, cluster=cluster2, host=host)
    ladder.tick(fault_list(REBOOT))
    assert record(tmp_path)["episode"]["slot"] is False and cluster2.count("drain") == 0 and host.count("reboot") == 0
    assert value(ladder, "node_health_remediation_waiting", on="slot") == 1
