"""The agent killed at every step of the ladder and started again: it resumes
where it was, never asks for a second reboot for one record, never loses the
escalation count."""

from __future__ import annotations

import pytest
from remediation_support import Clock, FakeCluster, FakeHost, Users, enforce, fault_list, finding, make


class Killed(BaseException):
    """The process died here (SIGKILL): nothing after this line ran."""


class DyingHost(FakeHost):
    def __init__(self, cfg, die_at: str) -> None:
        super().__init__(cfg)
        self.die_at = die_at

    def _maybe_die(self, name: str) -> None:
        if self.die_at == name:
            self.die_at = ""
            raise Killed(name)

    def reboot(self):
        res = super().reboot()
        self._maybe_die("reboot")  # killed after the command ran, before the agent saw its answer
        return res

    def reset_gpu(self, uuid):
        res = super().reset_gpu(uuid)
        self._maybe_die("reset_gpu")
        return res

    def verify_gpu(self, uuid, index):
        self._maybe_die("verify")
        return super().verify_gpu(uuid, index)


class DyingCluster(FakeCluster):
    die_at: str = ""

    def claim_slot(self, now):
        ok = super().claim_slot(now)
        if self.die_at == "claim":
            self.die_at = ""
            raise Killed("claim")
        return ok

    def drain(self, now, only_pod_uids=None):
        p = super().drain(now, only_pod_uids)
        if self.die_at == "drain":
            self.die_at = ""
            raise Killed("drain")
        return p


def run_until_killed(ladder, faults) -> None:
    try:
        for _ in range(5):
            ladder.tick(faults)
    except Killed:
        pass


@pytest.mark.parametrize("die_at", ["claim", "drain", "reboot", "settle", "none"])
def test_reboot_ladder_resumes_and_never_reboots_twice(tmp_path, die_at):
    cfg = enforce()
    clock = Clock()
    cluster = DyingCluster()
    cluster.die_at = die_at
    host = DyingHost(cfg, die_at)
    faults = fault_list(finding("XidCritical79", "reboot"))
    run_until_killed(make(tmp_path, cfg, cluster=cluster, host=host, clock=clock), faults)
    # a new process (the host and the cluster are the same machine and API server)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    for _ in range(3):
        ladder.tick(faults)
    assert host.count("reboot") == 1
    host.booted("boot-2")
    ladder.tick([])
    assert ladder.step == "settle"
    if die_at == "settle":
        ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    clock.t += 601
    ladder.tick([])
    assert ladder.step == "idle" and host.count("reboot") == 1 and not cluster.held


@pytest.mark.parametrize("die_at", ["reset_gpu", "verify"])
def test_reset_ladder_resumes_at_the_verification_never_resets_twice(tmp_path, die_at):
    cfg = enforce()
    host = DyingHost(cfg, die_at)
    cluster = FakeCluster()
    users = Users({"GPU-aaaa": frozenset({"uid-a"})})
    faults = fault_list(finding("XidCritical48", "reset_gpu"))
    run_until_killed(make(tmp_path, cfg, cluster=cluster, host=host, users=users), faults)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, users=users)
    for _ in range(3):
        ladder.tick(faults)
    assert host.count("reset_gpu") == 1 and host.count("verify") == 1
    if die_at == "verify":  # the reset's answer was seen (recorded): verified, released, the Xid stream told
        assert host.count("reboot") == 0 and ladder.step == "idle" and not cluster.held
    else:  # killed during the reset: whether it ran is unknown, never assumed; the fault stands → escalated
        assert host.count("reboot") == 1 and ladder.step == "rebooting"
        assert "RemediationEscalated" in [e[0] for e in cluster.events]
        from agent.gpu import resets
        from agent.statedir import StateDir
        assert resets.load(StateDir(str(tmp_path)), "boot-1") == [], "an unverified reset is never told to the Xid stream"


def test_a_restart_at_resetting_with_the_fault_gone_verifies_and_releases(tmp_path):
    cfg = enforce()
    host, cluster = DyingHost(cfg, "reset_gpu"), FakeCluster()
    users = Users({"GPU-aaaa": frozenset({"uid-a"})})
    faults = fault_list(finding("XidCritical48", "reset_gpu"))
    run_until_killed(make(tmp_path, cfg, cluster=cluster, host=host, users=users), faults)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, users=users)
    ladder.tick([])
    assert host.count("verify") == 1 and host.count("reset_gpu") == 1 and host.count("reboot") == 0
    assert ladder.step == "idle" and not cluster.held


def test_the_escalation_count_survives_restarts_and_reboots(tmp_path):
    cfg = enforce()
    clock, cluster = Clock(), FakeCluster()
    host = FakeHost(cfg)
    faults = fault_list(finding("XidCritical79", "reboot"))
    for boot in ("boot-2", "boot-3"):
        make(tmp_path, cfg, cluster=cluster, host=host, clock=clock).tick(faults)
        host.booted(boot)
        host.up = 99_999.0
        clock.t += 13 * 3600
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    ladder.tick(faults)
    assert host.count("reboot") == 2 and cluster.retired and ladder.step == "retired"
    again = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    again.tick(faults)
    assert again.step == "retired" and host.count("reboot") == 2 and cluster.count("set_retired") == 1


def test_unretire_by_the_command_clears_the_mark_and_the_cluster_condition(tmp_path):
    import subprocess
    import sys

    cfg = enforce()
    cluster, host = FakeCluster(), FakeHost(cfg)
    make(tmp_path, cfg, cluster=cluster, host=host).tick(fault_list(finding("RowRemapFailure", "rma")))
    assert cluster.retired
    run = [sys.executable, "-m", "agent", "remediation"]
    p = subprocess.run([*run, "unretire", "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "un-retired" in p.stdout, p.stderr
    again = subprocess.run([*run, "unretire", "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert "not retired" in again.stdout
    ladder = make(tmp_path, cfg, cluster=cluster, host=host)
    ladder.tick([])
    assert not cluster.retired and ladder.step == "idle" and cluster.calls[-1] == ("set_retired", False)
    status = subprocess.run([*run, "status", "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert '"retired": null' in status.stdout


# ---------------------------------------------------------------- standing time across restarts

REBOOT10 = finding("XidCritical79", "reboot")
DIAG = finding("NvLinkDown", "drain_and_diagnose")


def restarted(tmp_path, cfg, cluster, clock, host=None):
    """A new agent process: a new ladder on the same state dir, nothing in memory."""
    return make(tmp_path, cfg, cluster=cluster, clock=clock, host=host)


def test_a_restart_does_not_start_the_standing_time_again(tmp_path):
    cfg, clock, cluster = enforce(reboot_after="10m"), Clock(), FakeCluster()
    make(tmp_path, cfg, cluster=cluster, clock=clock).tick(fault_list(REBOOT10))
    clock.t += 300
    ladder = restarted(tmp_path, cfg, cluster, clock)
    ladder.tick(fault_list(REBOOT10))
    assert cluster.count("claim") == 0
    clock.t += 299
    ladder.tick(fault_list(REBOOT10))
    assert cluster.count("claim") == 0, "not sooner than 10 minutes after it was first seen"
    clock.t += 1
    restarted(tmp_path, cfg, cluster, clock).tick(fault_list(REBOOT10))
    assert cluster.count("claim") == 1, "10 minutes after it was first seen, across two restarts"


def test_a_fault_not_reported_yet_after_a_start_keeps_its_time_for_a_while(tmp_path):
    cfg, clock, cluster = enforce(drain_after="10m"), Clock(), FakeCluster()
    make(tmp_path, cfg, cluster=cluster, clock=clock).tick(fault_list(DIAG))
    clock.t += 590
    ladder = restarted(tmp_path, cfg, cluster, clock)
    ladder.tick([])  # the first snapshot after the start: the check that reports it has not run yet
    clock.t += 10
    ladder.tick(fault_list(DIAG))
    assert cluster.count("claim") == 1
    cluster2, clock2 = FakeCluster(), Clock()
    make(tmp_path / "gone", cfg, cluster=cluster2, clock=clock2).tick(fault_list(DIAG))
    ladder = restarted(tmp_path / "gone", cfg, cluster2, clock2)
    clock2.t += 300
    ladder.tick([])
    clock2.t += 150
    ladder.tick([])  # still not reported after the start-up grace: it cleared, forgotten
    clock2.t += 150
    ladder.tick(fault_list(DIAG))
    clock2.t += 599
    ladder.tick(fault_list(DIAG))
    assert cluster2.count("claim") == 0, "back after it cleared: its wait starts again"


@pytest.mark.parametrize("damage", ["missing", "corrupt", "clock set back", "another boot"])
def test_a_lost_or_doubtful_standing_time_restarts_the_wait(tmp_path, damage):
    cfg, clock, cluster = enforce(drain_after="10m"), Clock(), FakeCluster()
    host = FakeHost(cfg)
    make(tmp_path, cfg, cluster=cluster, clock=clock, host=host).tick(fault_list(DIAG))
    record = tmp_path / "remediation.json"
    if damage == "missing":
        record.unlink()
    elif damage == "corrupt":
        record.write_text(record.read_text()[:20])
    elif damage == "clock set back":
        clock.t -= 3600  # the record's time is ahead of the clock now
    else:
        host.booted("boot-2")
        host.up = 99_999.0
    clock.t += 600
    ladder = restarted(tmp_path, cfg, cluster, clock, host)
    ladder.tick(fault_list(DIAG))
    assert cluster.count("claim") == 0, "never a disruptive step on a lost or doubtful standing time"
    clock.t += 599
    ladder.tick(fault_list(DIAG))
    assert cluster.count("claim") == 0
    clock.t += 1
    ladder.tick(fault_list(DIAG))
    if damage == "corrupt":  # a record that could not be read never leads to an action for what stood then
        assert cluster.count("claim") == 0 and [f.subject for f in ladder.findings()] == ["record"]
        return
    assert cluster.count("claim") == 1, "the wait started again at the restart"
