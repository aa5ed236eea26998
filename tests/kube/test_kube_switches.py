"""The kill switch (a watched ConfigMap) and dry-run: decisions shown, taints left alone."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest

from agent.kube import actuator
from agent.metrics import build_registry
from agent.registry import CATALOG
from agent.store import Store
from fakeapi import FakeApiServer
from kube_support import (
    NODE, PREFIX, Clock, conditions, fake, finding, make_reconciler, our_taints, sample_value, settings,  # noqa: F401
    snapshot, start_actuator, wait_for,  # noqa: F401
)

KS_NS, KS_NAME = "node-health", "node-health-agent-kill-switch"
TAINT = (PREFIX + "disk", "FakeDiskFull", "NoSchedule")


def metrics_text(act: Any) -> str:
    store = Store()
    store.set_extra("kubernetes", act.published["samples"])
    return generate_latest(build_registry(store, CATALOG)).decode()


def test_kill_switch_pauses_taint_changes_not_conditions(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.set_configmap(KS_NS, KS_NAME, {"paused": "true"})
    act = start_actuator(fake, str(tmp_path), settings(kill_switch=KS_NAME))
    try:
        act.offer(snapshot([finding("FakeDiskFull")], runs=1))
        wait_for(lambda: conditions(fake).get("NodeHealthDiskProblem", {}).get("status") == "True")
        wait_for(lambda: sample_value(act, "node_health_would_taint", key=TAINT[0], cause="kill_switch") == 1)
        assert our_taints(fake) == [] and len(fake.events()) == 1, "events and conditions continue"
        assert sample_value(act, "node_health_kube_kill_switch", state="paused") == 1
        lists = len(fake.log(verbs=("list",)))
        fake.set_configmap(KS_NS, KS_NAME, {"paused": "false"})
        wait_for(lambda: our_taints(fake) == [TAINT], timeout=10)
        assert len(fake.log(verbs=("list",))) == lists, "the open watch delivered the flip, not a later re-list"
        fake.set_configmap(KS_NS, KS_NAME, {"paused": "true"})
        wait_for(lambda: act.reconciler.paused is True)
        act.offer(snapshot([], runs=2))  # recovered, but paused: the taint stays
        wait_for(lambda: sample_value(act, "node_health_would_untaint", key=TAINT[0], cause="kill_switch") == 1)
        assert our_taints(fake) == [TAINT]
        watches = fake.log(verbs=("watch",))
        assert watches and all(r.query.get("fieldSelector") == f"metadata.name={KS_NAME}"
                               and r.query.get("allowWatchBookmarks") == "true" for r in watches)
    finally:
        act.stop()


def test_kill_switch_unreadable_means_no_taint_changes(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.forbidden.add(("list", "configmaps"))
    act = start_actuator(fake, str(tmp_path), settings(kill_switch=KS_NAME))
    try:
        act.offer(snapshot([finding("FakeDiskFull")], runs=1))
        wait_for(lambda: sample_value(act, "node_health_kube_kill_switch", state="unknown") == 1)
        wait_for(lambda: conditions(fake).get("NodeHealthDiskProblem", {}).get("status") == "True")
        assert our_taints(fake) == []
    finally:
        act.stop()


def test_kill_switch_watch_resumes_from_the_bookmark_and_relists_after_410(
        fake: FakeApiServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actuator, "WATCH_MIN", 1)
    monkeypatch.setattr(actuator, "WATCH_MAX", 1)
    fake.set_configmap(KS_NS, KS_NAME, {"paused": "false"})
    act = start_actuator(fake, str(tmp_path), settings(kill_switch=KS_NAME))
    try:
        wait_for(lambda: len(fake.log(verbs=("watch",))) >= 3, timeout=10)
        lists = fake.log(verbs=("list",))
        assert len([r for r in lists if "configmaps" in r.path]) == 1, "resumed, not re-listed"
        first, second = fake.log(verbs=("watch",))[:2]
        assert int(second.query["resourceVersion"]) >= int(first.query["resourceVersion"])
        fake.stop()
        fake.edit_node(NODE, lambda n: n["metadata"]["labels"].update(busy="yes"))
        fake.cluster.compact()  # while it was away, its resourceVersion left the history
        fake.set_configmap(KS_NS, KS_NAME, {"paused": "true"})
        fake.start()
        wait_for(lambda: act.reconciler.paused is True, timeout=15)
        assert len([r for r in fake.log(verbs=("list",)) if "configmaps" in r.path]) == 2, "410 → list again"
    finally:
        act.stop()


def test_dry_run_writes_nothing_and_shows_its_decisions(fake: FakeApiServer, tmp_path: Any) -> None:
    act = start_actuator(fake, str(tmp_path), settings(), dry_run=True)
    try:
        act.offer(snapshot([finding("FakeDiskFull")], runs=1))
        wait_for(lambda: sample_value(act, "node_health_would_taint", key=TAINT[0], cause="dry_run") == 1)
        text = metrics_text(act)
        assert f'node_health_would_taint{{cause="dry_run",effect="NoSchedule",key="{TAINT[0]}"}} 1.0' in text
        assert 'node_health_would_set_condition{cause="dry_run",status="True",type="NodeHealthDiskProblem"} 1.0' in text
        assert "node_health_kube_dry_run 1.0" in text
        assert fake.writes() == [], "no writes at all"
    finally:
        act.stop()


def test_without_a_cluster_it_is_a_dry_run(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    rec = make_reconciler(None, str(tmp_path), settings(), clock=clock)
    rec.step(clock(), snapshot([finding("FakeDiskFull")], runs=1))
    assert rec.dry_run and ("node-health-agent/disk", "NoSchedule", "dry_run") in rec.would["taint"]
    assert "would carry taints ['node-health-agent/disk=FakeDiskFull:NoSchedule']" in caplog.text


@pytest.mark.parametrize(("data", "paused"), [
    ({"paused": "true"}, True), ({"paused": "false"}, False), ({}, False), ({"other": "x"}, False),
    ({"paused": "yes"}, True), ({"paused": "1"}, True), ({"paused": "on"}, True), ({"paused": "True "}, True),
    ({"paused": "fasle"}, True), ({"paused": "False"}, True), ({"paused": ""}, True), ({"paused": 0}, True),
    ({"paused": None}, True), ({"paused": "\n" * 5000}, True), ("not a map", True), (["x"], True),
])
def test_kill_switch_fails_closed(data: Any, paused: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 25 item 3: only an absent key or exactly "false" lets taint changes go; anything else pauses,
    logged once per value with a short escaped excerpt."""
    import threading

    seen: list[bool | None] = []
    ks = actuator.KillSwitch(None, settings(kill_switch=KS_NAME).kill_switch, seen.append,  # type: ignore[arg-type]
                             threading.Event())
    ks._found({"metadata": {"name": KS_NAME}, "data": data})
    ks._found({"metadata": {"name": KS_NAME}, "data": data})
    assert ks.state is paused and seen == [paused]
    odd = [r.getMessage() for r in caplog.records if "neither" in r.getMessage()]
    assert len(odd) == (1 if paused and data != {"paused": "true"} else 0)
    assert all(len(m) < 300 and "\n" not in m for m in odd)


def test_deleted_kill_switch_keeps_its_last_state(fake: FakeApiServer, tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25 item 3: deleting the ConfigMap never lifts a pause; the agent says so (KillSwitchDeleted, the
    missing gauge) and keeps it across a re-list; the ConfigMap back with "false" lets changes go again."""
    monkeypatch.setattr(actuator, "WATCH_MIN", 1)
    monkeypatch.setattr(actuator, "WATCH_MAX", 1)
    fake.set_configmap(KS_NS, KS_NAME, {"paused": "true"})
    act = start_actuator(fake, str(tmp_path), settings(kill_switch=KS_NAME))
    try:
        wait_for(lambda: act.reconciler.paused is True)
        fake.cluster.delete(("", "configmaps", KS_NS, KS_NAME))
        wait_for(lambda: sample_value(act, "node_health_kube_kill_switch_missing") == 1)
        wait_for(lambda: any(f.reason == "KillSwitchDeleted" for f in act.source._findings))
        assert act.reconciler.paused is True
        assert sample_value(act, "node_health_kube_kill_switch", state="paused") == 1
        lists = len([r for r in fake.log(verbs=("list",)) if "configmaps" in r.path])
        fake.stop()
        fake.cluster.compact()
        fake.start()  # a re-list that finds no ConfigMap: still paused
        wait_for(lambda: len([r for r in fake.log(verbs=("list",)) if "configmaps" in r.path]) > lists, timeout=15)
        assert act.reconciler.paused is True
        fake.set_configmap(KS_NS, KS_NAME, {"paused": "false"})
        wait_for(lambda: act.reconciler.paused is False, timeout=15)
        wait_for(lambda: sample_value(act, "node_health_kube_kill_switch_missing") == 0)
    finally:
        act.stop()


def test_kill_switch_never_created_is_active_and_says_so(fake: FakeApiServer, tmp_path: Any) -> None:
    act = start_actuator(fake, str(tmp_path), settings(kill_switch=KS_NAME))
    try:
        wait_for(lambda: sample_value(act, "node_health_kube_kill_switch_missing") == 1)
        assert act.reconciler.paused is False
        assert not any(f.reason == "KillSwitchDeleted" for f in act.source._findings)
    finally:
        act.stop()


def test_a_pause_survives_a_restart_that_finds_the_configmap_deleted(fake: FakeApiServer, tmp_path: Any) -> None:
    """Issue 25 item 3, across a restart: the last state read is kept in kill-switch.json, so an agent started
    after the ConfigMap was deleted stays paused (and says the ConfigMap is gone) instead of failing open."""
    fake.set_configmap(KS_NS, KS_NAME, {"paused": "true"})
    act = start_actuator(fake, str(tmp_path), settings(kill_switch=KS_NAME))
    try:
        wait_for(lambda: act.reconciler.paused is True)
        wait_for(lambda: (tmp_path / f"state-{NODE}" / "kill-switch.json").exists())
    finally:
        act.stop()
    fake.cluster.delete(("", "configmaps", KS_NS, KS_NAME))
    act = start_actuator(fake, str(tmp_path), settings(kill_switch=KS_NAME))
    try:
        wait_for(lambda: sample_value(act, "node_health_kube_kill_switch_missing") == 1)
        assert act.reconciler.paused is True
        wait_for(lambda: any(f.reason == "KillSwitchDeleted" for f in act.source._findings))
        fake.set_configmap(KS_NS, KS_NAME, {"paused": "false"})
        wait_for(lambda: act.reconciler.paused is False, timeout=15)
    finally:
        act.stop()
    act = start_actuator(fake, str(tmp_path), settings(kill_switch=KS_NAME))  # "false" kept too
    try:
        fake.cluster.delete(("", "configmaps", KS_NS, KS_NAME))
        wait_for(lambda: sample_value(act, "node_health_kube_kill_switch_missing") == 1)
        assert act.reconciler.paused is False
    finally:
        act.stop()
