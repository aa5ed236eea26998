"""The project's PEP 517 build backend: maturin where a Rust toolchain is, a
pure-Python wheel where none is.

With `cargo` on PATH (or NHA_NATIVE=1) every hook is maturin's: the wheel
carries the Rust parsers (`agent._native`). Without one (or NHA_NATIVE=0) the
agent is built as a pure-Python wheel (py3-none-any): the parsers run as
their Python twins, which give the same output (tests/parsers), and
`agent version` and `node_health_build_info{native="python"}` say so. Nothing
is downloaded: maturin alone would fetch a Rust toolchain from the network
(and fail with a traceback on an air-gapped GPU host). NHA_NATIVE=1 makes a
missing toolchain an error instead. See docs/parsers-and-benches.md.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import sys
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MATURIN = "maturin>=1.5,<2"
NATIVE_REQUIRES = [MATURIN, "cffi"]  # maturin's own list for bindings = "cffi" (it generates the cffi module)


def _native() -> bool:
    choice = os.environ.get("NHA_NATIVE", "auto").strip().lower()
    if choice in ("1", "true", "yes"):
        if shutil.which("cargo") is None:
            raise SystemExit("node-health-agent: NHA_NATIVE=1 but no Rust toolchain (cargo) is on PATH")
        return True
    if choice in ("0", "false", "no"):
        return False
    if choice != "auto":
        raise SystemExit(f"node-health-agent: NHA_NATIVE={choice!r}: expected auto, 1 or 0")
    if shutil.which("cargo") is not None:
        return True
    print(
        "node-health-agent: no Rust toolchain (cargo) on PATH: building the pure-Python wheel; the parsers run as "
        "their Python twins (same output, slower; see docs/parsers-and-benches.md). Install cargo, or set "
        "NHA_NATIVE=1 to require the native build.",
        file=sys.stderr,
    )
    return False


def _maturin() -> Any:
    import maturin  # installed by pip from get_requires_for_build_*()

    return maturin


# ---------------------------------------------------------------- PEP 517 hooks


def get_requires_for_build_wheel(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    return list(NATIVE_REQUIRES) if _native() else []


def get_requires_for_build_editable(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    return get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    return [MATURIN]


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Mapping[str, Any] | None = None) -> str:
    if _native():
        return str(_maturin().prepare_metadata_for_build_wheel(metadata_directory, config_settings))
    return _write_dist_info(Path(metadata_directory))


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(
    wheel_directory: str, config_settings: Mapping[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    if _native():
        return str(_maturin().build_wheel(wheel_directory, config_settings, metadata_directory))
    return _pure_wheel(Path(wheel_directory), editable=False)


def build_editable(
    wheel_directory: str, config_settings: Mapping[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    if _native():
        return str(_maturin().build_editable(wheel_directory, config_settings, metadata_directory))
    return _pure_wheel(Path(wheel_directory), editable=True)


def build_sdist(sdist_directory: str, config_settings: Mapping[str, Any] | None = None) -> str:
    return str(_maturin().build_sdist(sdist_directory, config_settings))


# ---------------------------------------------------------------- the pure-Python wheel


def _project() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        project: dict[str, Any] = tomllib.load(fh)["project"]
    return project


def _dist_name(project: Mapping[str, Any]) -> str:
    return f"{project['name'].replace('-', '_')}-{project['version']}"


def _metadata(project: Mapping[str, Any]) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '')}",
        f"License: {project.get('license', {}).get('text', '')}",
    ]
    lines += [f"Classifier: {c}" for c in project.get("classifiers", ())]
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", ())]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {d}; extra == \"{extra}\"" for d in deps]
    readme = ROOT / str(project.get("readme", "README.md"))
    body = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    return "\n".join(lines) + "\nDescription-Content-Type: text/markdown\n\n" + body


def _entry_points(project: Mapping[str, Any]) -> str:
    scripts = project.get("scripts", {})
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())


WHEEL = "Wheel-Version: 1.0\nGenerator: node-health-agent build_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _write_dist_info(directory: Path) -> str:
    project = _project()
    info = directory / f"{_dist_name(project)}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(_metadata(project), encoding="utf-8")
    (info / "WHEEL").write_text(WHEEL)
    (info / "entry_points.txt").write_text(_entry_points(project))
    return info.name


def _package_files() -> Iterator[Path]:
    """Every file of the `agent` package but caches and a native library built here."""
    for path in sorted((ROOT / "agent").rglob("*")):
        rel = path.relative_to(ROOT)
        if path.is_dir() or "__pycache__" in rel.parts or rel.parts[:2] == ("agent", "_native"):
            continue
        if path.suffix in (".pyc", ".so"):
            continue
        yield path


def _pure_wheel(out: Path, editable: bool) -> str:
    project = _project()
    name = _dist_name(project)
    info = f"{name}.dist-info"
    files: dict[str, bytes] = {}
    if editable:
        files[f"{project['name'].replace('-', '_')}.pth"] = f"{ROOT}\n".encode()
    else:
        for path in _package_files():
            files[path.relative_to(ROOT).as_posix()] = path.read_bytes()
    files[f"{info}/METADATA"] = _metadata(project).encode()
    files[f"{info}/WHEEL"] = WHEEL.encode()
    files[f"{info}/entry_points.txt"] = _entry_points(project).encode()
    record = [f"{arc},sha256={_digest(data)},{len(data)}" for arc, data in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arc, data in files.items():
            zf.writestr(arc, data)
    return wheel.name


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
