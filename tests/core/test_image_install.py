"""daemonset/Dockerfile without Docker: its build stage's `wheels.sh build` takes
the agent's prebuilt wheel (build_backend/release_wheel.py, as CI builds it:
no Rust in the image) and makes every other wheel the agent needs
(python-iptables' C extension and the [gpu] extra included), and its runtime
stage's `wheels.sh install`, run in a fresh virtual environment with no
compiler (CC=/bin/false), no index and no pip configuration, installs the
agent, which then runs on its native parsers."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_tool, skip_or_fail

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent.parent
DOCKERFILE = ROOT / "daemonset" / "Dockerfile"
SCRIPT = ROOT / "daemonset" / "wheels.sh"
RELEASE = ROOT / "build_backend" / "release_wheel.py"
PINS = ROOT / "daemonset" / "constraints.txt"


def stages() -> list[str]:
    """The Dockerfile's stages, each from its FROM line on."""
    return re.split(r"\n(?=FROM )", DOCKERFILE.read_text())[1:]


def fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin" / "python"


def offline_env(**extra: str) -> dict[str, str]:
    """No PIP_* from this machine (find-links, extra indexes), no pip.conf and no PYTHONPATH to the checkout:
    only the wheel folder counts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"} | extra


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The build stage, once: every wheel for the agent with the [gpu] extra (a superset of the plain image's)."""
    require_tool("cargo")
    require_tool("gcc")
    if importlib.util.find_spec("maturin") is None and shutil.which("maturin") is None:
        skip_or_fail("needs maturin (in the [test] extra)")
    tmp = tmp_path_factory.mktemp("image")
    dist = tmp / "dist"  # what CI's release step leaves in dist/
    res = subprocess.run([sys.executable, str(RELEASE), "--out", str(dist)], capture_output=True, text=True,
                         timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    python = fresh_venv(tmp / "build-venv")
    out = tmp / "wheels"
    res = subprocess.run(["sh", str(SCRIPT), "build", str(ROOT), str(out), "gpu"], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": str(python), "AGENT_DIST": str(dist)}, timeout=1800,
                         check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    yield out


def test_the_dockerfile_runs_the_script_with_no_compiler_in_the_runtime_stage() -> None:
    build, runtime = stages()
    assert "AS build" in build.splitlines()[0] and 'wheels.sh build /src /wheels "$EXTRAS"' in build
    assert runtime.startswith("FROM ${PYTHON_IMAGE}\n") and build.startswith("FROM ${PYTHON_IMAGE} AS build\n"), \
        "wheels are built on the runtime's own Python"
    assert re.search(r'CC=/bin/false sh \S+/wheels\.sh install /wheels "\$EXTRAS"', runtime)
    assert "gcc" not in runtime and "build-essential" not in runtime
    (python_image,) = re.findall(r"ARG PYTHON_IMAGE=python:(\d+\.\d+)\.\d+-slim", DOCKERFILE.read_text())
    assert python_image == f"{sys.version_info.major}.{sys.version_info.minor}", "the test builds the image's wheels"


def test_the_image_installs_the_prebuilt_wheel_and_compiles_no_rust() -> None:
    text = DOCKERFILE.read_text()
    build, runtime = stages()
    assert "COPY dist/ dist/" in build and "COPY . ." not in build, "the build stage takes dist/, not the source"
    assert not re.search(r"cargo|rustup|rust:|maturin", "".join(stages()), re.I)
    assert "python build_backend/release_wheel.py --out dist" in text
    assert "NODE_HEALTH_AGENT_PARSERS=native agent version" in runtime, "the image build fails without the native parsers"


def test_the_build_context_holds_every_copy_source_and_nothing_else() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*", "everything is left out unless named"
    admitted = {ln[1:].rstrip("/") for ln in rules[1:] if ln.startswith("!")}
    sources = {src.rstrip("/") for m in re.finditer(r"^COPY (?!--from)(.+)$", DOCKERFILE.read_text(), re.M)
               for src in m[1].split()[:-1]}
    assert sources == admitted


def test_without_a_prebuilt_wheel_the_build_stage_stops_in_one_line(tmp_path: Path) -> None:
    res = subprocess.run(["sh", str(SCRIPT), "build", str(ROOT), str(tmp_path / "wheels")], capture_output=True,
                         text=True, env={**os.environ, "AGENT_DIST": str(tmp_path)}, timeout=60, check=False)
    assert res.returncode == 2 and not res.stdout, res.stdout
    assert res.stderr.count("\n") == 1 and "build_backend/release_wheel.py --out dist" in res.stderr, res.stderr
    assert not (tmp_path / "wheels").exists()


def test_base_images_and_build_tools_are_pinned() -> None:
    text = DOCKERFILE.read_text()
    for image in re.findall(r"ARG \w+_IMAGE=(\S+)", text):
        assert re.search(r":\d+\.\d+\.\d+-", image), f"{image}: pin a full version"
    pins = dict(line.split("==") for line in PINS.read_text().splitlines() if line and not line.startswith("#"))
    assert "maturin" in pins and "python-iptables" in pins


def test_every_wheel_is_pinned(wheels: Path) -> None:
    pins = {line.split("==")[0] for line in PINS.read_text().splitlines() if line and not line.startswith("#")}
    built = {re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower() for w in wheels.glob("*.whl")}
    assert built - pins == {"node-health-agent"}, "a dependency without a pin in daemonset/constraints.txt"
    iptables = [w.name for w in wheels.glob("python_iptables-*.whl")]
    assert iptables and "-none-any" not in iptables[0], "python-iptables' C extension was built"


@pytest.mark.parametrize("extras", ["", "gpu"])
def test_runtime_stage_installs_without_a_compiler(wheels: Path, tmp_path: Path, extras: str) -> None:
    python = fresh_venv(tmp_path / "image")
    env = offline_env(CC="/bin/false", CXX="/bin/false", PYTHON=str(python))
    res = subprocess.run(["sh", str(SCRIPT), "install", str(wheels), extras], capture_output=True, text=True,
                         env=env, timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    agent = python.parent / "agent"
    res = subprocess.run([str(agent), "version"], capture_output=True, text=True, timeout=60, check=False,
                         env=env | {"NODE_HEALTH_AGENT_PARSERS": "native"})
    assert res.returncode == 0 and "parsers: native (agent._native)" in res.stdout, res.stdout + res.stderr
    # The compiled parts import: ours (Rust, cffi), python-iptables' extension, and with [gpu] NVRTC's bindings.
    imports = "import agent._native, iptc, bcrypt" + (", cuda.bindings.nvrtc" if extras else "")
    res = subprocess.run([str(python), "-c", imports], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
