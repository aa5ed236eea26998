"""Shared test plumbing.

Tests that need root (namespaces, mounts, iptables) are marked `privileged`.
When NHA_REQUIRE_PRIVILEGED=1 (set by .ci/run) a privileged test that would
skip fails instead, so privileged coverage cannot silently vanish in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# Shared helpers (launchers, fakes, fixtures builders) live in tests/support/ and are
# imported by their module name from the tests of every folder.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

CI_STRICT = os.environ.get("NHA_REQUIRE_PRIVILEGED") == "1"

# Agents under test that are not about GPUs must not read the test machine's own
# kernel log: an NVRM/Xid line there (a real GPU host, or a developer's manual
# check) would change their findings and exit codes.
NO_HOST_XID = "\n[checks.gpu]\nxid_events = false\n"
NO_KERNEL_LOG = "\n[checks.kernel]\nlog_faults = false\n"  # nor for kernel faults (a real host's ring has some)
NO_HOST_KMSG = NO_HOST_XID + NO_KERNEL_LOG


def skip_or_fail(reason: str) -> None:
    """Skip on a developer box; fail where CI demands privileged coverage."""
    if CI_STRICT:
        pytest.fail(f"required in CI (NHA_REQUIRE_PRIVILEGED=1): {reason}")
    pytest.skip(reason)


def require_root() -> None:
    if os.geteuid() != 0:
        skip_or_fail("needs root")


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        skip_or_fail(f"needs {name} on PATH")
    return path  # type: ignore[return-value]


# Switches (NHA_UPDATE_GOLDEN, NHA_UPDATE_README, any NHA_UPDATE_*) rewrite a
# reference file from the code under test instead of comparing with it: a run
# with one set proves nothing, so CI refuses it.
UPDATE_PREFIX = "NHA_UPDATE_"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        on = sorted(k for k, v in os.environ.items() if k.startswith(UPDATE_PREFIX) and v not in ("", "0"))
        if on:
            raise pytest.UsageError(
                f"{', '.join(on)}=1 rewrites reference files instead of testing them; refused under CI=true"
            )


def update_requested(switch: str) -> bool:
    """Whether the developer asked to rewrite a reference file (never under CI: see pytest_configure)."""
    assert switch.startswith(UPDATE_PREFIX)
    return os.environ.get(switch) == "1"


# --------------------------------------------------------- native parsers proven


def _native_fallbacks() -> dict[str, int]:
    native = sys.modules.get("agent.native")  # only once something imported it
    return native.fallbacks() if native is not None else {}  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A native parser that falls back to its Python twin fails the test, unless
    the test is marked `native_fallback` (it feeds strings with NUL bytes and
    checks, per call, that the fallback happened exactly then: `native_vs_twin`).
    So a twin test cannot pass by comparing the twin with itself."""
    before = _native_fallbacks()
    result = yield
    fell = {k: v - before.get(k, 0) for k, v in _native_fallbacks().items() if v != before.get(k, 0)}
    if fell and item.get_closest_marker("native_fallback") is None:
        pytest.fail(f"native parsers fell back to their Python twins {fell}: the native code did not produce these records")
    return result


def native_loaded() -> None:
    from agent import native

    if native.IMPLEMENTATION != "native":
        skip_or_fail(f"native parsers not loaded: {native.describe()}")


def _has_nul(records: list[Any]) -> bool:
    return any(isinstance(f, str) and "\0" in f for r in records for f in r)


def native_vs_twin(kind: str, data: bytes, parse: Callable[[bytes], list[Any]] | None = None) -> list[Any]:
    """The native parser's records for `data` (`parse`, or `agent.native.parse_<kind>`),
    required equal to its Python twin's, field types included, and produced by the
    native code: it falls back to the twin exactly when a string holds a NUL byte."""
    from agent import native

    parse = parse or getattr(native, f"parse_{kind}")
    before = native.fallbacks()[kind]
    got = parse(data)
    fell_back = native.fallbacks()[kind] - before
    want = native.PYTHON_TWINS[kind](data)
    assert got == want
    assert [(type(r), *map(type, r)) for r in got] == [(type(r), *map(type, r)) for r in want]
    assert fell_back == int(_has_nul(want)), (
        f"{kind}: {fell_back} fallback(s) to the twin for {len(want)} record(s) "
        f"{'with' if _has_nul(want) else 'without'} a NUL byte in a string"
    )
    return got


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("privileged") is not None:
        require_root()


@pytest.fixture
def mount_ns() -> Iterator[Any]:
    """A private mount and pid namespace (tests/support/mountns.py), killed after the test."""
    from mountns import MountNamespace

    require_tool("unshare")
    require_tool("nsenter")
    with MountNamespace() as ns:
        yield ns


def _our_host_rules() -> str:
    """Our traffic rules in this (the test runner's) network namespace, both backends."""
    out = []
    for tool in ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save"):
        if os.geteuid() != 0 or shutil.which(tool) is None:
            continue
        res = subprocess.run([tool], capture_output=True, text=True, check=False)
        out += [line for line in res.stdout.splitlines() if "node-health-agent:" in line or "NODE-HEALTH-" in line]
    return "\n".join(out)


@pytest.fixture(scope="session", autouse=True)
def host_firewall_untouched() -> Iterator[None]:
    """Tests run agents in namespaces of their own or with the traffic check off:
    the machine running the tests must not end up with our rules in its tables."""
    before = _our_host_rules()
    yield
    after = _our_host_rules()
    assert after == before, f"the tests left traffic rules in the host's own tables:\n{after}"


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterator[None]:
    """A command run in-process (`cli.main(["selftest", ...])`) sets the root logger up as the real command
    does (`agent.logs.setup`: a handler on the sys.stderr of that moment, pytest's capture). Put the root
    logger back after each test, or later tests' records go to a closed stream ("--- Logging error ---")."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def state_dirs_writable_again() -> Iterator[None]:
    """A read-only command run in-process (`cli.main(["selftest", ...])`) makes every later `StateDir` of the
    process read-only (`agent.statedir.read_only_process`), as it should in the real command: undo it after
    each test so that one test's selftest cannot make the next test's state dir silently read-only."""
    yield
    import agent.statedir

    agent.statedir._read_only_process = False


@pytest.fixture(scope="module")
def fake_gpu_libs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder with the fake libnvidia-ml.so.1, libcuda.so.1 and
    libcublas.so.12 (tests/fakenvml, tests/support/fakelibcuda), for the real burn
    worker through the real cuda-bindings and NVRTC."""
    import fakelibcuda
    import fakenvml

    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError as exc:
        skip_or_fail(f"needs cuda-bindings and NVRTC (pip install -e '.[test]'): {exc}")
    d = str(tmp_path_factory.mktemp("gpu-libs"))
    try:
        fakenvml.build(d)
        return fakelibcuda.build(d)
    except (OSError, subprocess.CalledProcessError) as exc:
        skip_or_fail(f"cannot build the fake NVIDIA libraries: {exc}")
        raise
