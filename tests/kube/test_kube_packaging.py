"""The Kubernetes packaging as rendered: daemonset/ through `kubectl kustomize`
(with and without the nvidia-runtime component) and charts/node-health-agent
through Helm's engine. Valid against the Kubernetes schemas; the chart's
defaults equal the kustomize base; the shipped ConfigMap loads NVML from a
host tree in both driver layouts; probes, Pod Security, budgets, monitors and
TLS as the values say."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from fakenvml import h100
from fakenvml.fixtures import HostTree, fake_nvml_lib  # noqa: F401 - fixture
from kube_render import K8S_VERSION, NAMESPACE, agent_toml, container, find, helm, kustomize

from agent.config import parse, to_toml

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WORKER_MIB, AGENT_MIB, GPUS = 425, 128, 8  # a burn worker on an H100 (reference/gpu.md f); the agent's request
NODES = {"taintBudget": {"nodes": 7500}}  # offline rendering cannot count the nodes; daemonset/ is sized for 7,500


def mib(quantity: str) -> int:
    units = {"Mi": 1, "Gi": 1024}
    return int(quantity[:-2]) * units[quantity[-2:]]


def helm_(values: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    merged: dict[str, Any] = json.loads(json.dumps(NODES))
    for key, value in (values or {}).items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    return helm(merged, **kw)


HASH = "$2b$04$gIRQECH6TerwO9xhwp4Plux7EkVMttvGlG4NaA0lmEInnRieRyE2i"  # bcrypt of "scrape-me"
BASIC_AUTH = {"metrics": {
    "tls": {"enabled": True, "secretName": "agent-tls", "scrape": {"caSecret": {"name": "agent-tls"}}},
    "basicAuth": {"enabled": True, "users": {"prometheus": HASH}, "scrapeSecret": {"name": "scrape"}},
    "serviceMonitor": {"enabled": True}}}
EVERYTHING_ON = {
    "nvidiaRuntime": {"enabled": True},
    "metrics": {"tls": {"enabled": True, "secretName": "agent-tls", "scrape": {"caSecret": {"name": "agent-tls"}}},
                "serviceMonitor": {"enabled": True}},
    "killSwitch": {"paused": True},
}


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return kustomize()


@pytest.fixture(scope="module")
def gpu_variant() -> list[dict[str, Any]]:
    return kustomize(["nvidia-runtime"])


@pytest.fixture(scope="module")
def chart() -> list[dict[str, Any]]:
    return helm_()


# ---------------------------------------------------------------- every rendering is valid


RENDERINGS = {
    "kustomize": lambda: kustomize(),
    "kustomize+nvidia-runtime": lambda: kustomize(["nvidia-runtime"]),
    "helm": lambda: helm_(),
    "helm+everything": lambda: helm_(EVERYTHING_ON),
    "helm+basic-auth,tls": lambda: helm_(BASIC_AUTH),
    "helm+mtls,no-budget": lambda: helm_({"metrics": {"tls": {
        "enabled": True, "secretName": "t", "clientAuth": True,
        "scrape": {"certSecret": {"name": "c"}, "keySecret": {"name": "c"}}}}, "taintBudget": {"enabled": False}}),
}


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_rendered_objects_are_valid(rendering: str) -> None:
    docs = RENDERINGS[rendering]()
    crds = [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    for doc in docs:
        if doc not in crds:  # the Prometheus Operator's CRDs have no schema here; tested below
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    parse(agent_toml(docs), f"{rendering}: agent.toml")  # the agent takes its config


def test_helm_lint_is_clean() -> None:
    import helm_python

    report = helm_python.lint(str(Path(__file__).parent.parent.parent / "charts" / "node-health-agent"), NODES,
                              namespace=NAMESPACE, strict=True, kube_version="v1.32.0")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report


# ---------------------------------------------------------------- the shipped ConfigMap finds NVML


LAYOUTS = {
    "host driver (Debian/Ubuntu)": "usr/lib/x86_64-linux-gnu",
    "host driver (RHEL)": "usr/lib64",
    "GPU Operator": "run/nvidia/driver/usr/lib/x86_64-linux-gnu",
    "GPU Operator (RHEL driver image)": "run/nvidia/driver/usr/lib64",
}


def selftest_gpu(toml: str, pod: Path, lib: str, layout: str) -> dict[str, Any]:
    """`agent selftest --only gpu` on a config as the pod sees it: every absolute path of the pod
    (the host's /proc, /sys and / at /host/...) lives under `pod`, the host tree under its rootfs."""
    cfg = parse(toml, "agent.toml")
    host = HostTree(str(pod / "host"))  # pod/host/proc, pod/host/sys: a boot id and the PCI bus
    assert (host.proc, host.sys) == (str(pod) + cfg.paths.procfs, str(pod) + cfg.paths.sysfs)
    host.add_gpu("0000:18:00")
    rootfs = pod / cfg.paths.rootfs.lstrip("/")
    (rootfs / layout).mkdir(parents=True)
    shutil.copy(lib, rootfs / layout / "libnvidia-ml.so.1")
    scenario = pod / "scenario"
    scenario.write_text("count 1\n" + "".join(f"0.{k} {v}\n" for k, v in h100(0).items()))
    (pod / "agent.toml").write_text(toml)
    res = subprocess.run(
        [sys.executable, "-m", "agent", "selftest", "--json", "--only", "gpu", "--config", str(pod / "agent.toml"),
         "--path.procfs", host.proc, "--path.sysfs", host.sys, "--path.rootfs", str(rootfs)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "FAKE_NVML_SCENARIO": str(scenario)},
    )
    assert res.returncode in (0, 1), res.stderr
    return dict(json.loads(res.stdout))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("renderer", ["kustomize", "helm"])
def test_shipped_configmap_loads_nvml_from_the_host_tree(tmp_path: Path, fake_nvml_lib: str, renderer: str,
                                                         layout: str) -> None:
    toml = agent_toml(kustomize() if renderer == "kustomize" else helm_())
    report = selftest_gpu(toml, tmp_path, fake_nvml_lib, LAYOUTS[layout])
    reasons = {f["reason"] for f in report["findings"]}
    (gpu,) = report["checks"]
    assert "NvmlUnavailable" not in reasons, report
    assert gpu["ok"] and gpu["subjects"]["gpu0"].startswith("NVIDIA H100 80GB HBM3 0000:18:00"), report


def test_driver_root_doubled_under_rootfs_is_what_the_test_catches(tmp_path: Path, fake_nvml_lib: str,
                                                                   base: list[dict[str, Any]]) -> None:
    """The value shipped before (driver_root = rootfs) looks under /host/root/host/root: not found."""
    toml = agent_toml(base).replace('driver_root = "/run/nvidia/driver:/"', 'driver_root = "/host/root"')
    report = selftest_gpu(toml, tmp_path, fake_nvml_lib, LAYOUTS["host driver (Debian/Ubuntu)"])
    (finding,) = [f for f in report["findings"] if f["reason"] == "NvmlUnavailable"]
    assert "/host/root/host/root" in finding["message"]


# ---------------------------------------------------------------- kustomize


def test_kustomize_sets_the_image_from_images(base: list[dict[str, Any]]) -> None:
    raw = (Path(__file__).parent.parent.parent / "daemonset" / "daemonset.yaml").read_text()
    assert "image: node-health-agent  #" in raw, "daemonset.yaml names the image; kustomization.yaml tags it"
    assert container(base)["image"] == "node-health-agent:0.1.0"


@pytest.mark.parametrize("renderer", ["kustomize", "helm"])
def test_namespace_admits_privileged_pods(renderer: str) -> None:
    docs = kustomize() if renderer == "kustomize" else helm_({"namespace": {"create": True}})
    ns = find(docs, "Namespace", find(docs, "DaemonSet")["metadata"]["namespace"])
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_chart_does_not_own_the_release_namespace_unless_asked(chart: list[dict[str, Any]]) -> None:
    """`helm install --create-namespace` (Helm stores the release in it first), or an existing one:
    the chart neither conflicts with it nor deletes it on uninstall."""
    assert NAMESPACE not in {d["metadata"]["name"] for d in chart if d["kind"] == "Namespace"}
    assert {d["metadata"]["name"] for d in chart if d["kind"] == "Namespace"} == {"node-health-budget", "node-health-disruption", "node-health-disrupted"}


@pytest.mark.parametrize("renderer", ["kustomize", "helm"])
def test_rolling_update_waits_for_agents_that_serve(renderer: str) -> None:
    docs = kustomize() if renderer == "kustomize" else helm_()
    ds, c = find(docs, "DaemonSet"), container(docs)
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "10%"
    assert ds["spec"]["minReadySeconds"] >= 10
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    listen = parse(agent_toml(docs), "agent.toml").metrics.listen
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and listen.endswith(f":{port[get['port']]}"), probe
        assert get.get("scheme", "HTTP") == "HTTP"
    # the startup probe covers a slow start before liveness may restart the agent
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 60


def test_nvidia_runtime_variant_can_burn(base: list[dict[str, Any]], gpu_variant: list[dict[str, Any]]) -> None:
    spec = find(gpu_variant, "DaemonSet")["spec"]["template"]["spec"]
    c = container(gpu_variant)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert spec["runtimeClassName"] == "nvidia"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert "NODE_NAME" in env, "the patch adds to the env, it does not replace it"
    assert not any("nvidia.com/gpu" in str(r) for r in c["resources"].values()), "no GPU taken from jobs"
    assert mib(c["resources"]["limits"]["memory"]) >= AGENT_MIB + GPUS * WORKER_MIB
    assert "runtimeClassName" not in find(base, "DaemonSet")["spec"]["template"]["spec"]
    # the rest of the DaemonSet is the base's
    strip = {"runtimeClassName", "containers"}
    assert {k: v for k, v in spec.items() if k not in strip} == \
        {k: v for k, v in find(base, "DaemonSet")["spec"]["template"]["spec"].items() if k not in strip}


# ---------------------------------------------------------------- Helm: its defaults are the kustomize base


HELM_ONLY_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                    "helm.sh/chart"}


def normalised(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy without what only Helm adds (its labels, the config checksum) or spells differently."""
    out = json.loads(json.dumps(doc))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("labels", "matchLabels"):
                if isinstance(node.get(key), dict):
                    node[key] = {k: v for k, v in node[key].items() if k not in HELM_ONLY_LABELS}
            node.pop("annotations", None)
            if isinstance(node.get("expression"), str):  # CEL: kustomize re-folds the YAML scalars
                node["expression"] = " ".join(node["expression"].split())
            if isinstance(node.get("env"), list):  # a strategic merge patch puts its entries first
                node["env"] = sorted(node["env"], key=lambda e: e["name"])
            if isinstance(node.get("httpGet"), dict):
                node["httpGet"].pop("scheme", None)  # HTTP is the default
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(out)
    out["metadata"].pop("labels", None)
    if out["kind"] == "ConfigMap" and "agent.toml" in out.get("data", {}):  # the effective config
        out["data"]["agent.toml"] = tomllib.loads(to_toml(parse(out["data"]["agent.toml"], "agent.toml")))
    return out


def test_helm_defaults_render_the_kustomize_base(base: list[dict[str, Any]]) -> None:
    chart = helm_({"namespace": {"create": True}})  # kustomize's base creates its namespace

    def key(d: dict[str, Any]) -> tuple[str, str, str]:
        return d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]

    assert sorted(map(key, chart)) == sorted(map(key, base))
    kustomized = {key(d): normalised(d) for d in base}
    for doc in chart:
        assert normalised(doc) == kustomized[key(doc)], key(doc)


def test_config_checksum_follows_the_config() -> None:
    def checksum(values: dict[str, Any]) -> str:
        return str(find(helm_(values), "DaemonSet")["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    plain = checksum({})
    assert checksum({"image": {"tag": "0.1.1"}}) == plain
    assert checksum({"config": {"checks": {"disk": {"interval": "1m"}}}}) != plain
    assert checksum({"metrics": {"port": 9905}}) != plain


def test_values_reach_the_agent_config_as_typed_values() -> None:
    """Helm reads numbers in values as floats; the chart writes integers back as integers."""
    docs = helm_({"config": {"checks": {"gpu": {"expected_count": 8, "ecc_corrected_rate": 250}}}})
    cfg = parse(agent_toml(docs), "agent.toml")
    assert cfg.checks["gpu"].expected_count == 8 and cfg.checks["gpu"].ecc_corrected_rate == 250.0
    assert cfg.checks["gpu"].driver_root == "/run/nvidia/driver:/", "a user's config keeps the chart's defaults"
    # keys the chart's objects fix cannot be pointed elsewhere
    docs = helm_({"config": {"paths": {"rootfs": "/elsewhere"}, "kubernetes": {"budget": {"namespace": "x"}}}})
    cfg = parse(agent_toml(docs), "agent.toml")
    assert cfg.paths.rootfs == "/host/root" and cfg.kubernetes.budget.namespace == "node-health-budget"


def test_release_name_and_namespace_flow_into_every_reference() -> None:
    docs = helm_({"kubernetes": {"taintPrefix": "health.example.com/"}}, name="gpu-health", namespace="ops")
    sa = find(docs, "ServiceAccount")["metadata"]
    assert (sa["name"], sa["namespace"]) == ("gpu-health-node-health-agent", "ops")
    user = "system:serviceaccount:ops:gpu-health-node-health-agent"
    for vap in (d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"):
        assert vap["spec"]["matchConditions"][0]["expression"].endswith(f"'{user}'")
        binding = find(docs, "ValidatingAdmissionPolicyBinding", vap["metadata"]["name"])
        assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    own_node = find(docs, "ValidatingAdmissionPolicy", "gpu-health-node-health-agent-own-node")
    assert {v["name"]: v["expression"] for v in own_node["spec"]["variables"]}["taintPrefix"] == "'health.example.com/'"
    k = parse(agent_toml(docs, "gpu-health-node-health-agent-config"), "agent.toml").kubernetes
    assert k.taint_prefix == "health.example.com/"
    switch = find(docs, "ConfigMap", k.kill_switch.name)
    assert switch["metadata"]["namespace"] == k.kill_switch.namespace == "ops"
    assert find(docs, "Role", "gpu-health-node-health-agent-kill-switch")["rules"][0]["resourceNames"] == [k.kill_switch.name]
    assert find(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]


def test_tolerations_and_kill_switch_values() -> None:
    docs = helm_({"tolerations": [{"key": "gpu", "operator": "Exists"}], "killSwitch": {"paused": True}})
    assert find(docs, "DaemonSet")["spec"]["template"]["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert find(docs, "ConfigMap", "node-health-agent-kill-switch")["data"] == {"paused": "true"}


@pytest.mark.parametrize(("nodes", "percent", "minimum", "quota"),
                         [(7500, 5, 1, "375"), (200, 5, 1, "10"), (10, 5, 1, "1"), (10, 5, 2, "2"), (64, 25, 1, "16")])
def test_taint_budget_is_a_share_of_the_nodes(nodes: int, percent: int, minimum: int, quota: str) -> None:
    docs = helm_({"taintBudget": {"nodes": nodes, "percent": percent, "minimum": minimum}})
    assert find(docs, "ResourceQuota", "node-health-taint-budget")["spec"]["hard"] == {"count/leases.coordination.k8s.io": quota}


@pytest.mark.parametrize(("nodes", "percent", "quota"), [(7500, 1, "75"), (200, 1, "2"), (10, 1, "1"), (64, 25, "16")])
def test_disruption_budget_is_a_smaller_share_of_the_same_nodes(nodes: int, percent: int, quota: str) -> None:
    docs = helm_({"taintBudget": {"nodes": nodes}, "disruptionBudget": {"percent": percent}})
    q = find(docs, "ResourceQuota", "node-health-disruption-budget")
    assert q["metadata"]["namespace"] == "node-health-disruption"
    assert q["spec"]["hard"] == {"count/leases.coordination.k8s.io": quota}
    k = parse(agent_toml(docs), "agent.toml").kubernetes
    assert (k.disruption_budget.namespace, k.disruption_budget.quota_name) == ("node-health-disruption", "node-health-disruption-budget")


def test_drain_delete_rbac_only_when_asked() -> None:
    def pod_verbs(docs: list[dict[str, Any]]) -> list[str]:
        (rule,) = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"] if r["resources"] == ["pods"]]
        return list(rule["verbs"])

    assert pod_verbs(helm_()) == ["list", "watch"]
    assert pod_verbs(helm_({"drain": {"allowDelete": True}})) == ["list", "watch", "delete"]


def test_never_drained_namespaces_follow_the_config_and_the_release() -> None:
    docs = helm_({"config": {"kubernetes": {"drain": {"skip_namespaces": ["kube-system", "gpu-operator"]}}}})
    (var,) = [v for v in find(docs, "ValidatingAdmissionPolicy", "node-health-agent-own-pods")["spec"]["variables"]
              if v["name"] == "neverDrained"]
    assert var["expression"] == f"['kube-system', 'gpu-operator', '{NAMESPACE}']"
    assert parse(agent_toml(docs), "agent.toml").kubernetes.drain.skip_namespaces == ("kube-system", "gpu-operator")


def test_defaults_render_offline_with_the_smallest_budgets() -> None:
    """`helm template` (Argo CD) with default values: no node count, so each budget is its
    minimum (fewer nodes tainted or disrupted, never more), and the quota says so."""
    docs = helm({})
    for name in ("node-health-taint-budget", "node-health-disruption-budget"):
        quota = find(docs, "ResourceQuota", name)
        assert quota["spec"]["hard"] == {"count/leases.coordination.k8s.io": "1"}
        assert quota["metadata"]["annotations"]["node-health-agent/sized-from"].startswith("unknown at render")
    assert find(helm_(), "ResourceQuota", "node-health-taint-budget")["metadata"]["annotations"] == {
        "node-health-agent/sized-from": "7500 nodes"}


def test_operator_objects_only_where_the_cluster_serves_their_crds() -> None:
    bare = helm({}, api_versions=())
    assert not {"PodMonitor", "ServiceMonitor", "PrometheusRule", "Service"} & {d["kind"] for d in bare}
    assert "DaemonSet" in {d["kind"] for d in bare}
    for doc in bare:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    some = helm({"metrics": {"serviceMonitor": {"enabled": True}}},
                api_versions=("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor"))
    assert {"ServiceMonitor", "Service"} <= {d["kind"] for d in some}
    assert not {"PodMonitor", "PrometheusRule"} & {d["kind"] for d in some}


def test_extra_args_service_account_security_context_and_fullname() -> None:
    docs = helm_({"extraArgs": ["--log-level", "debug"], "fullnameOverride": "nha",
                  "serviceAccount": {"annotations": {"example.com/role": "x"}},
                  "securityContext": {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0}})
    c = container(docs)
    assert c["args"] == ["run", "--config", "/etc/node-health-agent/agent.toml", "--log-level", "debug"]
    assert c["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0}
    assert find(docs, "DaemonSet")["metadata"]["name"] == "nha"
    sa = find(docs, "ServiceAccount")
    assert sa["metadata"]["name"] == "nha" and sa["metadata"]["annotations"] == {"example.com/role": "x"}
    assert find(docs, "ConfigMap", "nha-config")
    # An existing ServiceAccount: not created; the pods, bindings and admission policies name it.
    docs = helm_({"serviceAccount": {"create": False, "name": "gpu-agent"}})
    assert "ServiceAccount" not in {d["kind"] for d in docs}
    assert find(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-agent"
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-agent", "namespace": NAMESPACE}]
    for vap in (d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"):
        assert vap["spec"]["matchConditions"][0]["expression"].endswith(f"'system:serviceaccount:{NAMESPACE}:gpu-agent'")


def test_taint_budget_off() -> None:
    docs = helm_({"taintBudget": {"enabled": False}})
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "ResourceQuota") == [
        "node-health-disrupted", "node-health-disruption-budget"]
    assert not [d for d in docs if d["metadata"]["name"].endswith("-budget") and d["kind"] != "ResourceQuota"]
    lease = find(docs, "ValidatingAdmissionPolicy", "node-health-agent-own-lease")
    assert lease["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "node-health-disruption", "node-health-disrupted"]
    assert parse(agent_toml(docs), "agent.toml").kubernetes.budget.enabled is False


def test_both_budgets_and_the_breaker_off() -> None:
    docs = helm({"taintBudget": {"enabled": False}, "disruptionBudget": {"enabled": False},
                 "breaker": {"enabled": False}})  # no node count needed then
    assert not [d for d in docs if d["kind"] == "ResourceQuota" or "budget" in d["metadata"]["name"]
                or d["metadata"]["name"].endswith(("-disruption", "own-lease", "-breaker", "trip-only"))]
    assert parse(agent_toml(docs), "agent.toml").kubernetes.breaker.enabled is False
    assert parse(agent_toml(docs), "agent.toml").kubernetes.disruption_budget.enabled is False


def test_monitor_toggles(chart: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in chart}
    assert "PodMonitor" in kinds and "ServiceMonitor" not in kinds and "Service" not in kinds
    assert "PrometheusRule" in kinds and "PrometheusRule" not in {d["kind"] for d in helm_({"prometheusRule": {"enabled": False}})}
    docs = helm_({"metrics": {"podMonitor": {"enabled": False}, "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}})
    assert "PodMonitor" not in {d["kind"] for d in docs}
    svc, sm = find(docs, "Service"), find(docs, "ServiceMonitor")
    pod_labels = find(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"].items() <= pod_labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    assert sm["spec"]["endpoints"][0]["scheme"] == "http"


def test_the_metrics_path_reaches_the_agent_and_both_monitors_and_the_probes_keep_healthz() -> None:
    for path, values in (("/metrics", {}), ("/node/metrics", {"path": "/node/metrics"})):
        docs = helm_({"metrics": {**values, "serviceMonitor": {"enabled": True}}})
        assert parse(agent_toml(docs), "agent.toml").metrics.telemetry_path == path
        for kind, key in (("PodMonitor", "podMetricsEndpoints"), ("ServiceMonitor", "endpoints")):
            (ep,) = find(docs, kind)["spec"][key]
            assert ep["path"] == path, kind
        c = container(docs)
        assert {c[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"/healthz"}


def test_the_dashboard_for_grafanas_sidecar_is_the_dashboard_file() -> None:
    """On by default, as kube-prometheus-stack ships its dashboards: a ConfigMap labelled grafana_dashboard: "1"
    holding dashboards/node-health-agent.json itself (the chart's files/ links to it, nothing to drift)."""
    root = Path(__file__).parent.parent.parent
    shipped = root / "dashboards" / "node-health-agent.json"
    assert (root / "charts/node-health-agent/files/node-health-agent.json").resolve() == shipped.resolve()
    cm = find(helm_(), "ConfigMap", "node-health-agent-dashboard")
    assert cm["metadata"]["namespace"] == NAMESPACE and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in cm["metadata"]
    assert cm["data"]["node-health-agent.json"] == shipped.read_text().rstrip("\n")
    # kubectl's client-side apply (Argo CD's default) keeps the object in a 256 KiB annotation
    assert len(cm["data"]["node-health-agent.json"]) < 200_000
    custom = find(helm_({"grafanaDashboard": {"label": "grafana_dashboards", "labelValue": "gpu", "namespace": "monitoring",
                                              "labels": {"team": "ml"}, "annotations": {"grafana_folder": "GPU"}}}),
                  "ConfigMap", "node-health-agent-dashboard")
    assert custom["metadata"]["namespace"] == "monitoring" and custom["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert {"grafana_dashboards": "gpu", "team": "ml"}.items() <= custom["metadata"]["labels"].items()
    assert "grafana_dashboard" not in custom["metadata"]["labels"]
    assert not [d for d in helm_({"grafanaDashboard": {"enabled": False}}) if d["metadata"]["name"].endswith("-dashboard")]


def test_tls_moves_probes_and_monitors_to_https() -> None:
    docs = helm_(EVERYTHING_ON)
    c = container(docs)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS", probe
    for monitor, endpoints in (("PodMonitor", "podMetricsEndpoints"), ("ServiceMonitor", "endpoints")):
        (ep,) = find(docs, monitor)["spec"][endpoints]
        assert ep["scheme"] == "https" and ep["tlsConfig"]["ca"] == {"secret": {"name": "agent-tls", "key": "ca.crt"}}
    tls = parse(agent_toml(docs), "agent.toml").metrics.tls
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert tls.cert_file == mounts["tls"] + "/tls.crt" and tls.key_file == mounts["tls"] + "/tls.key"
    volumes = {v["name"]: v for v in find(docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "agent-tls"
    assert not tls.client_ca_file


def test_client_certificates_turn_probes_into_tcp_checks() -> None:
    """The kubelet's probes cannot present a client certificate."""
    docs = helm_({"metrics": {"tls": {"enabled": True, "secretName": "t", "clientAuth": True,
                                      "scrape": {"certSecret": {"name": "c"}, "keySecret": {"name": "c"}}}}})
    c = container(docs)
    assert all(c[p] .get("tcpSocket") == {"port": "metrics"} and "httpGet" not in c[p]
               for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    (ep,) = find(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert ep["tlsConfig"]["cert"] == {"secret": {"name": "c", "key": "tls.crt"}}
    assert ep["tlsConfig"]["keySecret"] == {"name": "c", "key": "tls.key"}
    assert parse(agent_toml(docs), "agent.toml").metrics.tls.client_ca_file.endswith("/ca.crt")


@pytest.mark.parametrize("values", [{"metrics": {"tls": {"enabled": True}}},
                                    {"metrics": {"tls": {"enabled": True, "secretName": "t", "clientAuth": True}}}],
                         ids=["no secret", "mtls without a client cert for prometheus"])
def test_tls_without_what_it_needs_is_refused(values: dict[str, Any]) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match="metrics.tls"):
        helm_(values)


def test_nvidia_runtime_value_matches_the_kustomize_component(gpu_variant: list[dict[str, Any]]) -> None:
    docs = helm_({"nvidiaRuntime": {"enabled": True}})
    assert container(docs)["image"] == "node-health-agent:0.1.0-gpu"
    helm_ds, kust_ds = normalised(find(docs, "DaemonSet")), normalised(find(gpu_variant, "DaemonSet"))
    helm_ds["spec"]["template"]["spec"]["containers"][0].pop("image")
    kust_ds["spec"]["template"]["spec"]["containers"][0].pop("image")
    assert helm_ds == kust_ds


@pytest.mark.parametrize(("values", "key"), [
    ({"killSwitch": {"paused": "yes"}}, "paused"),
    ({"taintBudget": {"percent": 0}}, "percent"),
    ({"taintBudget": {"nodes": 7500, "precent": 5}}, "precent"),
    ({"metrics": {"port": 70000}}, "port"),
    ({"imag": {"repository": "x"}}, "imag"),
    ({"metrics": {"path": "metrics"}}, "path"),
    ({"metrics": {"path": "/healthz"}}, "path"),
])
def test_values_schema_refuses_mistakes(values: dict[str, Any], key: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=key):
        helm_(values)


RESET = {"mode": "enforce", "actions": ["drain", "reset_gpu", "reboot"]}


def test_a_gpu_reset_without_nvidia_smi_in_the_pod_is_refused_at_render() -> None:
    """The plain image has no nvidia-smi: every reset would fail and escalate to a reboot."""
    import helm_python

    with pytest.raises(helm_python.HelmError, match='remediation.actions: "reset_gpu" needs nvidia-smi'):
        helm_({"config": {"remediation": RESET}})
    # The NVIDIA runtime variant, an nvidia-smi of the operator's, observe mode, or no reset: rendered.
    helm_({"config": {"remediation": RESET}, "nvidiaRuntime": {"enabled": True}})
    helm_({"config": {"remediation": {**RESET, "gpu_reset": {"nvidia_smi": "/opt/nvidia/bin/nvidia-smi"}}}})
    helm_({"config": {"remediation": {**RESET, "mode": "observe"}}})
    docs = helm_({"config": {"remediation": {"mode": "enforce", "actions": ["drain", "reboot"]}}})
    assert parse(agent_toml(docs), "agent.toml").remediation.actions == ("drain", "reboot")


def test_monitors_take_honor_labels_relabelings_and_metric_relabelings() -> None:
    extra = {"honorLabels": False, "relabelings": [{"targetLabel": "cluster", "replacement": "eu-1"}],
             "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "node_health_gpu_clock_event_.*", "action": "drop"}]}
    docs = helm_({"metrics": {"podMonitor": extra, "serviceMonitor": {"enabled": True, **extra}}})
    for kind, key in (("PodMonitor", "podMetricsEndpoints"), ("ServiceMonitor", "endpoints")):
        (ep,) = find(docs, kind)["spec"][key]
        assert ep["honorLabels"] is False
        assert ep["relabelings"] == [
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance", "action": "replace"},
            {"targetLabel": "cluster", "replacement": "eu-1"}]
        assert ep["metricRelabelings"] == extra["metricRelabelings"]
        assert find(docs, kind)["spec"]["jobLabel"] == "app.kubernetes.io/name"
    for kind, key in (("PodMonitor", "podMetricsEndpoints"),):
        (ep,) = find(helm_(), kind)["spec"][key]
        assert ep["honorLabels"] is True and "metricRelabelings" not in ep


def test_basic_auth_on_metrics_and_the_monitors_scrape_with_it() -> None:
    """Issue 25 item 7: an authenticated /metrics from values: the users' bcrypt hashes reach agent.toml (loaded by
    the real loader), both monitors scrape with the Secret's username and password; /healthz probes stay HTTP(S)
    without credentials (the agent serves /healthz without auth)."""
    docs = helm_(BASIC_AUTH)
    cfg = parse(agent_toml(docs), "agent.toml")
    assert dict(cfg.metrics.basic_auth_users) == {"prometheus": HASH}
    for monitor, endpoints in (("PodMonitor", "podMetricsEndpoints"), ("ServiceMonitor", "endpoints")):
        (ep,) = find(docs, monitor)["spec"][endpoints]
        assert ep["basicAuth"] == {"username": {"name": "scrape", "key": "username"},
                                   "password": {"name": "scrape", "key": "password"}}
    c = container(docs)
    assert all(c[p]["httpGet"]["path"] == "/healthz" for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    assert "basicAuth" not in str(helm_()), "off by default"


@pytest.mark.parametrize(("values", "said"), [
    ({"metrics": {"basicAuth": {"enabled": True, "scrapeSecret": {"name": "s"}}}}, "metrics.basicAuth.users"),
    ({"metrics": {"basicAuth": {"enabled": True, "users": {"p": HASH}}}}, "metrics.basicAuth.scrapeSecret.name"),
    ({"metrics": {"basicAuth": {"enabled": True, "users": {"p": "plaintext"}}}}, "users"),
])
def test_basic_auth_without_what_it_needs_is_refused(values: dict[str, Any], said: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=said):
        helm_(values)
