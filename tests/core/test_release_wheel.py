"""The release wheels CI builds (build_backend/release_wheel.py): the native one
is tagged `py3-none-manylinux_2_34_<arch>`, and that tag is the oldest glibc
policy its library satisfies; it installs offline (`pip install --no-index
--no-deps`) into a fresh virtual environment and runs the Rust parsers; beside
it, the pure-Python wheel is what pip picks where the native one does not fit.

Skipped without cargo or maturin on a developer box; CI (NHA_REQUIRE_PRIVILEGED=1)
installs both and fails instead of skipping."""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool, skip_or_fail
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent.parent
SCRIPT = ROOT / "build_backend" / "release_wheel.py"
ARCH = platform.machine()
# The shared libraries a manylinux wheel may link without bundling them (PEP 600 / auditwheel's policy list).
MANYLINUX_LIBS = {"libc.so.6", "libgcc_s.so.1", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                  "libutil.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}


def _script() -> object:
    spec = importlib.util.spec_from_file_location("release_wheel", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


POLICY: str = _script().POLICY  # type: ignore[attr-defined]


def offline_env(**extra: str) -> dict[str, str]:
    """No PIP_* of this machine (find-links, extra indexes), no pip.conf, no PYTHONPATH to the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"} | extra


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(native wheel, pure wheel), built once by the release script as CI runs it."""
    require_tool("cargo")
    if importlib.util.find_spec("maturin") is None and shutil.which("maturin") is None:
        skip_or_fail("needs maturin (in the [test] extra)")
    out = tmp_path_factory.mktemp("release") / "dist"
    res = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                         timeout=900, check=False, env=offline_env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    native, pure = (Path(line) for line in res.stdout.split()[-2:])
    assert sorted(out.iterdir()) == sorted([native, pure])
    return native, pure


def _tag(wheel: Path) -> Tag:
    (tag,) = parse_wheel_filename(wheel.name)[3]
    return tag


def _floor(tag: Tag) -> tuple[int, int]:
    m = re.fullmatch(rf"manylinux_(\d+)_(\d+)_{ARCH}", tag.platform)
    assert m, tag.platform
    return int(m[1]), int(m[2])


def _host_platforms(glibc_minor: int) -> list[str]:
    """What pip accepts on an x86_64 (or this arch) host with glibc 2.<minor>."""
    return [f"manylinux_2_{v}_{ARCH}" for v in range(glibc_minor, 16, -1)] + [f"linux_{ARCH}"]


def test_tags_one_wheel_for_every_cpython_from_311_on_a_glibc_floor(release: tuple[Path, Path]) -> None:
    native, pure = release
    tag = _tag(native)
    assert (tag.interpreter, tag.abi, tag.platform) == ("py3", "none", f"manylinux_{POLICY}_{ARCH}")
    assert _tag(pure) == Tag("py3", "none", "any")
    wheel_file = zipfile.ZipFile(native).read(f"{native.name.split('-py3')[0]}.dist-info/WHEEL").decode()
    assert f"Tag: {tag}\n" in wheel_file and "Root-Is-Purelib: false" in wheel_file
    floor = _floor(tag)[1]
    for minor in (11, 12, 13, 14):
        accepted = set(cpython_tags((3, minor), platforms=_host_platforms(floor))) | set(
            compatible_tags((3, minor), f"cp3{minor}", _host_platforms(floor)))
        assert tag in accepted, f"CPython 3.{minor} on glibc 2.{floor} would not take {native.name}"
        older = set(compatible_tags((3, minor), f"cp3{minor}", _host_platforms(floor - 1)))
        assert tag not in older and _tag(pure) in older, "an older glibc gets the pure wheel"


def test_the_tag_is_the_oldest_glibc_policy_the_library_satisfies(release: tuple[Path, Path], tmp_path: Path) -> None:
    """Checked apart from maturin: the newest GLIBC_x.y symbol version the library needs is the tag's,
    it links nothing outside the manylinux list, and nothing of libpython (hence py3-none, not abi3)."""
    objdump = require_tool("objdump")
    native, _ = release
    so = tmp_path / "lib_native.so"
    so.write_bytes(zipfile.ZipFile(native).read("agent/_native/lib_native.so"))
    symbols = subprocess.run([objdump, "-T", str(so)], capture_output=True, text=True, check=True).stdout
    needs = {(int(a), int(b)) for a, b in re.findall(r"\bGLIBC_(\d+)\.(\d+)", symbols)}
    assert max(needs) == _floor(_tag(native)), f"the library needs glibc {max(needs)}"
    undefined = re.findall(r"\*UND\*\s+\S+\s+(?:\S+\s+)?(\S+)$", symbols, re.M)
    assert undefined and not [s for s in undefined if s.startswith(("Py", "_Py"))]
    headers = subprocess.run([objdump, "-p", str(so)], capture_output=True, text=True, check=True).stdout
    needed = set(re.findall(r"NEEDED\s+(\S+)", headers))
    assert needed and needed <= MANYLINUX_LIBS, needed - MANYLINUX_LIBS


def test_both_wheels_hold_the_same_package(release: tuple[Path, Path]) -> None:
    native, pure = release

    def files(wheel: Path) -> set[str]:
        return {n for n in zipfile.ZipFile(wheel).namelist() if not n.startswith("node_health_agent-")}

    only_native = files(native) - files(pure)
    assert only_native == {"agent/_native/__init__.py", "agent/_native/ffi.py", "agent/_native/lib_native.so"}
    assert files(pure) <= files(native)


def test_installs_offline_in_a_fresh_venv_and_runs_the_native_parsers(release: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    """The agent from the wheel alone (--no-index --no-deps); its dependencies are importable through a
    .pth naming this test run's site-packages (they are not what is under test)."""
    native, _ = release
    env_dir = tmp_path / "host"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = offline_env(NODE_HEALTH_AGENT_PARSERS="native")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(native)], env=env,
                   cwd=tmp_path, check=True, capture_output=True, timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "zz_test_dependencies.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    probe = ("import agent, agent._native, agent.native as n; "
             "print(agent.__file__); print(agent._native.__file__); print(n.IMPLEMENTATION)")
    res = subprocess.run([str(python), "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    package, library, implementation = res.stdout.split()
    assert package.startswith(site) and library.startswith(site), "the wheel's agent, not the checkout's"
    assert implementation == "native"
    res = subprocess.run([str(env_dir / "bin" / "agent"), "version"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0 and "parsers: native (agent._native)" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize(("glibc_minor", "python", "expected"), [
    pytest.param(36, "3.11", "native", id="glibc 2.36 (Debian 12, the image) CPython 3.11"),
    pytest.param(34, "3.13", "native", id="glibc 2.34 (RHEL 9) CPython 3.13"),
    pytest.param(31, "3.12", "pure", id="glibc 2.31 (Ubuntu 20.04): the twins"),
    pytest.param(28, "3.11", "pure", id="glibc 2.28 (RHEL 8): the twins"),
])
def test_pip_picks_the_native_wheel_where_it_fits_and_the_twins_elsewhere(
        release: tuple[Path, Path], tmp_path: Path, glibc_minor: int, python: str, expected: str) -> None:
    native, pure = release
    platforms = [arg for p in _host_platforms(glibc_minor) for arg in ("--platform", p)]
    res = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-index", "--find-links", str(native.parent), "--no-deps",
         "--only-binary=:all:", "--python-version", python, *platforms, "-d", str(tmp_path), "node-health-agent"],
        env=offline_env(), capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    (got,) = [p.name for p in tmp_path.glob("*.whl")]
    assert got == {"native": native, "pure": pure}[expected].name
