"""The Grafana dashboard (dashboards/node-health-agent.json): every expression
parses (Prometheus' own parser through promtool, and promql-parser) and names
only metrics the agent's catalog declares; the fleet overview and the node
drill-down have the panels docs/alerts.md promises."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from promql import PROMETHEUS_SERIES, metric_names, promtool_parses

from agent.registry import CATALOG

DASHBOARD = Path(__file__).parent.parent.parent / "dashboards" / "node-health-agent.json"
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


def test_there_are_expressions() -> None:
    assert len(expressions()) >= 20


@pytest.mark.parametrize(("where", "expr"), expressions(), ids=[w for w, _ in expressions()])
def test_every_expression_names_only_catalog_metrics(where: str, expr: str) -> None:
    names = metric_names(as_promql(expr))
    assert names, f"{where} selects no metric"
    assert names - set(CATALOG.metrics) <= PROMETHEUS_SERIES, f"{where}: {names - set(CATALOG.metrics)}"


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
