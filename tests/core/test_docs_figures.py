"""Every figure in the README's and docs/*.md's prose says where it comes from.

A figure is a number with a unit of measure: a size (B, KB, KiB, MB, MiB, GB,
GiB), a share (%), a ratio (×, or x after a number), a duration (ns, µs, ms, s, m, min, h,
seconds, minutes, hours), a rate (lines/s, wake-ups/s, …), instructions/line
or a count of series. Prose is each paragraph, list item and table row
outside code blocks, inline code, link targets, HTML comments, headings (the
section's paragraphs carry the figure) and the generated reference tables
(docs/reference/, `<!-- BEGIN agent docs … -->` blocks: test_readme.py holds
them).

A block holding a figure must do one of:

1. cite the bench and its row: link to a section of benches/README.md
   (`[…](../benches/README.md#anchor)`) whose anchor exists and whose text
   names the bench that printed it (`benches/….py`); every number of the
   block's figures must then be one that section holds (to the figure's
   precision: 262 ms is the row's 261.8), so a stale copy fails — unless the
   block also says `<!-- figures: why -->` (arithmetic on the row, a goal).
   A table row may leave the citation to the table's caption (the paragraph
   just above the table) or its header row;
2. be a configured default or limit: each figure equals the default (in the
   embedded configuration, `agent config show`) of a key the block names in
   backticks (`interval`, `checks.burn.duration`, `memory_fraction`) or in
   a `<!-- default: checks.gpu.interval, kubernetes.qps -->` marker (dotted
   keys that must exist); the test normalises units (30 s = "30s",
   85 % = 0.85, 1 minute = "1m"); a table row may leave the marker to its
   caption;
3. carry `<!-- figures: why -->` (a reason, not empty): a fact of the world,
   not of this code (a Kubernetes or NVIDIA default, a kernel's message, an
   alert rule's `for:`), a worked example, or arithmetic on figures cited in
   the same section. As with 1, a row may leave it to its caption.

A `figures:` or `default:` marker in a block without a figure (a table's
caption aside) is stale and fails.
"""

from __future__ import annotations

import re
import tomllib
import unicodedata
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from docblocks import DOCS, ROOT, Block, Prose, blocks, markers, rel

from agent.config import parse, to_toml

BENCHES = ROOT / "benches" / "README.md"
NUMBER = r"\d[\d,]*(?:\.\d+)?"
UNITS = {
    "ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "B": 1.0, "KB": 1e3, "kB": 1e3, "KiB": 2.0**10, "MB": 1e6, "MiB": 2.0**20, "GB": 1e9, "GiB": 2.0**30,
    "%": 0.01, "×": 1.0, "x": 1.0,
}
UNIT = "|".join(sorted((re.escape(u) for u in UNITS), key=len, reverse=True))
FIGURE = re.compile(
    rf"(?<![\w.\-/#:])[~≈<>≤≥+±]?\s?({NUMBER}(?:\s?[–-]\s?{NUMBER})?)\s?"
    rf"(?:({UNIT})(?![\w/])|(?:(?:[kMG]\s)?[\w-]+/(?:s|line|run|cycle)\b)|(instructions/line|series)\b)"
)
# `8 × 425 MiB`: a "×" between numbers is arithmetic, its operands are the figures
TIMES_BETWEEN = re.compile(rf"{NUMBER}\s?×\s?(?={NUMBER})")
BENCH_LINK = re.compile(r"\]\((?:\.\./)*benches/README\.md#([\w-]+)\)")


def strip(text: str) -> str:
    """Prose without what holds no figure of its own: code, link targets, comments, footnote numbers."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"https?://\S+", " ", text)
    return TIMES_BETWEEN.sub(" ", text)


def figures(text: str) -> list[str]:
    return [m.group(0).strip() for m in FIGURE.finditer(strip(text))]


def value_of(figure: str) -> list[float]:
    """A figure's numbers in base units (seconds, bytes, ratio): `2.6-2.7 ms` -> [0.0026, 0.0027]."""
    unit = re.search(rf"({UNIT})$", figure.replace(" ", ""))
    scale = UNITS[unit.group(1)] if unit else 1.0
    return [float(n.replace(",", "")) * scale for n in re.findall(NUMBER, figure)]


@cache
def _sections() -> dict[str, list[str]]:
    """benches/README.md's anchors (GitHub's rule, as test_docs_links.py's) -> the text of that section (its
    subsections included) and of each section that encloses it, the title aside."""
    text = BENCHES.read_text()
    heads = list(re.finditer(r"^(#+) .*$", text, re.M))
    out: dict[str, list[str]] = {}
    seen: dict[str, int] = {}
    stack: list[tuple[int, str]] = []  # (level, text) of the enclosing sections
    for k, m in enumerate(heads):
        level = len(m.group(1))
        slug = "".join(c for c in unicodedata.normalize("NFKC", m.group(0).lstrip("#").strip().lower())
                       if c.isalnum() or c in " -_").replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        end = next((h.start() for h in heads[k + 1:] if len(h.group(1)) <= level), len(text))
        stack = [(lv, t) for lv, t in stack if lv < level]
        body = text[m.start():end]
        out[slug if n == 0 else f"{slug}-{n}"] = [body, *(t for _, t in reversed(stack))]
        if level > 1:  # the title's "section" is the whole file
            stack.append((level, body))
    return out


def _numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(NUMBER, text)]


def unmatched(figure: str, anchors: list[str]) -> list[str]:
    """The numbers of a figure that no cited section holds (to the figure's precision: 262 is 261.8)."""
    held = [x for a in anchors for x in _numbers(_sections().get(a, [""])[0])]
    out = []
    for n in re.findall(NUMBER, figure):
        decimals = len(n.split(".")[1]) if "." in n else 0
        value = float(n.replace(",", ""))
        if not any(abs(x - value) <= 0.5 * 10**-decimals + 1e-9 for x in held):
            out.append(n)
    return out


def bench_citation_problems(text: str) -> list[str] | None:
    """None: no citation; []: a good one; else what is wrong with the citations."""
    cited = BENCH_LINK.findall(text)
    if not cited:
        return None
    out = []
    for anchor in cited:
        sections = _sections().get(anchor)
        if sections is None:
            out.append(f"benches/README.md#{anchor}: no such section")
        elif not any((ROOT / b).is_file() for t in sections for b in re.findall(r"benches/[a-z][\w/]*\.py", t)):
            out.append(f"benches/README.md#{anchor}: the section names no bench (benches/….py)")
    return out


@cache
def defaults() -> dict[str, Any]:
    """Every key of the embedded configuration, dotted, with its default."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: dict[str, Any]) -> None:
        for key, val in node.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(val, dict):
                walk(path, val)
            else:
                flat[path] = val

    walk("", tomllib.loads(to_toml(parse("", "defaults.toml"))))
    return flat


def _default_values(val: Any) -> set[float]:
    if isinstance(val, bool):
        return set()
    if isinstance(val, int | float):
        return {float(val)}
    if isinstance(val, str):
        parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", val)
        if parts and "".join(n + u for n, u in parts) == val:
            scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
            return {sum(float(n) * scale[u] for n, u in parts)}
        if re.fullmatch(NUMBER, val):
            return {float(val)}
    if isinstance(val, list):
        return {v for x in val for v in _default_values(x)}
    return set()


def named_defaults(text: str) -> set[float]:
    """The defaults of the keys a block names in backticks (`interval`, `checks.gpu.interval`, `[remediation] interval`)."""
    names = set(re.findall(r"`(?:\[[\w.]+\]\s*)?([a-z_][a-z0-9_.]*)`", text))
    names |= {f"{s}.{k}" for s, k in re.findall(r"`\[([\w.]+)\]\s*([a-z_]+)`", text)}
    out: set[float] = set()
    for path, val in defaults().items():
        if any(path == n or path.endswith("." + n) for n in names):
            out |= _default_values(val)
    return out


def _is_default(figure: str, values: set[float]) -> bool:
    return all(any(abs(v - d) <= 1e-9 * max(1.0, abs(d)) for d in values) for v in value_of(figure))


def problems(block: Block) -> list[str]:
    text = block.prose.text
    found = figures(text)
    marks = markers(text)
    if "figures" in marks and not marks["figures"].strip():
        return [f"{block.prose.where}: `figures:` gives no reason"]
    if not found:
        stale = set() if block.is_caption else {"figures", "default"} & set(marks)
        return [f"{block.prose.where}: a `{m}:` marker in a block without a figure" for m in sorted(stale)]
    for where_text in (text, block.caption):
        cited = bench_citation_problems(where_text)
        if cited:
            return [f"{block.prose.where}: {c}" for c in cited]
        if cited is not None:
            if "figures" in markers(text) or "figures" in markers(where_text):
                return []  # some are arithmetic on the row, or a goal: the marker says
            missing = [n for f in found for n in unmatched(f, BENCH_LINK.findall(where_text))]
            return [f"{block.prose.where}: {', '.join(missing)}: not in the cited section of benches/README.md "
                    "(a stale figure? else say why with <!-- figures: why -->)"] if missing else []
        if "figures" in markers(where_text):
            return []
    values = named_defaults(text)
    for where_text in (text, block.caption):
        for key in filter(None, (k.strip() for k in markers(where_text).get("default", "").split(","))):
            if key not in defaults():
                return [f"{block.prose.where}: `default: {key}`: no such key in the configuration"]
            values |= _default_values(defaults()[key])
    bare = [f for f in found if not _is_default(f, values)]
    if not bare:
        return []
    return [f"{block.prose.where}: {', '.join(bare)}: cite the bench row (a link to benches/README.md#…), "
            f"name the config key it is the default of, or mark it <!-- figures: why -->"]


ALL = [b for path in DOCS for b in blocks(path)]
WITH_FIGURES = [b for b in ALL if figures(b.prose.text) or {"figures", "default"} & set(markers(b.prose.text))]


def test_the_docs_hold_figures() -> None:
    """The finder cannot go quiet: the docs quote MB, %, ×, ms and durations in dozens of places."""
    units = {re.sub(r"[\d.,\s–\-~≈<>≤≥+±]", "", f) for b in WITH_FIGURES for f in figures(b.prose.text)}
    assert {"MB", "%", "×", "ms", "s", "MiB"} <= units, units
    assert len(WITH_FIGURES) >= 50


@pytest.mark.parametrize("block", WITH_FIGURES, ids=[b.prose.where for b in WITH_FIGURES])
def test_every_figure_cites_its_bench_or_is_a_default(block: Block) -> None:
    assert problems(block) == []


@pytest.mark.parametrize(
    ("text", "found"),
    [
        pytest.param("RSS is 49.3 MB without a cluster.", ["49.3 MB"], id="size"),
        pytest.param("native 9.3 – 17.5 ms, Python 109.5 ms: 10.9 – 11.7×", ["9.3 – 17.5 ms", "109.5 ms", "10.9 – 11.7×"],
                     id="ranges and ratio"),
        pytest.param("8 × 425 MiB = 3,400 MiB", ["425 MiB", "3,400 MiB"], id="arithmetic"),
        pytest.param("0.284 % of a core, 2,000 series, 41 instructions/line, 1.2 M lines/s",
                     ["0.284 %", "2,000 series", "41 instructions/line", "1.2 M lines/s"], id="shares and counts"),
        pytest.param("Helm 3, kernel 4.x, Python ≥ 3.11, `30s`, Xid 79, [a](b.md#x-30-s)", [], id="not figures"),
        pytest.param("every 30 s and 5 minutes", ["30 s", "5 minutes"], id="durations"),
        pytest.param("up to 3x, 17 – 36x; not 0x8 nor 2x2", ["3x", "17 – 36x"], id="an ascii ratio"),
    ],
)
def test_the_finder_finds_figures(text: str, found: list[str]) -> None:
    assert figures(text) == found


def _block(tmp_path: Path, md: str) -> list[str]:
    doc = tmp_path / "x.md"
    doc.write_text(md)
    out = []
    for b in blocks(doc):
        fake = Prose(ROOT / "docs" / "x.md", b.prose.line, b.prose.text, b.prose.kind)
        out += problems(Block(fake, b.caption, b.is_caption))
    return out


@pytest.mark.parametrize(
    ("md", "found"),
    [
        pytest.param("It takes 12 ms.\n", "12 ms: cite the bench row", id="uncited"),
        pytest.param("It takes 12 ms ([b](../benches/README.md#no-such)).\n", "no such section", id="bad anchor"),
        pytest.param("It takes 12 ms ([b](../benches/README.md#where-and-how-these-figures-were-taken)).\n",
                     "names no bench", id="a section without a bench"),
        pytest.param("Every `interval` (31 s).\n", "31 s", id="not the default"),
        pytest.param("No figure here. <!-- figures: stale -->\n", "without a figure", id="stale marker"),
        pytest.param("It takes 12 ms. <!-- figures: -->\n", "gives no reason", id="empty marker"),
        pytest.param("The disk check runs every `checks.disk.interval` (30 s).\n", None, id="a default"),
        pytest.param("Kubelet waits 5 minutes. <!-- figures: Kubernetes' default -->\n", None, id="marked"),
        pytest.param("Polled every 30 s. <!-- default: checks.gpu.interval -->\n", None, id="a default by marker"),
        pytest.param("Polled every 31 s. <!-- default: checks.gpu.interval -->\n", "31 s", id="not that default"),
        pytest.param("Polled every 30 s. <!-- default: checks.gpu.no_such -->\n", "no such key", id="no such key"),
        pytest.param("Parsers ([b](../benches/README.md#gpu-xid-parser-nvml-poll-xid-latency)):\n\n"
                     "| a | b |\n|---|---|\n| x | 9.3 – 17.5 ms |\n", None, id="a row cited by its caption"),
        pytest.param("Parsers ([b](../benches/README.md#gpu-xid-parser-nvml-poll-xid-latency)):\n\n"
                     "| a | b |\n|---|---|\n| x | 16.6 ms |\n", "16.6: not in the cited section", id="a stale figure"),
    ],
)
def test_the_checker_tells_cited_from_uncited(tmp_path: Path, md: str, found: str | None) -> None:
    got = _block(tmp_path, md)
    if found is None:
        assert got == []
    else:
        assert any(found in p for p in got), got


def test_docs_files_are_read() -> None:
    assert {rel(p) for p in DOCS} >= {"README.md", "docs/cost.md", "docs/remediation.md"}
