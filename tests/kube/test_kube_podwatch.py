"""The node's pods from one list+watch (agent/kube/podwatch.py), against the fake API server through the real
kubernetes client: what is seen, resumed, relisted, and when the set is unknown."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agent.kube.podwatch import PodWatch, list_once, reconnect_delay, watch_timeout
from agent.kube.settings import PodWatchSection
from agent.pods import PodAddr
from fakeapi import FakeApiServer
from kube_support import NODE, fake, make_api, settings, wait_for  # noqa: F401 (fake: the fixture)

OTHER = "gpu-node-2"


@pytest.fixture
def started() -> Iterator[list[PodWatch]]:
    watches: list[PodWatch] = []
    yield watches
    for pw in watches:
        pw.stop()


def watch(fake: FakeApiServer, tmp: str, started: list[PodWatch], *, stale_after: float = 30.0,
          timeout: float = 60.0, **kw: Any) -> PodWatch:
    cfg = settings(backoff_max=1.0)
    pw = PodWatch(make_api(fake, tmp, cfg), NODE, PodWatchSection(stale_after=stale_after, watch_timeout=timeout),
                  rng=random.Random(3), reconnect=(0.05, 0.2), **kw)
    started.append(pw)
    pw.start()
    wait_for(lambda: pw.pods() is not None and pw.up, what="the first list and an open watch")
    return pw


def names(pw: PodWatch) -> list[str]:
    return [f"{p.namespace}/{p.name}" for p in pw.pods() or ()]


def ips(ns: str, name: str, *addrs: str) -> Any:
    def fn(pod: dict[str, Any]) -> None:
        pod["status"]["podIPs"] = [{"ip": a} for a in addrs]
        pod["status"]["podIP"] = addrs[0]
    return fn


def watches(fake: FakeApiServer) -> list[Any]:
    return [r for r in fake.log(verbs=("watch",)) if r.path == "/api/v1/pods"]


def test_initial_list_sees_this_nodes_running_pods_only(fake: FakeApiServer, tmp_path: Any, started: list[PodWatch]) -> None:
    fake.add_pod("team-a", "train-0", NODE)
    fake.add_pod("team-a", "done", NODE, phase="Succeeded")
    fake.add_pod("team-a", "failed", NODE, phase="Failed")
    fake.add_pod("team-b", "elsewhere", OTHER)
    fake.edit_pod("team-a", "train-0", ips("team-a", "train-0", "10.1.0.5", "fd00::5"))
    fake.add_pod("kube-system", "net", NODE)
    fake.edit_pod("kube-system", "net", lambda p: (p["spec"].__setitem__("hostNetwork", True),
                                                    p["status"].__setitem__("podIP", "192.168.0.9")))
    fake.edit_pod("team-a", "train-0", lambda p: p["metadata"].__setitem__("annotations", {
        "node-health-agent/internet-egress-bandwidth": "200M",
        "kubectl.kubernetes.io/last-applied-configuration": "{}", "huge": "x" * 5000}))
    pw = watch(fake, str(tmp_path), started, annotations={"node-health-agent/internet-egress-bandwidth", "huge"})
    pods = {p.name: p for p in pw.pods() or ()}
    assert sorted(pods) == ["net", "train-0"]
    train, net = pods["train-0"], pods["net"]
    assert train.ips == ("10.1.0.5", "fd00::5") and not train.host_network
    assert dict(train.annotations) == {"node-health-agent/internet-egress-bandwidth": "200M"}
    assert train.uid == fake.cluster.get(("", "pods", "team-a", "train-0"))["metadata"]["uid"]  # type: ignore[index]
    assert net.ips == ("192.168.0.9",) and net.host_network  # status.podIP when podIPs is absent
    lists = [r for r in fake.log(verbs=("list",)) if r.path == "/api/v1/pods"]
    assert [(r.query["fieldSelector"], r.query.get("resourceVersion")) for r in lists] == [(f"spec.nodeName={NODE}", "0")]
    w = watches(fake)[0].query
    # From the list's resourceVersion (nothing was written since).
    assert (w["fieldSelector"], w["allowWatchBookmarks"], w["resourceVersion"]) == (
        f"spec.nodeName={NODE}", "true", str(fake.cluster.rv))


def test_add_modify_delete_and_ips_assigned_later(fake: FakeApiServer, tmp_path: Any, started: list[PodWatch]) -> None:
    fake.add_pod("team-a", "old", NODE)
    pw = watch(fake, str(tmp_path), started)
    g0 = pw.generation()
    fake.add_pod("team-a", "new", NODE)  # scheduled: no IP yet
    wait_for(lambda: "team-a/new" in names(pw))
    assert [p.ips for p in pw.pods() or () if p.name == "new"] == [()]
    g1 = pw.generation()
    assert g1 != g0
    fake.edit_pod("team-a", "new", ips("team-a", "new", "10.1.0.7"))  # the CNI gave it an address
    wait_for(lambda: [p.ips for p in pw.pods() or () if p.name == "new"] == [("10.1.0.7",)])
    g2 = pw.generation()
    assert g2 != g1
    # Status churn a feature does not see (a readiness flip) leaves the generation alone.
    fake.edit_pod("team-a", "new", lambda p: p["status"].__setitem__("conditions", [{"type": "Ready", "status": "False"}]))
    fake.add_pod("team-a", "marker", NODE)  # ordered after the churn in the same stream
    wait_for(lambda: "team-a/marker" in names(pw))
    g3 = pw.generation()
    assert g3 == g2 + 1  # the marker only
    fake.cluster.delete(("", "pods", "team-a", "old"))
    fake.edit_pod("team-a", "marker", lambda p: p["status"].__setitem__("phase", "Failed"))
    wait_for(lambda: names(pw) == ["team-a/new"])
    assert pw.generation() == g3 + 2


def test_bookmarks_move_the_resume_point_without_relisting(fake: FakeApiServer, tmp_path: Any, started: list[PodWatch]) -> None:
    fake.add_pod("team-a", "a", NODE)
    pw = watch(fake, str(tmp_path), started, timeout=1.0)  # the server ends each watch after 1-2 s
    listed_rv = int(watches(fake)[0].query["resourceVersion"])
    g = pw.generation()
    for i in range(5):  # writes this watch never sees (another node's pods) move the global resourceVersion on
        fake.add_pod("team-b", f"b-{i}", OTHER)
    wait_for(lambda: len(watches(fake)) >= 3, timeout=30, what="the watch resumed twice")
    resumed = [int(r.query["resourceVersion"]) for r in watches(fake)[1:]]
    assert max(resumed) > listed_rv + 4  # bookmarks carried the resourceVersion past the unseen writes
    assert all(r.query["timeoutSeconds"] in ("1", "2") for r in watches(fake))
    assert pw.relists == {"initial": 1}
    assert names(pw) == ["team-a/a"] and pw.generation() == g


def test_expired_in_stream_relists_without_losing_or_duplicating(fake: FakeApiServer, tmp_path: Any,
                                                                  started: list[PodWatch]) -> None:
    for i in range(3):
        fake.add_pod("team-a", f"p-{i}", NODE)
    pw = watch(fake, str(tmp_path), started)
    fake.stop()  # the watch breaks; meanwhile the pods change and the history is compacted
    fake.cluster.delete(("", "pods", "team-a", "p-0"))
    fake.add_pod("team-a", "p-3", NODE)
    fake.edit_pod("team-a", "p-1", ips("team-a", "p-1", "10.1.0.11"))
    fake.cluster.compact()
    fake.start()
    wait_for(lambda: pw.relists["expired"] == 1 and pw.up, what="a relist after 410")
    assert names(pw) == ["team-a/p-1", "team-a/p-2", "team-a/p-3"]
    assert [p.ips for p in pw.pods() or () if p.name == "p-1"] == [("10.1.0.11",)]
    assert len({p.uid for p in pw.pods() or ()}) == 3
    relist = [r for r in fake.log(verbs=("list",)) if r.path == "/api/v1/pods"][-1]
    assert "resourceVersion" not in relist.query  # a consistent read after 410, not the cache that expired
    fake.add_pod("team-a", "p-4", NODE)  # and it watches on from the new list
    wait_for(lambda: "team-a/p-4" in names(pw))


def test_http_410_on_the_watch_request_relists(fake: FakeApiServer, tmp_path: Any, started: list[PodWatch]) -> None:
    fake.add_pod("team-a", "a", NODE)
    pw = watch(fake, str(tmp_path), started, timeout=1.0)
    fake.inject(410, method="GET", path=r"^/api/v1/pods$")  # the next request: the watch's reconnect
    wait_for(lambda: pw.relists["expired"] == 1 and pw.up, timeout=30)
    assert names(pw) == ["team-a/a"]


def test_server_down_unknown_after_the_staleness_limit_then_back(fake: FakeApiServer, tmp_path: Any,
                                                                 started: list[PodWatch]) -> None:
    fake.add_pod("team-a", "a", NODE)
    pw = watch(fake, str(tmp_path), started, stale_after=0.5)
    assert pw.findings() == ()
    g = pw.generation()
    fake.stop()
    wait_for(lambda: not pw.up)
    wait_for(lambda: pw.pods() is None, what="pods unknown after stale_after")
    assert [f.reason for f in pw.findings()] == ["PodsUnknown"] and pw.findings()[0].unknown
    assert pw.generation() != g  # a consumer caching by generation learns of it
    assert "node_health_kube_pod_watch_pods" not in {s.name for s in pw.samples()}
    fake.add_pod("team-a", "b", NODE)
    fake.start()
    wait_for(lambda: names(pw) == ["team-a/a", "team-a/b"], timeout=30, what="the set back after the server")
    assert pw.findings() == () and pw.relists == {"initial": 1}  # resumed, not relisted


def test_pods_on_other_nodes_are_never_seen(fake: FakeApiServer, tmp_path: Any, started: list[PodWatch]) -> None:
    fake.add_pod("team-b", "there", OTHER)
    pw = watch(fake, str(tmp_path), started)
    fake.add_pod("team-b", "there-too", OTHER)
    fake.edit_pod("team-b", "there", ips("team-b", "there", "10.2.0.1"))
    fake.cluster.delete(("", "pods", "team-b", "there"))
    fake.add_pod("team-a", "here", NODE)
    wait_for(lambda: names(pw) == ["team-a/here"])
    assert pw.generation() == 2  # listed (fresh), then the one pod of this node


def test_stop_joins_and_closes_the_watch(fake: FakeApiServer, tmp_path: Any, started: list[PodWatch]) -> None:
    pw = watch(fake, str(tmp_path), started)
    thread = pw._thread
    pw.stop()
    assert thread is not None and not thread.is_alive()
    wait_for(lambda: not fake.cluster.watchers, what="the server's watch gone")


def test_list_once(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.add_pod("team-a", "a", NODE)
    fake.add_pod("team-a", "b", OTHER)
    view = list_once(make_api(fake, str(tmp_path), settings()), NODE)
    assert [p.name for p in view.pods() or ()] == ["a"]
    fake.stop()
    assert list_once(make_api(fake, str(tmp_path), settings()), NODE).pods() is None


def test_reconnect_and_timeout_jitter_are_bounded_and_spread() -> None:
    rng = random.Random(1)
    for failures in range(1, 12):
        delays = [reconnect_delay(failures, rng) for _ in range(200)]
        top = min(60.0, 2 ** (failures - 1))
        assert all(top / 2 <= d <= top for d in delays)
        assert max(delays) - min(delays) > top / 4  # a fleet does not come back in step
    cfg = PodWatchSection(watch_timeout=300)
    timeouts = [watch_timeout(cfg, rng) for _ in range(500)]
    assert min(timeouts) >= 300 and max(timeouts) <= 600 and len(set(timeouts)) > 100


def test_podaddr_of_a_pod_object() -> None:
    from agent.kube.podwatch import addr_of, drain_record

    obj = {"metadata": {"namespace": "n", "name": "p", "uid": "u", "annotations": {"kubernetes.io/config.mirror": "x"},
                        "ownerReferences": [{"kind": "DaemonSet", "name": "ds", "controller": True, "uid": "o"}],
                        "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 30},
           "spec": {"terminationGracePeriodSeconds": 60, "containers": [{"name": "c" * 100}]},
           "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}],
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    addr = addr_of(obj, {"kubernetes.io/config.mirror"})
    assert addr == PodAddr("n", "p", "u", ("10.0.0.1", "fd00::1"), False, {"kubernetes.io/config.mirror": "x"})
    assert addr_of(obj).annotations == {}
    rec = drain_record(obj, addr)
    from agent.kube.drain import Pod, skip_reason

    assert Pod.of(rec) == Pod.of(obj) and skip_reason(rec, frozenset()) == skip_reason(obj, frozenset()) == "mirror"
    assert "containers" not in rec["spec"] and "conditions" not in rec["status"]


def pod_with_annotations(i: int, n: int) -> dict[str, Any]:
    notes = {f"tenant.example.com/note-{k}": f"{i}-{k}-" + "v" * 1000 for k in range(n)}
    notes["node-health-agent/internet-egress-bandwidth"] = "200M"
    return {"metadata": {"namespace": "team", "name": f"p-{i}", "uid": f"uid-{i}", "annotations": notes},
            "spec": {}, "status": {"phase": "Running", "podIPs": [{"ip": f"10.1.{i // 250}.{i % 250}"}]}}


def held(objs: list[dict[str, Any]], keep: Any) -> int:
    """Bytes the PodAddrs made of `objs` still hold (tracemalloc) once each pod object, decoded from JSON as
    the client does, is dropped."""
    import gc
    import json
    import tracemalloc

    from agent.kube.podwatch import addr_of

    raw = [json.dumps(o) for o in objs]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = []
        for text in raw:
            obj = json.loads(text)
            kept.append(addr_of(obj, keep(obj)))
            del obj
        gc.collect()
        size = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(kept) == len(objs)
    return size


def test_only_the_annotations_read_are_kept() -> None:
    """Issue 25 item 10: 110 pods x 250 annotations of ~1 KB. Keeping every short annotation (what the watch
    did) holds megabytes; keeping the keys the checks read holds what pods without annotations hold."""
    from agent.kube.podwatch import addr_of

    many = [pod_with_annotations(i, 250) for i in range(110)]
    none = [pod_with_annotations(i, 0) for i in range(110)]
    ann = "node-health-agent/internet-egress-bandwidth"
    every = held(many, lambda o: o["metadata"]["annotations"].keys())  # the old behaviour, for comparison
    read = held(many, lambda o: {ann})
    bare = held(none, lambda o: {ann})
    print(f"110 pods x 250 annotations: {every / 1e6:.1f} MB kept all, {read / 1e3:.0f} kB kept the key read, "
          f"{bare / 1e3:.0f} kB without annotations")
    assert every > 20_000_000
    assert read < bare * 1.5 + 4096
    assert dict(addr_of(many[0], {ann}).annotations) == {ann: "200M"}


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=10), kids, max_size=3),
                    max_leaves=20)
FIELDS = st.sampled_from(["metadata", "spec", "status", "annotations", "podIPs", "podIP", "ip", "uid", "name",
                          "namespace", "hostNetwork", "ownerReferences", "kind", "controller", "phase",
                          "node-health-agent/internet-egress-bandwidth", "kubernetes.io/config.mirror"])
POD_LIKE = st.recursive(JSON, lambda kids: st.dictionaries(FIELDS, kids, max_size=5), max_leaves=40)


@given(st.dictionaries(FIELDS, POD_LIKE, max_size=4))
@hsettings(max_examples=120, deadline=None)
def test_any_pod_object_gives_a_podaddr(obj: dict[str, Any]) -> None:
    """Issue 25 item 4: whatever a (hostile) API server sends as a pod, what features and the drain keep of it is
    made without an exception, with at most MAX_IPS addresses and only the annotation keys asked for."""
    from agent.kube.podwatch import MAX_IPS, addr_of, drain_record

    ann = "node-health-agent/internet-egress-bandwidth"
    addr = addr_of(obj, {ann})
    assert len(addr.ips) <= MAX_IPS and set(addr.annotations) <= {ann}
    assert all(isinstance(v, str) for v in addr.annotations.values())
    drain_record(obj, addr)
