"""The `agent …` commands the README and docs/*.md show are real: every one
(in code blocks and inline code, synopses included) names commands, flags and
choices the argparse parser has; every literal one parses (which of them
are run, and how, is tests/core/test_docs_agent_runs.py's). Every bench in
benches/ answers `--help` without running, and every `node_health_*` metric
the docs name is one the catalog declares.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from contextlib import redirect_stderr
from io import StringIO
from pathlib import Path

import pytest
from docblocks import DOCS, ROOT, commands, literal, placeholder

from agent.cli import build_parser

def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return None


def _clean(tok: str) -> str:
    return tok.strip("[](){},")


def problems(cmd: str) -> list[str]:
    """What the parser does not have of `cmd` (a command or a synopsis)."""
    tokens = cmd.split()
    assert tokens[0] == "agent", cmd
    return _walk(build_parser(), ["agent"], tokens[1:])


def _walk(parser: argparse.ArgumentParser, path: list[str], tokens: list[str]) -> list[str]:
    here = " ".join(path)
    subs = _subcommands(parser)
    if subs is not None and tokens and not _clean(tokens[0]).startswith("-"):
        out = []
        for name in _clean(tokens[0]).split("|"):
            if name not in subs:
                out.append(f"`{here}` has no command {name!r} (it has {', '.join(sorted(subs))})")
            else:
                out += _walk(subs[name], [*path, name], tokens[1:])
        return out
    out = []
    options = parser._option_string_actions
    positionals = [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
    k = 0
    while k < len(tokens):
        tok = _clean(tokens[k])
        k += 1
        if tok in ("", "|", "…", "...", "-"):
            continue
        if tok.startswith("-"):
            for alt in tok.split("|"):
                name, _, value = alt.partition("=")
                action = options.get(name)
                if action is None:
                    out.append(f"`{here}` has no option {name}")
                    continue
                if action.nargs == 0:
                    continue
                if not value and k < len(tokens) and not _clean(tokens[k]).startswith("-"):
                    value = _clean(tokens[k])
                    k += 1
                out += _choices(here, name, action, value)
            continue
        if not positionals:
            out.append(f"`{here}` takes no argument {tok!r}")
            continue
        action = positionals[0]
        if action.nargs not in ("*", "+"):
            positionals = positionals[1:]
        out += _choices(here, action.metavar or action.dest, action, tok)
    return out


def _choices(here: str, name: str, action: argparse.Action, value: str) -> list[str]:
    if not value or not action.choices or placeholder(value):
        return []
    return [f"`{here}`: {name} has no choice {v!r} (it has {', '.join(map(str, action.choices))})"
            for v in value.split("|") if v not in action.choices]


ALL = [(where, cmd) for path in DOCS for where, cmd in commands(path)]


def test_the_docs_show_commands() -> None:
    """The collector cannot go quiet: the README and docs show dozens of commands."""
    assert len(ALL) >= 30, ALL
    assert {cmd.split()[1] for _, cmd in ALL if len(cmd.split()) > 1} >= {
        "run", "selftest", "config", "version", "scan-log", "xid", "rules", "burn", "docs"
    }


@pytest.mark.parametrize(("where", "cmd"), ALL, ids=[f"{w} {c}" for w, c in ALL])
def test_every_command_in_the_docs_is_one_the_parser_has(where: str, cmd: str) -> None:
    assert problems(cmd) == [], f"{where}: {cmd}"
    argv = literal(cmd)
    if argv is not None:
        err = StringIO()
        with redirect_stderr(err):
            try:
                build_parser().parse_args(argv)
            except SystemExit as exc:
                assert exc.code == 0, f"{where}: `{cmd}` does not parse: {err.getvalue().strip()}"


@pytest.mark.parametrize(
    ("cmd", "found"),
    [
        ("agent rules install --json", "`agent rules install` has no option --json"),
        ("agent rules show|install|remove [--backend auto|legacy|nft] [--json]", "`agent rules remove` has no option --json"),
        ("agent burn [--backend auto|builtin|nvbandwidth]", "--backend has no choice 'nvbandwidth'"),
        ("agent docs config|tables", "what has no choice 'tables'"),
        ("agent selftest --only disk --fast", "`agent selftest` has no option --fast"),
        ("agent rules list", "`agent rules` has no command 'list'"),
        ("agent version now", "`agent version` takes no argument 'now'"),
    ],
)
def test_the_checker_finds_what_the_parser_lacks(cmd: str, found: str) -> None:
    assert any(found in p for p in problems(cmd)), problems(cmd)


BENCHES = sorted(p for p in (ROOT / "benches").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("bench", BENCHES, ids=[p.name for p in BENCHES])
def test_every_bench_answers_help_without_running(bench: Path) -> None:
    res = subprocess.run([sys.executable, str(bench), "--help"], capture_output=True, text=True, timeout=120,
                         check=False, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    assert out.startswith("usage: "), out[:500]
    # argparse's help and nothing else: after its options block no line of a benchmark's own output
    head, sep, options = out.partition("\noptions:\n")
    assert sep, out
    assert all(not line or line.startswith(" ") for line in options.splitlines()), out


# Names the docs show on purpose although no agent exports them any more.
RETIRED = {"node_health_gpu_count": "docs/metrics.md: the name earlier builds used for node_health_gpus"}


def _expand(name: str) -> list[str]:
    """node_health_x_{a,b}_total -> node_health_x_a_total, node_health_x_b_total."""
    m = re.search(r"\{([a-z0-9_]+(?:,[a-z0-9_]+)+)\}", name)
    if not m:
        return [name]
    return [n for alt in m.group(1).split(",") for n in _expand(name[: m.start()] + alt + name[m.end():])]


def test_every_metric_the_docs_name_is_declared() -> None:
    from agent.registry import CATALOG

    declared = {m.name for m in CATALOG.metrics.values()}
    unknown = []
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            # a brace group right after "_" is shell-style expansion; after a name, it is a label list
            for m in re.finditer(r"\bnode_health_[a-z0-9_]*(?:(?<=_)\{[a-z0-9_]+(?:,[a-z0-9_]+)+\}[a-z0-9_]*)*", line):
                if line[m.end():m.end() + 1] == "-":
                    continue  # a wheel's file name (node_health_agent-0.1.0-py3-none-any.whl), not a metric
                for name in _expand(m.group(0)):
                    prefix = name.endswith("_") or any(d.startswith(name + "_") for d in declared)  # grep node_health_x
                    if name not in declared and not prefix and name not in RETIRED:
                        unknown.append(f"{path.relative_to(ROOT)}:{n}: {name}")
    assert unknown == []
