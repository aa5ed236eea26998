"""Metric names and labels as Prometheus users expect them.

`promtool check metrics` (Prometheus' own linter) must be silent on what the
agent serves: on the golden scrape (tests/golden/metrics.txt, what `agent run`
serves on a fixture host) and on one series of every family in the catalog,
rendered by the agent's renderer, so families the fixture host cannot produce
(GPU telemetry, traffic, Kubernetes) are linted too.

docs/metrics.md lists the families that repeat node_exporter series; they
must carry node_exporter's label for the same thing, and the drop rule there
must match exactly those families.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType

import pytest
from promql import promtool_lint

from agent.findings import Sample
from agent.metrics import TextRenderer
from agent.registry import CATALOG
from agent.store import Snapshot

ROOT = Path(__file__).parent.parent.parent
GOLDEN = ROOT / "tests" / "golden" / "metrics.txt"
OVERLAP_DOC = ROOT / "docs" / "metrics.md"
# node_exporter's label names for the things both label (collector/netdev_*.go,
# collector/netclass_linux.go, collector/filesystem_common.go).
NODE_EXPORTER_LABELS = {"device", "mountpoint"}


def every_family() -> str:
    samples = tuple(
        Sample(spec.name, 1.0, tuple((label, f"{label}-value") for label in spec.labels))
        for spec in CATALOG.metrics.values()
        if spec.name != "node_health_build_info"  # the renderer writes it itself
    )
    empty = MappingProxyType({})
    snap = Snapshot(1, empty, empty, empty, empty, 0.0, 0.0, extra=MappingProxyType({"all": samples}))
    return TextRenderer(CATALOG).render(snap)


def test_promtool_is_silent_on_the_golden_scrape() -> None:
    text = GOLDEN.read_text().replace("<v>", "1")
    assert promtool_lint(text) == ""


def test_promtool_is_silent_on_every_catalog_family() -> None:
    text = every_family()
    assert text.count("# TYPE ") == len(CATALOG.metrics)
    assert promtool_lint(text) == ""


def test_promtool_lint_reports_a_count_suffix_on_a_gauge() -> None:
    """The linter under the two tests above does flag what they guard against."""
    said = promtool_lint("# HELP node_health_gpu_count GPUs.\n# TYPE node_health_gpu_count gauge\nnode_health_gpu_count 1\n")
    assert '"_count" suffix' in said


def _overlap_rows() -> list[tuple[str, str, tuple[str, ...]]]:
    text = OVERLAP_DOC.read_text()
    table = text.split("<!-- overlap table", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`node_health_"):
            labels = tuple(re.findall(r"`(\w+)`", cells[2]))
            rows.append((cells[0].strip("`"), cells[1], labels))
    return rows


def test_the_overlap_table_names_catalog_families_with_node_exporter_labels() -> None:
    rows = _overlap_rows()
    assert len(rows) == 20
    for name, theirs, labels in rows:
        spec = CATALOG.metric(name)
        assert set(labels) <= set(spec.labels), f"{name}: the table says {labels}, the catalog {spec.labels}"
        assert set(spec.labels) & NODE_EXPORTER_LABELS, f"{name} joins node_exporter's {theirs} by no shared label"


def test_the_documented_drop_rule_drops_exactly_the_overlap() -> None:
    m = re.search(r"regex: (node_health_\S+)\n\s+action: drop", OVERLAP_DOC.read_text())
    assert m, "docs/metrics.md has a metric_relabel_configs drop rule"
    rule = re.compile(m.group(1))  # Prometheus anchors relabel regexes at both ends
    dropped = {name for name in CATALOG.metrics if rule.fullmatch(name)}
    assert dropped == {name for name, _, _ in _overlap_rows()}


@pytest.mark.parametrize("old", ["interface", "path"])
def test_no_family_keeps_a_label_node_exporter_names_otherwise(old: str) -> None:
    assert [m.name for m in CATALOG.metrics.values() if old in m.labels] == []
