"""A native parser that hands a call to its Python twin is counted, logged once
and exported; and the twin tests fail when the native side is broken, so they
cannot pass by comparing the twin with itself.

The break: tests/support/break_native.py, a pytest plugin that makes every native call
return one NUL-separated string too many (a miscounting library), so every
call falls back to the twin and still returns the right records.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import native_loaded

from agent import metrics, native, registry, store

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
TESTS = ROOT / "tests"
# Every file that holds native parsers to their twins or reads through a native parser.
TWIN_FILES = (
    "test_parsers_twins.py",
    "test_parsers_generated.py",
    "test_parsers_nearmiss.py",
    "test_parsers_xid.py",
    "test_iptsave_parser.py",
    "test_parsers_boundary.py",
    "test_network_rates.py",
)
NUL_NAME = b"  et\x00h0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n"


@pytest.fixture(autouse=True)
def _native_loaded() -> None:
    native_loaded()


def fallback_series() -> dict[str, float]:
    series = metrics.collect_series(store.Store().snapshot(), registry.CATALOG)["node_health_native_fallback_total"]
    return {dict(labels)["parser"]: value for labels, value in series}


def test_every_parser_is_exported_at_zero_until_it_falls_back() -> None:
    assert set(fallback_series()) == {"net_dev", "diskstats", "mountinfo", "xid", "iptables_save", "kscreen"}
    assert fallback_series() == native.fallbacks()


@pytest.mark.native_fallback
def test_a_fallback_is_counted_per_parser_logged_once_and_on_metrics(caplog: pytest.LogCaptureFixture) -> None:
    before = native.fallbacks()
    with caplog.at_level(logging.WARNING, logger="agent.native"):
        for _ in range(3):
            assert [r.name for r in native.parse_net_dev(NUL_NAME)] == ["et\x00h0"]
        assert native.parse_diskstats(b"   8       0 sda 1 2 3 4 5 6 7 8 9 10 11\n")[0].name == "sda"  # no NUL
    after = native.fallbacks()
    assert {k: after[k] - before[k] for k in after} == {
        "net_dev": 3, "diskstats": 0, "mountinfo": 0, "xid": 0, "iptables_save": 0, "kscreen": 0
    }
    logged = [r.getMessage() for r in caplog.records if "net_dev" in r.getMessage()]
    assert len(logged) <= 1  # once per process: an earlier test may have logged it already
    assert before["net_dev"] > 0 or len(logged) == 1
    text = metrics.build_registry(store.Store(), registry.CATALOG).text().decode()
    assert f'node_health_native_fallback_total{{parser="net_dev"}} {after["net_dev"]:.1f}' in text
    assert 'node_health_native_fallback_total{parser="diskstats"} ' in text


def test_the_first_fallback_is_logged_in_a_fresh_process() -> None:
    code = (
        "import logging; logging.basicConfig(level=logging.WARNING, format='%(name)s %(message)s')\n"
        "from agent import native\n"
        f"for _ in range(5): native.parse_net_dev({NUL_NAME!r})\n"
        "print(native.fallbacks())"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str({"net_dev": 5, "diskstats": 0, "mountinfo": 0, "xid": 0, "iptables_save": 0, "kscreen": 0})
    warnings = [line for line in res.stderr.splitlines() if line.startswith("agent.native ")]
    assert len(warnings) == 1 and "native parser net_dev" in warnings[0], res.stderr


@pytest.mark.slow
def _find(name: str) -> Path:
    [path] = TESTS.rglob(name)  # wherever the tests are grouped
    return path


def test_a_miscounting_native_library_fails_every_twin_file() -> None:
    plugin_dir = str(_find("break_native.py").parent)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([plugin_dir, os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "break_native", "-rf", "--tb=no",
         *(str(_find(f)) for f in TWIN_FILES)],
        capture_output=True, text=True, timeout=900, check=False, env=env, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    failed_files = set(re.findall(r"^FAILED (?:\S+/)?(test_\w+\.py)::", res.stdout, re.M))
    assert failed_files == set(TWIN_FILES), res.stdout[-3000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ failed", summary), summary
