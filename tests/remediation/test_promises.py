"""Issue 23's promises on fakes: held drains, clocks that cannot jump, fail closed; issue 24 item 3: observe
mode and dry run are dry (every metric and event they produce, listed)."""

from __future__ import annotations

import dataclasses

import pytest
from remediation_support import Clock, FakeCluster, FakeHost, Progress, Users, enforce, fault_list, finding, make, settings, value

from agent.config import ConfigError
from agent.remediation.cluster import NoCluster

REBOOT = finding("XidCritical79", "reboot")
RESET = finding("XidCritical48", "reset_gpu")
RESET_B = finding("XidCritical63", "reset_gpu")  # another reset-type Xid on the same GPU
RMA = finding("RowRemapFailure", "rma")
DIAG = finding("NvLinkDown", "drain_and_diagnose")


@dataclasses.dataclass
class StuckDrain(FakeCluster):
    """A PodDisruptionBudget that never allows the eviction: the drain times out with the pod still there."""

    def drain(self, now, only_pod_uids=None):
        self.calls.append(("drain", None if only_pod_uids is None else tuple(sorted(only_pod_uids))))
        return Progress(done=False, timed_out=True, evicted=0, blocked=("ml/db-0",), remaining=("ml/db-0",))


# ---------------------------------------------------------------- on_timeout = "wait" holds


def test_a_drain_that_timed_out_with_pods_left_never_reboots_and_holds_naming_them(tmp_path):
    cfg, clock = enforce(), Clock()
    cluster, host = StuckDrain(), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    for _ in range(50):
        ladder.tick(fault_list(REBOOT))
        clock.t += 3600
    assert host.count("reboot") == 0 and ladder.step == "drain" and cluster.count("drain") == 50, "it goes on retrying"
    (held,) = [f for f in ladder.findings() if f.reason == "RemediationHeld"]
    assert held.subject == "drain" and "ml/db-0" in held.message and "PodDisruptionBudget" in held.message
    assert value(ladder, "node_health_remediation_waiting", on="drain") == 1
    assert ("drain", "ok") not in ladder.counts and "RemediationDrained" not in [e[0] for e in cluster.events]


@pytest.mark.parametrize("fault", [RMA, RESET])
def test_retire_and_reset_hold_too(tmp_path, fault):
    cfg, clock = enforce(), Clock()
    cluster, host = StuckDrain(), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock, users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
    for _ in range(10):
        ladder.tick(fault_list(fault))
        clock.t += 3600
    assert host.calls == [] and not cluster.retired and ladder.step == "drain"


def test_force_after_is_an_opt_in_that_goes_past_the_pods_after_its_time(tmp_path):
    cfg, clock = enforce(reboot={"force_after": "2h"}), Clock()
    cluster, host = StuckDrain(), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    ladder.tick(fault_list(REBOOT))
    clock.t += 7199
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 0
    clock.t += 1
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1 and ladder.counts[("drain", "forced")] == 1


@pytest.mark.parametrize("value_", ["-1s", "soon", True])
def test_force_after_is_validated(value_):
    with pytest.raises(ConfigError) as err:
        settings(reboot={"force_after": value_})
    assert "force_after" in str(err.value)


# ---------------------------------------------------------------- clocks that cannot jump


def _scenario(tmp_path, steps: dict[int, float], cfg) -> list:
    """A fault's life over 40 ticks of 15 minutes (a reboot, back, the cap, a retirement); `steps` moves the wall
    clock by the given seconds before tick i. Returns every command and cluster call, in order."""
    clock, wall = Clock(), Clock()
    cluster, host = FakeCluster(), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock, wall=wall)
    for i in range(40):
        wall.t += steps.get(i, 0.0)
        ladder.tick(fault_list(REBOOT) if i % 7 != 6 else [])
        if ladder.step == "rebooting" and i % 3 == 0:
            host.booted(f"boot-{i}")
            host.up = 99_999.0
            ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock, wall=wall)  # a new process
        clock.t += 900
        wall.t += 900
    return [c for c in host.calls] + [c for c in cluster.calls if c[0] != "renew"]


@pytest.mark.parametrize("step", [3600.0, -3600.0, 86_400.0, -86_400.0, 8 * 86_400.0])
def test_wall_clock_steps_change_no_decision(tmp_path, step):
    cfg = enforce(reboot_after="20m", reboot={"max_per_day": 1, "settle": "30m"})
    base = _scenario(tmp_path / "a", {}, cfg)
    assert ("reboot",) in base
    for at in (1, 4, 9, 17):
        assert _scenario(tmp_path / f"s{at}", {at: step, at + 8: step}, cfg) == base, f"step {step:+.0f}s at tick {at}"


def test_a_wall_step_of_an_hour_does_not_shorten_the_standing_time(tmp_path):
    clock, wall = Clock(), Clock()
    cluster = FakeCluster()
    ladder = make(tmp_path, enforce(reboot_after="10m"), cluster=cluster, clock=clock, wall=wall)
    ladder.tick(fault_list(REBOOT))
    clock.t += 5
    wall.t += 3605
    ladder.tick(fault_list(REBOOT))
    assert cluster.calls == []


def test_the_daily_cap_counts_boot_time_across_boots_not_wall_time(tmp_path):
    cfg = enforce(reboot={"max_per_day": 1})
    clock, wall = Clock(), Clock()
    host, cluster = FakeHost(cfg), FakeCluster()
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock, wall=wall)
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1
    clock.t += 3600  # an hour later the node is up again
    host.booted("boot-2")
    clock.t += 3600
    wall.t += 3 * 86_400  # and NTP stepped the wall clock three days ahead
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock, wall=wall)
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1 and value(ladder, "node_health_remediation_waiting", on="daily_cap") == 1
    clock.t += 86_400 - 3600 - 1  # 1 s short of 24 h of boot time since the reboot (the hour down does not count)
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1
    clock.t += 1
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 2


def test_a_record_of_another_boot_never_shortens_a_wait(tmp_path):
    """A cloned disk or a restored state dir: the fault's first-seen time and the step's time are of another
    boot, so the waits start again in this one."""
    cfg = enforce(reboot_after="10m", gpu_reset={"busy_timeout": "10m"})
    clock = Clock()
    host, cluster = FakeHost(cfg), FakeCluster()
    make(tmp_path, cfg, host=host, cluster=cluster, clock=clock).tick([])
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock)
    ladder.tick(fault_list(REBOOT))  # first seen in boot-1
    clock.t += 3600
    host.booted("boot-2")  # the state dir now runs in another boot, 1 s after it began
    clock.t += 1
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock)
    ladder.tick(fault_list(REBOOT))
    assert cluster.calls == [], "the wait starts again in this boot"
    # an episode waiting on a busy GPU, recorded in another boot: the busy timeout starts again too
    host.pids["GPU-aaaa"] = (42,)
    cluster2, host2 = FakeCluster(), FakeHost(cfg)
    host2.pids["GPU-aaaa"] = (42,)
    users = Users({"GPU-aaaa": frozenset({"uid-a"})})
    other = tmp_path / "busy"
    lad = make(other, cfg, host=host2, cluster=cluster2, clock=clock, users=users)
    lad.tick(fault_list(RESET))
    assert lad.step == "reset_gpu"
    clock.t += 300
    host2.booted("boot-9")
    host2.up = 99_999.0
    clock.t += 5
    lad = make(other, cfg, host=host2, cluster=cluster2, clock=clock, users=users)
    lad.tick(fault_list(RESET))
    clock.t += 300
    lad.tick(fault_list(RESET))
    assert host2.count("reboot") == 0 and lad.step == "reset_gpu", "not 10 minutes of busy GPU in this boot yet"


# ---------------------------------------------------------------- fail closed


def test_an_unreadable_mig_mode_is_mig_no_reset(tmp_path):
    cfg = enforce()
    host, cluster = FakeHost(cfg), FakeCluster()
    host.mig["GPU-aaaa"] = None  # type: ignore[assignment]  (nvidia-smi failed or hung)
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
    ladder.tick(fault_list(RESET))
    assert host.count("reset_gpu") == 0 and host.count("reboot") == 1
    assert any("cannot be read" in e[1] for e in cluster.events if e[0] == "RemediationEscalated")


@pytest.mark.parametrize("stop_before", ["drain", "reboot"])
def test_the_kill_switch_is_read_again_immediately_before_each_host_changing_command(tmp_path, stop_before):
    """Flipped while the tick runs (after the tick's first read): the next command does not run."""
    cfg = enforce()
    host, cluster = FakeHost(cfg), FakeCluster()
    asks: list[str] = []

    def go_ahead():
        asks.append(f"{len(cluster.calls)}")
        if stop_before == "drain" or cluster.count("drain"):
            return "kill_switch"
        return None

    ladder = make(tmp_path, cfg, host=host, cluster=cluster, go_ahead=go_ahead)
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 0 and asks
    assert cluster.count("drain") == (0 if stop_before == "drain" else 1)
    assert value(ladder, "node_health_remediation_would", action="reboot", cause="kill_switch") == 1


def test_the_kill_switch_read_again_stops_a_retirement_and_the_power_off(tmp_path):
    cfg, clock = enforce(retire={"command": ["/bin/true"], "power_off_after": "1h"}), Clock()
    host, cluster = FakeHost(cfg), FakeCluster()
    stop: list[str] = []
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock, go_ahead=lambda: stop[0] if stop else None)
    stop.append("kill_switch")
    ladder.tick(fault_list(RMA))
    assert not cluster.retired and cluster.count("drain") == 0
    stop.clear()
    ladder.tick(fault_list(RMA))
    ladder.tick(fault_list(RMA))  # the retire command runs on the tick after the retirement
    assert cluster.retired and host.count("retire_command") == 1
    stop.append("kill_switch")
    clock.t += 7200
    ladder.tick(fault_list(RMA))
    assert host.count("power_off") == 0
    stop.clear()
    ladder.tick(fault_list(RMA))
    assert host.count("power_off") == 1


def test_a_reboot_that_never_came_releases_the_slot_after_the_overdue_time_and_says_so(tmp_path):
    cfg, clock = enforce(), Clock()
    host, cluster = FakeHost(cfg), FakeCluster()
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock)
    ladder.tick(fault_list(REBOOT))
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock)  # killed at "rebooting", same boot
    clock.t += 7199
    ladder.tick(fault_list(REBOOT))
    assert ladder.step == "rebooting" and value(ladder, "node_health_remediation_waiting", on="reboot") is None, (
        "a reboot in flight is no wait: only an overdue one is reported")
    clock.t += 1
    ladder.tick(fault_list(REBOOT))
    assert not cluster.held and cluster.count("release") == 1 and host.count("reboot") == 1
    assert "RemediationFailed" in [e[0] for e in cluster.events]
    assert value(ladder, "node_health_remediation_waiting", on="reboot") == 1
    ladder.tick(fault_list(REBOOT))
    assert cluster.count("release") == 1 and host.count("reboot") == 1


def test_at_most_one_reset_per_gpu_per_boot_whatever_the_fault_key(tmp_path):
    cfg, clock = enforce(), Clock()
    host, cluster = FakeHost(cfg), FakeCluster()
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock, users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
    ladder.tick(fault_list(RESET))
    assert host.count("reset_gpu") == 1 and ladder.step == "idle"
    ladder.tick(fault_list(RESET, RESET_B))  # another reset-type Xid on the same GPU
    assert host.count("reset_gpu") == 1 and host.count("reboot") == 1


# ---------------------------------------------------------------- issue 24 item 3: observe and dry run are dry


class TellingNoCluster(NoCluster):
    def __init__(self) -> None:
        self.events: list[str] = []

    def event(self, reason, message, warning=False):
        self.events.append(reason)


@pytest.mark.parametrize("cluster_kind", ["cluster", "none"])
@pytest.mark.parametrize("mode", ["observe", "dry_run"])
def test_observe_and_dry_run_produce_only_would_series_and_no_event(tmp_path, mode, cluster_kind):
    cfg = settings() if mode == "observe" else enforce()
    clock, host = Clock(), FakeHost(cfg)
    cluster = FakeCluster() if cluster_kind == "cluster" else TellingNoCluster()
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock, dry_run=mode == "dry_run",  # type: ignore[arg-type]
                  users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
    series: set[tuple] = set()
    for faults in ([REBOOT], [RESET], [RMA], [DIAG], [REBOOT, RMA], []):
        for _ in range(3):
            ladder.tick(fault_list(*faults))
            clock.t += 3600
            series |= {(s.name, s.labels, s.value) for s in ladder.samples()}
    names = {s[0] for s in series}
    assert names == {"node_health_remediation_mode", "node_health_remediation_step", "node_health_remediation_would",
                     "node_health_remediation_reboots", "node_health_remediation_uncured_reboots",
                     "node_health_remediation_retired"}
    assert {s[1] for s in series if s[0] == "node_health_remediation_step"} <= {(("step", "idle"),), (("step", "claim"),)}
    assert {s[1] for s in series if s[0] == "node_health_remediation_mode"} == {(("mode", mode),)}
    assert {dict(s[1])["cause"] for s in series if s[0] == "node_health_remediation_would"} == {mode}
    assert {dict(s[1])["action"] for s in series if s[0] == "node_health_remediation_would"} == (
        {"drain", "reboot", "reset_gpu", "retire"} if cluster_kind == "cluster" else {"reboot", "reset_gpu", "retire"})
    assert {s[2] for s in series if s[0] in ("node_health_remediation_reboots", "node_health_remediation_retired")} == {0}
    assert cluster.events == [] and host.calls == [] and ladder.counts == {}
    assert [c for c in getattr(cluster, "calls", []) if c[0] != "renew"] == []


@pytest.mark.parametrize("step", ["claim", "drain", "reboot", "retire", "reset_gpu", "verify", "resetting"])
def test_an_episode_of_another_boot_starts_again_after_the_fault_stood_its_time_here(tmp_path, step):
    """A restored state dir holds an episode of another boot before its act: the 1-second-old fault of this boot
    is not drained, reset or rebooted for at once; the episode's slot is given back."""
    import json

    cfg, clock = enforce(reboot_after="10m", reset_gpu_after="10m", rma_after="10m"), Clock()
    host, cluster = FakeHost(cfg), FakeCluster()
    cluster.held, cluster.slots = True, 0
    ep = {"key": "gpu/gpu0/XidCritical79", "action": "reboot", "subject": "gpu0", "step": step, "started": 1.0,
          "step_at": 5.0, "uuid": "GPU-aaaa", "gpu": "0", "slot": True, "boot_id": "boot-0", "step_boot": "boot-0"}
    (tmp_path / "remediation.json").write_text(json.dumps({"version": 1, "episode": ep, "seen": {ep["key"]: 1.0},
                                                           "seen_boot": "boot-0"}))
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock, users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
    ladder.tick(fault_list(REBOOT))
    clock.t += 1
    ladder.tick(fault_list(REBOOT))
    assert host.calls == [] and cluster.count("drain") == 0 and not cluster.held and ladder.step == "idle"
    clock.t += 600
    ladder.tick(fault_list(REBOOT))
    assert cluster.count("drain") == 1 and host.count("reboot") == 1, "after its standing time in this boot"


def test_max_per_boot_allows_that_many_resets_of_one_gpu_then_escalates(tmp_path):
    cfg, clock = enforce(gpu_reset={"max_per_boot": 2}), Clock()
    host, cluster = FakeHost(cfg), FakeCluster()
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock, users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
    for fault in (RESET, RESET_B):
        ladder.tick(fault_list(fault))
        assert ladder.step == "idle"
        ladder.tick([])
    assert host.count("reset_gpu") == 2 and host.count("reboot") == 0
    ladder.tick(fault_list(RESET))  # back after two resets in this boot
    assert host.count("reset_gpu") == 2 and host.count("reboot") == 1
    note = next(e[1] for e in cluster.events if e[0] == "RemediationEscalated")
    assert "reset 2 times in this boot already (gpu_reset.max_per_boot = 2)" in note


@dataclasses.dataclass
class LandingCluster(FakeCluster):
    """A drain moves every pod but those in `stuck` (their PDB never allows); a drain times out after 60 s."""

    stuck: set[str] = dataclasses.field(default_factory=set)
    began: float | None = None

    def drain(self, now: float, only_pod_uids: frozenset[str] | None = None) -> Progress:
        self.calls.append(("drain", None if only_pod_uids is None else tuple(sorted(only_pod_uids))))
        left = tuple(sorted(self.stuck))
        if not left:
            self.began = None
            return Progress(done=True)
        self.began = now if self.began is None else self.began
        return Progress(done=False, timed_out=now - self.began >= 60, remaining=left, blocked=left)


@pytest.mark.parametrize("fault", ["reboot", "reset_gpu"])
def test_a_pod_that_lands_after_the_drain_is_drained_before_the_act_and_never_disrupted_under_wait(tmp_path, fault):
    """The drain finished, then the act waited (the uptime floor; a busy GPU): a pod that tolerates the taint
    lands under a PDB that never allows. The act drains again first and holds under on_timeout = "wait" (found
    by the stateful test at a larger budget: test_ladder_stateful.py's TestPdbStateful)."""
    cfg, clock = enforce(reboot={"min_uptime": "30m"}, gpu_reset={"busy_timeout": "1h"}), Clock()
    host, cluster = FakeHost(cfg), LandingCluster()
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock, users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
    faults = fault_list(REBOOT if fault == "reboot" else RESET)
    host.up, host.pids["GPU-aaaa"] = 60.0, (4242,)  # below min_uptime; a process holds the GPU
    ladder.tick(faults)
    assert ladder.step == fault and host.calls == [], "drained, then waiting"
    cluster.stuck = {"ml/db-0"}  # lands now, and its PDB never lets it go
    host.up, host.pids["GPU-aaaa"] = 99_999.0, ()
    for _ in range(10):
        clock.t += 30
        ladder.tick(faults)
        assert host.count("reboot") == host.count("reset_gpu") == 0, "never over the pod the drain could not move"
    assert ladder.step == "drain"
    assert any(f.reason == "RemediationHeld" and "ml/db-0" in f.message for f in ladder.findings())
    assert "RemediationRedrain" in [e[0] for e in cluster.events]
    cluster.stuck = set()  # its PDB allows at last
    clock.t += 30
    ladder.tick(faults)
    assert host.count(fault) == 1, "drained again, the act goes on"


def test_a_forced_drain_does_not_wait_for_the_same_pods_again_when_the_reboot_waited_after_it(tmp_path):
    """force_after went past the pods; the reboot then waited (the uptime floor): it does not drain again for
    them (that would wait out the drain timeout and force_after once more, for ever)."""
    cfg, clock = enforce(reboot={"force_after": "2h", "min_uptime": "30m"}), Clock()
    cluster, host = StuckDrain(), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    host.up = 60.0
    ladder.tick(fault_list(REBOOT))
    clock.t += 7200
    ladder.tick(fault_list(REBOOT))
    assert ladder.step == "reboot" and ladder.counts[("drain", "forced")] == 1 and host.count("reboot") == 0
    drains = cluster.count("drain")
    host.up = 99_999.0
    clock.t += 1
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)  # and across a restart
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1 and cluster.count("drain") == drains


def test_a_stronger_fault_takes_an_episode_over_only_once_it_has_stood_its_own_time(tmp_path):
    """A reset episode is under way (a process holds the GPU); a reboot fault arrives. It takes the episode
    over (a whole-node drain, a reboot) only after reboot_after, never on the reset's time (found by the
    stateful test at 1,000 examples: the reset fault then cleared and the node was drained for a reboot
    fault 151 s old)."""
    cfg, clock = enforce(reset_gpu_after="2m", reboot_after="10m"), Clock()
    host, cluster = FakeHost(cfg), FakeCluster()
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock, users=Users({"GPU-aaaa": frozenset({"uid-a"})}))
    host.pids["GPU-aaaa"] = (4242,)  # the reset waits for the GPU
    ladder.tick(fault_list(RESET))
    clock.t += 120
    ladder.tick(fault_list(RESET, REBOOT))
    assert ladder.step == "reset_gpu" and ("drain", ("uid-a",)) in cluster.calls
    for _ in range(9):  # 540 s: the reboot fault has not stood its 600 s
        clock.t += 60
        ladder.tick(fault_list(RESET, REBOOT))
        assert ladder.rec.episode is not None and ladder.rec.episode.action == "reset_gpu"
    assert ("drain", None) not in cluster.calls and host.count("reboot") == 0
    clock.t += 60
    ladder.tick(fault_list(RESET, REBOOT))  # 600 s: now it takes over
    assert ladder.rec.episode is None or ladder.rec.episode.action == "reboot"
    assert ("drain", None) in cluster.calls


def test_a_fault_that_cleared_after_a_start_waits_anew_even_within_the_startup_grace(tmp_path):
    """The startup grace keeps a recorded fault's time while the checks have not reported it yet; a fault this
    process was told of and then not has cleared: back, it waits its whole time again (found by the stateful
    test at 1,000 examples: cleared 10 s after a restart, back after another, and drained at once)."""
    cfg, clock = enforce(reboot_after="10m"), Clock()
    host, cluster = FakeHost(cfg), FakeCluster(slots=0)  # no slot: nothing goes past the claim
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock)
    ladder.tick(fault_list(REBOOT))
    clock.t += 3600
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock)  # restarted: within the grace
    ladder.tick(fault_list(REBOOT))
    clock.t += 10
    ladder.tick([])  # a check says it is gone
    assert ladder.rec.episode is None or ladder.rec.episode.step == "release"
    clock.t += 10
    ladder = make(tmp_path, cfg, host=host, cluster=cluster, clock=clock)  # restarted again
    cluster.slots = 1
    ladder.tick(fault_list(REBOOT))  # back
    assert cluster.count("drain") == 0 and host.count("reboot") == 0, "it waits its 10 minutes again"
    clock.t += 600
    ladder.tick(fault_list(REBOOT))
    assert host.count("reboot") == 1
