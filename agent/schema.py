"""The configuration schema: the building blocks every section is made of.

A section is a frozen dataclass; a field's type says what TOML value it takes,
its metadata (set with `opt`) says the range, the choices, whether a string is
a duration, and the one-line doc that `agent config show` and the README print.
`build` turns a TOML table into a section, and every error is a `ConfigError`
naming the file, the key and what was expected, in one line.

This module is a leaf: it imports nothing of the agent, so every feature's
``settings.py`` can use it, and `agent.config` (the root loader) assembles the
sections into one `Config`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol


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


@dataclass(frozen=True)
class CheckConfig:
    """Settings every check has. A check's own config subclasses this."""

    enabled: bool = opt(True, "Run this check.")
    interval: float = opt(30.0, "Time between runs.", duration=True, min=1)
    timeout: float = opt(10.0, "A run longer than this is reported as CheckTimeout.", duration=True, min=0.1)


class ConfigView(Protocol):
    """What a check may read of the whole configuration (`agent.config.Config` is one)."""

    @property
    def checks(self) -> Mapping[str, CheckConfig]: ...

    def check(self, name: str) -> Any: ...


# ---------------------------------------------------------------- building


def build(cls: Any, raw: Any, prefix: str, source: str, skip: frozenset[str] | set[str] = frozenset()) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(source, prefix or None, f"expected a table, got {describe_value(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal") and f.name not in skip}
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields:
            raise ConfigError(source, join(prefix, key), unknown_key(key, fields))
    values = {}
    for name, f in fields.items():
        if name in raw:
            values[name] = _convert(raw[name], hints[name], f.metadata, join(prefix, name), source)
    obj = cls(**values)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        problem = validate()
        if problem:
            key, message = problem
            raise ConfigError(source, join(prefix, key), message)
    return obj


def _convert(value: Any, tp: Any, meta: Mapping[str, Any], key: str, source: str) -> Any:
    def fail(expected: str) -> typing.NoReturn:
        raise ConfigError(source, key, f"expected {expected}, got {describe_value(value)}")

    origin = typing.get_origin(tp)
    if meta.get("duration"):
        if not isinstance(value, str):
            fail('a duration string such as "30s", "5m" or "1h30m"')
        try:
            out: Any = parse_duration(value)
        except ValueError:
            fail('a duration such as "30s", "5m" or "1h30m"')
    elif dataclasses.is_dataclass(tp):
        return build(tp, value, key, source)
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


def join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def unknown_key(key: str, valid: Mapping[str, Any] | set[str]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    if close:
        return f'unknown key (did you mean "{close[0]}"?)'
    return "unknown key; expected one of " + ", ".join(sorted(valid))


def describe_value(value: Any) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    kind = kinds.get(type(value), type(value).__name__)
    if isinstance(value, (dict, list)):
        return kind
    shown = f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else repr(value)
    return f"{shown} ({kind})"


# ---------------------------------------------------------------- JSON schema

DURATION_PATTERN = r"^\s*(\d+(\.\d+)?(ms|s|m|h|d))+\s*$"


def json_schema(tp: Any, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema of what `build` takes for `tp` (a section's dataclass, or a field's
    type with its `opt` metadata): unknown keys, types, choices, ranges and duration syntax.
    What a field's `check` or a section's `validate` decides is left to the agent."""
    meta = meta or {}
    doc = {"description": meta["doc"]} if meta.get("doc") else {}
    origin = typing.get_origin(tp)
    if meta.get("duration"):
        return {**doc, "type": "string", "pattern": DURATION_PATTERN}
    if dataclasses.is_dataclass(tp):
        props = {
            f.name: json_schema(hint, f.metadata)
            for f in dataclasses.fields(tp)
            if not f.metadata.get("internal")
            for hint in (typing.get_type_hints(tp)[f.name],)
        }
        return {**doc, "type": "object", "additionalProperties": False, "properties": props}
    out: dict[str, Any]
    if origin is Literal:
        out = {"enum": list(typing.get_args(tp))}
    elif tp is bool:
        out = {"type": "boolean"}
    elif tp is int:
        out = {"type": "integer"}
    elif tp is float:
        out = {"type": "number"}
    elif tp is str:
        out = {"type": "string"}
    elif origin is tuple:
        item_meta = {k: v for k, v in meta.items() if k != "doc"}
        return {**doc, "type": "array", "items": json_schema(typing.get_args(tp)[0], item_meta)}
    elif origin in (Mapping, dict) or tp is Mapping:
        return {**doc, "type": "object", "additionalProperties": json_schema(typing.get_args(tp)[1])}
    elif origin in (typing.Union, types.UnionType):
        return json_schema([a for a in typing.get_args(tp) if a is not type(None)][0], meta)
    else:  # pragma: no cover - a schema bug, not a user error
        raise TypeError(f"unsupported config type {tp!r}")
    if meta.get("min") is not None:
        out["minimum"] = meta["min"]
    if meta.get("max") is not None:
        out["maximum"] = meta["max"]
    return {**doc, **out}


# ---------------------------------------------------------------- rendering


def plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            if f.metadata.get("internal"):
                continue
            v = getattr(obj, f.name)
            out[f.name] = format_duration(v) if f.metadata.get("duration") else plain(v)
        return out
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return [plain(v) for v in obj]
    return obj


def fields_doc(cls: type, prefix: str) -> list[tuple[str, str, str]]:
    """(key, default, doc) rows for the README's config reference."""
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = join(prefix, f.name)
        default: Any = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            rows.extend(fields_doc(type(default), key))
            continue
        shown = format_duration(default) if f.metadata.get("duration") else plain(default)
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
