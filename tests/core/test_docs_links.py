"""Everything the docs and manifests point at exists: every relative link and
its anchor, every repository path in backticks (`agent/gpu/nvml.py`,
`tests/core/test_readme.py::test_name`), every `agent.x.y` module, and every
test file a manifest's comment names. A rename that forgets a doc fails here."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from agent.settings import AgentSection

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
MARKDOWN = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "benches" / "README.md",
            *sorted((ROOT / "docs").rglob("*.md"))]
MANIFESTS = sorted(
    p for d in ("daemonset", "charts", "alerts", "systemd", "config") for p in (ROOT / d).rglob("*")
    if p.is_file() and p.suffix in (".yaml", ".yml", ".tpl", ".toml", ".service", ".json", "")
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
TOPS = ("agent", "tests", "benches", "native", "daemonset", "charts", "alerts", "dashboards", "systemd", "config",
        "docs", "build_backend", ".ci")
PATH = re.compile(r"`((?:" + "|".join(re.escape(t) for t in TOPS) + r")/[A-Za-z0-9_./\-]*[A-Za-z0-9_/])(?:::(\w+))?`")
MODULE = re.compile(r"`(agent(?:\.[a-z_][a-z0-9_]*)+)`")
TEST_IN_COMMENT = re.compile(r"\b(tests/[A-Za-z0-9_/]+\.py)\b")
TEST_NAME = re.compile(r"`(test_[a-z0-9_]+)`")  # a promise that names the test holding it
FENCE = re.compile(r"^\s*(```|~~~)")
AGENT_KEYS = set(AgentSection.__dataclass_fields__)


def _prose(path: Path) -> str:
    """The text outside code fences (a shell example may name a path that the reader makes)."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip()
        slug = "".join(
            c for c in unicodedata.normalize("NFKC", text.lower())
            if c.isalnum() or c in " -_"
        ).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


@pytest.mark.parametrize("doc", [p for p in MARKDOWN if p.exists()], ids=_rel)
def test_links_and_their_anchors_exist(doc: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(doc)):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {_rel(dest)}")
    assert not broken, f"{_rel(doc)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", [p for p in MARKDOWN if p.exists()], ids=_rel)
def test_paths_tests_and_modules_named_exist(doc: Path) -> None:
    text = _prose(doc)
    missing = []
    for rel, test in PATH.findall(text):
        if any(ch in rel for ch in "*<>{}") or rel.endswith("/"):
            continue
        path = ROOT / rel
        if not path.exists():
            missing.append(rel)
        elif test and not re.search(rf"def {test}\b", path.read_text()):
            missing.append(f"{rel}::{test}")
    for mod in MODULE.findall(text):
        parts = mod.split(".")
        if len(parts) == 2 and (parts[1] in AGENT_KEYS or parts[1] in ("toml", "lock", "json")):
            continue  # a key of [agent] (`agent.state_dir`) or a file name (`agent.toml`), not a module
        # `agent.kube.drain.evict` names a function: one of the leading prefixes must be a module.
        if not any((ROOT / Path(*parts[:n])).with_suffix(".py").exists() or (ROOT / Path(*parts[:n])).is_dir()
                   for n in range(len(parts), 1, -1)):
            missing.append(mod)
    assert not missing, f"{_rel(doc)} names what does not exist: {sorted(set(missing))}"


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        names.update(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


@pytest.mark.parametrize("doc", [p for p in MARKDOWN if p.exists()], ids=_rel)
def test_tests_named_as_holding_a_promise_exist(doc: Path) -> None:
    """docs/remediation.md, docs/burn.md, ... name the test behind each promise: a renamed test fails here."""
    named = set(TEST_NAME.findall(doc.read_text()))
    missing = sorted(named - _test_names())
    assert not missing, f"{_rel(doc)} names tests that do not exist: {missing}"


@pytest.mark.parametrize("manifest", MANIFESTS, ids=_rel)
def test_test_files_named_in_manifests_exist(manifest: Path) -> None:
    named = set(TEST_IN_COMMENT.findall(manifest.read_text(errors="replace")))
    missing = sorted(t for t in named if not (ROOT / t).exists())
    assert not missing, f"{_rel(manifest)} names tests that do not exist: {missing}"


def test_the_anchor_rule_matches_githubs() -> None:
    doc = ROOT / "docs" / "kubernetes.md"
    assert "deployment-daemonset-or-the-helm-chart" in anchors(doc)
    assert "the-taint-budget-fleet-wide-no-controller" in anchors(doc)
