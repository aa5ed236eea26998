"""Every command line the README and docs/*.md show is run by a test, or
marked as illustrative in a way this test checks.

What counts as a command line: every line of a ```sh / ```bash / ```shell
block (comment lines aside, `\\` continuations joined), the `$ ` lines of a
```console, ```text or unlabelled block (the lines after them are output),
the lines of an indented code block that start with a command, and the
`agent …` commands in inline code. An unlabelled block whose line
starts with a command but has no `$ ` prompt fails: label it `sh`.

How each is held true, by its first program:

- `agent …` (also `python -m agent`, `sudo agent`, the agent side of a pipe):
  every one parses with the real CLI parser (test_docs_commands.py), and
  the literal ones run by their class (test_docs_agent_runs.py). A pipe into
  `agent … -` from the host's log (`journalctl -k`, `dmesg`) needs nothing
  more: its agent side runs there on a saved kernel log.
- `benches/….py …`: its flags must be ones the bench's `--help` lists (a
  bench's run takes minutes, root or a GPU; benches/README.md holds what it
  printed).
- anything else (kubectl, helm, pip, promtool, curl, cargo, pytest,
  systemctl, iptables-save, …) needs a marker, on the lines just above the
  block (the whole block) or as the line's trailing comment (that line):
  `<!-- run by: tests/x.py::test_y, .ci/run -->` names where it is run (each
  target must exist and mention the program), or
  `<!-- illustrative: why it is not run here -->` (a reason, not empty).
  `echo`, `cd`, `export` are shell, not commands of their own.

A marker above a block with no command line to cover is stale and fails.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from docblocks import DOCS, ROOT, Fence, fences, markers, rel

SHELL = {"sh", "bash", "shell"}
PROMPTED = {"console", "text", ""}
BUILTINS = {"echo", "cd", "export", "set"}
LOG_SOURCES = {"journalctl", "dmesg", "cat"}  # what feeds `agent scan-log -` on the host
STARTS_A_COMMAND = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:sudo\s+)?"
    r"(?:agent|kubectl|helm|pip3?|\S*python3?|curl|promtool|cargo|systemctl|journalctl|iptables\S*)\s")


@dataclass(frozen=True)
class Line:
    where: str
    text: str  # the command line, prompt and trailing comment taken off
    marks: dict[str, str]  # the block's markers, then the line's own


def _join(body: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Lines with their `\\` continuations joined."""
    pending: tuple[int, str] | None = None
    for n, raw in body:
        if pending is not None:
            n, raw = pending[0], pending[1] + " " + raw.strip()
        if raw.rstrip().endswith("\\"):
            pending = (n, raw.rstrip()[:-1])
            continue
        pending = None
        yield n, raw


def _split_comment(text: str) -> tuple[str, str]:
    """('cmd', 'comment') of `cmd   # comment`; a `#` inside quotes is not a comment."""
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = ""
        list(lex)
    except ValueError:
        return text, ""
    m = re.search(r"\s#\s?(.*)$", text)
    if not m or text[: m.start()].count("'") % 2 or text[: m.start()].count('"') % 2:
        return text, ""
    return text[: m.start()].rstrip(), m.group(1)


def shell_lines(fence: Fence) -> Iterator[Line | str]:
    """The command lines of a block; a str for a line that should be a command but is not shown as one."""
    if fence.lang not in SHELL | PROMPTED | {"indented"}:
        return
    for n, raw in _join(fence.body):
        line = raw.strip()
        if fence.lang == "indented" and not STARTS_A_COMMAND.match(line):
            continue  # an indented block of prose or output, not a command
        prompted = line.startswith("$ ")
        if fence.lang in PROMPTED and not prompted:
            if fence.lang == "" and STARTS_A_COMMAND.match(line):
                yield f"{rel(fence.path)}:{n}: a command in an unlabelled block: label the block sh (or prompt it `$ `)"
            continue
        if not line or line.startswith("#"):
            continue
        text, comment = _split_comment(line[2:] if prompted else line)
        own = markers(f"<!-- {comment} -->") if re.match(r"[a-z ]+:", comment) else {}
        yield Line(f"{rel(fence.path)}:{n}", text, {**fence.marks, **own})


def stages(text: str) -> list[list[str]]:
    """The simple commands of a line (split at |, &&, ||, ;), each as its words."""
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars="|&;")
        lex.whitespace_split = True
        words = list(lex)
    except ValueError:
        words = text.split()
    out: list[list[str]] = [[]]
    for w in words:
        if w in ("|", "||", "&&", ";", "&"):
            out.append([])
        else:
            out[-1].append(w)
    return [s for s in out if s]


def program(words: list[str]) -> str:
    """`NHA_X=1 sudo .venv/bin/python -m pytest …` -> 'pytest'; `python benches/b.py` -> 'benches/b.py'."""
    words = list(words)
    while words and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]) or words[0] == "sudo"):
        words.pop(0)
    if not words:
        return ""
    name = os.path.basename(words[0])
    if re.fullmatch(r"python3?(\.\d+)?", name) and len(words) > 1:
        return words[2] if words[1] == "-m" and len(words) > 2 else words[1]
    return name


ALL_LINES = [item for path in DOCS for fence in fences(path) for item in shell_lines(fence)]
LINES = [x for x in ALL_LINES if isinstance(x, Line)]


def test_the_docs_show_shell_lines() -> None:
    """The collector cannot go quiet: the docs show kubectl, helm, promtool, pytest and agent lines."""
    progs = {program(s) for line in LINES for s in stages(line.text)}
    assert progs >= {"agent", "kubectl", "helm", "promtool", "pytest", "pip", "cargo", "systemd-analyze"}, progs
    assert len(LINES) >= 30


def test_no_command_hides_in_an_unlabelled_block() -> None:
    assert [x for x in ALL_LINES if isinstance(x, str)] == []


def _imports(text: str) -> list[Path]:
    """The tests/support modules a test file imports by name."""
    support = ROOT / "tests" / "support"
    names = re.findall(r"^\s*(?:from|import)\s+([a-z_][a-z0-9_]*)", text, re.M)
    out = []
    for name in names:
        for cand in (support / f"{name}.py", support / name / "__init__.py"):
            if cand.exists():
                out.append(cand)
    return out


def run_by_problems(target: str, prog: str) -> list[str]:
    """What is wrong with `run by: target` for a line whose program is `prog`."""
    file, _, test = target.strip().partition("::")
    path = ROOT / file
    if not path.is_file():
        return [f"{target}: no such file"]
    text = path.read_text()
    if test and not re.search(rf"^\s*(?:async )?def {re.escape(test)}\b", text, re.M):
        return [f"{target}: no test {test} in {file}"]
    word = os.path.basename(prog)
    if not any(word in t for t in [text, *(p.read_text() for p in _imports(text))]):
        return [f"{target} does not mention {word!r}: it cannot be what runs this line"]
    return []


@cache
def _bench_help(bench: str, *sub: str) -> str:
    """A bench's --help (a subcommand's, for `bench.py node --rounds 5`)."""
    res = subprocess.run([sys.executable, str(ROOT / bench), *sub, "--help"], capture_output=True, text=True, timeout=120,
                         check=False, cwd=ROOT, stdin=subprocess.DEVNULL)
    return res.stdout


def line_problems(line: Line) -> list[str]:
    """Why a command line is neither run by a test nor marked illustrative ([] when it is one of them)."""
    parts = stages(line.text)
    progs = [program(s) for s in parts]
    if not progs or progs[0] in BUILTINS:
        return []
    if progs[0] == "agent":
        return []  # parsed by test_docs_commands.py, run below by its class
    if "agent" in progs and all(p in LOG_SOURCES or p == "agent" or p in ("grep", "head") for p in progs):
        return []  # a kernel log piped into `agent scan-log -`: the agent side runs below on a saved log
    if progs[0].startswith("benches/") and progs[0].endswith(".py"):
        if not (ROOT / progs[0]).is_file():
            return [f"{line.where}: {progs[0]}: no such bench"]
        words = parts[0][parts[0].index(progs[0]) + 1:]
        sub = words[: next((i for i, w in enumerate(words) if w.startswith("-")), len(words))]
        helptext = _bench_help(progs[0], *sub)
        flags = [w.split("=")[0] for w in words if w.startswith("--")]
        return [f"{line.where}: {progs[0]} has no option {f}" for f in flags if not re.search(rf"{f}\b", helptext)]
    if "illustrative" in line.marks:
        return [] if line.marks["illustrative"].strip() else [f"{line.where}: `illustrative:` gives no reason"]
    if "run by" in line.marks:
        return [f"{line.where}: {p}" for t in line.marks["run by"].split(",") for p in run_by_problems(t, progs[0])]
    return [f"{line.where}: `{line.text}` is neither run by a test (`<!-- run by: tests/…::test_… -->`) "
            f"nor marked `<!-- illustrative: why -->`"]


@pytest.mark.parametrize("line", LINES, ids=[f"{x.where} {x.text[:60]}" for x in LINES])
def test_every_command_line_is_run_by_a_test_or_marked_illustrative(line: Line) -> None:
    assert line_problems(line) == []


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_no_marker_above_a_block_is_stale(doc: Path) -> None:
    stale = []
    for fence in fences(doc):
        covered = [x for x in shell_lines(fence) if isinstance(x, Line)]
        if {"illustrative", "run by"} & set(fence.marks) and not covered:
            stale.append(f"{fence.where}: a marker above a block with no command line")
    assert stale == []


@pytest.mark.parametrize(
    ("md", "found"),
    [
        pytest.param("```sh\nkubectl get nodes\n```\n", "neither run by a test", id="unmarked kubectl"),
        pytest.param("<!-- illustrative: -->\n```sh\nhelm list\n```\n", "gives no reason", id="no reason"),
        pytest.param("<!-- run by: tests/core/test_nothing.py -->\n```sh\npromtool x\n```\n", "no such file",
                     id="missing test file"),
        pytest.param("<!-- run by: tests/core/test_docs_links.py::test_nope -->\n```sh\npromtool x\n```\n",
                     "no test test_nope", id="missing test"),
        pytest.param("<!-- run by: tests/core/test_docs_links.py -->\n```sh\npromtool x\n```\n",
                     "does not mention 'promtool'", id="a test that cannot run it"),
        pytest.param("```sh\nsudo .venv/bin/python benches/bench_cycle.py --no-such-flag\n```\n",
                     "has no option --no-such-flag", id="bench flag"),
        pytest.param("```sh\ncurl -s x | grep y   # illustrative: needs a running agent\n```\n", None,
                     id="a line's own marker"),
        pytest.param("<!-- run by: .ci/run -->\n```sh\npip install -e '.[test]' && python -m pytest\n```\n", None,
                     id="run by CI"),
        pytest.param("```console\n$ journalctl -k | agent scan-log -\nout\n```\n", None, id="piped log"),
    ],
)
def test_the_checker_finds_unmarked_and_wrongly_marked_lines(tmp_path: Path, md: str, found: str | None) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(md)
    (fence,) = fences(doc)
    got = [p for x in shell_lines(_rooted(fence)) if isinstance(x, Line) for p in line_problems(x)]
    if found is None:
        assert got == []
    else:
        assert any(found in p for p in got), got


def test_an_unlabelled_block_with_a_command_is_found(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("```\nkubectl get nodes\n```\n")
    (fence,) = fences(doc)
    assert [x for x in shell_lines(_rooted(fence)) if isinstance(x, str)]


def _rooted(fence: Fence) -> Fence:
    """A temporary file's block, named as if it were under the repository (rel() needs that)."""
    return Fence(ROOT / "docs" / fence.path.name, fence.line, fence.lang, fence.body, fence.marks)
