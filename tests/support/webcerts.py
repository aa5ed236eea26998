"""Real certificates for the web tests, made with openssl: a CA, a server
certificate for 127.0.0.1, client certificates from that CA and from another."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from conftest import require_tool


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(crt), "-days", "2", "-subj", f"/CN={name}")
    return crt, key


def make_leaf(d: Path, name: str, ca: tuple[Path, Path], san: str = "IP:127.0.0.1,DNS:localhost") -> tuple[Path, Path]:
    key, csr, crt, ext = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt", d / f"{name}.ext"
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    ext.write_text(f"subjectAltName={san}\n")
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
         "-out", str(crt), "-days", "2", "-extfile", str(ext))
    return crt, key


@dataclass
class Certs:
    dir: Path
    ca: Path
    server: tuple[Path, Path]  # (cert, key)
    client: tuple[Path, Path]  # signed by ca, SAN DNS:scraper.example
    stranger: tuple[Path, Path]  # signed by another CA

    def fingerprint(self, cert: Path) -> bytes:
        out = subprocess.run(["openssl", "x509", "-in", str(cert), "-outform", "DER"], check=True, capture_output=True)
        return out.stdout


def make_certs(d: Path) -> Certs:
    require_tool("openssl")
    d.mkdir(parents=True, exist_ok=True)
    ca = make_ca(d, "ca")
    other = make_ca(d, "other-ca")
    return Certs(
        dir=d, ca=ca[0],
        server=make_leaf(d, "server", ca),
        client=make_leaf(d, "client", ca, san="DNS:scraper.example"),
        stranger=make_leaf(d, "stranger", other, san="DNS:scraper.example"),
    )
