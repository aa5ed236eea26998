"""Reference tables for the README, generated from the schema and the catalog
(`agent docs config|metrics|reasons`); a test keeps the README in sync."""

from __future__ import annotations

from . import catalog
from .checks import registry
from .config import Config, fields_doc


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def config_rows() -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for section in ("agent", "paths", "metrics", "kubernetes"):
        cls = Config.__dataclass_fields__[section].default_factory  # type: ignore[misc]
        rows += fields_doc(cls, section)  # type: ignore[arg-type]
    for name, spec in registry().items():
        rows += fields_doc(spec.config, f"checks.{name}")
    return rows


def render(what: str) -> str:
    if what == "config":
        rows = [(f"`{k}`", f"`{d}`", doc) for k, d, doc in config_rows()]
        return _table(("key", "default", "meaning"), rows)
    if what == "metrics":
        rows = [
            (f"`{m.name}`", m.kind, ", ".join(f"`{label}`" for label in m.labels), m.help)
            for m in sorted(catalog.metrics().values(), key=lambda m: m.name)
        ]
        return _table(("metric", "type", "labels", "meaning"), rows)
    if what == "reasons":
        rows = [
            (f"`{r.name}`", r.severity.value + (" (unknown)" if r.unknown else ""), r.family, r.summary)
            for r in sorted(catalog.reasons().values(), key=lambda r: r.name)
        ]
        return _table(("reason", "severity", "family", "meaning"), rows)
    raise ValueError(what)
