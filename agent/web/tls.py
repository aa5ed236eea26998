"""The TLS context, built as exporter-toolkit builds Go's tls.Config, and
kept current as the files change.

exporter-toolkit re-reads the web config and the certificate files on every
handshake, so a rotated certificate is served from the next connection on and
a broken one fails every handshake. Here each new connection costs a `stat`
of those files; when one changed, the files are loaded again, and a pair that
does not load (half-written, key and certificate mismatched, deleted) keeps
the previous context serving: one log line and
``node_health_web_config_last_reload_successful`` 0 say so until the files
are good again. Connections already open keep their certificate, as in Go.
"""

from __future__ import annotations

import ctypes
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from ..filewatch import Stamp, stamp
from ..schema import ConfigError
from ..settings import MetricsSection
from .settings import CIPHERS, CLIENT_AUTH, CURVES, VERSIONS, WebSettings, from_sections, read_file

log = logging.getLogger(__name__)


def resolve(metrics: MetricsSection, toml_source: str) -> WebSettings:
    """The web settings of `[metrics]` (or of the file it names), with every
    file they name read and loaded now: all that can be known before the port
    is bound. Raises ConfigError naming the key."""
    return _files_loaded(from_sections(metrics, toml_source))


def load_file(path: str) -> WebSettings:
    """An exporter-toolkit web config file, its certificate files loaded. Raises ConfigError."""
    return _files_loaded(read_file(path))


def _files_loaded(s: WebSettings) -> WebSettings:
    if s.tls.enabled:
        build_context(s)  # reads and loads every file; raises ConfigError naming the key
    return s


def build_context(s: WebSettings) -> ssl.SSLContext:
    """The server context for `s`; every file read and loaded now. Raises ConfigError."""
    t = s.tls

    def key(name: str) -> str:
        return f"tls_server_config.{name}" if s.from_file else f"metrics.tls.{name}"

    def fail(name: str, message: str) -> ConfigError:
        return ConfigError(s.source, key(name), message)

    if not t.cert and not t.cert_file:
        raise fail("cert_file", "TLS is configured: expected one of cert or cert_file, got neither")
    if not t.key and not t.key_file:
        raise fail("key_file", "TLS is configured: expected one of key or key_file, got neither")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for name, value in (("min_version", t.min_version), ("max_version", t.max_version)):
        if value not in VERSIONS:
            raise fail(name, f'expected one of {", ".join(VERSIONS)}, got "{value}"')
    if VERSIONS[t.min_version] > VERSIONS[t.max_version]:
        raise fail("min_version", f"{t.min_version} is above max_version {t.max_version}")
    ctx.minimum_version, ctx.maximum_version = VERSIONS[t.min_version], VERSIONS[t.max_version]
    _load_pair(ctx, s, fail)
    _ciphers(ctx, s, fail)
    _client_auth(ctx, s, fail)
    return ctx


def _read(path: str, name: str, fail: Callable[[str, str], ConfigError]) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        raise fail(name, f"cannot read {path}: {exc.strerror or exc}") from None


def _load_pair(ctx: ssl.SSLContext, s: WebSettings, fail: Callable[[str, str], ConfigError]) -> None:
    t = s.tls
    cert = _read(t.cert_file, "cert_file", fail) if t.cert_file else t.cert
    key = _read(t.key_file, "key_file", fail) if t.key_file else t.key
    if "-----BEGIN" not in cert:
        raise fail("cert_file" if t.cert_file else "cert", "expected a PEM certificate")
    if "-----BEGIN" not in key:
        raise fail("key_file" if t.key_file else "key", "expected a PEM private key")

    def encrypted() -> bytes:
        raise fail("key_file" if t.key_file else "key", "expected an unencrypted private key")

    # load_cert_chain takes paths only: what was read is loaded from a private
    # copy, so the pair checked is the pair served even while the files change.
    with tempfile.TemporaryDirectory(prefix="nha-tls-") as tmp:
        cpath, kpath = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        for path, text in ((cpath, cert), (kpath, key)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
                fh.write(text)
        try:
            ctx.load_cert_chain(cpath, kpath, password=encrypted)
        except ssl.SSLError as exc:
            what = "cert_file" if t.cert_file else "cert"
            raise fail(what, f"certificate and key do not load as a pair: {exc.reason or exc}") from None


def _ciphers(ctx: ssl.SSLContext, s: WebSettings, fail: Callable[[str, str], ConfigError]) -> None:
    t = s.tls
    names: list[str] = []
    for name in t.cipher_suites:
        if name not in CIPHERS:
            raise fail("cipher_suites", f'unknown cipher "{name}"; expected names from Go\'s tls.CipherSuites()')
        openssl = CIPHERS[name]
        if openssl:
            names.append(openssl)
    if names:
        ctx.set_ciphers(":".join(names))
    if t.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    for curve in t.curve_preferences:
        if curve not in CURVES:
            raise fail("curve_preferences", f'unknown curve "{curve}"; expected one of {", ".join(CURVES)}')
    if len(t.curve_preferences) > 1:
        raise fail("curve_preferences", "expected one curve (Python's ssl module restricts key exchange to one)")
    if t.curve_preferences:
        ctx.set_ecdh_curve(CURVES[t.curve_preferences[0]])


def _client_auth(ctx: ssl.SSLContext, s: WebSettings, fail: Callable[[str, str], ConfigError]) -> None:
    t = s.tls
    mode = t.client_auth_type or "NoClientCert"
    if mode not in CLIENT_AUTH:
        raise fail("client_auth_type", f'expected one of {", ".join(CLIENT_AUTH)}, got "{mode}"')
    ask, require, verify = CLIENT_AUTH[mode]
    if (t.client_ca_file or t.client_ca) and not ask:
        raise fail("client_auth_type", "a client CA is configured: expected a client_auth_type other than NoClientCert")
    if t.client_allowed_sans and not ask:
        raise fail("client_allowed_sans", "expected a client_auth_type that asks for a client certificate")
    if not ask:
        return
    try:
        if t.client_ca_file:
            ctx.load_verify_locations(cafile=t.client_ca_file)
        elif t.client_ca:
            ctx.load_verify_locations(cadata=t.client_ca)
        elif verify:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go verifies against the system roots
    except FileNotFoundError as exc:
        raise fail("client_ca_file", f"cannot read {t.client_ca_file}: {exc.strerror}") from None
    except (ssl.SSLError, OSError) as exc:
        name = "client_ca_file" if t.client_ca_file else "client_ca"
        raise fail(name, f"expected PEM CA certificates: {getattr(exc, 'reason', None) or exc}") from None
    if verify:
        ctx.verify_mode = ssl.CERT_REQUIRED if require else ssl.CERT_OPTIONAL
        return
    try:
        _ask_without_verifying(ctx, require)
    except OSError as exc:
        raise fail("client_auth_type", f"{mode} is not available with this Python's ssl module: {exc}") from None


# ---------------------------------------------------------------- asking without verifying

# Python's ssl module verifies every client certificate it asks for. Go's
# RequestClientCert and RequireAnyClientCert ask for one and accept any: the
# same OpenSSL call Python makes for CERT_OPTIONAL/REQUIRED, with a verify
# callback that accepts. (Python then still decodes the peer certificate, so
# client_allowed_sans works in these modes, as in Go.)
_SSL_VERIFY_PEER, _SSL_VERIFY_FAIL_IF_NO_PEER_CERT = 0x01, 0x02
_VERIFY_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_ACCEPT_ANY = _VERIFY_CB(lambda _ok, _store: 1)


def _libssl() -> Any:
    lib = ctypes.CDLL(ssl._ssl.__file__)  # type: ignore[attr-defined] # dlsym searches its libssl too
    lib.SSL_CTX_set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, _VERIFY_CB]
    lib.SSL_CTX_set_verify.restype = None
    lib.SSL_CTX_get_verify_mode.argtypes = [ctypes.c_void_p]
    lib.SSL_CTX_get_verify_mode.restype = ctypes.c_int
    return lib


def _ask_without_verifying(ctx: ssl.SSLContext, require: bool) -> None:
    lib = _libssl()
    # PySSLContext starts with PyObject_HEAD, then its SSL_CTX *ctx: proven
    # below by setting a verify mode through Python and reading it back.
    ptr = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    ctx.verify_mode = ssl.CERT_REQUIRED
    if lib.SSL_CTX_get_verify_mode(ptr) != _SSL_VERIFY_PEER | _SSL_VERIFY_FAIL_IF_NO_PEER_CERT:
        raise OSError("cannot reach the OpenSSL context")
    ctx.verify_mode = ssl.CERT_NONE
    if lib.SSL_CTX_get_verify_mode(ptr) != 0:
        raise OSError("cannot reach the OpenSSL context")
    mode = _SSL_VERIFY_PEER | (_SSL_VERIFY_FAIL_IF_NO_PEER_CERT if require else 0)
    lib.SSL_CTX_set_verify(ptr, mode, _ACCEPT_ANY)


# ---------------------------------------------------------------- kept current


class Serving:
    """The web settings and TLS context in use, reloaded when their files change.

    `current()` runs for each connection and request: a `stat` per file when
    nothing changed. `on_reload(ok)` is told of each reload's result."""

    def __init__(self, settings: WebSettings, on_reload: Callable[[bool], None] = lambda ok: None) -> None:
        self._settings = settings
        self._ctx = build_context(settings) if settings.tls.enabled else None
        self._stamp = stamp(self._watched(settings))
        self._failed: Stamp | None = None
        self._lock = threading.Lock()
        self._on_reload = on_reload

    @staticmethod
    def _watched(s: WebSettings) -> tuple[str, ...]:
        return ((s.source,) if s.from_file else ()) + s.tls.files()

    @property
    def tls(self) -> bool:
        return self._ctx is not None

    def current(self) -> tuple[WebSettings, ssl.SSLContext | None]:
        now = stamp(self._watched(self._settings))
        if now != self._stamp and now != self._failed:
            with self._lock:
                if now != self._stamp and now != self._failed:
                    self._reload(now)
        return self._settings, self._ctx

    def _reload(self, now: Stamp) -> None:
        try:
            new = read_file(self._settings.source) if self._settings.from_file else self._settings
            if new.tls.enabled != self.tls:
                raise ConfigError(new.source, "tls_server_config",
                                  "TLS cannot be turned on or off while serving; restart or reload the agent")
            ctx = build_context(new) if new.tls.enabled else None
        except ConfigError as exc:
            self._failed = now
            log.error("web config changed and does not load, still serving the previous one: %s", exc)
            self._on_reload(False)
            return
        self._settings, self._ctx, self._failed = new, ctx, None
        self._stamp = now if self._watched(new) == tuple(p for p, _ in now) else stamp(self._watched(new))
        log.info("web config reloaded from %s after a change on disk", new.source)
        self._on_reload(True)
