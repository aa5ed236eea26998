"""Configuration: one TOML file validated into frozen dataclasses.

This module is the root loader: it assembles `Config` from the agent's own
sections (`agent.settings`), the ``[kubernetes]`` section (`agent.kube.settings`),
the ``[remediation]`` section (`agent.remediation.settings`) and one ``[checks.<name>]`` table per check of the registry (each check's config
class lives in its feature's ``settings.py``), then runs the checks that span
sections. The building blocks (`opt`, durations, `CheckConfig`, `ConfigError`,
`build`) are in the leaf module `agent.schema`. Every error names the file, the
key and what was expected, in one line; the CLI turns a `ConfigError` into
exit code 2.

The documented defaults live in ``config/agent.toml``, shipped inside the
package (``agent/agent.toml``) and used when no file is given. A test holds
that file equal to the dataclass defaults.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any

from . import registry
from .kube.settings import KubernetesSection
from .remediation.settings import RemediationSection
from .schema import CheckConfig as CheckConfig
from .schema import ConfigError as ConfigError
from .schema import build, describe_value, plain, unknown_key
from .schema import fields_doc as fields_doc
from .schema import format_duration as format_duration
from .schema import json_schema as schema_of
from .schema import parse_duration as parse_duration
from .settings import AgentSection as AgentSection
from .settings import MetricsSection as MetricsSection
from .settings import PathsSection as PathsSection
from .settings import TLSSection as TLSSection

EMBEDDED = "<embedded config/agent.toml>"


@dataclass(frozen=True)
class Config:
    source: str = field(default=EMBEDDED, metadata={"internal": True})
    agent: AgentSection = field(default_factory=AgentSection, metadata={"doc": "The agent process."})
    paths: PathsSection = field(default_factory=PathsSection, metadata={"doc": "Host filesystem roots."})
    metrics: MetricsSection = field(default_factory=MetricsSection, metadata={"doc": "The Prometheus endpoint."})
    kubernetes: KubernetesSection = field(default_factory=KubernetesSection, metadata={"doc": "Node taints, conditions, events."})
    remediation: RemediationSection = field(
        default_factory=RemediationSection, metadata={"doc": "Drain, GPU reset, reboot, retire (docs/remediation.md)."}
    )
    checks: Mapping[str, CheckConfig] = field(
        default_factory=lambda: MappingProxyType({}), metadata={"doc": "One table per check: [checks.<name>]."}
    )

    def check(self, name: str) -> Any:
        return self.checks[name]


# ---------------------------------------------------------------- loading


def load(path: str | None) -> Config:
    """Load and validate `path` (None: the embedded defaults)."""
    if path is None:
        return parse(resources.files("agent").joinpath("agent.toml").read_text(encoding="utf-8"), EMBEDDED)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read the file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"not UTF-8 text (byte {exc.start})") from None
    return parse(text, path)


def parse(text: str, source: str) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, None, f"TOML syntax error: {exc}") from None
    checks_raw = data.pop("checks", {})
    cfg: Config = build(Config, data, "", source, skip={"checks"})
    checks = _build_checks(checks_raw, source)
    named = _check_reasons(checks, source)
    _check_policy(cfg.kubernetes, source, named)
    return dataclasses.replace(cfg, source=source, checks=checks)


def defaults() -> Config:
    """The configuration with every default filled in (what an empty file gives)."""
    return parse("", EMBEDDED)


def _build_checks(raw: Any, source: str) -> Mapping[str, CheckConfig]:
    specs = registry.CHECKS
    if not isinstance(raw, dict):
        raise ConfigError(source, "checks", f"expected a table, got {describe_value(raw)}")
    for name in raw:
        if name not in specs:
            raise ConfigError(source, f"checks.{name}", unknown_key(name, specs))
    built = {name: build(spec.config, raw.get(name, {}), f"checks.{name}", source) for name, spec in specs.items()}
    return MappingProxyType(built)


def _check_reasons(checks: Mapping[str, CheckConfig], source: str) -> frozenset[str]:
    """The reasons the checks' configurations name (an operator's kernel patterns): none may be, or
    differ only in case from, a reason another feature declares. Returns their names."""
    taken = {r.lower(): r for r in registry.CATALOG.reasons}
    names = set()
    for check, key, reason in registry.configured_reasons(checks):
        clash = taken.get(reason.name.lower())
        if clash is not None:
            raise ConfigError(source, f"checks.{check}.{key}", f'expected a reason of its own; "{reason.name}" is (or differs '
                              f'only in case from) the agent\'s reason "{clash}" (see `agent docs reasons`)')
        names.add(reason.name)
    return frozenset(names)


def _check_policy(k: KubernetesSection, source: str, named: frozenset[str] = frozenset()) -> None:
    """``[kubernetes.policy] overrides`` name checks and reasons of the registry, or reasons the checks'
    configurations name; a check is named as findings carry it (``xid/Xid79``: the gpu check's Xid stream,
    whose findings say ``check="xid"``)."""
    checks, reasons = [*registry.CHECKS, *registry.FINDING_SOURCES], set(registry.CATALOG.reasons) | named
    for key in k.policy.overrides:
        check, _, reason = key.partition("/")
        problem = None
        if check != "*" and check not in checks:
            problem = f'unknown check "{check}"; expected one of "*", ' + ", ".join(checks)
        elif reason and reason not in reasons:
            problem = f'unknown finding reason "{reason}" (see `agent docs reasons`)'
        elif check == "*" and not reason:
            problem = 'expected "*/Reason"; use the severity defaults for every check'
        if problem:
            raise ConfigError(source, f"kubernetes.policy.overrides.{key}", problem)


# ---------------------------------------------------------------- JSON schema


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a config file's tables (the Helm chart's `config:` value is
    generated from it): every section, and one table per check of the registry."""
    out = schema_of(Config)
    out["properties"]["checks"] = {
        "description": "One table per check: [checks.<name>].",
        "type": "object",
        "additionalProperties": False,
        "properties": {name: schema_of(spec.config) for name, spec in registry.CHECKS.items()},
    }
    return out


# ---------------------------------------------------------------- rendering


def to_toml(cfg: Config) -> str:
    """The effective configuration as TOML (durations written back as "30s")."""
    import tomli_w

    return tomli_w.dumps(plain(cfg))
