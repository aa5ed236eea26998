"""The shape of the code (docs/architecture.md): heavy libraries load only with
their feature, no module is loaded by a name held in a string, adapters stay
thin, and the import contracts of pyproject.toml hold."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
AGENT = ROOT / "agent"
# cuda.bindings, not cuda: the cuda-bindings wheel installs a .pth that imports the bare `cuda` namespace at start.
HEAVY = ("kubernetes", "pyroute2", "iptc", "pynvml", "cuda.bindings", "prometheus_client", "h2")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted(set(sys.modules) & set({HEAVY!r}))))"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True)
    return res.stdout.split()


def test_the_registry_the_config_and_the_commands_load_no_heavy_library() -> None:
    """DESIGN rule 6: kubernetes, pyroute2, iptc, pynvml and cuda load only when their feature runs."""
    code = (
        "from agent import registry, config, docs\n"
        "from agent.cli.main import build_parser\n"
        "build_parser()\n"
        "cfg = config.defaults()\n"
        "docs.render('config'); docs.render('metrics'); docs.render('reasons')\n"
        "from agent.runtime import build_checks\n"
    )
    assert _loaded_after(code) == []


def test_the_probe_sees_a_heavy_library_when_one_is_imported() -> None:
    """The probe above can fail: importing a feature's heavy module shows up."""
    assert _loaded_after("import agent.metrics") == ["prometheus_client"]


def _python_files() -> list[Path]:
    return [p for p in AGENT.rglob("*.py") if "_native" not in p.parts]


def test_no_module_is_imported_by_a_name_held_in_a_string() -> None:
    found = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name in ("import_module", "__import__"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_no_module_imports_a_private_name_of_another() -> None:
    """What modules share is public (agent/cli/shared.py for the commands); `_name` stays in its module."""
    found = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


def test_check_adapters_are_thin() -> None:
    """An adapter names its check and hands a builder to its feature's engine (about 80 lines at most)."""
    long = {p.name: n for p in (AGENT / "checks").glob("*.py") if (n := len(p.read_text().splitlines())) > 80}
    assert long == {}


@pytest.mark.skipif(shutil.which("lint-imports") is None and not (Path(sys.executable).parent / "lint-imports").exists(),
                    reason="import-linter is not installed (pip install -e '.[test]')")
def test_import_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    res = subprocess.run([exe, "--no-cache"], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout
