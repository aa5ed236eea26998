"""Every record the ladder writes loads back; a retirement is final; read-only commands are read-only."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import pytest
from remediation_support import Clock, FakeCluster, FakeHost, enforce, fault_list, finding, make, settings, value

from agent.kube.api import ApiError
from agent.remediation import record as R
from agent.remediation.ladder import Ladder

REBOOT = finding("XidCritical79", "reboot")
RMA = finding("RowRemapFailure", "rma")


def _full(step: str) -> R.Record:
    """A record with every field set to something other than its default."""
    ep = R.Episode(key="gpu/gpu0/XidCritical48", action="reset_gpu", subject="gpu0", step=step, started=1.5e9,
                   step_at=12.5, uuid="GPU-aaaa", gpu="0", pci="0000:18:00", scope="gpu", slot=True, boot_id="b-1",
                   booted_at=3.0, retry_at=4.0, reset_at=5.0, note="why", step_boot="b-2", forced=True)
    return R.Record(
        episode=ep, reboots=[R.Reboot("k", 1.6e9, "b-0", back=True, failed=True, up=77.0)],
        retired=R.Retired(1.7e9, "k", "w", command_done=True, powered_off=True, boot_id="b-2", up=8.0),
        handled={"k": "b-2"}, resets={"GPU-aaaa": "b-2"}, reset_counts={"GPU-aaaa": 2}, unretire=True, seen={"k": 9.0}, seen_boot="b-2",
        boots=[("b-0", 100.0), ("b-1", 200.0)],
    )


@pytest.mark.parametrize("step", R.STEPS)
def test_every_step_and_field_round_trips(step):
    rec = _full(step)
    back = R.parse(json.loads(json.dumps(rec.to_json())))
    assert back == rec
    for f in dataclasses.fields(R.Record):
        assert getattr(back, f.name) != getattr(R.Record(), f.name), f"field {f.name} not exercised"
    bare = R.Episode(key="k", action="reboot", subject="s", step=step, started=0.0, step_at=0.0)
    for f in dataclasses.fields(R.Episode):
        assert getattr(back.episode, f.name) != getattr(bare, f.name) or f.name == "step", f"episode.{f.name} not exercised"


def test_the_ladder_handles_exactly_the_steps_a_record_may_hold(tmp_path):
    ladder = make(tmp_path, enforce())
    seen = set()
    for step in R.STEPS:  # each persisted step has a handler (a KeyError here would be a step without one)
        ladder.rec = R.Record(episode=dataclasses.replace(_full(step).episode, boot_id="boot-1", step_boot="boot-1"))
        ladder.tick([])
        seen.add(step)
    assert seen == set(R.STEPS)


def _load(tmp_path) -> R.Record:
    from agent.statedir import StateDir

    rec = StateDir(str(tmp_path), read_only=True).load(R.RECORD_FILE)
    assert rec is not None, "the record written by the ladder loads back"
    return rec


@dataclasses.dataclass
class FlakyRelease(FakeCluster):
    failures: int = 0

    def release_slot(self, now):
        if self.failures:
            self.failures -= 1
            raise ApiError(0, "client-side rate limit")
        super().release_slot(now)


def test_a_retirement_whose_release_fails_loads_back_retries_the_release_and_never_reboots_again(tmp_path):
    cfg, clock = enforce(), Clock()
    cluster, host = FlakyRelease(failures=3), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    with pytest.raises(ApiError):
        ladder.tick(fault_list(RMA))
    rec = _load(tmp_path)
    assert rec.retired is not None and rec.episode is not None and rec.episode.step == "release"
    assert not list(tmp_path.glob("remediation.json.bad-*"))
    for _ in range(3):  # restarted each time: the release is retried until done
        ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
        try:
            ladder.tick(fault_list(RMA, REBOOT))
        except ApiError:
            pass
    assert not cluster.held and _load(tmp_path).episode is None and cluster.count("release") == 1
    host.booted("boot-2")
    host.up = 99_999.0
    clock.t += 86_400
    ladder = make(tmp_path, cfg, cluster=cluster, host=host, clock=clock)
    for _ in range(3):
        ladder.tick(fault_list(REBOOT, RMA))
    assert host.count("reboot") == 0 and host.count("reset_gpu") == 0 and ladder.step == "retired"
    assert [c for c in cluster.calls if c[0] == "drain"] == [("drain", None)], "drained once, never again"


def test_the_node_says_retired_and_the_record_does_not_then_retired(tmp_path):
    cfg = enforce()
    cluster, host = FakeCluster(retired=True), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host)
    for _ in range(3):
        ladder.tick(fault_list(REBOOT))
    assert ladder.step == "retired" and host.count("reboot") == 0 and cluster.count("drain") == 0
    (f,) = [f for f in ladder.findings() if f.reason == "NodeRetired"]
    assert "the Node carries the retired label but the local record does not" in f.message
    assert _load(tmp_path).retired is not None


def test_a_node_retired_read_that_fails_is_tried_again_and_nothing_acts_before(tmp_path):
    cfg = enforce()

    class Unreadable(FakeCluster):
        def node_retired(self):
            raise ApiError(500, "boom")

    cluster, host = Unreadable(retired=True), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host)
    with pytest.raises(ApiError):
        ladder.tick(fault_list(REBOOT))
    assert cluster.calls == [] and host.calls == []


def test_an_unreadable_record_never_leads_to_an_action_and_is_reported(tmp_path):
    (tmp_path / "remediation.json").mkdir()  # open() fails with EISDIR: unreadable, left where it is
    cfg = enforce()
    cluster, host = FakeCluster(), FakeHost(cfg)
    ladder = make(tmp_path, cfg, cluster=cluster, host=host)
    for _ in range(3):
        ladder.tick(fault_list(REBOOT))
    assert cluster.calls == [] and host.calls == [] and (tmp_path / "remediation.json").is_dir()
    assert [(f.subject, f.reason) for f in ladder.findings()] == [("record", "RemediationHeld")]


# ---------------------------------------------------------------- read-only commands


def _digest(path) -> dict[str, str]:
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, path)] = "dir" if os.path.isdir(p) else hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


AGENT = [sys.executable, "-m", "agent"]


@pytest.mark.parametrize("content", [b'{"version": 1, "episode": {"step": "nope"}}', b"", b"\xff\xfe", None])
def test_remediation_status_leaves_the_state_dir_byte_identical(tmp_path, content):
    state = tmp_path / "state"
    state.mkdir()
    if content is None:  # a good record, of a retired node
        make(state, enforce(), cluster=FakeCluster()).tick(fault_list(RMA))
    else:
        (state / "remediation.json").write_bytes(content)
    (state / "agent.lock").write_text("1\n")
    before = _digest(state)
    p = subprocess.run([*AGENT, "remediation", "status", "--state-dir", str(state)], capture_output=True, text=True,
                       timeout=60)
    assert _digest(state) == before
    if content is None:
        assert p.returncode == 0 and json.loads(p.stdout)["retired"]["key"] == "gpu/gpu0/RowRemapFailure"
    else:
        assert p.returncode == 1 and "left where it is" in json.loads(p.stdout)["problem"]


@pytest.mark.parametrize("action", ["status", "unretire"])
def test_a_state_dir_that_does_not_exist_is_bad_usage_not_an_empty_record(tmp_path, action):
    missing = tmp_path / "nope"
    p = subprocess.run([*AGENT, "remediation", action, "--state-dir", str(missing)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1, (p.stdout, p.stderr)
    assert f"state dir {missing}: no such directory" in p.stderr
    assert not missing.exists(), "unretire must not create the state dir it was pointed at by mistake"


def test_selftest_and_config_show_leave_the_state_dir_byte_identical(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    for name in ("remediation.json", "edac.json", "gpu-inventory.json", "kernel-log.json", "network-interfaces.json", "burn.json",
                 "gpu-poll.json", "xid-stream.json", "gpu-resets.json", "infiniband.json"):
        (state / name).write_bytes(b"{damaged")  # every file a check reads at start: none is set aside
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[agent]\nstate_dir = "{state}"\n')
    before = _digest(state)
    subprocess.run([*AGENT, "selftest", "--config", str(cfg), "--json"], capture_output=True, text=True, timeout=300)
    subprocess.run([*AGENT, "config", "show", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert _digest(state) == before


# ---------------------------------------------------------------- un-retire while the agent runs


def test_unretire_from_outside_against_a_running_ladder_runner(tmp_path):
    """The agent holds the lock (as the DaemonSet's pod always does): `unretire` asks it through a request
    file; the running runner applies it, clears the Node's mark, and the command says so (exit 0)."""
    from agent.remediation.runner import Runner
    from agent.statedir import StateDir
    from agent.store import Store

    cfg = enforce(interval="1s")
    cluster, host = FakeCluster(), FakeHost(cfg)
    StateDir(str(tmp_path)).lock()  # this process is the running agent
    ladder: Ladder = make(tmp_path, cfg, cluster=cluster, host=host)
    ladder.tick(fault_list(RMA))
    assert cluster.retired
    runner = Runner(ladder, interval=1.0, publish_samples=lambda s: None)
    runner.offer(Store().snapshot())
    runner.start()
    try:
        p = subprocess.run([*AGENT, "remediation", "unretire", "--state-dir", str(tmp_path), "--wait", "30"],
                           capture_output=True, text=True, timeout=60)
    finally:
        runner.stop()
    assert p.returncode == 0 and "un-retired by the running agent" in p.stdout, (p.stdout, p.stderr)
    assert not cluster.retired and ladder.step == "idle" and _load(tmp_path).reboots == []
    assert not (tmp_path / R.UNRETIRE).exists()


def test_unretire_with_no_agent_taking_the_request_up_exits_3_and_leaves_it(tmp_path):
    from agent.statedir import StateDir

    StateDir(str(tmp_path)).lock()
    p = subprocess.run([*AGENT, "remediation", "unretire", "--state-dir", str(tmp_path), "--wait", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and "no running agent took the request up" in p.stderr
    assert (tmp_path / R.UNRETIRE).exists()
    assert not (tmp_path / "remediation.json").exists(), "the record is never written by the command then"


def test_a_request_file_is_applied_by_the_next_start_too(tmp_path):
    cfg = enforce()
    cluster, host = FakeCluster(), FakeHost(cfg)
    make(tmp_path, cfg, cluster=cluster, host=host).tick(fault_list(RMA))
    (tmp_path / R.UNRETIRE).write_text('{"version": 1, "at": 1800000000.0}')
    ladder = make(tmp_path, cfg, cluster=cluster, host=host)
    ladder.tick([])
    assert ladder.step == "idle" and not cluster.retired and not (tmp_path / R.UNRETIRE).exists()



def test_a_record_of_0_1_0_still_matches_the_xid_fault_it_was_written_for(tmp_path):
    """Xid findings keep `check="xid"` (docs/gpu.md), so the fault key 0.1.0 wrote into remediation.json
    for an Xid, "xid/gpu0/Xid79", is the key this version makes for the same fault: after the upgrade,
    the reboot 0.1.0 asked for it counts as uncured when the Xid is back (the retire window counts it;
    a key of another shape would start the count again)."""
    from agent.gpu.xid_tracker import Event, XidStream
    from agent.parsers.xid import KIND_XID

    key, now = "xid/gpu0/Xid79", Clock().t
    written_by_0_1_0 = {  # no "_format" stamp, no boot-clock fields: as 0.1.0 wrote it
        "version": 1, "episode": None, "retired": None, "handled": {}, "resets": {},
        "reboots": [{"key": key, "at": now - 3600, "boot_id": "boot-0", "back": False}],
    }
    (tmp_path / R.FILE).write_text(json.dumps(written_by_0_1_0))
    stream = XidStream(dedupe_window=5.0, app_hold=60.0, coverage_hold=60.0, overrides={},
                       subject_of=lambda pci, kind: ("gpu0", "0"), clock=lambda: 10.0)
    stream.add(Event("kmsg", KIND_XID, 79, "0000:18:00", "GPU has fallen off the bus.", 9.0))
    [xid79] = stream.findings()
    assert f"{xid79.check}/{xid79.subject}/{xid79.reason}" == key
    ladder = make(tmp_path, settings(), clock=Clock(now))  # observe: the record is kept, nothing is done
    ladder.tick(fault_list(xid79))
    assert [r.back for r in ladder.rec.reboots] == [True], "0.1.0's reboot for it did not cure it"
    assert value(ladder, "node_health_remediation_uncured_reboots") == 1
    assert _load(tmp_path).reboots[0].key == key
