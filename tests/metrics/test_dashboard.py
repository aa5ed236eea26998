"""The Grafana dashboard (dashboards/node-health-agent.json): every expression
parses (Prometheus' own parser through promtool, and promql-parser) and names
only metrics a default-config agent exports or node_exporter series that
docs/metrics.md names; none relies on a series docs/metrics.md tells users to
drop; the fleet overview and the node drill-down have the panels
docs/alerts.md promises."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from conftest import update_requested
from promql import PROMETHEUS_SERIES, metric_names, promtool_parses

from agent.metrics import NVLINK_PER_GPU, RenderOptions
from agent.registry import CATALOG, FEATURES
from agent.settings import MetricsSection

ROOT = Path(__file__).parent.parent.parent
DASHBOARD = ROOT / "dashboards" / "node-health-agent.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
GOLDEN = ROOT / "tests" / "golden" / "metrics.txt"
# The kustomize base's copy (kustomize reads no file outside daemonset/); the chart links to the file itself.
KUSTOMIZE_CONFIGMAP = ROOT / "daemonset" / "grafana-dashboard.yaml"
KUSTOMIZE_HEAD = """\
# The Grafana dashboard (dashboards/node-health-agent.json) as a ConfigMap for
# Grafana's dashboard sidecar (kube-prometheus-stack: label grafana_dashboard "1").
# Do not edit: NHA_UPDATE_DASHBOARD=1 python -m pytest tests/metrics/test_dashboard.py
# rewrites it from the dashboard; the chart renders the same (grafanaDashboard).
apiVersion: v1
kind: ConfigMap
metadata:
  name: node-health-agent-dashboard
  namespace: node-health
  labels:
    app.kubernetes.io/name: node-health-agent
    grafana_dashboard: "1"
data:
  node-health-agent.json: |-
"""
# Features whose families the golden scrape's fixture host cannot show: no NVML (GPU telemetry), no cluster,
# traffic accounting off, no finished burn. Their families count as exported when the defaults keep them.
GOLDEN_BLIND = ("gpu", "gpu_telemetry", "kube", "traffic", "burn", "remediation")
FLEET_PANELS = {
    "Nodes by state",
    "Active findings by reason",
    "GPU Xids over time",
    "Taint budget and kill switch",
    "Internet vs cluster traffic",
    "Kubernetes API requests",
}
# Grafana's interval variables become a duration, the dashboard's own variables a label value.
INTERVALS = re.compile(r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}")
VARIABLE = re.compile(r"\$\{?(\w+)\}?")
LABEL_VALUES = re.compile(r"^label_values\((.+),\s*\w+\)$", re.S)


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(items: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    for p in dashboard()["panels"] if items is None else items:
        yield p
        yield from panels(p.get("panels", []))


def as_promql(expr: str) -> str:
    """What Prometheus receives once Grafana has put in its variables."""
    return VARIABLE.sub("x", INTERVALS.sub("5m", expr))


def expressions() -> list[tuple[str, str]]:
    """(where, expression) for every panel target and every query variable."""
    out = [(f"panel {p['title']!r} {t['refId']}", t["expr"]) for p in panels() for t in p.get("targets", [])]
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = LABEL_VALUES.match(query)
            assert m, f"variable {var['name']}: label_values(<selector>, <label>) expected, got {query!r}"
            out.append((f"variable {var['name']}", m.group(1)))
    return out


def _overlap() -> dict[str, set[str]]:
    """docs/metrics.md's overlap table: the agent's family -> node_exporter's families for the same data."""
    out: dict[str, set[str]] = {}
    for line in METRICS_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`node_health_"):
            out[cells[0].strip("`")] = {n.split("{")[0] for n in re.findall(r"`(node_[a-z_]+(?:\{[a-z_]+\})?)`", cells[1])}
    assert len(out) >= 20, "the overlap table of docs/metrics.md was not found"
    return out


def _dropped() -> re.Pattern[str]:
    """The drop rule docs/metrics.md gives node_exporter users ("Dropping one side")."""
    m = re.search(r"regex: (node_health_\S+)\n\s+action: drop", METRICS_DOC.read_text())
    assert m, "the drop rule of docs/metrics.md was not found"
    return re.compile(m.group(1))


def _default_families() -> set[str]:
    """What a default-config agent exports: the golden scrape's families (a fixture host, default [metrics]), and
    the families of the features that host cannot show, less what the default [metrics] section leaves out."""
    out = {line.split("{")[0].split(" ")[0] for line in GOLDEN.read_text().splitlines() if line and line[0] != "#"}
    out |= {m.name for f in GOLDEN_BLIND for m in FEATURES[f][1]}
    options = RenderOptions.of(MetricsSection())
    if not options.nvlink_per_link:  # folded per GPU at render
        out = (out - set(NVLINK_PER_GPU)) | set(NVLINK_PER_GPU.values())
    return {n for n in out if not any(re.fullmatch(fnmatch.translate(p), n) for p in options.exclude)}


def _children(node: Any) -> Iterator[Any]:
    for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield child
    yield from getattr(node, "args", None) or ()


def _names(node: Any) -> Iterator[str]:
    if type(node).__name__ == "VectorSelector" and node.name:
        yield node.name
    for child in _children(node):
        yield from _names(child)


def reliance(expr: str) -> set[str]:
    """The series to drop that `expr` relies on: those not on the right of an `or` whose left side reads their
    node_exporter counterpart (`A or on(...) B`: B only where node_exporter has no series)."""
    overlap, dropped = _overlap(), _dropped()
    out: set[str] = set()

    def walk(node: Any, fallback: frozenset[str]) -> None:
        if type(node).__name__ == "VectorSelector" and node.name and dropped.fullmatch(node.name):
            if node.name not in fallback:
                out.add(node.name)
        if type(node).__name__ == "BinaryExpr" and str(node.op) == "or":
            left = set(_names(node.lhs))
            walk(node.lhs, fallback)
            walk(node.rhs, fallback | {a for a, ne in overlap.items() if ne & left})
            return
        for child in _children(node):
            walk(child, fallback)

    walk(promql_parser.parse(as_promql(expr)), frozenset())
    return out


def test_there_are_expressions() -> None:
    assert len(expressions()) >= 20


@pytest.mark.parametrize(("where", "expr"), expressions(), ids=[w for w, _ in expressions()])
def test_every_expression_names_only_series_of_a_default_install(where: str, expr: str) -> None:
    """What a default-config agent exports (not per-link NVLink, which is off by default), or node_exporter's
    series for the same data, named in docs/metrics.md's overlap table."""
    names = metric_names(as_promql(expr))
    assert names, f"{where} selects no metric"
    node_exporter = set().union(*_overlap().values())
    assert names <= _default_families() | node_exporter | PROMETHEUS_SERIES, \
        f"{where}: {names - _default_families() - node_exporter - PROMETHEUS_SERIES}"


@pytest.mark.parametrize(("where", "expr"), expressions(), ids=[w for w, _ in expressions()])
def test_no_expression_relies_on_a_series_the_docs_tell_users_to_drop(where: str, expr: str) -> None:
    """docs/metrics.md tells node_exporter users to drop the agent's overlapping series: a panel reads
    node_exporter's and falls back to the agent's only where node_exporter has none (three panels went blank)."""
    assert not reliance(expr), f"{where} relies on {sorted(reliance(expr))}"


@pytest.mark.parametrize(("expr", "relied"), [
    pytest.param('rate(node_health_network_receive_errors_total{instance=~"$instance"}[5m])',
                 {"node_health_network_receive_errors_total"}, id="a dropped series alone"),
    pytest.param("node_network_receive_errs_total or node_health_network_receive_errors_total", set(),
                 id="as node_exporter's fallback"),
    pytest.param("node_network_receive_errs_total or node_health_network_receive_drops_total",
                 {"node_health_network_receive_drops_total"}, id="the fallback of another series"),
    pytest.param("node_health_disk_size_bytes or node_filesystem_size_bytes", {"node_health_disk_size_bytes"},
                 id="in front of node_exporter's"),
])
def test_the_reliance_check_can_fail(expr: str, relied: set[str]) -> None:
    assert reliance(expr) == relied


def test_a_default_install_lacks_the_per_link_nvlink_series() -> None:
    assert "node_health_gpu_nvlink_bytes_total" not in _default_families()
    assert {"node_health_gpu_nvlink_gpu_bytes_total", "node_health_gpu_power_watts", "node_health_disk_mounted"} \
        <= _default_families()


def test_every_expression_parses_with_prometheus(tmp_path: Path) -> None:
    promtool_parses([as_promql(e) for _, e in expressions()], tmp_path)


def test_a_misspelt_metric_would_be_caught() -> None:
    """The catalog test above can fail: an expression with a name the agent never exports."""
    names = metric_names(as_promql('rate(node_health_gpu_xid_total{job=~"$job"}[$__rate_interval])'))
    assert names - set(CATALOG.metrics) == {"node_health_gpu_xid_total"}


def test_fleet_overview_and_node_drill_down() -> None:
    top = dashboard()["panels"]
    rows = [p["title"] for p in top if p["type"] == "row"]
    assert rows == ["Fleet", "Node: $instance"]
    at = [p["title"] for p in top].index("Node: $instance")
    fleet = {p["title"] for p in top[:at]}
    node = top[at + 1:]
    assert FLEET_PANELS <= fleet
    assert len(node) >= 8
    for p in node:
        for t in p["targets"]:
            assert 'instance=~"$instance"' in t["expr"], f"node panel {p['title']!r} is not about the chosen node"
    variables = {v["name"] for v in dashboard()["templating"]["list"]}
    assert variables == {"datasource", "job", "instance"}


def test_panels_use_the_chosen_data_source_and_fit_the_grid() -> None:
    taken: set[tuple[int, int]] = set()
    titles = []
    for p in panels():
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"panel {p['title']!r} overlaps another"
        taken |= cells
        titles.append(p["title"])
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["targets"] and p["description"]
    assert len(titles) == len(set(titles))


def _panel_expr(title: str, ref: str) -> str:
    (expr,) = [t["expr"] for p in panels() if p["title"] == title for t in p["targets"] if t["refId"] == ref]
    return str(expr).replace("$instance", "n1").replace("$job", "node-health-agent").replace("$__rate_interval", "5m")


def test_the_moved_panels_read_node_exporter_and_fall_back_to_the_agent(tmp_path: Path) -> None:
    """Evaluated by Prometheus (promtool test rules): node_exporter's series where it has them, for the mounts
    the agent watches and the physical interfaces; the agent's own only where node_exporter has none."""
    import subprocess

    import yaml
    from conftest import require_tool

    ne, nha = 'job="node-exporter",instance="n1"', 'job="node-health-agent",instance="n1"'
    series = {
        f'node_filesystem_avail_bytes{{{ne},mountpoint="/",device="vda1",fstype="ext4"}}': "25x10",
        f'node_filesystem_size_bytes{{{ne},mountpoint="/",device="vda1",fstype="ext4"}}': "100x10",
        f'node_filesystem_avail_bytes{{{ne},mountpoint="/boot",device="vda2",fstype="ext4"}}': "1x10",  # not watched
        f'node_filesystem_size_bytes{{{ne},mountpoint="/boot",device="vda2",fstype="ext4"}}': "2x10",
        f'node_health_disk_mounted{{{nha},mountpoint="/"}}': "1x10",
        f'node_health_disk_mounted{{{nha},mountpoint="/data"}}': "1x10",
        f'node_health_disk_available_bytes{{{nha},mountpoint="/"}}': "50x10",  # node_exporter's wins
        f'node_health_disk_size_bytes{{{nha},mountpoint="/"}}': "100x10",
        f'node_health_disk_available_bytes{{{nha},mountpoint="/data"}}': "10x10",  # node_exporter does not see it
        f'node_health_disk_size_bytes{{{nha},mountpoint="/data"}}': "40x10",
        f'node_health_build_info{{{nha},version="0.1.0",native="true",python="3.12"}}': "1x10",
        f'node_network_receive_errs_total{{{ne},device="eth0"}}': "0+60x10",
        f'node_network_transmit_errs_total{{{ne},device="eth0"}}': "0+0x10",
        f'node_network_receive_errs_total{{{ne},device="veth1a2b"}}': "0+600x10",  # a pod's end: left out
        f'node_network_transmit_errs_total{{{ne},device="veth1a2b"}}': "0+0x10",
        f'node_health_network_receive_errors_total{{{nha},device="eth0"}}': "0+120x10",  # node_exporter's wins
        f'node_health_network_transmit_errors_total{{{nha},device="eth0"}}': "0+0x10",
        f'node_health_network_receive_errors_total{{{nha},device="eth1"}}': "0+30x10",
        f'node_health_network_transmit_errors_total{{{nha},device="eth1"}}': "0+0x10",
    }
    tests = [{"interval": "1m", "input_series": [{"series": k, "values": v} for k, v in series.items()],
              "promql_expr_test": [
                  {"expr": _panel_expr("Disk space used", "A"), "eval_time": "5m", "exp_samples": [
                      {"labels": '{job="node-exporter",instance="n1",mountpoint="/",device="vda1",fstype="ext4"}',
                       "value": 0.75},
                      {"labels": '{job="node-health-agent",instance="n1",mountpoint="/data"}', "value": 0.75}]},
                  {"expr": _panel_expr("Link errors and drops", "A"), "eval_time": "5m", "exp_samples": [
                      {"labels": '{job="node-exporter",instance="n1",device="eth0"}', "value": 1},
                      {"labels": '{job="node-health-agent",instance="n1",device="eth1"}', "value": 0.5}]},
              ]}]
    path = tmp_path / "panels.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    res = subprocess.run([require_tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_kustomize_base_carries_the_dashboard_file_as_the_chart_does() -> None:
    """daemonset/grafana-dashboard.yaml is the dashboard, byte for byte (the chart's render is compared with the
    kustomize base in tests/kube/test_kube_packaging.py)."""
    body = DASHBOARD.read_text().rstrip("\n")
    want = KUSTOMIZE_HEAD + "".join(f"    {line}\n" if line else "\n" for line in body.split("\n"))
    if update_requested("NHA_UPDATE_DASHBOARD"):
        KUSTOMIZE_CONFIGMAP.write_text(want)
        pytest.skip(f"{KUSTOMIZE_CONFIGMAP} rewritten from the dashboard")
    assert KUSTOMIZE_CONFIGMAP.read_text() == want, \
        "NHA_UPDATE_DASHBOARD=1 python -m pytest tests/metrics/test_dashboard.py rewrites daemonset/grafana-dashboard.yaml"
    import yaml

    assert yaml.safe_load(want)["data"]["node-health-agent.json"] == body
