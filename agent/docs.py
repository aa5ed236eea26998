"""Reference tables for the README, generated from the schema and the catalog
(`agent docs config|metrics|reasons`); a test keeps the README in sync."""

from __future__ import annotations

from collections.abc import Sequence

from .config import Config
from .registry import CATALOG, CHECKS
from .schema import fields_doc


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def config_rows() -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for section in ("agent", "paths", "metrics", "kubernetes"):
        rows += fields_doc(type(getattr(Config(), section)), section)
    for name, spec in CHECKS.items():
        rows += fields_doc(spec.config, f"checks.{name}")
    return rows


def render(what: str) -> str:
    if what == "config":
        return _table(("key", "default", "meaning"), [(f"`{k}`", f"`{d}`", doc) for k, d, doc in config_rows()])
    if what == "metrics":
        metrics = sorted(CATALOG.metrics.values(), key=lambda m: m.name)
        return _table(
            ("metric", "type", "labels", "meaning"),
            [(f"`{m.name}`", m.kind, ", ".join(f"`{label}`" for label in m.labels), m.help) for m in metrics],
        )
    if what == "reasons":
        reasons = sorted(CATALOG.reasons.values(), key=lambda r: r.name)
        return _table(
            ("reason", "severity", "family", "meaning"),
            [(f"`{r.name}`", r.severity.value + (" (unknown)" if r.unknown else ""), r.family, r.summary) for r in reasons],
        )
    raise ValueError(what)
