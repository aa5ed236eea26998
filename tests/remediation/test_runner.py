"""The ladder's thread: fed the store's snapshots, survives the API server's refusals."""

from __future__ import annotations

import logging

import threading

from agentproc import wait_for
from remediation_support import FakeCluster, FakeHost, GPU_INFO, enforce, finding, make

from agent.kube.api import ApiError, Wait
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
    assert runner.step(snap) == 10 and ladder.step == "rebooting"
    assert published and any(s.name == "node_health_remediation_step" and dict(s.labels) == {"step": "rebooting"}
                             for s in published[-1])


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
