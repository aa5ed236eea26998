"""The README's and docs/*.md's parts as the docs tests read them: fenced code
blocks (with the HTML-comment markers just above them), prose blocks (a
paragraph or a table row) and the `agent …` commands shown anywhere.

Markers are HTML comments, invisible on GitHub:
`<!-- illustrative: why -->`, `<!-- run by: tests/x.py::test_y, .ci/run -->`,
`<!-- figures: why -->`. A marker on the lines just above a fence (blank lines
between allowed) applies to the whole block; inside a paragraph or a table row
it applies to that block.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w-]*)")
MARKER = re.compile(r"<!--\s*([a-z ]+):\s*(.*?)\s*-->")
GENERATED = re.compile(r"<!-- BEGIN agent docs.*?<!-- END agent docs[^>]*-->", re.S)
INLINE = re.compile(r"(?<!`)`(agent [^`]+)`(?!`)")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def markers(text: str) -> dict[str, str]:
    """{kind: argument} of the `<!-- kind: argument -->` comments in a text (not those shown in inline code)."""
    return {m.group(1).strip(): m.group(2) for m in MARKER.finditer(re.sub(r"`[^`\n]*`", " ", text))}


@dataclass(frozen=True)
class Fence:
    path: Path
    line: int  # the opening fence's line number
    lang: str
    body: list[tuple[int, str]]
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


@dataclass(frozen=True)
class Prose:
    """A paragraph, a list item's paragraph or one table row, outside code."""

    path: Path
    line: int
    text: str
    kind: str  # "paragraph", "row", "heading"

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


def fences(path: Path) -> Iterator[Fence]:
    """Fenced blocks, and indented code blocks (lang "indented": 4 spaces after a blank line)."""
    lines = path.read_text().splitlines()
    k = 0
    while k < len(lines):
        m = FENCE.match(lines[k])
        indented = not m and lines[k].startswith("    ") and lines[k].strip() and k > 0 and not lines[k - 1].strip()
        if not m and not indented:
            k += 1
            continue
        start = k
        above = []
        j = k - 1
        while j >= 0 and (not lines[j].strip() or lines[j].strip().startswith("<!--")):
            above.append(lines[j])
            j -= 1
        body = []
        if m:
            k += 1
            while k < len(lines) and not FENCE.match(lines[k]):
                body.append((k + 1, lines[k]))
                k += 1
            k += 1
        else:
            while k < len(lines) and (lines[k].startswith("    ") or not lines[k].strip()):
                body.append((k + 1, lines[k]))
                k += 1
        yield Fence(path, start + 1, m.group(2) if m else "indented", body, markers("\n".join(above)))


def prose(path: Path) -> Iterator[Prose]:
    """Paragraphs (blank-line separated), table rows and headings outside fences and HTML comments."""
    para: list[str] = []
    first = 0
    fenced = False

    def flush() -> Iterator[Prose]:
        if para:
            yield Prose(path, first, "\n".join(para), "paragraph")
        para.clear()

    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            yield from flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        stripped = line.strip()
        if not stripped:
            yield from flush()
        elif stripped.startswith("|"):
            yield from flush()
            yield Prose(path, n, stripped, "row")
        elif stripped.startswith("#"):
            yield from flush()
            yield Prose(path, n, stripped, "heading")
        else:
            if re.match(r"^\s*(?:[-*+]|\d+\.)\s", line) and para:
                yield from flush()  # a new list item: its own block
            if not para:
                first = n
            para.append(line)
    yield from flush()


@dataclass(frozen=True)
class Block:
    prose: Prose
    caption: str  # for a table row: the paragraph just above its table, and the header row
    is_caption: bool = False  # a paragraph just above a table (its marker may be for the rows)


def blocks(path: Path) -> Iterator[Block]:
    """Paragraphs and table rows outside the generated tables (docs/reference/, `<!-- BEGIN agent docs -->`),
    each row with its table's caption and header."""
    if path.parent.name == "reference":
        return  # generated: test_readme.py
    text = path.read_text()
    generated = [(m.start(), m.end()) for m in GENERATED.finditer(text)]
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    caption, header, last_kind = "", "", ""
    pending: Prose | None = None
    for p in prose(path):
        if any(a <= offsets[p.line - 1] < b for a, b in generated):
            continue
        if pending is not None:
            yield Block(pending, "", is_caption=p.kind == "row")
            pending = None
        if p.kind == "row":
            if last_kind != "row":
                header = p.text
            last_kind = "row"
            yield Block(p, caption + "\n" + header)
            continue
        if p.kind == "paragraph":
            caption = p.text
            pending = p
        elif p.kind == "heading":
            caption = ""
        last_kind = p.kind
    if pending is not None:
        yield Block(pending, "")


# ---------------------------------------------------------------- `agent …` commands anywhere


def commands(path: Path) -> Iterator[tuple[str, str]]:
    """(where, command) for each `agent …` command shown in a Markdown file:
    fenced and indented code (a pipe's agent side too) and inline code."""
    in_fence = False
    prev_blank = True
    for n, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{rel(path)}:{n}"
        if FENCE.match(line):
            in_fence = not in_fence
            prev_blank = False
            continue
        indented = not in_fence and line.startswith("    ") and prev_blank and line.strip()
        if in_fence or indented:
            for cmd in shell_agent_commands(line):
                yield where, cmd
        else:
            prev_blank = not line.strip()
            for m in INLINE.finditer(line):
                yield where, m.group(1).replace("\\|", "|").strip()
        if indented:
            prev_blank = True  # the rest of an indented block


def piped_commands(path: Path) -> set[tuple[str, str]]:
    """(where, command) of the `agent` commands shown reading a pipe: `journalctl -k | agent scan-log -`."""
    out = set()
    fenced = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            text = re.split(r"\s+#\s", re.sub(r"^\s*\$\s+", "", line.strip()))[0]
            for part in re.split(r"\s\|\s", text)[1:]:
                out |= {(f"{rel(path)}:{n}", cmd) for cmd in shell_agent_commands(part)}
    return out


def shell_agent_commands(line: str) -> Iterator[str]:
    """The `agent` commands of a shell line: `$ a | agent scan-log - --json  # note` gives one."""
    text = re.sub(r"^\s*(\$|#)\s+", "", line.strip())
    text = re.split(r"\s+#\s", text)[0]  # a trailing comment
    for part in re.split(r"\s(?:\||&&|;)\s", text):  # pipes and command lists
        part = re.sub(r"^sudo\s+", "", part.strip())
        part = re.sub(r"^(?:\S*/)?python3?\s+-m\s+agent(\s|$)", r"agent\1", part)
        if re.match(r"agent(\s|$)", part):
            yield part


def placeholder(tok: str) -> bool:
    """FILE, N, <n>, HOST:PORT, 0,1,…, … : a stand-in, not a literal value."""
    return ("…" in tok or "..." in tok or bool(re.fullmatch(r"[A-Z][A-Z0-9_:]*|<[^<>]+>", tok))
            or tok == "FILE|-")


def literal(cmd: str) -> list[str] | None:
    """The argv of a command shown as typed (no synopsis brackets, choices or stand-ins)."""
    argv = cmd.split()[1:]
    if any(c in cmd for c in "[]|{}…") or "..." in cmd or any(placeholder(t) for t in argv):
        return None
    return argv
