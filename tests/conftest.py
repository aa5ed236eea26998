"""Shared test plumbing.

Tests that need root (namespaces, mounts, iptables) are marked `privileged`.
When NHA_REQUIRE_PRIVILEGED=1 (set by .ci/run) a privileged test that would
skip fails instead, so privileged coverage cannot silently vanish in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

CI_STRICT = os.environ.get("NHA_REQUIRE_PRIVILEGED") == "1"

# Agents under test that are not about GPUs must not read the test machine's own
# kernel log: an NVRM/Xid line there (a real GPU host, or a developer's manual
# check) would change their findings and exit codes.
NO_HOST_KMSG = "\n[checks.gpu]\nxid_events = false\n"


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


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("privileged") is not None:
        require_root()


@pytest.fixture
def mount_ns() -> Iterator[Any]:
    """A private mount and pid namespace (tests/mountns.py), killed after the test."""
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


@pytest.fixture(scope="module")
def fake_gpu_libs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder with the fake libnvidia-ml.so.1, libcuda.so.1 and
    libcublas.so.12 (tests/fakenvml, tests/fakelibcuda), for the real burn
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
