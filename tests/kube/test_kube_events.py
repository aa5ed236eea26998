"""Events: client-go's dedupe (series), rate limit, MicroTime and namespace, against the fake server."""

from __future__ import annotations

from typing import Any

from agent.kube.events import EventRecorder
from agent.kube.policy import EventSpec
from fakeapi import FakeApiServer
from kube_support import NODE, fake, make_api, settings  # noqa: F401 - fixture

SPEC = EventSpec("Warning", "FakeDiskFull", "Detected", "disk /data: full")


def recorder(fake: FakeApiServer, tmp: str, burst: int = 25) -> EventRecorder:
    return EventRecorder(make_api(fake, tmp, settings()), NODE, burst=burst, refill=300, now=0)


def test_a_repeat_patches_the_series_instead_of_creating(fake: FakeApiServer, tmp_path: Any) -> None:
    rec = recorder(fake, str(tmp_path))
    assert rec.send(SPEC, "uid", 0, 1_800_000_000.0, "n.1") == "created"  # a whole second: the fraction must survive
    assert rec.send(SPEC, "uid", 60, 1_800_000_060.5, "n.2") == "series"
    assert rec.send(SPEC, "uid", 120, 1_800_000_120.5, "n.3") == "series"
    (ev,) = fake.objects("events.k8s.io", "events", "default")
    assert ev["series"]["count"] == 3 and ev["eventTime"].startswith("2027-01-15T08:00:00.000001")
    assert ev["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid"}
    assert rec.send(SPEC, "uid", 120 + 361, 1_800_000_500.0, "n.4") == "created", "a series ends after 6 quiet minutes"


def test_an_expired_series_is_created_again(fake: FakeApiServer, tmp_path: Any) -> None:
    rec = recorder(fake, str(tmp_path))
    rec.send(SPEC, "uid", 0, 1_800_000_000.2, "n.1")
    for ev in fake.objects("events.k8s.io", "events", "default"):  # the event TTL (1 h by default) passed
        fake.cluster.delete(("events.k8s.io", "events", "default", ev["metadata"]["name"]))
    assert rec.send(SPEC, "uid", 10, 1_800_000_010.2, "n.2") == "created"
    assert [r.status for r in fake.log(verbs=("patch",))] == [404]


def test_a_storm_is_cut_by_the_token_bucket(fake: FakeApiServer, tmp_path: Any) -> None:
    rec = recorder(fake, str(tmp_path), burst=3)
    results = [rec.send(EventSpec("Warning", f"R{i}", "Detected", "n"), "uid", 0, 1_800_000_000.3 + i, f"n.{i}")
               for i in range(5)]
    assert results == ["created"] * 3 + ["dropped"] * 2
    assert rec.send(EventSpec("Warning", "Later", "Detected", "n"), "uid", 301, 1_800_000_301.3, "n.9") == "created"


def test_an_event_sent_again_after_a_crash_is_not_duplicated(fake: FakeApiServer, tmp_path: Any) -> None:
    recorder(fake, str(tmp_path)).send(SPEC, "uid", 0, 1_800_000_000.3, "n.1")
    again = recorder(fake, str(tmp_path))  # restarted: the outbox still held it, with its name
    assert again.send(SPEC, "uid", 0, 1_800_000_000.3, "n.1") == "created"
    assert len(fake.objects("events.k8s.io", "events", "default")) == 1
    assert [r.status for r in fake.log(verbs=("create",))] == [201, 409]
