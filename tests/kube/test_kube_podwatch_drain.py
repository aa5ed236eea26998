"""The drain reads the node's pods from the pod watch while it is open (no LIST of its own), and lists again
when the watch is down; the fake server's timeline is the witness that budgets still hold."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from typing import Any

import pytest

from agent.kube.api import Wait
from agent.kube.drain import Drainer, DrainProgress
from agent.kube.podwatch import PodWatch
from agent.kube.settings import DrainSection, PodWatchSection
from fakeapi import FakeApiServer
from kube_support import NODE, Clock, make_api, settings, wait_for

APP = "team-a"
AGENT_NS = "node-health"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeApiServer]:
    f = FakeApiServer(clock=clock, wall=lambda: 1.8e9 + clock.t, bookmark_interval=0.2)
    f.start()
    f.add_node(NODE)
    yield f
    f.stop()


@pytest.fixture
def pod_watch(fake: FakeApiServer, tmp_path: Any) -> Iterator[PodWatch]:
    pw = PodWatch(make_api(fake, str(tmp_path), settings()), NODE, PodWatchSection(), rng=random.Random(1))
    pw.start()
    wait_for(lambda: pw.drain_pods() is not None, what="the pod watch open")
    yield pw
    pw.stop()


def drainer(fake: FakeApiServer, tmp_path: Any, clock: Clock, watched: Any) -> Drainer:
    api = make_api(fake, str(tmp_path), settings(), clock)
    return Drainer(api, NODE, dataclasses.replace(DrainSection()), own_namespace=AGENT_NS, rng=random.Random(3),
                   watched=watched)


def truth(fake: FakeApiServer) -> set[tuple[str, bool]]:
    return {(p["metadata"]["uid"], bool(p["metadata"].get("deletionTimestamp"))) for p in fake.pods(NODE)
            if p["status"].get("phase") not in ("Succeeded", "Failed")}


def seen(pw: PodWatch) -> set[tuple[str, bool]]:
    return {(p["metadata"]["uid"], bool(p["metadata"].get("deletionTimestamp"))) for p in pw.drain_pods() or ()}


def run(d: Drainer, fake: FakeApiServer, clock: Clock, pw: PodWatch | None, until: float) -> list[DrainProgress]:
    """A step a second; the kubelets act at each tick, and the watch has caught up before the next step."""
    out: list[DrainProgress] = []
    end = clock.t + until
    while clock.t < end:
        try:
            out.append(d.step(clock.t))
        except Wait:
            pass
        if out and out[-1].done:
            break
        clock.t += 1.0
        fake.tick()
        if pw is not None and pw.up:
            wait_for(lambda: seen(pw) == truth(fake), what="the watch caught up")
    return out


def pod_lists(fake: FakeApiServer) -> list[Any]:
    return [r for r in fake.log(verbs=("list",)) if r.path == "/api/v1/pods"]


def test_a_drain_reads_the_open_watch_and_lists_nothing(fake: FakeApiServer, tmp_path: Any, clock: Clock,
                                                        pod_watch: PodWatch) -> None:
    fake.add_pod("kube-system", f"etcd-{NODE}", NODE, mirror=True)
    fake.add_pod("monitoring", "exporter-x", NODE, owner=("DaemonSet", "exporter"))
    fake.add_replicaset(APP, "web", 3, NODE, labels={"app": "web"}, ready_after=10)
    fake.add_pdb(APP, "web", {"app": "web"}, max_unavailable=1)
    fake.add_pod("scratch", "job", NODE, owner=("ReplicaSet", "job"), stop_after=3)
    wait_for(lambda: seen(pod_watch) == truth(fake))
    d = drainer(fake, tmp_path, clock, pod_watch.drain_pods)
    assert d.plan() == ["scratch/job", f"{APP}/web-0", f"{APP}/web-1", f"{APP}/web-2"]
    steps = run(d, fake, clock, pod_watch, until=600)
    assert steps[-1].done and steps[-1].evicted == 4
    assert sorted(p["metadata"]["name"] for p in fake.pods(NODE)) == [f"etcd-{NODE}", "exporter-x"]
    assert [r.query.get("resourceVersion") for r in pod_lists(fake)] == ["0"], "the watch's own list, none by the drain"
    # Budgets hold as with the LIST: the app never lost two pods at once.
    gone = [name for _, what, ns, name in fake.workloads.timeline if ns == APP and what.startswith("evicted")]
    assert gone == ["web-0", "web-1", "web-2"]
    refused = [r for r in fake.log(verbs=("create",)) if r.path.endswith("/eviction") and r.status == 429]
    assert refused, "web-1 and web-2 waited for the budget"


def test_the_drain_lists_again_while_the_watch_is_down(fake: FakeApiServer, tmp_path: Any, clock: Clock,
                                                       pod_watch: PodWatch) -> None:
    fake.add_pod("scratch", "a", NODE, owner=("ReplicaSet", "a"), stop_after=2)
    fake.add_pod("scratch", "b", NODE, owner=("ReplicaSet", "b"), stop_after=2)
    wait_for(lambda: seen(pod_watch) == truth(fake))
    d = drainer(fake, tmp_path, clock, pod_watch.drain_pods)
    d.step(clock.t)
    assert len(pod_lists(fake)) == 1
    pod_watch.stop()  # down: drain_pods() is None, the drain falls back to its LIST
    assert pod_watch.drain_pods() is None
    steps = run(d, fake, clock, None, until=120)
    assert steps[-1].done and steps[-1].evicted == 2
    assert len(pod_lists(fake)) >= 2 and all("resourceVersion" not in r.query for r in pod_lists(fake)[1:])


def test_a_pod_it_evicted_is_not_evicted_again_before_the_watch_shows_its_deletion(
    fake: FakeApiServer, tmp_path: Any, clock: Clock, pod_watch: PodWatch
) -> None:
    fake.add_pod("scratch", "slow", NODE, owner=("ReplicaSet", "slow"), stop_after=60)
    wait_for(lambda: seen(pod_watch) == truth(fake))
    before = pod_watch.drain_pods()  # what a watch that has not yet delivered the deletion still says
    d = drainer(fake, tmp_path, clock, lambda: before)
    for _ in range(10):
        p = d.step(clock.t)
        clock.t += 1.0
    evictions = [r for r in fake.log(verbs=("create",)) if r.path.endswith("/eviction")]
    assert len(evictions) == 1 and p.evicted == 1 and not p.done and p.remaining == ()
