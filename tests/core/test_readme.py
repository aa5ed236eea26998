"""The README and docs/*.md stay true: their reference tables are generated
from the schema and the catalog (`agent docs …`) between BEGIN/END markers,
no catalog row is restated by hand outside them, and the README's two
commands are the ones CI runs.

To refresh the tables after changing the schema or the catalog (the test then
skips, as it compared nothing; refused under CI=true, see conftest.pytest_configure):
    NHA_UPDATE_README=1 python -m pytest tests/core/test_readme.py
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
from agent.registry import CATALOG, FEATURES

ROOT = Path(__file__).parent.parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
REFERENCE = ROOT / "docs" / "reference"
BLOCK = re.compile(r"(<!-- BEGIN agent docs (\w+)(?: (\w+))? -->\n)(.*?)(<!-- END agent docs \2(?: \3)? -->)", re.S)
STALE = "generated tables are stale: NHA_UPDATE_README=1 python -m pytest tests/core/test_readme.py"


def _refresh(path: Path) -> tuple[str, str, set[tuple[str, str | None]]]:
    text = path.read_text()
    found = {(m.group(2), m.group(3)) for m in BLOCK.finditer(text)}
    fresh = BLOCK.sub(lambda m: m.group(1) + docs.render(m.group(2), m.group(3)) + m.group(5), text)
    return text, fresh, found


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_generated_tables_match_the_code(path: Path) -> None:
    text, fresh, _ = _refresh(path)
    if update_requested("NHA_UPDATE_README"):
        path.write_text(fresh)
        pytest.skip(f"{path.name}: tables rewritten from the code: review the diff, then run without NHA_UPDATE_README")
    assert fresh == text, f"{path.name}: {STALE}"


def test_docs_reference_has_the_whole_reference() -> None:
    """The three whole tables live in docs/reference/, one page each; the README links them."""
    for what in ("config", "metrics", "reasons"):
        assert _refresh(REFERENCE / f"{what}.md")[2] == {(what, None)}
        assert f"docs/reference/{what}.md" in README.read_text()


def test_every_features_reasons_and_metrics_have_their_table_in_docs() -> None:
    found = set().union(*(_refresh(p)[2] for p in DOCS))
    wanted = {
        (what, name)
        for name, (reasons, metrics) in FEATURES.items()
        if name != "core"  # the agent's own: in the README
        for what, declared in (("reasons", reasons), ("metrics", metrics))
        if declared
    }
    assert wanted <= found, f"no generated table in docs/ for {sorted(wanted - found)}"
    assert ("actions", None) in found, "docs/gpu.md: the Xid catalog by action"
    assert ("xids", None) in found, "docs/gpu.md: every Xid, its bucket, severity and action"


def _outside_blocks(text: str) -> str:
    return BLOCK.sub("", text)


def _hand_rows(text: str) -> list[tuple[str, str]]:
    """(header, first cell) of every table row outside the generated blocks."""
    rows, header = [], ""
    lines = _outside_blocks(text).splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            header = ""
        elif not header and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = line
        elif not line.startswith("|---"):
            rows.append((header, line.split("|")[1].strip()))
    return rows


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_no_catalog_row_is_restated_by_hand(path: Path) -> None:
    """A table that says what a reason or metric means (its severity, type or meaning) is generated;
    tables about something else may name them (docs/metrics.md's overlap with node_exporter)."""
    declared = set(CATALOG.reasons) | set(CATALOG.metrics)
    restated = [
        cell for header, cell in _hand_rows(path.read_text())
        if re.search(r"\| (meaning|severity|type|when) \|", header) and re.sub(r"[`{].*", "", cell.strip("`")) in declared
    ]
    assert not restated, f"{path.name}: table rows restate the catalog by hand: {restated}"


def test_ci_runs_the_readme_test_command() -> None:
    text = README.read_text()
    m = re.search(r"## Tests\n.*?```sh\n(.+?)\n```", text, re.S)
    assert m, "README has a Tests section with one command"
    assert m.group(1).strip() in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("what", ["config", "metrics", "reasons", "actions", "patterns", "xids"])
def test_docs_command_renders(what: str) -> None:
    assert docs.render(what).startswith("| ")


@pytest.mark.parametrize("feature", ["disk", "network", "gpu", "traffic", "burn", "kube", "core"])
def test_a_features_table_holds_only_what_it_declares(feature: str) -> None:
    reasons, metrics = FEATURES[feature]
    table = docs.render("metrics", feature)
    assert {m.name for m in metrics} == set(re.findall(r"^\| `(\w+)`", table, re.M))
    names = set(re.findall(r"^\| `(\w+)`", docs.render("reasons", feature), re.M))
    assert names == {r.name for r in reasons if not re.fullmatch(r"Xid\d+", r.name)}


def test_docs_command_refuses_an_unknown_feature() -> None:
    with pytest.raises(ValueError, match="no feature 'nosuch'"):
        docs.render("metrics", "nosuch")


def test_agent_docs_takes_a_feature_and_refuses_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    from agent import cli

    assert cli.main(["docs", "metrics", "disk"]) == 0
    assert capsys.readouterr().out == docs.render("metrics", "disk")
    assert cli.main(["docs", "reasons", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no feature 'nosuch'" in err and "Traceback" not in err


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
