"""The README stays true: its reference tables are generated from the schema
and the catalog (`agent docs …`), and its two commands are the ones CI runs.

To refresh the tables after changing the schema or the catalog (the test then
skips, as it compared nothing; refused under CI=true, see conftest.pytest_configure):
    NHA_UPDATE_README=1 python -m pytest tests/test_readme.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import update_requested

from agent import docs

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- BEGIN agent docs (\w+) -->\n)(.*?)(<!-- END agent docs \2 -->)", re.S)


def test_reference_tables_match_the_code() -> None:
    text = README.read_text()
    found = {m.group(2) for m in BLOCK.finditer(text)}
    assert found == {"config", "metrics", "reasons"}
    fresh = BLOCK.sub(lambda m: m.group(1) + docs.render(m.group(2)) + m.group(4), text)
    if update_requested("NHA_UPDATE_README"):
        README.write_text(fresh)
        pytest.skip("README.md tables rewritten from the code: review the diff, then run without NHA_UPDATE_README")
    assert fresh == text, "README reference tables are stale: NHA_UPDATE_README=1 python -m pytest tests/test_readme.py"


def test_ci_runs_the_readme_test_command() -> None:
    text = README.read_text()
    m = re.search(r"## Tests\n.*?```sh\n(.+?)\n```", text, re.S)
    assert m, "README has a Tests section with one command"
    assert m.group(1).strip() in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("what", ["config", "metrics", "reasons"])
def test_docs_command_renders(what: str) -> None:
    assert docs.render(what).startswith("| ")


@pytest.mark.parametrize("switch", ["NHA_UPDATE_GOLDEN", "NHA_UPDATE_README"])
def test_update_switches_fail_the_run_under_ci(switch: str) -> None:
    """A switch that rewrites a reference file makes its test compare the file with
    itself: under CI=true the run must fail, not pass vacuously."""
    env = {k: v for k, v in os.environ.items() if k not in ("NHA_UPDATE_GOLDEN", "NHA_UPDATE_README")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", str(Path(__file__))]
    res = subprocess.run(cmd, env=env | {"CI": "true", switch: "1"}, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode != 0
    assert f"{switch}=1 rewrites reference files instead of testing them; refused under CI=true" in res.stdout + res.stderr
    ok = subprocess.run(cmd, env=env | {"CI": "true"}, capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
