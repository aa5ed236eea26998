"""daemonset/: valid against the Kubernetes schemas, consistent with the agent's config, and a
ValidatingAdmissionPolicy that does what it says (its CEL evaluated offline with cel-python)."""

from __future__ import annotations

import copy
import glob
import os
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from agent.config import parse

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "daemonset")
K8S_VERSION = "1.32"  # VAP v1: 1.30; the node-name claim in bound tokens: GA in 1.32
AGENT = "system:serviceaccount:node-health:node-health-agent"


def docs() -> list[dict[str, Any]]:
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "*.yaml"))):
        if not path.endswith("kustomization.yaml"):
            out += [d for d in yaml.safe_load_all(open(path)) if d]
    return out


def find(kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def agent_config() -> Any:
    return parse(find("ConfigMap", "node-health-agent-config")["data"]["agent.toml"], "daemonset/config.yaml")


# The PodMonitor is a Prometheus Operator CRD (no schema here): test_podmonitor_selects_the_agent_pods checks it.
@pytest.mark.parametrize("doc", [pytest.param(d, id=f"{d['kind']}/{d['metadata']['name']}") for d in docs()
                                 if not d["apiVersion"].startswith("monitoring.coreos.com/")])
def test_manifest_is_valid(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_lists_every_file() -> None:
    listed = yaml.safe_load(open(os.path.join(ROOT, "kustomization.yaml")))["resources"]
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "*.yaml")) if "kustomization" not in p)
    assert sorted(listed) == files


def test_podmonitor_selects_the_agent_pods() -> None:
    pm, ds = find("PodMonitor"), find("DaemonSet")
    pod = ds["spec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pm["spec"]["namespaceSelector"]["matchNames"] == [ds["metadata"]["namespace"]]
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
    assert all(e["port"] in ports and e["path"] == "/metrics" for e in pm["spec"]["podMetricsEndpoints"])


def test_daemonset_runs_everywhere_as_the_agent_expects() -> None:
    ds = find("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    cfg = agent_config()
    assert {"operator": "Exists"} in spec["tolerations"], "tolerates every taint, its own included"
    assert spec["priorityClassName"] == "system-node-critical" and spec["hostNetwork"] is True
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
    # /dev/kmsg and /dev/nvidia* need more than capabilities: see the comment in daemonset.yaml
    assert c["securityContext"]["privileged"] is True and c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port = {p["name"]: p["containerPort"] for p in c["ports"]}[c["livenessProbe"]["httpGet"]["port"]]
    assert cfg.metrics.listen.endswith(f":{port}")
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "10%"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in (cfg.paths.procfs, cfg.paths.sysfs, cfg.paths.rootfs, "/dev/kmsg", cfg.agent.state_dir, "/run/xtables.lock"):
        assert path in mounts, path
    assert not mounts[cfg.paths.rootfs].get("readOnly"), "the disk check's write probe needs the host's / writable"
    assert mounts[cfg.paths.rootfs]["mountPropagation"] == "HostToContainer", "mounts made later are seen"
    # driver_root is a host path, resolved under rootfs (not /host/root/host/root): the GPU Operator's
    # driver, else the host's (test_kube_packaging.py loads NVML from both layouts)
    assert cfg.checks["gpu"].driver_roots() == ["/run/nvidia/driver", "/"]
    hostpaths = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert hostpaths[mounts[cfg.agent.state_dir]["name"]] == "/var/lib/node-health-agent", "state survives the pod"


def test_config_names_match_the_cluster_objects() -> None:
    k = agent_config().kubernetes
    assert find("ConfigMap", k.kill_switch.name)["metadata"]["namespace"] == k.kill_switch.namespace
    quota = find("ResourceQuota", k.budget.quota_name)
    assert quota["metadata"]["namespace"] == k.budget.namespace
    assert "count/leases.coordination.k8s.io" in quota["spec"]["hard"]
    roles = {r["metadata"]["name"]: r for r in docs() if r["kind"] == "Role"}
    assert roles["node-health-agent-kill-switch"]["rules"][0]["resourceNames"] == [k.kill_switch.name]
    assert roles["node-health-agent-budget"]["metadata"]["namespace"] == k.budget.namespace
    disruption = find("ResourceQuota", k.disruption_budget.quota_name)
    assert disruption["metadata"]["namespace"] == k.disruption_budget.namespace != k.budget.namespace
    assert int(disruption["spec"]["hard"]["count/leases.coordination.k8s.io"]) < int(quota["spec"]["hard"]["count/leases.coordination.k8s.io"])
    assert roles["node-health-agent-disruption"]["metadata"]["namespace"] == k.disruption_budget.namespace
    assert roles["node-health-agent-disruption"]["rules"][1]["resourceNames"] == [k.disruption_budget.quota_name]
    lease_ns = Policy("node-health-agent-own-lease").doc["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]
    assert sorted(lease_ns["values"]) == sorted([k.budget.namespace, k.disruption_budget.namespace, k.breaker.namespace])
    records = find("ResourceQuota", k.breaker.quota_name)
    assert records["metadata"]["namespace"] == k.breaker.namespace
    assert records["spec"]["hard"]["count/leases.coordination.k8s.io"] == "30"
    assert roles["node-health-agent-breaker"]["metadata"]["namespace"] == k.breaker.namespace
    assert roles["node-health-agent-breaker"]["rules"][1]["resourceNames"] == [k.breaker.quota_name]
    patch = [r for r in roles["node-health-agent-kill-switch"]["rules"] if "patch" in r["verbs"]]
    assert patch == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [k.kill_switch.name], "verbs": ["patch"]}]


@pytest.mark.parametrize(
    ("group", "resource", "verb", "namespace"),
    [
        ("", "nodes", "list", ""), ("", "nodes", "get", ""), ("", "nodes", "patch", ""),
        ("", "nodes/status", "patch", ""),
        ("events.k8s.io", "events", "create", "default"), ("events.k8s.io", "events", "patch", "default"),
        ("", "configmaps", "list", "node-health"), ("", "configmaps", "watch", "node-health"),
        ("coordination.k8s.io", "leases", "create", "node-health-budget"),
        ("coordination.k8s.io", "leases", "get", "node-health-budget"),
        ("coordination.k8s.io", "leases", "delete", "node-health-budget"),
        ("", "resourcequotas", "get", "node-health-budget"),
        ("", "pods", "list", ""), ("", "pods", "watch", ""), ("", "pods/eviction", "create", ""),
        ("coordination.k8s.io", "leases", "create", "node-health-disruption"),
        ("coordination.k8s.io", "leases", "get", "node-health-disruption"),
        ("coordination.k8s.io", "leases", "delete", "node-health-disruption"),
        ("coordination.k8s.io", "leases", "list", "node-health-disruption"),  # expiry: find the dead holders' slots
        ("coordination.k8s.io", "leases", "patch", "node-health-disruption"),  # expiry: renew its own
        ("", "resourcequotas", "get", "node-health-disruption"),
        ("", "configmaps", "get", "node-health"), ("", "configmaps", "patch", "node-health"),  # the fleet breaker
        ("coordination.k8s.io", "leases", "create", "node-health-disrupted"),
        ("coordination.k8s.io", "leases", "get", "node-health-disrupted"),
        ("coordination.k8s.io", "leases", "delete", "node-health-disrupted"),
        ("coordination.k8s.io", "leases", "list", "node-health-disrupted"),
        ("", "resourcequotas", "get", "node-health-disrupted"),
    ],
)
def test_rbac_grants_each_call_the_agent_makes(group: str, resource: str, verb: str, namespace: str) -> None:
    kind = "Role" if namespace else "ClusterRole"
    rules = [r for d in docs() if d["kind"] == kind and d["metadata"].get("namespace", "") == namespace for r in d["rules"]]
    assert any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_rbac_for_pods_is_list_watch_and_evict_only() -> None:
    """No get (the pod watch and the drain read with the node's field selector), no delete unless the timeout
    policy deletes."""
    verbs = {(res, v) for d in docs() for r in d.get("rules", []) for res in r["resources"] if res.startswith("pods")
             for v in r["verbs"]}
    assert verbs == {("pods", "list"), ("pods", "watch"), ("pods/eviction", "create")}
    assert agent_config().kubernetes.drain.deletes is False


def test_rbac_grants_nothing_broad() -> None:
    for d in docs():
        for rule in d.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
            assert not {"update", "deletecollection", "escalate", "bind"} & set(rule["verbs"])


# ---------------------------------------------------------------- the policy's CEL


class Policy:
    def __init__(self, name: str) -> None:
        self.doc = find("ValidatingAdmissionPolicy", name)
        self.env = celpy.Environment()

    def _eval(self, expr: str, act: dict[str, Any]) -> Any:
        return self.env.program(self.env.compile(expr)).evaluate(act)

    def admit(self, request: dict[str, Any], obj: Any, old: Any) -> list[str]:
        """The failed validations' messages; [] when admitted (or not matched)."""
        act: dict[str, Any] = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
                               "oldObject": celpy.json_to_cel(old)}
        if not all(self._eval(m["expression"], act) for m in self.doc["spec"].get("matchConditions", [])):
            return []
        variables: dict[str, Any] = {}
        for v in self.doc["spec"].get("variables", []):
            act["variables"] = celpy.celtypes.MapType(variables)
            variables[celpy.celtypes.StringType(v["name"])] = self._eval(v["expression"], act)
        act["variables"] = celpy.celtypes.MapType(variables)
        return [v.get("message", v["expression"]) for v in self.doc["spec"]["validations"] if not self._eval(v["expression"], act)]

    def value(self, name: str) -> Any:
        (v,) = [v for v in self.doc["spec"]["variables"] if v["name"] == name]
        return self._eval(v["expression"], {})

    def variable(self, name: str) -> str:
        return str(self.value(name))


def node(name: str = "n1", taints: list[dict[str, str]] | None = None, conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"a": "b"}}, "spec": {"taints": taints or []},
            "status": {"conditions": conditions or [{"type": "Ready", "status": "True"}], "capacity": {"cpu": "8"}}}


def request(node_claim: str | None = "n1", sub: str = "", user: str = AGENT, name: str = "n1", op: str = "UPDATE") -> dict[str, Any]:
    extra = {"authentication.kubernetes.io/node-name": [node_claim]} if node_claim else {}
    return {"userInfo": {"username": user, "extra": extra}, "subResource": sub, "name": name, "operation": op}


OURS = {"key": "node-health-agent/disk", "value": "DiskFull", "effect": "NoSchedule"}
THEIRS = {"key": "other.team/drain", "effect": "NoSchedule"}
OUR_COND = {"type": "NodeHealthDiskProblem", "status": "True"}
RETIRED = "node-health-agent/retired"


def with_(obj: dict[str, Any], fn: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    fn(out)
    return out


@pytest.mark.parametrize(
    ("req", "old", "new", "allowed"),
    [
        pytest.param(request(), node(taints=[THEIRS]), node(taints=[THEIRS, OURS]), True, id="adds its taint to its node"),
        pytest.param(request(), node(taints=[THEIRS, OURS]), node(taints=[THEIRS]), True, id="removes its taint"),
        pytest.param(request(name="n2"), node("n2"), node("n2", taints=[OURS]), False, id="another node"),
        pytest.param(request(node_claim=None), node(), node(taints=[OURS]), False, id="token without the node claim"),
        pytest.param(request(), node(taints=[THEIRS]), node(taints=[OURS]), False, id="removes a foreign taint"),
        pytest.param(request(), node(), node(taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
                     False, id="adds a reserved taint"),
        pytest.param(request(), node(), with_(node(), lambda n: n["spec"].update(unschedulable=True)), False, id="cordons"),
        pytest.param(request(), node(), with_(node(), lambda n: n["metadata"]["labels"].update(x="y")), False, id="labels"),
        pytest.param(request(), node(), with_(node(), lambda n: n["metadata"]["labels"].update({RETIRED: "true"})),
                     True, id="sets its retired label"),
        pytest.param(request(), with_(node(), lambda n: n["metadata"]["labels"].update({RETIRED: "true"})), node(),
                     True, id="removes its retired label"),
        pytest.param(request(), node(), with_(node(), lambda n: n["metadata"]["labels"].update({RETIRED: "yes"})),
                     False, id="retired label with another value"),
        pytest.param(request(), node(), with_(node(), lambda n: n["metadata"]["labels"].update({RETIRED: "true", "a": "c"})),
                     False, id="retired label and a foreign label"),
        pytest.param(request(), node(), with_(node(), lambda n: n["metadata"]["labels"].pop("a")), False,
                     id="removes a foreign label"),
        pytest.param(request(name="n2"), node("n2"), with_(node("n2"), lambda n: n["metadata"]["labels"].update({RETIRED: "true"})),
                     False, id="retires another node"),
        pytest.param(request(sub="status"), node(), node(conditions=[{"type": "Ready", "status": "True"},
                                                                     {"type": "NodeHealthNeedsHardwareRepair", "status": "True"}]),
                     True, id="status: its retired condition"),
        pytest.param(request(sub="status"), node(), node(conditions=[{"type": "Ready", "status": "True"}, OUR_COND]),
                     True, id="status: sets its condition"),
        pytest.param(request(sub="status"), node(), node(conditions=[{"type": "Ready", "status": "False"}]), False,
                     id="status: changes the kubelet's Ready"),
        pytest.param(request(sub="status"), node(), with_(node(), lambda n: n["status"]["capacity"].update(cpu="64")),
                     False, id="status: fakes capacity"),
        pytest.param(request(user="system:node:n1"), node(taints=[THEIRS]), node(), True, id="someone else: not matched"),
    ],
)
def test_node_policy(req: dict[str, Any], old: dict[str, Any], new: dict[str, Any], allowed: bool) -> None:
    assert (Policy("node-health-agent-own-node").admit(req, new, old) == []) == allowed


@pytest.mark.parametrize(
    ("req", "lease", "allowed"),
    [
        pytest.param(request(op="CREATE"), {"metadata": {"name": "n1", "ownerReferences": [{"kind": "Node", "name": "n1"}]}},
                     True, id="its own slot"),
        pytest.param(request(op="CREATE", name="n2"), {"metadata": {"name": "n2", "ownerReferences": [{"kind": "Node", "name": "n2"}]}},
                     False, id="another node's slot"),
        pytest.param(request(op="CREATE"), {"metadata": {"name": "n1"}}, False, id="not owned by the node"),
        pytest.param({**request(op="DELETE", name="n2"), "namespace": "node-health-budget"}, None, False,
                     id="frees another node's taint slot"),
        pytest.param({**request(op="DELETE", name="n2"), "namespace": "node-health-disruption"}, None, True,
                     id="reclaims another node's expired disruption slot"),
        pytest.param({**request(op="UPDATE", name="n2"), "namespace": "node-health-disruption"},
                     {"metadata": {"name": "n2", "ownerReferences": [{"kind": "Node", "name": "n2"}]}}, False,
                     id="renews another node's disruption slot"),
        pytest.param({**request(op="UPDATE"), "namespace": "node-health-disruption"},
                     {"metadata": {"name": "n1", "ownerReferences": [{"kind": "Node", "name": "n1"}]}}, True,
                     id="renews its own slot"),
        pytest.param(request(op="DELETE"), None, True, id="frees its own slot"),
        pytest.param({**request(op="DELETE", name="n2"), "namespace": "node-health-disrupted"}, None, True,
                     id="deletes another node's breaker record past the window"),
        pytest.param({**request(op="CREATE", name="n2"), "namespace": "node-health-disrupted"},
                     {"metadata": {"name": "n2", "ownerReferences": [{"kind": "Node", "name": "n2"}]}}, False,
                     id="records another node's disruption"),
    ],
)
def test_lease_policy(req: dict[str, Any], lease: Any, allowed: bool) -> None:
    assert (Policy("node-health-agent-own-lease").admit(req, lease, None) == []) == allowed


def switch(**data: str) -> dict[str, Any]:
    return {"metadata": {"name": "node-health-agent-kill-switch", "namespace": "node-health"}, "data": data}


TRIP = {"breaker": "tripped", "breaker-reason": "31 nodes", "breaker-signal": "disrupted", "breaker-node": "n1"}


@pytest.mark.parametrize(
    ("old", "new", "allowed"),
    [
        pytest.param(switch(paused="false"), switch(paused="false", **TRIP), True, id="trips the breaker"),
        pytest.param(switch(paused="false", breaker="false"), switch(paused="false", **TRIP), True, id="trips it after a reset"),
        pytest.param(switch(paused="false", **TRIP), switch(paused="false", breaker="false"), False, id="resets the breaker"),
        pytest.param(switch(paused="true"), switch(paused="false", **TRIP), False, id="unpauses the kill switch"),
        pytest.param(switch(paused="false"), switch(paused="true", **TRIP), False, id="pauses the kill switch"),
        pytest.param(switch(paused="false"), switch(paused="false", other="x", **TRIP), False, id="adds another key"),
        pytest.param(switch(paused="false"), switch(paused="false", **{**TRIP, "breaker": "yes"}), False,
                     id="another value than tripped"),
    ],
)
def test_the_agent_may_only_trip_the_breaker(old: dict[str, Any], new: dict[str, Any], allowed: bool) -> None:
    req = {**request(op="UPDATE", name="node-health-agent-kill-switch"), "namespace": "node-health"}
    assert (Policy("node-health-agent-trip-only").admit(req, new, old) == []) == allowed


def evict_request(ns: str = "team-a", claim: str | None = "n1") -> dict[str, Any]:
    return {**request(claim, sub="eviction", name="web-0", op="CREATE"), "namespace": ns}


def eviction(grace: int | None = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-0"},
                          "deleteOptions": {"preconditions": {"uid": "u"}}}
    if grace is not None:
        ev["deleteOptions"]["gracePeriodSeconds"] = grace
    return ev


def pod_on(node_name: str) -> dict[str, Any]:
    return {"metadata": {"name": "web-0", "namespace": "team-a"}, "spec": {"nodeName": node_name}}


@pytest.mark.parametrize(
    ("req", "obj", "old", "allowed"),
    [
        pytest.param(evict_request(), eviction(), None, True, id="evicts, with the pod's own grace period"),
        pytest.param(evict_request(claim="n2"), eviction(), None, True,
                     id="evicts a pod on another node: the policy cannot tell (the Eviction has no nodeName)"),
        pytest.param(evict_request("kube-system"), eviction(), None, False, id="evicts in kube-system"),
        pytest.param(evict_request("node-health"), eviction(), None, False, id="evicts in its own namespace"),
        pytest.param(evict_request(), eviction(grace=0), None, False, id="shortens the grace period"),
        pytest.param({**request(op="DELETE", name="web-0"), "namespace": "team-a"}, None, pod_on("n1"), True,
                     id="deletes a pod on its own node"),
        pytest.param({**request(op="DELETE", name="web-0"), "namespace": "team-a"}, None, pod_on("n2"), False,
                     id="deletes a pod on another node"),
        pytest.param({**request(None, op="DELETE", name="web-0"), "namespace": "team-a"}, None, pod_on("n1"), False,
                     id="deletes without the node claim"),
    ],
)
def test_pods_policy(req: dict[str, Any], obj: Any, old: Any, allowed: bool) -> None:
    assert (Policy("node-health-agent-own-pods").admit(req, obj, old) == []) == allowed


def test_policy_uses_the_configured_prefixes() -> None:
    k = agent_config().kubernetes
    policy = Policy("node-health-agent-own-node")
    assert policy.variable("taintPrefix") == k.taint_prefix
    assert policy.variable("conditionPrefix") == k.condition_prefix
    assert policy.variable("retiredLabel") == k.taint_prefix + "retired"
    never = sorted(str(x) for x in Policy("node-health-agent-own-pods").value("neverDrained"))
    assert never == sorted({*k.drain.skip_namespaces, find("ServiceAccount")["metadata"]["namespace"]})
    rbac_sa = find("ServiceAccount")
    assert f"system:serviceaccount:{rbac_sa['metadata']['namespace']}:{rbac_sa['metadata']['name']}" == AGENT
    for name in ("node-health-agent-own-node", "node-health-agent-own-lease", "node-health-agent-own-pods"):
        assert AGENT in Policy(name).doc["spec"]["matchConditions"][0]["expression"]
        assert find("ValidatingAdmissionPolicyBinding", name)["spec"]["policyName"] == name


def test_image_runs_the_command_the_daemonset_gives() -> None:
    dockerfile = (Path(__file__).parent.parent.parent / "daemonset" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["agent"]' in dockerfile and "iptables nftables" in dockerfile
    (c,) = find("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "run" and c["args"][1:] == ["--config", "/etc/node-health-agent/agent.toml"]
