"""The README stays true: its reference tables are generated from the schema
and the catalog (`agent docs …`), and its two commands are the ones CI runs.

To refresh the tables after changing the schema or the catalog:
    NHA_UPDATE_README=1 python -m pytest tests/test_readme.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from agent import docs

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- BEGIN agent docs (\w+) -->\n)(.*?)(<!-- END agent docs \2 -->)", re.S)


def test_reference_tables_match_the_code() -> None:
    text = README.read_text()
    found = {m.group(2) for m in BLOCK.finditer(text)}
    assert found == {"config", "metrics", "reasons"}
    fresh = BLOCK.sub(lambda m: m.group(1) + docs.render(m.group(2)) + m.group(4), text)
    if os.environ.get("NHA_UPDATE_README") == "1":
        README.write_text(fresh)
        return
    assert fresh == text, "README reference tables are stale: NHA_UPDATE_README=1 python -m pytest tests/test_readme.py"


def test_ci_runs_the_readme_test_command() -> None:
    text = README.read_text()
    m = re.search(r"## Tests\n.*?```sh\n(.+?)\n```", text, re.S)
    assert m, "README has a Tests section with one command"
    assert m.group(1).strip() in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("what", ["config", "metrics", "reasons"])
def test_docs_command_renders(what: str) -> None:
    assert docs.render(what).startswith("| ")
