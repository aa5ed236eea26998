"""python-iptables finds iptables' extension directory (XTABLES_LIBDIR) without
help, or the agent says plainly that it cannot."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import require_tool

from agent.traffic import legacy
from agent.traffic.tools import Unavailable


def test_first_directory_with_the_comment_extension_wins(tmp_path) -> None:
    empty, good, later = tmp_path / "empty", tmp_path / "good", tmp_path / "later"
    for d in (empty, good, later):
        d.mkdir()
    (good / "libxt_comment.so").write_bytes(b"")
    (later / "libxt_comment.so").write_bytes(b"")
    assert legacy.find_libdir([str(tmp_path / "missing"), str(empty), str(good), str(later)]) == str(good)
    assert legacy.find_libdir([str(empty)]) is None


def test_nowhere_to_be_found_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(legacy, "find_libdir", lambda candidates=None: None)
    with pytest.raises(Unavailable, match=r"libxt_comment\.so.*XTABLES_LIBDIR"):
        legacy.load_iptc()


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="unset"),
        pytest.param({"XTABLES_LIBDIR": "/nonexistent/xtables"}, id="pointing nowhere"),
        pytest.param({"XTABLES_LIBDIR": "/nonexistent:/also/missing"}, id="a list iptables accepts"),
    ],
)
def test_python_iptables_imports(env: dict[str, str]) -> None:
    require_tool("iptables-legacy")
    code = "import os; from agent.traffic.legacy import load_iptc; load_iptc(); print(os.environ['XTABLES_LIBDIR'])"
    base = {k: v for k, v in os.environ.items() if k != "XTABLES_LIBDIR"}
    # no /sbin on PATH either: python-iptables' own fallback (ldconfig) is not what makes this work
    res = subprocess.run([sys.executable, "-c", code], check=False, env={**base, **env, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    libdir = res.stdout.strip()
    assert os.path.isfile(os.path.join(libdir, "libxt_comment.so"))
