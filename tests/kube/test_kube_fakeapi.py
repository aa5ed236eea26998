"""The fake API server answers as kube-apiserver does, through the real client.

Each test is a row of shared/reference/kubernetes.md §10; the last ones pin
down what the installed kubernetes client (37.x) and urllib3 do with a 429,
which is why the agent switches urllib3's retries off (§4.3).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from fakeapi import FakeApiServer
from kube_support import NODE, fake  # noqa: F401 - fixture

SMP = "application/strategic-merge-patch+json"


def core(fake: FakeApiServer, tmp_path: Any, *, retries: Any = False, token: str | None = None) -> client.CoreV1Api:
    cfg = client.Configuration()
    config.load_kube_config(config_file=fake.kubeconfig(os.path.join(tmp_path, "kc"), token=token), client_configuration=cfg)
    cfg.retries = retries
    return client.CoreV1Api(client.ApiClient(cfg))


def body(resp: Any) -> Any:
    return json.loads(resp.data)


def error(fn: Any, *args: Any, **kw: Any) -> ApiException:
    with pytest.raises(ApiException) as info:
        fn(*args, _preload_content=False, **kw)
    return info.value


def rv(fake: FakeApiServer) -> str:
    return str(fake.node(NODE)["metadata"]["resourceVersion"])


def test_get_and_list(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    assert body(api.read_node(NODE, _preload_content=False))["metadata"]["name"] == NODE
    assert error(api.read_node, "nope").status == 404
    lst = body(api.list_node(field_selector=f"metadata.name={NODE}", resource_version="0", _preload_content=False))
    assert lst["kind"] == "NodeList" and [n["metadata"]["name"] for n in lst["items"]] == [NODE]
    assert int(lst["metadata"]["resourceVersion"]) >= int(rv(fake))


def test_smp_replaces_taints_wholesale_and_checks_the_resource_version(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    fake.edit_node(NODE, lambda n: n["spec"].update(taints=[{"key": "other.team/x", "effect": "NoSchedule"}]))
    stale = rv(fake)
    mine = {"key": "mine/x", "effect": "NoSchedule"}
    api.patch_node(NODE, {"spec": {"taints": [mine]}}, _content_type=SMP, _preload_content=False)
    assert fake.node(NODE)["spec"]["taints"] == [mine], "atomic list: the other team's taint is gone"
    err = error(api.patch_node, NODE, {"metadata": {"resourceVersion": stale}, "spec": {"taints": []}}, _content_type=SMP)
    assert err.status == 409
    assert json.loads(err.body)["message"] == (
        f'Operation cannot be fulfilled on nodes "{NODE}": the object has been modified; '
        "please apply your changes to the latest version and try again")


def test_status_smp_merges_conditions_by_type(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    cond = {"type": "MyProblem", "status": "True", "reason": "R", "message": "m",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    api.patch_node_status(NODE, {"status": {"conditions": [cond]}, "spec": {"unschedulable": True}},
                          _content_type=SMP, _preload_content=False)
    node = fake.node(NODE)
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "MyProblem"]
    assert "unschedulable" not in node["spec"], "the status subresource ignores spec"
    api.patch_node_status(NODE, {"status": {"conditions": [{"type": "MyProblem", "$patch": "delete"}]}},
                          _content_type=SMP, _preload_content=False)
    assert [c["type"] for c in fake.node(NODE)["status"]["conditions"]] == ["Ready"]


@pytest.mark.parametrize(
    ("content_type", "patch", "status"),
    [
        pytest.param("application/json-patch+json", [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}],
                     422, id="json patch: failed test"),
        pytest.param("application/json-patch+json", [{"op": "remove", "path": "/spec/nothing"}], 422,
                     id="json patch: missing path"),
        pytest.param("application/json", {"spec": {}}, 415, id="unsupported content type"),
        pytest.param(SMP, {"spec": {"taints": [{"key": "bad key!", "effect": "NoSchedule"}]}}, 422, id="invalid taint key"),
        pytest.param(SMP, {"spec": {"taints": [{"key": "a/b", "effect": "Sometimes"}]}}, 422, id="invalid effect"),
        pytest.param(SMP, {"spec": {"taints": [{"key": "a/b", "effect": "NoSchedule"}] * 2}}, 422, id="duplicate taint"),
    ],
)
def test_patch_errors(fake: FakeApiServer, tmp_path: Any, content_type: str, patch: Any, status: int) -> None:
    api = core(fake, tmp_path)
    assert error(api.patch_node, NODE, patch, _content_type=content_type).status == status


def test_json_patch_body_must_be_an_array(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    # The client itself turns a dict body into a strategic merge patch, so send the bytes by hand.
    api.api_client.configuration.retries = False
    resp = api.api_client.rest_client.pool_manager.request(
        "PATCH", f"{fake.url}/api/v1/nodes/{NODE}", body=b"{}",
        headers={"Content-Type": "application/json-patch+json", "Authorization": f"Bearer {fake.token}"})
    assert resp.status == 400


def test_merge_patch_replaces_arrays(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    fake.edit_node(NODE, lambda n: n["spec"].update(taints=[{"key": "a/x", "effect": "NoSchedule"}]))
    api.patch_node(NODE, {"spec": {"taints": [{"key": "b/y", "effect": "NoSchedule"}]}},
                   _content_type="application/merge-patch+json", _preload_content=False)
    assert [t["key"] for t in fake.node(NODE)["spec"]["taints"]] == ["b/y"]


def test_put_with_stale_resource_version_conflicts(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    node = fake.node(NODE)
    fake.edit_node(NODE, lambda n: n["metadata"].setdefault("labels", {}).update(x="1"))
    assert error(api.replace_node, NODE, node).status == 409
    node["metadata"].pop("resourceVersion")
    api.replace_node(NODE, node, _preload_content=False)  # nodes allow an unconditional update


def test_a_write_that_changes_nothing_keeps_the_resource_version(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    before = rv(fake)
    api.patch_node(NODE, {"metadata": {"labels": {"kubernetes.io/hostname": NODE}}}, _content_type=SMP, _preload_content=False)
    assert rv(fake) == before


def test_watch_bookmarks_resume_and_expiry(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    start = rv(fake)
    threading.Timer(0.3, lambda: fake.edit_node(NODE, lambda n: n["metadata"]["labels"].update(w="1"))).start()
    resp = api.list_node(field_selector=f"metadata.name={NODE}", watch=True, allow_watch_bookmarks=True,
                         resource_version=start, timeout_seconds=1, _preload_content=False)
    kinds = [json.loads(line)["type"] for line in iter_resp_lines(resp)]
    assert "MODIFIED" in kinds and kinds.count("BOOKMARK") >= 2 and kinds[-1] == "BOOKMARK"
    fake.cluster.compact()
    resp = api.list_node(field_selector=f"metadata.name={NODE}", watch=True, resource_version=start,
                         timeout_seconds=5, _preload_content=False)
    events = [json.loads(line) for line in iter_resp_lines(resp)]
    assert [e["type"] for e in events] == ["ERROR"] and events[0]["object"]["code"] == 410
    assert events[0]["object"]["message"].startswith(f"too old resource version: {start}")


def test_events_validation(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    ev = client.EventsV1Api(api.api_client)
    good = {"metadata": {"name": "n.1"}, "eventTime": "2026-01-01T00:00:00.000001Z", "reportingController": "agent",
            "reportingInstance": "agent-n", "action": "Detected", "reason": "R", "type": "Warning",
            "regarding": {"kind": "Node", "name": NODE, "apiVersion": "v1"}}
    ev.create_namespaced_event("default", good, _preload_content=False)
    wrong_ns = dict(good, metadata={"name": "n.2"})
    fake.cluster.create_namespace("elsewhere")
    assert error(ev.create_namespaced_event, "elsewhere", wrong_ns).status == 422
    missing = {k: v for k, v in good.items() if k != "reportingController"} | {"metadata": {"name": "n.3"}}
    assert error(ev.create_namespaced_event, "default", missing).status == 422
    legacy = {"metadata": {"name": "n.4"}, "involvedObject": {"kind": "Node", "name": NODE}, "reason": "R",
              "message": "m", "type": "Normal", "count": 1}
    api.create_namespaced_event("default", legacy, _preload_content=False)
    assert len(fake.events()) == 2


def test_a_whole_second_micro_time_without_fraction_is_refused(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    # What isoformat() makes of a whole second (reference §11): the server wants six digits.
    resp = api.api_client.rest_client.pool_manager.request(
        "POST", f"{fake.url}/apis/events.k8s.io/v1/namespaces/default/events",
        body=json.dumps({"metadata": {"name": "n.9"}, "eventTime": "2026-01-01T00:00:00+00:00"}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {fake.token}"})
    assert resp.status == 400


def test_leases_under_a_quota(fake: FakeApiServer, tmp_path: Any) -> None:
    api = core(fake, tmp_path)
    leases = client.CoordinationV1Api(api.api_client)
    fake.set_quota("slots", "cap", 1)
    uid = fake.node(NODE)["metadata"]["uid"]
    lease = {"metadata": {"name": NODE, "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid}]},
             "spec": {"holderIdentity": NODE}}
    leases.create_namespaced_lease("slots", lease, _preload_content=False)
    err = error(leases.create_namespaced_lease, "slots", {"metadata": {"name": "other"}, "spec": {}})
    assert err.status == 403 and json.loads(err.body)["message"] == (
        'leases.coordination.k8s.io "other" is forbidden: exceeded quota: cap, requested: '
        "count/leases.coordination.k8s.io=1, used: count/leases.coordination.k8s.io=1, "
        "limited: count/leases.coordination.k8s.io=1")
    quota = fake.cluster.get(("", "resourcequotas", "slots", "cap"))
    assert quota is not None and quota["status"]["used"] == {"count/leases.coordination.k8s.io": "1"}
    fake.cluster.delete(("", "nodes", "", NODE))
    assert fake.objects("coordination.k8s.io", "leases", "slots") == [], "the garbage collector follows the owner"


def test_wrong_token_and_rbac(fake: FakeApiServer, tmp_path: Any) -> None:
    assert error(core(fake, tmp_path, token="stolen").read_node, NODE).status == 401
    fake.forbidden.add(("patch", "nodes"))
    err = error(core(fake, tmp_path).patch_node, NODE, {"spec": {}}, _content_type=SMP)
    assert err.status == 403 and 'cannot patch resource "nodes" in API group "" at the cluster scope' in json.loads(err.body)["message"]


@pytest.mark.parametrize(
    ("form", "content_type", "has_header"),
    [
        pytest.param("text", "text/plain", True, id="APF plain text"),
        pytest.param("json", "application/json", True, id="Status with retryAfterSeconds"),
        pytest.param("none", "application/json", False, id="no Retry-After"),
    ],
)
def test_429_forms(fake: FakeApiServer, tmp_path: Any, form: str, content_type: str, has_header: bool) -> None:
    fake.inject(429, retry_after=3, form=form)
    err = error(core(fake, tmp_path).read_node, NODE)
    assert err.status == 429 and err.headers["Content-Type"].startswith(content_type)
    assert ("Retry-After" in err.headers) == has_header


def test_urllib3_default_retries_hide_a_429_on_get_but_not_on_patch(fake: FakeApiServer, tmp_path: Any) -> None:
    """kubernetes 37.x leaves Configuration.retries None → urllib3's Retry(3) retries GET/PUT/DELETE on
    429 + Retry-After, invisibly; PATCH/POST surface at once (reference §4.3)."""
    api = core(fake, tmp_path, retries=None)
    fake.inject(429, retry_after=0, form="text", times=2)
    api.read_node(NODE, _preload_content=False)  # succeeds: urllib3 retried twice behind the client's back
    assert [r.status for r in fake.log(verbs=("get",))] == [429, 429, 200]
    fake.inject(429, retry_after=0, form="text", times=1)
    assert error(api.patch_node, NODE, {"spec": {}}, _content_type=SMP).status == 429
    assert [r.status for r in fake.log(verbs=("patch",))] == [429]


def test_retries_off_surface_every_429(fake: FakeApiServer, tmp_path: Any) -> None:
    fake.inject(429, retry_after=0, form="text", times=1)
    assert error(core(fake, tmp_path, retries=False).read_node, NODE).status == 429
    assert [r.status for r in fake.log(verbs=("get",))] == [429]


@pytest.mark.parametrize("code", [500, 503, 504])
def test_server_errors(fake: FakeApiServer, tmp_path: Any, code: int) -> None:
    fake.inject(code)
    assert error(core(fake, tmp_path).read_node, NODE).status == code
