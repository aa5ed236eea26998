"""The ladder's thread: fed the store's snapshots, survives the API server's refusals."""

from __future__ import annotations

import logging

import threading

from agentproc import wait_for
from remediation_support import FakeCluster, FakeHost, GPU_INFO, enforce, finding, make

from agent.kube.api import ApiError, Wait
from agent.remediation.faults import faults
from agent.remediation.runner import Runner
from agent.store import Store


def snapshot(*findings):
    store = Store()
    store.set_events("xid", findings, GPU_INFO)
    return store.snapshot()


def test_a_tick_that_meets_an_api_error_or_a_wait_is_tried_again(tmp_path, caplog):
    cluster = FakeCluster(fail=ApiError(429, "too many requests"))
    ladder = make(tmp_path, enforce(), cluster=cluster, host=FakeHost(enforce()))
    published = []
    runner = Runner(ladder, interval=10, publish_samples=published.append)
    snap = snapshot(finding("Xid79", "reboot"))
    caplog.set_level(logging.INFO, logger="agent.remediation.runner")
    assert runner.step(snap) == 30.0 and ladder.step == "drain"
    assert "the API server said 429" in caplog.text
    caplog.clear()
    cluster.fail = Wait(0.0)  # our own rate limit: tried again when the token is due (at least MIN_GAP)
    assert runner.step(snap) == 1.0
    assert "client-side rate limit (no request sent)" in caplog.text and "API server said" not in caplog.text
    cluster.fail = None
    assert runner.step(snap) == 1.0 and ladder.step == "rebooting"  # it moved: the next tick comes soon (MIN_GAP)
    assert published and any(s.name == "node_health_remediation_step" and dict(s.labels) == {"step": "rebooting"}
                             for s in published[-1])
    assert runner.step(snap) == 10  # nothing moved: the next at `interval`, or when a fault or the kill switch changes


def test_the_thread_follows_offered_snapshots_and_publishes_its_findings(tmp_path):
    cluster = FakeCluster(slots=0)
    ladder = make(tmp_path, enforce(), cluster=cluster)
    emitted = []
    runner = Runner(ladder, interval=0.05, publish_samples=lambda s: None, paused=lambda: False)
    runner.source.start(lambda findings, samples: emitted.append(tuple(findings)))
    before = set(threading.enumerate())
    runner.start()
    try:
        runner.offer(snapshot(finding("Xid79", "reboot")))
        wait_for(lambda: emitted and [f.reason for f in emitted[-1]] == ["DisruptionSlotWaiting"], what="waiting finding")
        ours = [t for t in threading.enumerate() if t.name == "remediation" and t not in before]
        assert len(ours) == 1
    finally:
        runner.stop()
    # This runner's thread is gone (a "remediation" thread another test left behind is not this test's business).
    assert not ours[0].is_alive()


def test_the_kill_switch_is_read_before_every_tick(tmp_path):
    host = FakeHost(enforce())
    state = {"paused": True}
    ladder = make(tmp_path, enforce(), host=host)
    runner = Runner(ladder, interval=10, publish_samples=lambda s: None, paused=lambda: state["paused"])
    snap = snapshot(finding("Xid79", "reboot"))
    runner.step(snap)
    assert host.count("reboot") == 0 and ladder.would.get("reboot") == "kill_switch"
    state["paused"] = False
    runner.step(snap)
    assert host.count("reboot") == 1


def test_only_a_change_of_the_faults_or_of_the_kill_switch_wakes_the_thread(tmp_path):
    """Issue 29: a check result that changes no fault (nearly all of them) costs the ladder's thread nothing;
    the thread still ticks every `interval` on the latest snapshot."""
    state = {"paused": False}
    runner = Runner(make(tmp_path, enforce()), interval=10, publish_samples=lambda s: None,
                    paused=lambda: state["paused"])
    store = Store()
    store.set_events("xid", (), GPU_INFO)
    runner.offer(store.snapshot())
    assert runner._wake.is_set()  # the first snapshot: the ladder has seen nothing yet
    runner._wake.clear()
    store.set_events("disk", (finding("DiskSlow", "none", subject="/data", check="disk"),))
    store.set_events("xid", (), GPU_INFO + GPU_INFO)  # more samples, the same GPUs
    runner.offer(store.snapshot())
    assert not runner._wake.is_set()  # no finding the ladder acts on changed
    assert runner._snap is store.snapshot()  # ...and the next tick takes the latest snapshot anyway
    store.set_events("xid", (finding("Xid79", "reboot"),), GPU_INFO)
    runner.offer(store.snapshot())
    assert runner._wake.is_set()  # a fault
    runner._wake.clear()
    store.set_events("xid", (finding("Xid79", "reboot", subject="gpu1"),), GPU_INFO)
    runner.offer(store.snapshot())
    assert runner._wake.is_set()  # another GPU's
    runner._wake.clear()
    state["paused"] = True
    runner.offer(store.snapshot())
    assert runner._wake.is_set()  # the kill switch's state is read by every tick


def test_faults_skips_the_samples_when_no_finding_is_acted_on():
    class Samples:
        def __iter__(self):
            raise AssertionError("walked the samples")

    assert faults([finding("DiskSlow", "none", subject="/data", check="disk")], Samples()) == []
    assert [f.uuid for f in faults([finding("Xid79", "reboot")], GPU_INFO)] == ["GPU-aaaa"]


def test_the_kill_switchs_change_kicks_the_ladder_it_was_started_with(tmp_path):
    from kube_support import make_reconciler
    from kube_support import settings as kube_settings

    from agent.catalog import Catalog
    from agent.hostpaths import HostPaths
    from agent.kube.actuator import Actuator
    from agent.remediation.runner import start
    from agent.statedir import StateDir

    rec = make_reconciler(None, str(tmp_path), kube_settings())
    act = Actuator(rec, kill_switch=None, publish_samples=lambda s: None)
    state = StateDir(str(tmp_path / "state"))
    state.ensure()
    runner = start(enforce(), state, HostPaths(), kube=act, dry_run=True, config_path=None,
                   publish_samples=lambda s: None, catalog=Catalog.declare((), ()))
    try:
        assert act.on_paused == runner.kick
    finally:
        runner.stop()
