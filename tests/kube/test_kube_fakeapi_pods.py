"""The fake API server's pods, PodDisruptionBudgets and eviction subresource,
through the real client, answering as kube-apiserver's eviction.go does."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from fakeapi import EVICT_MSG, MULTI_PDB_MSG, FakeApiServer
from kube_support import NODE, Clock

NS = "team-a"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Any:
    wall = [1.8e9]
    f = FakeApiServer(clock=clock, wall=lambda: wall[0] + clock.t)
    f.start()
    f.add_node(NODE)
    yield f
    f.stop()


def core(fake: FakeApiServer, tmp_path: Any) -> client.CoreV1Api:
    cfg = client.Configuration()
    config.load_kube_config(config_file=fake.kubeconfig(os.path.join(tmp_path, "kc")), client_configuration=cfg)
    cfg.retries = False
    return client.CoreV1Api(client.ApiClient(cfg))


def evict(api: client.CoreV1Api, name: str, ns: str = NS, **options: Any) -> Any:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
    if options:
        body["deleteOptions"] = options
    return json.loads(api.create_namespaced_pod_eviction(name, ns, body, _preload_content=False).data)


def refused(api: client.CoreV1Api, name: str, ns: str = NS) -> ApiException:
    with pytest.raises(ApiException) as info:
        evict(api, name, ns)
    return info.value


def names(fake: FakeApiServer, node: str = NODE) -> list[str]:
    return sorted(p["metadata"]["name"] for p in fake.pods(node))


def test_list_by_node_field_selector(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    fake.add_pod(NS, "a", NODE)
    fake.add_pod("team-b", "b", NODE, phase="Succeeded")
    fake.add_pod(NS, "elsewhere", "other-node")
    got = json.loads(api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}", _preload_content=False).data)
    assert got["kind"] == "PodList" and sorted(p["metadata"]["name"] for p in got["items"]) == ["a", "b"]
    running = json.loads(api.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={NODE},status.phase!=Succeeded", _preload_content=False).data)
    assert [p["metadata"]["name"] for p in running["items"]] == ["a"]
    with pytest.raises(ApiException) as info:
        api.list_pod_for_all_namespaces(field_selector="spec.nodeNam=x", _preload_content=False)
    assert info.value.status == 400 and "field label not supported" in json.loads(info.value.body)["message"]


def test_eviction_without_a_budget_is_201_and_the_pod_terminates_with_its_grace(
        fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    api = core(fake, tmp_path)
    fake.add_pod(NS, "a", NODE, grace=60, stop_after=20)
    out = evict(api, "a")
    assert out == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    pod = fake.pods(NODE)[0]
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 60 and pod["metadata"]["deletionTimestamp"]
    assert {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting"} in pod["status"]["conditions"]
    clock.t += 19
    fake.tick()
    assert names(fake) == ["a"], "still stopping"
    clock.t += 1
    fake.tick()
    assert names(fake) == []
    with pytest.raises(ApiException) as info:
        evict(api, "a")
    assert info.value.status == 404 and json.loads(info.value.body)["message"] == 'pods "a" not found'


def test_a_pdb_at_zero_answers_429_with_the_disruption_budget_cause(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    fake.add_replicaset(NS, "web", 2, NODE, labels={"app": "web"}, ready_after=30)
    pdb = fake.add_pdb(NS, "web", {"app": "web"}, max_unavailable=1)
    assert {k: pdb["status"][k] for k in ("disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods")} == {
        "disruptionsAllowed": 1, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2}
    evict(api, "web-0")
    status = fake.pdb(NS, "web")["status"]
    assert status["disruptionsAllowed"] == 0 and status["currentHealthy"] == 1, "the replacement is not Ready yet"
    err = refused(api, "web-1")
    assert err.status == 429 and "Retry-After" not in err.headers
    body = json.loads(err.body)
    assert body["reason"] == "TooManyRequests" and body["message"] == EVICT_MSG
    assert body["details"]["causes"] == [
        {"reason": "DisruptionBudget", "message": "The disruption budget web needs 1 healthy pods and has 1 currently"}]


def test_the_budget_comes_back_when_the_replacement_is_ready(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    api = core(fake, tmp_path)
    fake.add_replicaset(NS, "web", 2, NODE, labels={"app": "web"}, ready_after=30)
    fake.add_pdb(NS, "web", {"app": "web"}, min_available=1)
    evict(api, "web-0")
    assert refused(api, "web-1").status == 429
    clock.t += 30
    evict(api, "web-1")
    assert names(fake, "spare-node") == ["web-r1", "web-r2"]


def test_a_pod_under_two_budgets_is_a_500_and_stays(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    fake.add_pod(NS, "a", NODE, labels={"app": "a", "tier": "x"})
    fake.add_pdb(NS, "by-app", {"app": "a"}, min_available=0)
    fake.add_pdb(NS, "by-tier", {"tier": "x"}, min_available=0)
    err = refused(api, "a")
    assert err.status == 500
    assert json.loads(err.body) == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                    "message": MULTI_PDB_MSG, "code": 500}
    assert names(fake) == ["a"]


def test_a_stale_budget_is_still_being_processed(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    fake.add_pod(NS, "a", NODE, labels={"app": "a"})
    fake.workloads.pdb_controller = False
    fake.add_pdb(NS, "a", {"app": "a"}, min_available=0)
    err = refused(api, "a")
    assert err.status == 429 and err.headers["Retry-After"] == "10"
    details = json.loads(err.body)["details"]
    assert details["retryAfterSeconds"] == 10
    assert details["causes"][0]["message"] == "The disruption budget a is still being processed by the server."


def test_terminal_pending_and_unready_pods_skip_the_budget(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    for name, phase in (("done", "Succeeded"), ("waiting", "Pending")):
        fake.add_pod(NS, name, NODE, labels={"app": "a"}, phase=phase)
    fake.add_pod(NS, "ready", NODE, labels={"app": "a"})
    fake.add_pod(NS, "ready2", NODE, labels={"app": "a"})
    fake.add_pod(NS, "unready", NODE, labels={"app": "a"}, ready=False)
    fake.add_pdb(NS, "a", {"app": "a"}, min_available=2)
    for name in ("done", "waiting", "unready"):  # unready: the budget (2 healthy of 2) is met, nothing spent
        assert evict(api, name)["status"] == "Success"
    assert fake.pdb(NS, "a")["status"]["disruptionsAllowed"] == 0
    assert refused(api, "ready").status == 429


def test_a_stuck_pod_stays_listed_past_its_grace_period(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    api = core(fake, tmp_path)
    fake.add_pod(NS, "stuck", NODE, grace=30, stuck=True)
    evict(api, "stuck")
    clock.t += 3600
    pods = json.loads(api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}", _preload_content=False).data)
    (pod,) = pods["items"]
    assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"] == 30
    assert evict(api, "stuck")["status"] == "Success", "an already terminating pod is deleted again, no budget"


def test_delete_with_grace_and_uid_precondition(fake: FakeApiServer, tmp_path: Any, clock: Clock) -> None:
    api = core(fake, tmp_path)
    pod = fake.add_pod(NS, "a", NODE, grace=45, stop_after=100)
    with pytest.raises(ApiException) as info:
        api.delete_namespaced_pod("a", NS, body={"preconditions": {"uid": "someone-else"}}, _preload_content=False)
    assert info.value.status == 409 and "Precondition failed: UID in precondition" in json.loads(info.value.body)["message"]
    out = json.loads(api.delete_namespaced_pod("a", NS, body={"preconditions": {"uid": pod["metadata"]["uid"]}},
                                               _preload_content=False).data)
    assert out["metadata"]["deletionGracePeriodSeconds"] == 45, "the pod's own terminationGracePeriodSeconds"
    clock.t += 45
    fake.tick()
    assert names(fake) == [], "the kubelet kills it at the end of its grace period"


def test_eviction_body_must_name_the_pod(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    fake.add_pod(NS, "a", NODE)
    with pytest.raises(ApiException) as info:
        api.create_namespaced_pod_eviction("a", NS, {"apiVersion": "policy/v1", "kind": "Eviction",
                                                     "metadata": {"name": "b"}}, _preload_content=False)
    assert info.value.status == 400
    assert json.loads(info.value.body)["message"] == "name in URL does not match name in Eviction object"
