"""The built-in backend's real libraries on a host without an NVIDIA driver
(this machine and CI): cuBLAS from the wheel loads and exports what the burn
calls, and the real worker says "cannot run here" instead of failing a GPU."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest
from burnfakes import gpus
from conftest import skip_or_fail

from agent.burn import cublas
from agent.burn.backend import NoWatch
from agent.burn.builtin import BuiltinBackend
from agent.burn.model import BurnPlan
from agent.burn.orchestrator import run_burn
from agent.burn.verdict import Thresholds


def _no_driver() -> None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    pytest.skip("this host has an NVIDIA driver: the GPU benchmarks cover it (benches/burn.py)")


def _lib() -> ctypes.CDLL:
    try:
        return cublas.load_library()
    except cublas.CublasError as exc:
        skip_or_fail(f"needs the nvidia-cublas-cu12 wheel (pip install -e '.[test]'): {exc}")
        raise


def test_cublas_from_the_wheel_exports_what_the_burn_calls() -> None:
    lib = cublas.declare(_lib())
    assert cublas.version(lib).startswith(("12.", "13."))
    for name in ("cublasCreate_v2", "cublasSetStream_v2", "cublasGemmEx", "cublasDestroy_v2"):
        assert getattr(lib, name) is not None


def test_cublas_handle_without_a_gpu_is_an_error_not_a_crash() -> None:
    _no_driver()
    _lib()
    with pytest.raises(cublas.CublasError, match="cublasCreate: cuBLAS status"):
        cublas.Cublas(stream=0)


@pytest.mark.parametrize(
    "command",
    [
        ["list"],
        ["run", "--seconds", "1", "--matrix-size", "1024", "--memory-fraction", "0.1", "--memory-time-share", "0.2"],
    ],
)
def test_real_worker_without_a_driver_says_unavailable(command: list[str]) -> None:
    _no_driver()
    res = subprocess.run(
        [sys.executable, "-m", "agent.burn.worker", *command], capture_output=True, text=True, timeout=60, check=False
    )
    events = [json.loads(line) for line in res.stdout.splitlines()]
    assert res.returncode == 3, res.stderr
    assert events[-1]["event"] == "unavailable" and "cuda" in events[-1]["message"].lower()


def test_builtin_backend_without_a_driver_leaves_gpus_unknown() -> None:
    _no_driver()
    report = run_burn(BuiltinBackend(), gpus(2), BurnPlan(seconds=1, hang_timeout=60), NoWatch("test"), Thresholds())
    assert report.status == "unknown", report
    assert all(g.status == "unknown" and g.notes[0].startswith("not tested: ") for g in report.gpus)


@pytest.mark.parametrize("layout", ["nvidia/cu13/lib/libcublas.so.13", "nvidia/cublas/lib/libcublas.so.12"])
def test_cublas_is_found_in_either_wheel_layout_without_loading_it(
    layout: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA 12's wheel (nvidia-cublas-cu12) and CUDA 13's (nvidia-cublas, as
    PyTorch cu13x installs it) put libcublas in different folders."""
    import site

    monkeypatch.delenv(cublas.ENV, raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-toolkit"))
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(tmp_path)])
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(tmp_path / "user"))
    monkeypatch.setattr("sysconfig.get_paths", lambda: {"purelib": str(tmp_path)})
    monkeypatch.setattr("ctypes.util.find_library", lambda name: None)
    assert not cublas.installed()
    (tmp_path / layout).parent.mkdir(parents=True)
    (tmp_path / layout).write_bytes(b"\x7fELF")
    assert cublas.installed()


def test_cublas_named_by_the_environment(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cublas.ENV, str(tmp_path / "libcublas.so.12"))
    assert not cublas.installed()
    with pytest.raises(cublas.CublasError, match="cannot load cuBLAS from NODE_HEALTH_AGENT_CUBLAS="):
        cublas.load_library()
    (tmp_path / "libcublas.so.12").write_bytes(b"")
    assert cublas.installed()
