"""The shipped Kubernetes packaging, rendered as users render it: `kubectl
kustomize` on daemonset/ (with or without its nvidia-runtime component) and
Helm's own engine (the Helm Go SDK through helm-python-sdk) on
charts/node-health-agent/."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from conftest import require_tool

ROOT = Path(__file__).parent.parent.parent
KUSTOMIZE = ROOT / "daemonset"
CHART = ROOT / "charts" / "node-health-agent"
K8S_VERSION = "1.32"  # VAP v1: 1.30; the node-name claim in bound tokens: GA in 1.32
RELEASE, NAMESPACE = "node-health-agent", "node-health"
CONFIG_MAP = "node-health-agent-config"

Doc = dict[str, Any]


def kustomize(components: Sequence[str] = ()) -> list[Doc]:
    """`kubectl kustomize daemonset/`; components are turned on as a user does, in kustomization.yaml."""
    kubectl = require_tool("kubectl")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "daemonset"
        shutil.copytree(KUSTOMIZE, base)
        if components:
            with open(base / "kustomization.yaml", "a") as fh:
                fh.write("components:\n" + "".join(f"  - {c}\n" for c in components))
        out = subprocess.run([kubectl, "kustomize", str(base)], capture_output=True, text=True, check=True, timeout=120)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# What a cluster with the Prometheus Operator serves (`helm template --api-versions ...`,
# as Argo CD passes its cluster's): the chart renders its monitors and rules only where these are.
OPERATOR_APIS = ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/PodMonitor",
                 "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule")


def helm(values: Mapping[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE,
         api_versions: Sequence[str] = OPERATOR_APIS) -> list[Doc]:
    """`helm template --api-versions ...` through Helm's own engine; a template's `fail` raises
    helm_python.HelmError, a value the schema refuses helm_python.HelmValuesError."""
    import json

    import helm_python
    from helm_python import _native

    opts = {"name": name, "namespace": namespace, "api_versions": list(api_versions)}
    with helm_python.Chart.load(str(CHART)) as chart:
        # Chart.render does not pass api_versions; the SDK's helm_render takes them.
        rendered = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(dict(values or {})),
                                                  json.dumps(opts)))
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


def find(docs: Sequence[Doc], kind: str, name: str | None = None) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def agent_toml(docs: Sequence[Doc], name: str = CONFIG_MAP) -> str:
    return str(find(docs, "ConfigMap", name)["data"]["agent.toml"])


def container(docs: Sequence[Doc]) -> Doc:
    (c,) = find(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c
