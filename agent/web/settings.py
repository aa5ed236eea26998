"""The web configuration: the exporter-toolkit file, or the TOML sections.

The file is the one node_exporter and dcgm-exporter take with
``--web.config.file`` (https://github.com/prometheus/exporter-toolkit,
docs/web-configuration.md), read the way exporter-toolkit reads it
(web/tls_config.go): strict YAML (an unknown or repeated key is refused),
TLS 1.2 to 1.3 by default, relative paths taken from the file's directory,
TLS on as soon as any TLS key is set, then cert and key both required, a
client CA without a client_auth_type refused, bcrypt hashes only, and only
the five security headers it allows.

Two keys are narrower here, where Python's ssl module cannot do what Go's
crypto/tls does: ``curve_preferences`` takes one curve (OpenSSL is given a
list of one), and ``client_allowed_sans`` needs a client_auth_type that
verifies the certificate (an unverified certificate's names prove nothing).
The agent speaks HTTP/1.1 only, so ``http2`` is accepted and has no effect.

This module reads no certificate: `agent.web.tls.resolve` and
`agent.web.tls.load_file` add what can be known before the port is bound (the
certificate and key files read and loaded as a pair, the CA file loaded), and
`agent config check` and `agent run` both call them.
"""

from __future__ import annotations

import functools
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..schema import ConfigError, parse_duration
from ..settings import MetricsSection

# Go's tls.CipherSuites() (what exporter-toolkit accepts) and their OpenSSL names.
# The TLS 1.3 suites are accepted and, as in Go, not configurable.
CIPHERS: Mapping[str, str | None] = MappingProxyType({
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
})
CURVES: Mapping[str, str] = MappingProxyType(
    {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
)
VERSIONS: Mapping[str, ssl.TLSVersion] = MappingProxyType({
    "TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3,
})
# client_auth_type → (a certificate is asked for, it must be given, it is verified)
CLIENT_AUTH: Mapping[str, tuple[bool, bool, bool]] = MappingProxyType({
    "NoClientCert": (False, False, False),
    "RequestClientCert": (True, False, False),
    "RequireAnyClientCert": (True, True, False),
    "RequireClientCert": (True, True, False),  # exporter-toolkit's old name for RequireAnyClientCert
    "VerifyClientCertIfGiven": (True, False, True),
    "RequireAndVerifyClientCert": (True, True, True),
})
# exporter-toolkit's extraHTTPHeaders: the headers that may be set, and their allowed values (empty: any).
HEADERS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
})
# golang.org/x/crypto/bcrypt: "$2" + optional minor + "$" + two-digit cost (4..31) + "$" + 53 characters.
_BCRYPT = re.compile(r"\$2([aby]?)\$(\d\d)\$[./A-Za-z0-9]{53}")


@dataclass(frozen=True)
class TLSServer:
    cert: str = ""  # inline PEM
    key: str = ""
    client_ca: str = ""
    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""
    client_auth_type: str = ""  # "": NoClientCert
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True
    curve_preferences: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return any((self.cert, self.key, self.client_ca, self.cert_file, self.key_file, self.client_ca_file,
                    self.client_auth_type))

    def files(self) -> tuple[str, ...]:
        """The files read to build the TLS context (watched for changes)."""
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


@dataclass(frozen=True)
class WebSettings:
    source: str  # the web config file, or the TOML file its [metrics] sections came from
    tls: TLSServer = field(default_factory=TLSServer)
    users: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    http2: bool = True
    rate_interval: float = 0.0  # seconds between requests; 0: no limit
    rate_burst: int = 0
    from_file: bool = False  # read from a --web.config.file (re-read when it changes)

    @property
    def key_prefix(self) -> str:
        """How keys are named in messages: the YAML path, or the TOML one."""
        return "" if self.from_file else "metrics."


# ---------------------------------------------------------------- the two sources


def from_sections(metrics: MetricsSection, toml_source: str) -> WebSettings:
    """The web settings `agent run` serves with, every file checked. Raises ConfigError."""
    if metrics.web_config_file:
        if metrics.tls.cert_file or metrics.tls.key_file or metrics.tls.client_ca_file or metrics.basic_auth_users:
            raise ConfigError(
                toml_source, "metrics.web_config_file",
                "expected either a web config file or [metrics.tls]/[metrics.basic_auth_users], not both",
            )
        return read_file(metrics.web_config_file)
    t = metrics.tls
    tls = TLSServer(
        cert_file=t.cert_file, key_file=t.key_file, client_ca_file=t.client_ca_file, min_version=t.min_version,
        client_auth_type="RequireAndVerifyClientCert" if t.client_ca_file else "",
    )
    settings = WebSettings(source=toml_source, tls=tls, users=metrics.basic_auth_users)
    validate(settings)
    return settings


def read_file(path: str) -> WebSettings:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read the web config file: {exc.strerror or exc}") from None
    settings = parse(raw, path)
    validate(settings)
    return settings


def parse(raw: bytes, path: str) -> WebSettings:
    """Strict YAML into settings (no file is read here; see `validate`)."""
    import yaml

    try:
        data = yaml.load(raw, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, "YAML error: " + " ".join(str(exc).split())) from None
    data = {} if data is None else data
    r = _Reader(path)
    r.keys(data, "", ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"))
    tls_raw = r.table(data, "tls_server_config")
    r.keys(tls_raw, "tls_server_config", tuple(TLSServer.__dataclass_fields__))
    base = os.path.dirname(os.path.abspath(path))
    tls = TLSServer(**{
        name: r.value(tls_raw, f"tls_server_config.{name}", f.default)
        for name, f in TLSServer.__dataclass_fields__.items() if name in tls_raw
    })
    tls = _join_dir(tls, base)
    http = r.table(data, "http_server_config")
    r.keys(http, "http_server_config", ("http2", "headers"))
    rate = r.table(data, "rate_limit")
    r.keys(rate, "rate_limit", ("interval", "burst"))
    return WebSettings(
        source=path, tls=tls, from_file=True,
        users=r.strings(data, "basic_auth_users"),
        headers=r.strings(http, "headers", "http_server_config.headers"),
        http2=r.value(http, "http_server_config.http2", True),
        rate_interval=r.duration(rate, "rate_limit.interval"),
        rate_burst=r.value(rate, "rate_limit.burst", 0),
    )


def _join_dir(tls: TLSServer, base: str) -> TLSServer:
    """exporter-toolkit's SetDirectory: relative paths are relative to the web config file."""
    from dataclasses import replace

    def join(p: str) -> str:
        return os.path.join(base, p) if p and not os.path.isabs(p) else p

    return replace(tls, cert_file=join(tls.cert_file), key_file=join(tls.key_file), client_ca_file=join(tls.client_ca_file))


class _Reader:
    """Typed access to the parsed YAML; every error one line naming the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, key or None, message)

    def keys(self, table: Mapping[str, Any], prefix: str, allowed: tuple[str, ...]) -> None:
        from ..schema import unknown_key

        for key in table:
            if key not in allowed:
                raise self.fail(f"{prefix}.{key}" if prefix else str(key), unknown_key(str(key), set(allowed)))

    def table(self, data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {_kind(value)}")
        return value

    def value(self, table: Mapping[str, Any], key: str, default: Any) -> Any:
        name = key.rpartition(".")[2]
        value = table.get(name)
        if value is None:
            return default
        want = type(default)
        if want is tuple:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise self.fail(key, f"expected a list of strings, got {_kind(value)}")
            return tuple(value)
        if want is int and isinstance(value, bool) or not isinstance(value, want):
            raise self.fail(key, f"expected {_KINDS.get(want, want.__name__)}, got {_kind(value)}")
        return value

    def strings(self, table: Mapping[str, Any], name: str, key: str | None = None) -> Mapping[str, str]:
        value = self.table(table, name) if key is None else _sub(self, table, name, key)
        for k, v in value.items():
            if not isinstance(v, str):
                raise self.fail(f"{key or name}.{k}", f"expected a string, got {_kind(v)}")
        return MappingProxyType({str(k): v for k, v in value.items()})

    def duration(self, table: Mapping[str, Any], key: str) -> float:
        value = table.get(key.rpartition(".")[2])
        if value is None or value == 0 or value == "0":
            return 0.0
        try:
            if not isinstance(value, str):
                raise ValueError(value)
            return parse_duration(value)
        except ValueError:
            raise self.fail(key, f'expected a duration such as "1s" or "100ms", got {_kind(value)}') from None


def _sub(r: _Reader, table: Mapping[str, Any], name: str, key: str) -> Mapping[str, Any]:
    value = table.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise r.fail(key, f"expected a mapping, got {_kind(value)}")
    return value


_KINDS = {str: "a string", bool: "true or false", int: "an integer"}


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f'"{value}"' if isinstance(value, str) else repr(value)


@functools.cache
def _strict_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        """yaml.v2's UnmarshalStrict refuses a key given twice; SafeLoader keeps the last."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f'key "{key}" given twice', key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return Loader


# ---------------------------------------------------------------- validation


def validate(s: WebSettings) -> None:
    """exporter-toolkit's checks (validateUsers, validateHeaderConfig,
    ConfigToTLSConfig), files included. Raises ConfigError."""
    p = s.key_prefix
    for user, hashed in s.users.items():
        problem = bcrypt_problem(hashed)
        if problem:
            raise ConfigError(s.source, f"{p}basic_auth_users.{user}", problem)
    for name, value in s.headers.items():
        if name not in HEADERS:
            raise ConfigError(s.source, f"http_server_config.headers.{name}",
                              "this header can not be configured; expected one of " + ", ".join(HEADERS))
        if HEADERS[name] and value not in HEADERS[name]:
            raise ConfigError(s.source, f"http_server_config.headers.{name}",
                              f'expected one of {", ".join(HEADERS[name])}, got "{value}"')
    if s.rate_burst < 0:
        raise ConfigError(s.source, "rate_limit.burst", f"expected 0 or more, got {s.rate_burst}")


def bcrypt_problem(hashed: str) -> str | None:
    m = _BCRYPT.fullmatch(hashed)
    if m is None:
        return 'expected a bcrypt hash ("$2y$10$" and 53 more characters, as `htpasswd -nBC 10 ""` prints it)'
    if not 4 <= int(m.group(2)) <= 31:
        return f"expected a bcrypt cost from 04 to 31, got {m.group(2)}"
    return None
