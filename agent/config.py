"""Configuration: one TOML file validated into frozen dataclasses.

The schema is the dataclasses themselves: a field's type says what TOML value
it takes, its metadata (set with `opt`) says the range, the choices, whether a
string is a duration, and the one-line doc that `agent config show` and the
README print. Every error names the file, the key and what was expected, in
one line; the CLI turns a `ConfigError` into exit code 2.

The documented defaults live in ``config/agent.toml``, shipped inside the
package (``agent/agent.toml``) and used when no file is given. A test holds
that file equal to the dataclass defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any, Literal

EMBEDDED = "<embedded config/agent.toml>"


class ConfigError(Exception):
    """A configuration problem, rendered as one line: ``file: key: what was expected``."""

    def __init__(self, source: str, key: str | None, message: str) -> None:
        super().__init__(source, key, message)
        self.source, self.key, self.message = source, key, message

    def __str__(self) -> str:
        return f"{self.source}: {self.key}: {self.message}" if self.key else f"{self.source}: {self.message}"


# ---------------------------------------------------------------- durations

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``"30s"``, ``"5m"``, ``"1h30m"``, ``"250ms"`` → seconds. Raises ValueError."""
    pos, total = 0, 0.0
    text = text.strip()
    while pos < len(text):
        m = _DURATION.match(text, pos)
        if not m:
            raise ValueError(text)
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if not text:
        raise ValueError(text)
    return total


def format_duration(seconds: float) -> str:
    if seconds and seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out, rest = [], int(round(seconds))
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(out) or "0s"


# ---------------------------------------------------------------- field metadata


def opt(
    default: Any,
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    duration: bool = False,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A schema field. `check` returns an "expected …" message for a bad value, or None."""
    meta = {"doc": doc, "min": min, "max": max, "duration": duration, "check": check}
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples and MappingProxyType for defaults")
    if isinstance(default, Mapping):
        return field(default_factory=lambda: MappingProxyType(dict(default)), metadata=meta)
    return field(default=default, metadata=meta)


def host_port(value: str) -> str | None:
    """Validator for ``host:port`` (IPv6 as ``[::1]:9904``); None when fine."""
    try:
        split_host_port(value)
    except ValueError:
        return f'expected "host:port" (e.g. "10.0.0.1:443" or "[::1]:9904"), got "{value}"'
    return None


def split_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(value)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(value)
    return host, int(port)


# ---------------------------------------------------------------- sections


@dataclass(frozen=True)
class AgentSection:
    state_dir: str = opt("/var/lib/node-health-agent", "Directory for state that survives restarts (findings, cursors, boot id).")
    node_name: str = opt("", 'Name of this node; empty: $NODE_NAME, else the hostname.')
    log_level: Literal["debug", "info", "warning", "error"] = opt("info", "Log level.")
    log_format: Literal["auto", "text", "json"] = opt("auto", "auto: text on a terminal, JSON lines otherwise.")
    jitter: float = opt(0.1, "Fraction of each check's interval by which its runs are spread at random.", min=0, max=0.5)


@dataclass(frozen=True)
class PathsSection:
    procfs: str = opt("/proc", "Where the host's /proc is mounted (the DaemonSet mounts it under /host).")
    sysfs: str = opt("/sys", "Where the host's /sys is mounted.")
    rootfs: str = opt("/", "Where the host's root filesystem is mounted; host paths in checks are resolved under it.")


@dataclass(frozen=True)
class TLSSection:
    cert_file: str = opt("", "PEM certificate; with key_file, /metrics is served over HTTPS.")
    key_file: str = opt("", "PEM private key for cert_file.")
    client_ca_file: str = opt("", "PEM CA bundle; when set, clients must present a certificate it signed.")
    min_version: Literal["TLS12", "TLS13"] = opt("TLS12", "Lowest TLS version accepted.")


@dataclass(frozen=True)
class MetricsSection:
    listen: str = opt("0.0.0.0:9904", "Address of the /metrics and /healthz endpoint.", check=host_port)
    tls: TLSSection = field(default_factory=TLSSection, metadata={"doc": "TLS, in the style of Prometheus exporters' web config."})
    basic_auth_users: Mapping[str, str] = opt(
        MappingProxyType({}), "user = bcrypt hash; when set, /metrics needs HTTP basic auth (/healthz does not)."
    )
    web_config_file: str = opt(
        "", "exporter-toolkit web config (YAML, as node_exporter's --web.config.file); replaces tls and basic_auth_users."
    )


@dataclass(frozen=True)
class CheckConfig:
    """Settings every check has. A check's own config subclasses this."""

    enabled: bool = opt(True, "Run this check.")
    interval: float = opt(30.0, "Time between runs.", duration=True, min=1)
    timeout: float = opt(10.0, "A run longer than this is reported as CheckTimeout.", duration=True, min=0.1)


from .kube.settings import KubernetesSection  # noqa: E402 - after CheckConfig, which it does not need; kube.settings needs opt()


@dataclass(frozen=True)
class Config:
    source: str = field(default=EMBEDDED, metadata={"internal": True})
    agent: AgentSection = field(default_factory=AgentSection, metadata={"doc": "The agent process."})
    paths: PathsSection = field(default_factory=PathsSection, metadata={"doc": "Host filesystem roots."})
    metrics: MetricsSection = field(default_factory=MetricsSection, metadata={"doc": "The Prometheus endpoint."})
    kubernetes: KubernetesSection = field(default_factory=KubernetesSection, metadata={"doc": "Node taints, conditions, events."})
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
    cfg: Config = _build(Config, data, "", source, skip={"checks"})
    checks = _build_checks(checks_raw, source)
    return dataclasses.replace(cfg, source=source, checks=checks)


def defaults() -> Config:
    """The configuration with every default filled in (what an empty file gives)."""
    return parse("", EMBEDDED)


def _build_checks(raw: Any, source: str) -> Mapping[str, CheckConfig]:
    from .checks import registry

    specs = registry()
    if not isinstance(raw, dict):
        raise ConfigError(source, "checks", f"expected a table, got {_describe(raw)}")
    for name in raw:
        if name not in specs:
            raise ConfigError(source, f"checks.{name}", _unknown(name, specs))
    built = {name: _build(spec.config, raw.get(name, {}), f"checks.{name}", source) for name, spec in specs.items()}
    return MappingProxyType(built)


def _build(cls: Any, raw: Any, prefix: str, source: str, skip: frozenset[str] | set[str] = frozenset()) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(source, prefix or None, f"expected a table, got {_describe(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal") and f.name not in skip}
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields:
            raise ConfigError(source, _join(prefix, key), _unknown(key, fields))
    values = {}
    for name, f in fields.items():
        if name in raw:
            values[name] = _convert(raw[name], hints[name], f.metadata, _join(prefix, name), source)
    obj = cls(**values)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        problem = validate()
        if problem:
            key, message = problem
            raise ConfigError(source, _join(prefix, key), message)
    return obj


def _convert(value: Any, tp: Any, meta: Mapping[str, Any], key: str, source: str) -> Any:
    def fail(expected: str) -> typing.NoReturn:
        raise ConfigError(source, key, f"expected {expected}, got {_describe(value)}")

    origin = typing.get_origin(tp)
    if meta.get("duration"):
        if not isinstance(value, str):
            fail('a duration string such as "30s", "5m" or "1h30m"')
        try:
            out: Any = parse_duration(value)
        except ValueError:
            fail('a duration such as "30s", "5m" or "1h30m"')
    elif dataclasses.is_dataclass(tp):
        return _build(tp, value, key, source)
    elif origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            fail("one of " + ", ".join(f'"{c}"' for c in choices))
        out = value
    elif tp is bool:
        if not isinstance(value, bool):
            fail("true or false")
        out = value
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail("an integer")
        out = value
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail("a number")
        out = float(value)
    elif tp is str:
        if not isinstance(value, str):
            fail("a string")
        out = value
    elif origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if not isinstance(value, list):
            fail("a list")
        item_meta = {k: v for k, v in meta.items() if k != "check"} | {"check": meta.get("check")}
        out = tuple(_convert(v, item_tp, item_meta, f"{key}[{i}]", source) for i, v in enumerate(value))
        return out
    elif origin in (Mapping, dict) or tp is Mapping:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            fail("a table")
        return MappingProxyType(
            {k: _convert(v, val_tp, {}, f"{key}.{k}", source) for k, v in value.items()}
        )
    elif origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(value, args[0], meta, key, source)
    else:  # pragma: no cover - a schema bug, not a user error
        raise TypeError(f"unsupported config type {tp!r} at {key}")
    if meta.get("min") is not None and out < meta["min"]:
        fail(f"a value of at least {_fmt_bound(meta['min'], meta)}")
    if meta.get("max") is not None and out > meta["max"]:
        fail(f"a value of at most {_fmt_bound(meta['max'], meta)}")
    if meta.get("check") is not None:
        problem = meta["check"](out)
        if problem:
            raise ConfigError(source, key, problem)
    return out


def _fmt_bound(bound: float, meta: Mapping[str, Any]) -> str:
    return f'"{format_duration(bound)}"' if meta.get("duration") else f"{bound:g}"


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _unknown(key: str, valid: Mapping[str, Any] | set[str]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    if close:
        return f'unknown key (did you mean "{close[0]}"?)'
    return "unknown key; expected one of " + ", ".join(sorted(valid))


def _describe(value: Any) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    kind = kinds.get(type(value), type(value).__name__)
    if isinstance(value, (dict, list)):
        return kind
    shown = f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else repr(value)
    return f"{shown} ({kind})"


# ---------------------------------------------------------------- rendering


def to_toml(cfg: Config) -> str:
    """The effective configuration as TOML (durations written back as "30s")."""
    import tomli_w

    return tomli_w.dumps(_plain(cfg))


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            if f.metadata.get("internal"):
                continue
            v = getattr(obj, f.name)
            out[f.name] = format_duration(v) if f.metadata.get("duration") else _plain(v)
        return out
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return [_plain(v) for v in obj]
    return obj


def fields_doc(cls: type, prefix: str) -> list[tuple[str, str, str]]:
    """(key, default, doc) rows for the README's config reference."""
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = _join(prefix, f.name)
        default: Any = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            rows.extend(fields_doc(type(default), key))
            continue
        shown = format_duration(default) if f.metadata.get("duration") else _plain(default)
        rows.append((key, _toml_value(shown), f.metadata.get("doc", "")))
    return rows


def _toml_value(v: Any) -> str:
    """A TOML value on one line (tomli_w breaks arrays over lines)."""
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    import tomli_w

    return tomli_w.dumps({"v": v}).strip()[4:]
