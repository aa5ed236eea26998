"""Shared test plumbing.

Tests that need root (namespaces, mounts, iptables) are marked `privileged`.
When NHA_REQUIRE_PRIVILEGED=1 (set by .ci/run) a privileged test that would
skip fails instead, so privileged coverage cannot silently vanish in CI.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CI_STRICT = os.environ.get("NHA_REQUIRE_PRIVILEGED") == "1"


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
