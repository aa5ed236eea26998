"""The native boundary: panics come back as errors, the choice of parsers is explicit.

A panic inside Rust must reach Python as `NativeError` and leave the process
running; NODE_HEALTH_AGENT_PARSERS picks the implementation (and refuses bad
values in one line); `agent version` and `node_health_build_info` say which
one is in use; the crate's own unit tests pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import require_tool, skip_or_fail
from test_parsers_twins import FIXTURES

from agent import native

ROOT = Path(__file__).resolve().parent.parent.parent


def run_python(code: str, *, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != native.ENV} | env
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=full, cwd=cwd, check=False
    )


def agent(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run_python(f"import sys; from agent.cli import main; sys.exit(main({list(args)!r}))", env=env, cwd=cwd)


@pytest.fixture()
def native_only() -> None:
    if native.IMPLEMENTATION != "native":
        skip_or_fail(f"native parsers not loaded: {native.describe()}")


def test_panic_is_native_error_and_process_survives(native_only: None, capfd: pytest.CaptureFixture[str]) -> None:
    data = (FIXTURES / "net_dev_64nics").read_bytes()
    for _ in range(3):
        with pytest.raises(native.NativeError, match="deliberate panic from nha_selftest_panic"):
            native.selftest_panic()
        assert len(native.parse_net_dev(data)) == 64
    assert "panicked" not in capfd.readouterr().err  # the message reaches Python, not stderr


def test_panic_in_a_subprocess_exits_cleanly(native_only: None) -> None:
    res = run_python(
        "from agent import native\n"
        "try:\n    native.selftest_panic()\nexcept native.NativeError as exc:\n    print('caught', exc)\n"
        "print(len(native.parse_net_dev(open('/proc/net/dev', 'rb').read())) > 0)",
        env={},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["caught deliberate panic from nha_selftest_panic (code -1)", "True"]
    assert res.stderr == ""


def test_threads_keep_their_own_buffers(native_only: None) -> None:
    inputs = [
        (FIXTURES / n).read_bytes() for n in ("mountinfo_k8s_gpu_node", "net_dev_64nics", "diskstats_4.4_11fields")
    ]
    parsers = [native.parse_mountinfo, native.parse_net_dev, native.parse_diskstats]
    expected = [p(d) for p, d in zip(parsers, inputs)]
    errors: list[str] = []

    def work(k: int) -> None:
        for i in range(60):
            j = (i + k) % 3
            if parsers[j](inputs[j]) != expected[j]:
                errors.append(f"thread {k} iteration {i}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_input_larger_than_the_kept_buffers(native_only: None) -> None:
    line = b"veth%d: " + b" ".join(b"%d" % (10**12 + i) for i in range(16)) + b"\n"
    big = b"".join(line % i for i in range(20000))  # ~2.5 MB of numbers out: more than is kept per thread
    assert native.parse_net_dev(big) == native.PYTHON_TWINS["net_dev"](big)
    small = (FIXTURES / "net_dev_64nics").read_bytes()
    assert native.parse_net_dev(small) == native.PYTHON_TWINS["net_dev"](small)


# ---------------------------------------------------------------- which implementation


def test_default_uses_native_and_says_so(native_only: None) -> None:
    res = agent("version", env={})
    assert res.returncode == 0, res.stderr
    assert "parsers: native (agent._native)" in res.stdout.splitlines()


def test_env_python_forces_the_twins() -> None:
    res = run_python(
        "from agent import native, metrics, registry, store\n"
        "from prometheus_client.exposition import generate_latest\n"
        "print(native.IMPLEMENTATION, all(getattr(native, 'parse_' + k) is f for k, f in native.PYTHON_TWINS.items()))\n"
        "print([l for l in generate_latest(metrics.build_registry(store.Store(), registry.CATALOG)).decode().splitlines()"
        " if l.startswith('node_health_build_info')][0])",
        env={native.ENV: "python"},
    )
    assert res.returncode == 0, res.stderr
    first, info = res.stdout.splitlines()
    assert first == "python True"
    assert 'native="false"' in info
    res = agent("version", env={native.ENV: "python"})
    assert "parsers: python (forced by NODE_HEALTH_AGENT_PARSERS=python)" in res.stdout.splitlines()


@pytest.fixture()
def without_library(tmp_path: Path) -> Path:
    """A copy of the package without its native library, importable from its own directory."""
    shutil.copytree(ROOT / "agent", tmp_path / "agent", ignore=shutil.ignore_patterns("_native", "__pycache__"))
    return tmp_path


def test_env_native_without_the_library_is_one_line_exit_2(without_library: Path) -> None:
    res = agent("version", env={native.ENV: "native"}, cwd=without_library)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith("agent: environment: NODE_HEALTH_AGENT_PARSERS: native parsers required")
    assert "agent._native" in res.stderr


def test_auto_without_the_library_falls_back_and_says_why(without_library: Path) -> None:
    res = agent("version", env={}, cwd=without_library)
    assert res.returncode == 0, res.stderr
    assert "parsers: python (native library unavailable: No module named 'agent._native')" in res.stdout


def test_unknown_choice_is_one_line_exit_2() -> None:
    res = agent("version", env={native.ENV: "rust"})
    assert res.returncode == 2
    assert (
        res.stderr
        == 'agent: environment: NODE_HEALTH_AGENT_PARSERS: expected one of "auto", "native", "python", got "rust"\n'
    )


# ---------------------------------------------------------------- the crate's own tests


@pytest.mark.slow
def test_cargo_unit_tests() -> None:
    cargo = require_tool("cargo")
    res = subprocess.run(
        [cargo, "test", "--offline", "--quiet", "--manifest-path", str(ROOT / "native" / "Cargo.toml")],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "test result: ok" in res.stdout
