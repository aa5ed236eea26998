"""Pod attribution behind the Prometheus Operator: a real Prometheus scrapes
`agent run` (fake NVML, a fake kubelet allocating GPU 0 to ml/train-0) with the
scrape job prometheus-operator generates for the chart's PodMonitor, target
labels of the agent's own pod included. The join queries (docs/dcgm-exporter.md) and the
dashboard's "Pods and processes on GPUs" table must name the workload's pod,
not the agent's. A second job, the same PodMonitor with honorLabels false,
shows what they would say without it (exported_pod, the agent's pod)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agentproc import Agent, free_port
from conftest import require_tool
from fakekubelet import FakeKubelet
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures
from kube_render import NAMESPACE, find, helm

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent.parent
AGENT_POD, NODE = "node-health-agent-x7k2p", "gpu-node-1"
NODES = {"taintBudget": {"nodes": 10}}


def _snake(key: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    """A monitor's RelabelConfig (camelCase) as Prometheus takes it, as the Operator converts it."""
    return {_snake(k): v for k, v in rule.items()}


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def operator_job(monitor: dict[str, Any], target: str, pod_labels: dict[str, str], container: str,
                 node: str) -> dict[str, Any]:
    """The scrape job prometheus-operator generates for a PodMonitor's first endpoint
    (pkg/prometheus/promcfg.go, generatePodMonitorConfig; its testdata/*PodMonitor*.golden),
    with Kubernetes service discovery replaced by one static target carrying the
    __meta_kubernetes_* labels that discovery gives the agent's pod."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    (ep,) = monitor["spec"]["podMetricsEndpoints"]
    relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, value in sorted(monitor["spec"]["selector"].get("matchLabels", {}).items()):
        relabel.append({"action": "keep", "regex": f"({value});true", "source_labels": [
            f"__meta_kubernetes_pod_label_{_sanitize(key)}", f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"]})
    relabel += [
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": ep["port"]},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{ns}/{name}"},
        *([{"source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(monitor['spec']['jobLabel'])}"],
            "target_label": "job", "regex": "(.+)", "replacement": "${1}"}] if monitor["spec"].get("jobLabel") else []),
        {"target_label": "endpoint", "replacement": ep["port"]},
        *(_relabel(r) for r in ep.get("relabelings", [])),
        {"source_labels": ["__address__"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
        {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"},
    ]
    meta = {
        "__meta_kubernetes_namespace": ns,
        "__meta_kubernetes_pod_name": AGENT_POD,
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_pod_container_port_name": ep["port"],
        "__meta_kubernetes_pod_node_name": node,
        "__meta_kubernetes_pod_phase": "Running",
    }
    for key, value in pod_labels.items():
        meta[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = value
        meta[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
    job: dict[str, Any] = {
        "job_name": f"podMonitor/{ns}/{name}/0",
        "honor_labels": bool(ep.get("honorLabels", False)),
        "scrape_interval": "1s",  # the monitor's 30s, shortened for the test
        "metrics_path": ep["path"],
        "scheme": ep["scheme"],
        "static_configs": [{"targets": [target], "labels": meta}],
        "relabel_configs": relabel,
    }
    if ep.get("metricRelabelings"):
        job["metric_relabel_configs"] = [_relabel(r) for r in ep["metricRelabelings"]]
    return job


class Prometheus:
    def __init__(self, tmp: Path, jobs: list[dict[str, Any]]) -> None:
        binary = require_tool("prometheus")
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}))
        self.port = free_port()
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback
            body = json.load(r)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def poll(self, expr: str, pred: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                last = self.query(expr)
                if pred(last):
                    return last
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        raise AssertionError(f"{expr}: {last}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="nha-", dir="/tmp")  # short: a unix socket path has 108 bytes
    os.makedirs(os.path.join(path, "pods"))
    yield path
    shutil.rmtree(path)


def readme_join_queries() -> list[str]:
    """The PromQL of docs/dcgm-exporter.md's "GPUs and pods: the join" section (the README's first query is
    its first), one query per entry."""
    text = (ROOT / "docs" / "dcgm-exporter.md").read_text().split("## GPUs and pods: the join", 1)[1]
    block = text.split("```promql\n", 1)[1].split("```", 1)[0]
    queries, current = [], ""
    for line in block.splitlines():
        if line.startswith("#"):
            if current.strip():
                queries.append(current)
            current = ""
        else:
            current += line + "\n"
    return [*queries, current] if current.strip() else queries


def dashboard_pod_table() -> list[str]:
    board = json.loads((ROOT / "dashboards" / "node-health-agent.json").read_text())
    (panel,) = [p for p in board["panels"] if p.get("title") == "Pods and processes on GPUs"]
    return [t["expr"].replace("$job", ".+").replace("$instance", ".+") for t in panel["targets"]]


def pods(result: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(r["metric"].get("namespace", ""), r["metric"].get("pod", "")) for r in result}


def test_workload_pods_survive_the_operators_target_labels(tmp_path: Path, host, scenario, fake_nvml_lib,  # type: ignore[no-untyped-def]
                                                           kubelet_root: str) -> None:
    docs = helm(NODES)
    monitor = find(docs, "PodMonitor")
    daemonset = find(docs, "DaemonSet")
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    container = daemonset["spec"]["template"]["spec"]["containers"][0]["name"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True

    host.add_gpu("0000:18:00")
    host.add_gpu("0000:28:00")
    scenario.set([h100(0), h100(1)])
    extra = (f'xid_events = false\n[checks.gpu_pods]\ninterval = "1s"\ncall_timeout = "1s"\n'
             f'pod_resources_socket = "{kubelet_root}/kubelet.sock"\npod_logs_dir = "{kubelet_root}/pods"\n'
             '[checks.burn]\nenabled = false\n[checks.gpu_telemetry]\ninterval = "1s"\n')
    agent = Agent(tmp_path, host.toml(str(tmp_path / "state"), extra, fake_nvml_lib).replace(
        "[agent]\n", "[agent]\njitter = 0.0\n"))
    kubelet = FakeKubelet(os.path.join(kubelet_root, "kubelet.sock"),
                          [("ml", "train-0", {"main": [("nvidia.com/gpu", [h100(0)["uuid"]])]})])
    target = f"127.0.0.1:{agent.port}"
    shipped = operator_job(monitor, target, labels, container, NODE)
    # The same PodMonitor without honorLabels, on a node of its own so the joins keep the two apart.
    unhonored = json.loads(json.dumps(monitor))
    unhonored["metadata"]["name"] += "-unhonored"
    unhonored["spec"]["podMetricsEndpoints"][0]["honorLabels"] = False
    plain = operator_job(unhonored, target, labels, container, "other-node")
    with kubelet:
        agent.poll(lambda t: 'pod="train-0"' in t and "node_health_gpu_power_watts{" in t, "train-0 on gpu 0")
        prom = Prometheus(tmp_path, [shipped, plain])
        try:
            sel = f'{{job="node-health-agent",instance="{NODE}"}}'  # the job the alerts' selector names
            got = prom.poll("node_health_gpu_allocation" + sel, lambda r: len(r) == 1)
            assert got[0]["metric"]["namespace"] == "ml" and got[0]["metric"]["pod"] == "train-0"
            assert got[0]["metric"]["container"] == "main" and got[0]["metric"]["instance"] == NODE
            assert "exported_pod" not in got[0]["metric"]
            # A series without pod labels keeps the target's: the agent's own pod.
            watts = prom.poll("node_health_gpu_power_watts" + sel, lambda r: len(r) == 2)
            assert {r["metric"]["pod"] for r in watts} == {AGENT_POD}

            queries = readme_join_queries()
            assert len(queries) == 4, queries
            power = prom.poll(queries[0], lambda r: len(r) == 2)  # one per job (node)
            assert pods(power) == {("ml", "train-0"), (NAMESPACE, AGENT_POD)}, power
            (mine,) = [r for r in power if r["metric"].get("pod") == "train-0"]
            assert float(mine["value"][1]) > 0
            per_container = prom.query(queries[1])
            assert ("ml", "train-0") in pods(per_container)
            # Xids per pod (none logged here: no rows, and none naming the agent) and unallocated GPUs.
            assert (NAMESPACE, AGENT_POD) not in pods([r for r in prom.query(queries[2]) if r["metric"]])
            prom.query(queries[3])

            allocation, processes = dashboard_pod_table()
            rows = [r for r in prom.query(allocation) if r["metric"]["instance"] == NODE]
            assert pods(rows) == {("ml", "train-0")}, rows
            rows = [r for r in prom.query(processes) if r["metric"]["instance"] == NODE]
            assert AGENT_POD not in {r["metric"].get("pod") for r in rows}, rows
            # Without honorLabels the workload's pod is moved to exported_pod and the agent's takes its place.
            (bad,) = prom.query('node_health_gpu_allocation{instance="other-node"}')
            assert bad["metric"]["pod"] == AGENT_POD and bad["metric"]["exported_pod"] == "train-0"
        finally:
            prom.stop()
            agent.stop()
