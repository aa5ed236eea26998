"""The cluster client is loaded lean: the agent's requests go through the library's own `ApiClient`
without the generated API classes and models (~21 MB of RSS), and without the parts of the package
the agent never uses (issue 29; figures in benches/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agent.kube.api import CORE_OPS, COORDINATION_OPS, EVENTS_OPS, Endpoint
from fakeapi import FakeApiServer
from kube_support import NODE, fake  # noqa: F401 - fixture

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def api_client(fake: FakeApiServer, tmp_path: Any) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=fake.kubeconfig(os.path.join(tmp_path, "kc")), client_configuration=cfg)
    cfg.retries = False
    return client.ApiClient(cfg)


def fresh(code: str, **env: str) -> dict[str, Any]:
    """Run `code` in a fresh interpreter (nothing of kubernetes imported yet); it prints one JSON line."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, **env}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


LOADED = """
    import json, sys
    def loaded():
        mods = [m for m in sys.modules if m.startswith("kubernetes")]
        return {"api": [m for m in mods if m.startswith("kubernetes.client.api.")],
                "models": [m for m in mods if m.startswith("kubernetes.client.models.")],
                "extras": [m for m in mods if m.split(".")[1:2] and m.split(".")[1] in
                           ("dynamic", "stream", "informer", "leaderelection")] + [m for m in mods if m.startswith("kubernetes.utils.create")],
                "requests": "requests" in sys.modules}
"""


@pytest.mark.parametrize("kind", ["in-cluster", "kubeconfig"])
def test_building_the_client_loads_no_api_classes_models_or_unused_parts(kind: str, tmp_path: Any) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    kc = tmp_path / "kc"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "f",
        "clusters": [{"name": "f", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "a", "user": {"token": "t"}}], "contexts": [{"name": "f", "context": {"cluster": "f", "user": "a"}}],
    }))
    source = (f'ClusterSource("in-cluster", token_file="{token}", ca_file="{token}")' if kind == "in-cluster"
              else f'ClusterSource("kubeconfig", "{kc}")')
    got = fresh(LOADED + f"""
    from agent.kube.connect import ClusterSource, build_client
    from agent.kube.api import KubeApi
    api, _ = build_client({source})
    print(json.dumps({{**loaded(), "host": api.configuration.host}}))
    """, KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_SERVICE_PORT="443")
    assert got["api"] == [] and got["models"] == [] and got["extras"] == []
    assert got["host"] == ("https://10.0.0.1:443" if kind == "in-cluster" else "http://127.0.0.1:1")
    # in-cluster needs no kubeconfig loader (oauthlib, requests); a kubeconfig does
    assert got["requests"] is (kind == "kubeconfig")


def test_a_lean_package_is_the_whole_package_to_anyone_who_asks_for_more() -> None:
    got = fresh(LOADED + """
    from agent.kube.connect import lean
    lean()
    import kubernetes.config.incluster_config
    before = loaded()
    import kubernetes
    out = {"before": before, "version": kubernetes.__version__,
           "load_kube_config": callable(kubernetes.config.load_kube_config),
           "core": kubernetes.client.CoreV1Api.__name__, "stream": kubernetes.stream.__name__}
    from kubernetes import dynamic
    out["dynamic"] = dynamic.__name__
    print(json.dumps(out))
    """)
    assert got["before"]["api"] == [] and got["before"]["extras"] == []
    assert got["version"].startswith("37.") and got["load_kube_config"]
    assert (got["core"], got["stream"], got["dynamic"]) == ("CoreV1Api", "kubernetes.stream", "kubernetes.dynamic")


def test_every_endpoint_is_the_generated_methods_path_and_verb(tmp_path: Any) -> None:
    """Each operation sends what ``kubernetes.client``'s generated method of the same name sends."""
    import inspect

    groups = ((client.CoreV1Api, CORE_OPS), (client.CoordinationV1Api, COORDINATION_OPS), (client.EventsV1Api, EVENTS_OPS))
    for cls, ops in groups:
        for name, (method, path) in ops.items():
            source = inspect.getsource(getattr(cls, f"_{name}_serialize"))
            assert f"method='{method}'" in source and f"resource_path='{path}'" in source, name
            params = list(inspect.signature(getattr(cls, name)).parameters)[1:]
            assert Endpoint(None, method, path).params == [p for p in params if p in ("name", "namespace")], name


def test_an_endpoint_sends_query_body_and_content_type_and_raises_on_an_error(fake: FakeApiServer, tmp_path: Any) -> None:  # noqa: F811
    ac = api_client(fake, tmp_path)
    patch = Endpoint(ac, *CORE_OPS["patch_node"])
    resp = patch(NODE, {"metadata": {"labels": {"a": "b"}}}, _content_type="application/strategic-merge-patch+json")
    assert resp.status == 200 and json.loads(resp.data)["metadata"]["labels"]["a"] == "b"
    listed = Endpoint(ac, *CORE_OPS["list_node"])(field_selector=f"metadata.name={NODE}", resource_version="0", watch=None)
    assert [n["metadata"]["name"] for n in json.loads(listed.data)["items"]] == [NODE]
    last = fake.requests[-1]
    assert (last.method, last.path, last.query) == ("GET", "/api/v1/nodes", {"fieldSelector": f"metadata.name={NODE}", "resourceVersion": "0"})
    assert fake.requests[-2].content_type == "application/strategic-merge-patch+json"
    with pytest.raises(ApiException) as info:
        Endpoint(ac, *CORE_OPS["read_node"])("no-such-node")
    assert info.value.status == 404 and json.loads(info.value.body)["reason"] == "NotFound"
    with pytest.raises(TypeError):
        Endpoint(ac, *CORE_OPS["read_node"])()
