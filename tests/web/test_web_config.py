"""The exporter-toolkit web config file, read as exporter-toolkit reads it:
strict keys, its defaults, relative paths, every file checked before binding."""

from __future__ import annotations

import shutil
from pathlib import Path

import bcrypt
import pytest
from webcerts import Certs, make_certs

from agent.config import ConfigError, MetricsSection, TLSSection
from agent.web.tls import load_file, resolve

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def write(d: Path, text: str) -> str:
    path = d / "web.yml"
    path.write_text(text)
    return str(path)


def tls_block(certs: Certs, extra: str = "") -> str:
    return f"tls_server_config:\n  cert_file: {certs.server[0]}\n  key_file: {certs.server[1]}\n{extra}"


def test_an_empty_file_is_plain_http_with_exporter_toolkit_defaults(tmp_path: Path) -> None:
    s = load_file(write(tmp_path, ""))
    assert not s.tls.enabled and not s.users and not s.headers
    assert (s.tls.min_version, s.tls.max_version, s.tls.prefer_server_cipher_suites, s.http2) == ("TLS12", "TLS13", True, True)


def test_the_shared_node_exporter_secret_loads_unchanged(tmp_path: Path, certs: Certs) -> None:
    """Every key of exporter-toolkit's docs/web-configuration.md, as a shared Secret would hold them."""
    text = tls_block(certs, f"""  client_ca_file: {certs.ca}
  client_auth_type: RequireAndVerifyClientCert
  client_allowed_sans: [scraper.example]
  min_version: TLS12
  max_version: TLS13
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: false
  curve_preferences: [CurveP256]
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    X-Content-Type-Options: nosniff
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  prometheus: {HASH}
rate_limit:
  interval: 1s
  burst: 10
""")
    s = load_file(write(tmp_path, text))
    assert s.tls.client_auth_type == "RequireAndVerifyClientCert" and s.tls.client_allowed_sans == ("scraper.example",)
    assert dict(s.users) == {"prometheus": HASH} and s.headers["X-Frame-Options"] == "deny"
    assert (s.rate_interval, s.rate_burst, s.http2) == (1.0, 10, False)


def test_relative_paths_are_relative_to_the_web_config_file(tmp_path: Path, certs: Certs) -> None:
    shutil.copy(certs.server[0], tmp_path / "tls.crt")
    shutil.copy(certs.server[1], tmp_path / "tls.key")
    s = load_file(write(tmp_path, "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"))
    assert s.tls.cert_file == str(tmp_path / "tls.crt")


@pytest.mark.parametrize("client_auth", [
    "NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert",
])
def test_all_five_client_auth_types_load(tmp_path: Path, certs: Certs, client_auth: str) -> None:
    ca = f"  client_ca_file: {certs.ca}\n" if "Verify" in client_auth else ""
    s = load_file(write(tmp_path, tls_block(certs, f"  client_auth_type: {client_auth}\n{ca}")))
    assert s.tls.client_auth_type == client_auth


BAD = [
    pytest.param("tls_server_config:\n  cert_filse: x\n", "tls_server_config.cert_filse", 'did you mean "cert_file"',
                 id="unknown key (exporter-toolkit's web_config_junk_key)"),
    pytest.param("basic_auth_users:\n  a: x\n  a: y\n", None, 'key "a" given twice', id="a key given twice"),
    pytest.param("tls_server_config: [1]\n", "tls_server_config", "expected a mapping", id="not a mapping"),
    pytest.param("rate_limit:\n  interval: soon\n", "rate_limit.interval", "expected a duration", id="bad duration"),
    pytest.param("{{cert}}  min_version: TLS14\n", "tls_server_config.min_version", "TLS10, TLS11, TLS12, TLS13",
                 id="unknown TLS version"),
    pytest.param("{{cert}}  min_version: TLS13\n  max_version: TLS12\n", "tls_server_config.min_version",
                 "above max_version", id="min above max"),
    pytest.param("{{cert}}  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n", "tls_server_config.cipher_suites",
                 "unknown cipher", id="a cipher Go does not offer"),
    pytest.param("{{cert}}  curve_preferences: [CurveP999]\n", "tls_server_config.curve_preferences", "unknown curve",
                 id="unknown curve"),
    pytest.param("{{cert}}  client_auth_type: Maybe\n", "tls_server_config.client_auth_type",
                 "expected one of NoClientCert", id="unknown client_auth_type"),
    pytest.param("{{cert}}  client_ca_file: {{ca}}\n", "tls_server_config.client_auth_type",
                 "other than NoClientCert", id="client CA without a client auth policy"),
    pytest.param("tls_server_config:\n  key_file: {{key}}\n", "tls_server_config.cert_file",
                 "expected one of cert or cert_file", id="key without cert"),
    pytest.param("tls_server_config:\n  cert_file: {{crt}}\n", "tls_server_config.key_file",
                 "expected one of key or key_file", id="cert without key"),
    pytest.param("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: {{key}}\n",
                 "tls_server_config.cert_file", "cannot read /nonexistent.crt: No such file", id="missing cert file"),
    pytest.param("tls_server_config:\n  cert_file: {{crt}}\n  key_file: /nonexistent.key\n",
                 "tls_server_config.key_file", "cannot read /nonexistent.key", id="missing key file"),
    pytest.param("tls_server_config:\n  cert_file: {{crt}}\n  key_file: {{otherkey}}\n", "tls_server_config.cert_file",
                 "do not load as a pair", id="key of another certificate"),
    pytest.param("{{cert}}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: /nonexistent-ca.crt\n",
                 "tls_server_config.client_ca_file", "cannot read /nonexistent-ca.crt", id="missing CA file"),
    pytest.param("basic_auth_users:\n  prometheus: plaintext\n", "basic_auth_users.prometheus", "expected a bcrypt hash",
                 id="a password that is not a bcrypt hash"),
    pytest.param("basic_auth_users:\n  prometheus: $2y$99$" + "a" * 53 + "\n", "basic_auth_users.prometheus",
                 "cost from 04 to 31", id="bcrypt cost out of range"),
    pytest.param("http_server_config:\n  headers:\n    Server: nginx\n", "http_server_config.headers.Server",
                 "can not be configured", id="a header exporter-toolkit does not allow"),
    pytest.param("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
                 "http_server_config.headers.X-Frame-Options", "expected one of deny, sameorigin", id="a header value"),
    pytest.param("http_server_config:\n  http2: yes please\n", "http_server_config.http2", "expected true or false",
                 id="a string for a boolean"),
]


@pytest.mark.parametrize(("text", "key", "message"), BAD)
def test_bad_web_configs_are_refused_naming_the_key(
    tmp_path: Path, certs: Certs, text: str, key: str | None, message: str
) -> None:
    text = (text.replace("{{cert}}", tls_block(certs)).replace("{{ca}}", str(certs.ca))
            .replace("{{crt}}", str(certs.server[0])).replace("{{key}}", str(certs.server[1]))
            .replace("{{otherkey}}", str(certs.client[1])))
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_file(path)
    assert exc.value.source == path and exc.value.key == key and message in exc.value.message, str(exc.value)
    assert "\n" not in str(exc.value)


def test_the_toml_sections_are_checked_as_strictly(certs: Certs) -> None:
    with pytest.raises(ConfigError, match=r"metrics.tls.cert_file: cannot read /nonexistent"):
        resolve(MetricsSection(tls=TLSSection(cert_file="/nonexistent", key_file=str(certs.server[1]))), "a.toml")
    with pytest.raises(ConfigError, match=r"metrics.basic_auth_users.p: expected a bcrypt hash"):
        resolve(MetricsSection(basic_auth_users={"p": "secret"}), "a.toml")
    with pytest.raises(ConfigError, match=r"not both"):
        resolve(MetricsSection(web_config_file="/x.yml", basic_auth_users={"p": HASH}), "a.toml")
