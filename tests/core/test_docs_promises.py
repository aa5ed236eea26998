"""Each behavioural promise in the safety sections of docs/remediation.md,
docs/burn.md and docs/kubernetes.md names the test that holds it.

A promise is a paragraph, list item or table row of a section in SAFETY that
says `never`, `always`, `only`, `at most` or `fails closed`. It must name a
test (`test_name` in backticks, or a `tests/….py` path; test_docs_links.py
checks that the names exist), or — a table row — its table's caption (the
paragraph just above the table) must; or the block says why it is no
promise of this code with `<!-- not a promise: why -->` (a rationale, the
kubelet's behaviour, what an attacker could do). A section of SAFETY that is
no longer in its doc fails: a renamed section must be named here again.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from docblocks import ROOT, Block, Prose, blocks, markers, prose

SAFETY = {
    "docs/remediation.md": ["The ladder", "Pods the drain could not move", "Time that cannot jump", "GPU reset",
                            "Reboot methods", "Modes and switches", "The fleet breaker", "Bare metal (no Kubernetes)"],
    "docs/burn.md": ["What a burn does", "The preflight", "Never under live work", "Kubernetes: the preflight taint",
                     "Periodic re-test"],
    "docs/kubernetes.md": ["Taints", "Drain", "The disruption budget", "The fleet breaker", "Retire",
                           "Least privilege, and what the admission policy cannot do",
                           "Threat model: a tenant, a network peer, a stolen agent token", "Kill switch and dry run"],
}
PROMISE = re.compile(r"\b(never|always|only|at most|fails? closed)\b", re.I)
NAMES_A_TEST = re.compile(r"`[^`]*\btest_\w+[^`]*`|\btests/[\w/]+\.py\b|\btest_[a-z0-9_]{8,}\b")


def headings(path: Path) -> list[tuple[int, str]]:
    """(line, title) of each heading outside code blocks; `### Reboot methods (`[x]`)` -> 'Reboot methods'."""
    return [(p.line, p.text.lstrip("#").strip().split(" (`")[0].strip()) for p in prose(path) if p.kind == "heading"]


def promises(path: Path, sections: list[str]) -> list[Block]:
    """The blocks of the given sections of one doc that make a promise."""
    heads = headings(path)
    out = []
    for block in blocks(path):
        heading = next((title for line, title in reversed(heads) if line < block.prose.line), "")
        if heading in sections and PROMISE.search(re.sub(r"`[^`]*`|<!--.*?-->", " ", block.prose.text, flags=re.S)):
            out.append(block)
    return out


def problem(block: Block) -> str | None:
    text = block.prose.text
    if NAMES_A_TEST.search(text) or (block.prose.kind == "row" and NAMES_A_TEST.search(block.caption)):
        return None
    reason = markers(text).get("not a promise")
    if reason is not None:
        return None if reason.strip() else f"{block.prose.where}: `not a promise:` gives no reason"
    return f"{block.prose.where}: a promise that names no test: {text[:120]!r}…"


DOCS = [ROOT / p for p in SAFETY]
PROMISES = [b for path in DOCS for b in promises(path, SAFETY[str(path.relative_to(ROOT))])]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_safety_section_is_still_there(doc: Path) -> None:
    titles = {title for _, title in headings(doc)}
    assert set(SAFETY[str(doc.relative_to(ROOT))]) <= titles


def test_the_finder_sees_the_promises() -> None:
    """It cannot go quiet: these sections make dozens of promises."""
    assert len(PROMISES) >= 40, len(PROMISES)


@pytest.mark.parametrize("block", PROMISES, ids=[b.prose.where for b in PROMISES])
def test_every_promise_names_the_test_that_holds_it(block: Block) -> None:
    assert problem(block) is None


@pytest.mark.parametrize(
    ("md", "bad"),
    [
        pytest.param("## Drain\n\nThe drain never evicts a DaemonSet pod.\n", True, id="a promise without a test"),
        pytest.param("## Drain\n\nThe drain never evicts a DaemonSet pod (`test_daemonset_pods_stay`).\n", False,
                     id="named"),
        pytest.param("## Drain\n\nThe kubelet never asks. <!-- not a promise: the kubelet's -->\n", False,
                     id="not ours"),
        pytest.param("## Drain\n\nThe kubelet never asks. <!-- not a promise: -->\n", True, id="no reason"),
        pytest.param("## Drain\n\nAnswers (`test_answers_are_handled`):\n\n| a | b |\n|---|---|\n| 404 | never again |\n",
                     False, id="a row held by its caption"),
        pytest.param("## Elsewhere\n\nThe drain never evicts a DaemonSet pod.\n", False, id="not a safety section"),
    ],
)
def test_the_checker_finds_a_promise_without_a_test(tmp_path: Path, md: str, bad: bool) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(md)
    found = [problem(Block(Prose(ROOT / "docs" / "x.md", b.prose.line, b.prose.text, b.prose.kind), b.caption))
             for b in promises(doc, ["Drain"])]
    assert any(found) == bad, found
