"""Installs without a compiler: the build backend (build_backend/nha_build.py)
hands every hook to maturin where `cargo` is, and builds a pure-Python wheel
where it is not: nothing is downloaded, the wheel holds the whole package,
and the installed agent runs on the Python twins and says so."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
sys.path.insert(0, str(ROOT / "build_backend"))
import nha_build  # noqa: E402


def _path_without_cargo(tmp_path: Path) -> str:
    """A PATH with the interpreter's directory and nothing that holds cargo."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "cargo").exists()]
    return os.pathsep.join(keep)


def test_no_cargo_asks_for_nothing_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", _path_without_cargo(tmp_path))
    monkeypatch.setenv("NHA_NATIVE", "auto")
    assert nha_build.get_requires_for_build_wheel() == []
    assert "no Rust toolchain (cargo)" in capsys.readouterr().err
    monkeypatch.setenv("NHA_NATIVE", "1")
    with pytest.raises(SystemExit, match="NHA_NATIVE=1 but no Rust toolchain"):
        nha_build.get_requires_for_build_wheel()
    monkeypatch.setenv("NHA_NATIVE", "maybe")
    with pytest.raises(SystemExit, match="expected auto, 1 or 0"):
        nha_build.get_requires_for_build_wheel()


def test_cargo_present_means_maturin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cargo = tmp_path / "bin" / "cargo"
    cargo.parent.mkdir()
    cargo.write_text("#!/bin/sh\nexit 0\n")
    cargo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{cargo.parent}{os.pathsep}{_path_without_cargo(tmp_path)}")
    monkeypatch.setenv("NHA_NATIVE", "auto")
    assert nha_build.get_requires_for_build_wheel() == [nha_build.MATURIN, "cffi"]
    assert nha_build.get_requires_for_build_editable() == [nha_build.MATURIN, "cffi"]


def test_the_pure_wheel_installs_and_runs_on_the_twins(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(NHA_NATIVE="0", PATH=_path_without_cargo(tmp_path))
    out = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out),
         str(ROOT)],
        env=env, check=True, capture_output=True, timeout=300,
    )
    (wheel,) = out.glob("node_health_agent-*-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "agent"], cwd=ROOT, capture_output=True, text=True, check=True)
    for rel in tracked.stdout.split():
        assert rel in names, f"{rel} missing from the pure wheel"
    assert not any(n.startswith("agent/_native/") or n.endswith((".so", ".pyc")) for n in names)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], env=env, check=True, capture_output=True, timeout=300)
    res = subprocess.run(
        [sys.executable, "-m", "agent", "version"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**env, "PYTHONPATH": str(target), "NODE_HEALTH_AGENT_PARSERS": "auto"}, check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "parsers: python (native library unavailable" in res.stdout, res.stdout
    res = subprocess.run(
        [sys.executable, "-c", "import agent, sys; print(agent.__file__)"], cwd=tmp_path, capture_output=True,
        text=True, timeout=60, env={**env, "PYTHONPATH": str(target)}, check=True,
    )
    assert res.stdout.startswith(str(target)), "the installed wheel, not the checkout, was imported"
