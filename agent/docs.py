"""Reference tables for the README and docs/*.md, generated from the schema
and the catalog (`agent docs config|metrics|reasons [FEATURE]`); a test keeps
every generated block in sync (tests/test_readme.py)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from .catalog import MetricSpec, Reason
from .config import Config
from .registry import CATALOG, CHECKS, FEATURES
from .schema import fields_doc


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def config_rows() -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for section in ("agent", "paths", "metrics", "kubernetes", "remediation"):
        rows += fields_doc(type(getattr(Config(), section)), section)
    for name, spec in CHECKS.items():
        rows += fields_doc(spec.config, f"checks.{name}")
    return rows


def _section_rows(section: str) -> list[tuple[str, str, str]]:
    """One top-level section of the config (`agent docs config remediation`)."""
    value = getattr(Config(), section, None)
    if value is None or section in ("source", "checks"):
        raise ValueError(f"no config section {section!r}")
    return fields_doc(type(value), section)


def render(what: str, feature: str | None = None) -> str:
    """One table: `config`, or the `metrics` or `reasons` of the whole catalog
    or of one feature (`disk`, `gpu`, `kube`, …, `core`)."""
    if what == "config":
        keys = config_rows() if feature is None else _section_rows(feature)
        return _table(("key", "default", "meaning"), [(f"`{k}`", f"`{d}`", doc) for k, d, doc in keys])
    if what == "actions" and feature is None:
        return _actions()
    if what == "patterns" and feature is None:
        return _patterns()
    if what == "xids" and feature is None:
        return _xids()
    if what not in ("metrics", "reasons"):
        raise ValueError(what)
    if feature is None:
        reasons: Iterable[Reason] = CATALOG.reasons.values()
        metrics: Iterable[MetricSpec] = CATALOG.metrics.values()
    else:
        try:
            reasons, metrics = FEATURES[feature]
        except KeyError:
            raise ValueError(f"no feature {feature!r}; expected one of {', '.join(FEATURES)}") from None
    if what == "metrics":
        return _table(
            ("metric", "type", "labels", "meaning"),
            [(f"`{m.name}`", m.kind, ", ".join(f"`{label}`" for label in m.labels), m.help)
             for m in sorted(metrics, key=lambda m: m.name)],
        )
    rows = [(f"`{r.name}`", r.severity.value + (" (unknown)" if r.unknown else ""), r.family, f"`{r.action}`", r.summary)
            for r in sorted(reasons, key=lambda r: r.name) if feature is None or not _PER_XID.match(r.name)]
    per_xid = [r for r in reasons if _PER_XID.match(r.name)] if feature is not None else []
    if per_xid:  # a feature's page names them once; the README lists every one
        rows.append((
            "`Xid<N>`", "per Xid, from the Xid catalog", per_xid[0].family, "per Xid",
            f"One reason per Xid of the catalog ({len(per_xid)} of them: `Xid79`, `Xid48`, …), with its severity and "
            "action; `agent docs reasons` lists them all.",
        ))
    return _table(("reason", "severity", "family", "action", "meaning"), rows)


_PER_XID = re.compile(r"Xid\d+$")


def _actions() -> str:
    """The Xid catalog by recommended action: what to do, which Xids, how long the finding stays."""
    from .findings import ACTION_TEXT, ACTIONS
    from .gpu.xid_catalog import catalog, hold

    rows = []
    for action in ACTIONS:
        infos = sorted((i for i in catalog().values() if i.action == action), key=lambda i: i.xid)
        severities = sorted({i.severity for i in infos}, key=lambda s: s.rank)
        rows.append((f"`{action}`", ACTION_TEXT[action], ", ".join(str(i.xid) for i in infos) or "—",
                     ", ".join(s.value for s in severities) or "—", hold(action)))
    return _table(("action", "what to do", "Xids", "severity", "the finding stays"), rows)


def _xids() -> str:
    """Every Xid of the catalog: NVIDIA's immediate resolution bucket, the severity and action the
    agent derives from it, and where (and why) it departs from the bucket."""
    from .gpu.xid_catalog import BUCKETS, catalog

    rows = []
    for i in sorted(catalog().values(), key=lambda i: i.xid):
        bucket = BUCKETS.get(i.bucket)
        how = f"deviation: {i.deviation}" if i.deviation else bucket[2] if bucket else ""
        rows.append((str(i.xid), f"`{i.mnemonic}`" if i.mnemonic else "", f"`{i.bucket}`" if i.bucket else "(none)",
                     i.severity.value, f"`{i.action}`", how))
    return _table(("Xid", "mnemonic", "NVIDIA bucket", "severity", "action", "why"), rows)


def _patterns() -> str:
    """The kernel-log fault table (agent/kernel/catalog.py): what each pattern matches and what it raises."""
    from .kernel.catalog import PATTERNS
    from .schema import format_duration

    rows = []
    for p in PATTERNS:
        stays = "until reboot" if p.hold is None else format_duration(p.hold)
        when = "each match" if p.threshold == 1 else f"{p.threshold} in {format_duration(p.window)}"
        rows.append((f"`{p.name}`", f"`{p.reason}`", p.severity.value, f"`{p.action}`", when, stays, f"`{p.pattern}`"))
    return _table(("pattern", "reason", "severity", "action", "raised on", "stays", "matches (message start)"), rows)
