"""PromQL as Prometheus reads it: expressions parsed by a real PromQL parser
(promql-parser, the Rust parser behind GreptimeDB) to list the metrics they
name, and by Prometheus' own parser (`promtool check rules`) to prove they parse."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from conftest import require_tool

# Series Prometheus itself makes, which the agent's catalog does not declare.
PROMETHEUS_SERIES = frozenset({"up"})


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield from _walk(child)
    for child in getattr(node, "args", None) or ():
        yield from _walk(child)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (by name or by a __name__ matcher)."""
    names: set[str] = set()
    for node in _walk(promql_parser.parse(expr)):
        if type(node).__name__ != "VectorSelector":
            continue
        if node.name:
            names.add(node.name)
        for m in node.matchers.matchers:
            if m.name == "__name__":
                names.add(m.value)
    return names


def promtool_parses(exprs: Iterable[str], tmp: Path) -> None:
    """Every expression parses with Prometheus' own parser (as recording rules)."""
    promtool = require_tool("promtool")
    rules = [{"record": f"expression:{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp / "expressions.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "expressions", "rules": rules}]}))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def promtool_lint(text: str) -> str:
    """What `promtool check metrics` says about an exposition: '' when clean."""
    promtool = require_tool("promtool")
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    said = (res.stdout + res.stderr).strip()
    assert res.returncode == 0 or said, f"promtool exited {res.returncode} without saying why"
    return said
