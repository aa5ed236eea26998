"""The `agent …` commands the README and docs/*.md show are real: every one
(in code blocks and inline code, synopses included) names commands, flags and
choices the argparse parser has; every literal one parses; those that need no
root, GPU or cluster are run (bounded, in a temporary state dir) and must not
fail as bad usage. Every bench in benches/ answers `--help` without running,
and every `node_health_*` metric the docs name is one the catalog declares.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr
from io import StringIO
from pathlib import Path

import pytest

from agent.cli import build_parser

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"(?<!`)`(agent [^`]+)`(?!`)")
# Commands run for real: none needs root, a GPU or a cluster, and none changes the host.
RUNNABLE = {("version",), ("docs",), ("xid",), ("config", "show"), ("config", "check"), ("selftest",), ("scan-log",)}


def commands(path: Path) -> Iterator[tuple[str, str]]:
    """(where, command) for each `agent …` command shown in a Markdown file."""
    in_fence = False
    prev_blank = True
    for n, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{path.relative_to(ROOT)}:{n}"
        if FENCE.match(line):
            in_fence = not in_fence
            prev_blank = False
            continue
        indented = not in_fence and line.startswith("    ") and prev_blank and line.strip()
        if in_fence or indented:
            for cmd in _shell_commands(line):
                yield where, cmd
        else:
            prev_blank = not line.strip()
            for m in INLINE.finditer(line):
                yield where, m.group(1).replace("\\|", "|").strip()
        if indented:
            prev_blank = True  # the rest of an indented block


def _shell_commands(line: str) -> Iterator[str]:
    """The `agent` commands of a shell line: `$ a | agent scan-log - --json  # note` gives one."""
    text = re.sub(r"^\s*(\$|#)\s+", "", line.strip())
    text = re.split(r"\s+#\s", text)[0]  # a trailing comment
    for part in re.split(r"\s(?:\||&&|;)\s", text):  # pipes and command lists
        part = re.sub(r"^sudo\s+", "", part.strip())
        if re.match(r"agent(\s|$)", part):
            yield part


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return None


def _placeholder(tok: str) -> bool:
    """FILE, N, <n>, HOST:PORT, 0,1,…, … : a stand-in, not a literal value."""
    return ("…" in tok or "..." in tok or bool(re.fullmatch(r"[A-Z][A-Z0-9_:]*|<[^<>]+>", tok))
            or tok == "FILE|-")


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
    if not value or not action.choices or _placeholder(value):
        return []
    return [f"`{here}`: {name} has no choice {v!r} (it has {', '.join(map(str, action.choices))})"
            for v in value.split("|") if v not in action.choices]


def literal(cmd: str) -> list[str] | None:
    """The argv of a command shown as typed (no synopsis brackets, choices or stand-ins)."""
    argv = cmd.split()[1:]
    if any(c in cmd for c in "[]|{}…") or "..." in cmd or any(_placeholder(t) for t in argv):
        return None
    return argv


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


RUN = sorted({cmd for _, cmd in ALL if (argv := literal(cmd)) is not None
              and (tuple(argv[:2]) in RUNNABLE or tuple(argv[:1]) in RUNNABLE)
              and all(Path(a).exists() for a in argv[1:] if a.startswith("/"))})


def test_runnable_commands_are_found() -> None:
    assert {c.split()[1] for c in RUN} >= {"selftest", "version", "docs", "xid"}, RUN


@pytest.mark.slow
@pytest.mark.parametrize("cmd", RUN)
def test_commands_that_need_no_root_gpu_or_cluster_run(cmd: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "KUBECONFIG"))}
    env |= {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "NODE_NAME": "docs-node"}
    res = subprocess.run([sys.executable, "-m", "agent", *cmd.split()[1:]], capture_output=True, text=True,
                         timeout=240, check=False, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
    # selftest and scan-log exit 1 for a finding on this machine: that is not the docs' fault; 2 is
    allowed = (0, 1) if cmd.split()[1] in ("selftest", "scan-log") else (0,)
    assert res.returncode in allowed, f"`{cmd}` exited {res.returncode}: {res.stderr[-2000:]}"
    assert res.stdout.strip(), f"`{cmd}` printed nothing"


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
