"""The shipped alert rules: valid for Prometheus, unit-tested with promtool
(every alert firing and not firing), the PrometheusRule equal to the plain
rules file, a runbook for every alert, and only metrics the catalog declares.

To rewrite daemonset/prometheusrule.yaml after changing the rules file:
    NHA_UPDATE_ALERTS=1 python -m pytest tests/metrics/test_alerts.py
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import require_tool, update_requested
from kube_render import find, helm
from promql import PROMETHEUS_SERIES, metric_names

from agent.registry import CATALOG

ROOT = Path(__file__).parent.parent.parent
RULES = ROOT / "alerts" / "node-health-agent.rules.yml"
UNIT_TESTS = sorted((ROOT / "alerts" / "tests").glob("*.test.yml"))
PROMETHEUS_RULE = ROOT / "daemonset" / "prometheusrule.yaml"
RUNBOOKS = ROOT / "docs" / "alerts.md"
RUNBOOK_BASE = "https://github.com/node-health-agent/node-health-agent/blob/main/docs/alerts.md#"
PROMETHEUS_RULE_HEAD = """\
# The alert rules as a Prometheus Operator PrometheusRule: generated from
# alerts/node-health-agent.rules.yml (the canonical file; runbooks in docs/alerts.md).
# Do not edit: NHA_UPDATE_ALERTS=1 python -m pytest tests/metrics/test_alerts.py rewrites it.
# The Prometheus' ruleSelector must match these labels (kube-prometheus-stack:
# ruleSelectorNilUsesHelmValues=false, or add its release label here).
"""


def groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RULES.read_text())["groups"])


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups() for r in g["rules"] if "alert" in r}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """promtool's output in the order it wrote it (results on stdout, failures on stderr)."""
    return subprocess.run([require_tool("promtool"), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)


def prometheus_rule() -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "node-health-agent",
            "namespace": "node-health",
            "labels": {"app.kubernetes.io/name": "node-health-agent"},
        },
        "spec": {"groups": groups()},
    }


def test_the_prometheusrule_carries_the_rules_file() -> None:
    text = PROMETHEUS_RULE_HEAD + yaml.safe_dump(prometheus_rule(), sort_keys=False, width=120)
    if update_requested("NHA_UPDATE_ALERTS"):
        PROMETHEUS_RULE.write_text(text)
    assert yaml.safe_load(PROMETHEUS_RULE.read_text()) == prometheus_rule(), (
        "daemonset/prometheusrule.yaml differs from alerts/: NHA_UPDATE_ALERTS=1 python -m pytest tests/metrics/test_alerts.py"
    )


def test_promtool_check_rules(tmp_path: Path) -> None:
    spec = tmp_path / "from-prometheusrule.yml"
    spec.write_text(yaml.safe_dump(yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]))
    res = promtool("check", "rules", str(RULES), str(spec))
    assert res.returncode == 0, res.stdout
    assert res.stdout.count(f"SUCCESS: {len(alerts())} rules found") == 2, res.stdout


def test_promtool_unit_tests_pass() -> None:
    res = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in (c for f in UNIT_TESTS for c in yaml.safe_load(f.read_text())["tests"]):
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert sorted(set(alerts()) - fires) == [], "alerts no unit test sees firing"
    assert sorted(set(alerts()) - quiet) == [], "alerts no unit test sees quiet"


def test_the_unit_tests_catch_each_alert_that_cannot_fire(tmp_path: Path) -> None:
    """The same unit tests, against rules where one alert never fires, must fail
    on that alert: one copy per alert, all run by one promtool."""
    copies: dict[str, list[Path]] = {}
    for name in alerts():
        broken = groups()
        for r in (r for g in broken for r in g["rules"] if r.get("alert") == name):
            r["expr"] = "vector(1) == 0"
        (tmp_path / name / "tests").mkdir(parents=True)
        (tmp_path / name / RULES.name).write_text(yaml.safe_dump({"groups": broken}))
        copies[name] = [tmp_path / name / "tests" / f.name for f in UNIT_TESTS]
        for src, dst in zip(UNIT_TESTS, copies[name]):
            dst.write_text(src.read_text())
    res = promtool("test", "rules", *(str(p) for paths in copies.values() for p in paths))
    said = res.stdout
    assert res.returncode != 0
    for name, paths in copies.items():
        sections = [said.split(f"Unit Testing:  {p}", 1)[1].split("Unit Testing:", 1)[0] for p in paths]
        assert any("FAILED" in s and f"alertname: {name}," in s for s in sections), f"{name}: {sections}"


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    out = set()
    for m in re.finditer(r"^#+ (.+)$", markdown, re.M):
        out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("name", sorted(alerts()))
def test_every_alert_has_a_runbook_and_says_what_and_where(name: str) -> None:
    rule = alerts()[name]
    assert rule["labels"]["severity"] in ("critical", "warning")
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    url = rule["annotations"]["runbook_url"]
    assert url == RUNBOOK_BASE + name.lower()
    assert name.lower() in _anchors(RUNBOOKS.read_text()), f"docs/alerts.md has no section {name}"


def test_the_rules_name_only_metrics_the_catalog_declares() -> None:
    for name, rule in alerts().items():
        names = metric_names(rule["expr"])
        assert names, f"{name} selects no metric"
        assert names - set(CATALOG.metrics) <= PROMETHEUS_SERIES, f"{name}: {names - set(CATALOG.metrics)}"


CHART_NODES = {"taintBudget": {"nodes": 10}}


def chart_rule_spec(values: dict[str, Any], name: str = "node-health-agent") -> dict[str, Any]:
    return dict(find(helm({**CHART_NODES, **values}, name=name), "PrometheusRule")["spec"])


def test_the_charts_prometheusrule_is_the_rules_file_by_default() -> None:
    assert chart_rule_spec({}) == {"groups": groups()}


def test_the_chart_templates_the_agent_selector_and_runbook_urls(tmp_path: Path) -> None:
    spec = chart_rule_spec({"prometheusRule": {"agentSelector": 'job="gpu-agents",cluster="eu-1"',
                                               "runbookBaseURL": "https://runbooks.example.com/nha#"}})
    rules = {r["alert"]: r for g in spec["groups"] for r in g["rules"]}
    assert set(rules) == set(alerts())
    assert rules["NodeHealthAgentDown"]["expr"] == 'up{job="gpu-agents",cluster="eu-1"} == 0'
    assert rules["NodeHealthAgentAbsent"]["expr"] == 'absent(up{job="gpu-agents",cluster="eu-1"})'
    for name, rule in rules.items():
        assert rule["annotations"]["runbook_url"] == "https://runbooks.example.com/nha#" + name.lower()
    path = tmp_path / "chart-rules.yml"
    path.write_text(yaml.safe_dump(spec))
    res = promtool("check", "rules", str(path))
    assert res.returncode == 0, res.stdout


def _job(docs: list[dict[str, Any]], kind: str) -> str:
    """The job the Prometheus Operator gives a monitor's targets: the value of its jobLabel on
    the pods (PodMonitor) or the Service (ServiceMonitor); without jobLabel, <namespace>/<name>
    (PodMonitor) or the Service's name."""
    monitor = find(docs, kind)
    owner = (find(docs, "DaemonSet")["spec"]["template"] if kind == "PodMonitor"
             else find(docs, "Service", monitor["metadata"]["name"] + "-metrics"))
    label = monitor["spec"].get("jobLabel")
    if label and label in owner["metadata"]["labels"]:
        return str(owner["metadata"]["labels"][label])
    return f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}" if kind == "PodMonitor" \
        else str(owner["metadata"]["name"])


@pytest.mark.parametrize("release", ["node-health-agent", "gpu-agents"])
@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_every_release_and_monitor_gives_the_job_the_alerts_select(release: str, kind: str) -> None:
    docs = helm({**CHART_NODES, "metrics": {"serviceMonitor": {"enabled": True}}}, name=release)
    selector = yaml.safe_load(Path(ROOT / "charts/node-health-agent/values.yaml").read_text())["prometheusRule"]["agentSelector"]
    assert selector == f'job="{_job(docs, kind)}"'
    assert f"up{{{selector}}}" in alerts()["NodeHealthAgentDown"]["expr"]
