"""The `agent …` commands the README and docs/*.md show as typed (no `[…]`,
`a|b`, `…` or FILE-style stand-ins: those only parse, test_docs_commands.py)
are run, in a temporary directory and HOME, without a kubeconfig or
in-cluster variables, each by its class (CLASSES; a new command fails until
it has one):

- read-only (`version`, `docs`, `xid`, `config show|check`, `selftest`,
  `scan-log`, `remediation status`): run as shown, must not exit 2 (bad
  usage) and must print something;
- `run` is the daemon, which as root installs iptables chains and serves a
  port: it runs with `--once` (every check once, installing nothing:
  test_traffic_daemon.py's test_dry_run_once_and_selftest_change_nothing);
- `rules …` changes the host's iptables: it runs only as root, in a network
  namespace of its own (`unshare --net`);
- `burn`, `selftest --burn` and `remediation unretire` need a GPU or change
  the node's record: parsed only (their behaviour is tests/burn/'s and
  tests/remediation/'s).

A command that reads a state dir gets an empty temporary one
(`--state-dir`) unless it names one (the docs mean the agent's; the test
machine's is neither read nor written). A host file the docs name is
replaced by a stand-in (HOST_FILES: the shipped config, a saved kernel log, a
web config); a command naming another absolute path this machine lacks is
skipped, saying so. A pipe into `agent … -` is fed a saved kernel log (its
source, `journalctl -k`/`dmesg`, reads the host and is not run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr
from io import StringIO
from pathlib import Path

import pytest
from docblocks import DOCS, ROOT, commands, literal, piped_commands

from agent.cli import build_parser

KERNEL_LOGS = ROOT / "tests" / "fixtures" / "kernel"
HOST_FILES: dict[str, Path | str] = {  # a file of the repository, or the text of a temporary one
    "/etc/node-health-agent/agent.toml": ROOT / "config" / "agent.toml",
    "/var/log/kern.log": KERNEL_LOGS / "dmesg-T.log",
    "/etc/node-health-agent/web/web-config.yml": "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
}
READ_ONLY = "read-only: run as shown"
ONCE = "the daemon: run with --once"
NETNS = "changes iptables: run as root in a network namespace of its own"
PARSE_ONLY = "needs a GPU or changes the node's record: parsed only"
CLASSES = {
    ("version",): READ_ONLY, ("docs",): READ_ONLY, ("xid",): READ_ONLY, ("config", "show"): READ_ONLY,
    ("config", "check"): READ_ONLY, ("selftest",): READ_ONLY, ("scan-log",): READ_ONLY,
    ("remediation", "status"): READ_ONLY,
    ("run",): ONCE,
    ("rules", "show"): NETNS, ("rules", "install"): NETNS, ("rules", "remove"): NETNS,
    ("burn",): PARSE_ONLY, ("remediation", "unretire"): PARSE_ONLY,
}
ALLOWED_EXIT = {"selftest": (0, 1), "scan-log": (0, 1), "run": (0, 1)}  # 1: a finding on this machine, not the docs'


def agent_commands() -> list[tuple[str, str, bool]]:
    """(where, command, piped) of every `agent` command shown; piped: its input comes from a pipe."""
    out = set()
    for path in DOCS:
        piped = piped_commands(path)
        out |= {(where, cmd, (where, cmd) in piped) for where, cmd in commands(path)}
    return sorted(out)


def klass(argv: list[str]) -> str | None:
    if "--burn" in argv:
        return PARSE_ONLY
    return CLASSES.get(tuple(argv[:2])) or CLASSES.get(tuple(argv[:1]))


AGENT = agent_commands()
LITERAL = [(w, c, p) for w, c, p in AGENT if literal(c) is not None]


@pytest.mark.parametrize(("where", "cmd", "piped"), LITERAL, ids=[f"{w} {c}" for w, c, _ in LITERAL])
def test_every_literal_agent_command_has_a_class(where: str, cmd: str, piped: bool) -> None:
    argv = literal(cmd)
    assert argv is not None
    assert klass(argv) is not None, f"{where}: `{cmd}`: decide how the docs test runs it (CLASSES)"


def _runnable() -> list[tuple[str, list[str], bool]]:
    out = {}
    for where, cmd, piped in LITERAL:
        argv = literal(cmd)
        assert argv is not None
        if klass(argv) in (READ_ONLY, ONCE, NETNS):
            out.setdefault(cmd, (where, argv, piped))
    return sorted(out.values(), key=lambda x: x[0])


RUN = _runnable()


def test_runnable_commands_are_found() -> None:
    assert {argv[0] for _, argv, _ in RUN} >= {"selftest", "version", "docs", "xid", "scan-log", "config", "run"}, RUN


def _argv(argv: list[str], tmp_path: Path) -> list[str] | None:
    """The command with the docs' host files replaced by stand-ins; None when it names one without."""
    out = []
    for a in argv:
        if isinstance(stand_in := HOST_FILES.get(a), Path):
            a = str(stand_in)
        elif isinstance(stand_in, str):
            (tmp_path / "host").mkdir(exist_ok=True)
            (tmp := tmp_path / "host" / Path(a).name).write_text(stand_in)
            a = str(tmp)
        elif a.startswith("/") and not Path(a).exists():
            return None
        out.append(a)
    if klass(argv) == ONCE:
        out.append("--once")
    if "--state-dir" not in out and _takes_state_dir(argv):
        (tmp_path / "state").mkdir(exist_ok=True)
        out += ["--state-dir", str(tmp_path / "state")]
    return out


def _takes_state_dir(argv: list[str]) -> bool:
    """Whether the command reads a state dir: it is given an empty temporary one (the docs imply the agent's)."""
    try:
        with redirect_stderr(StringIO()):
            build_parser().parse_args([*argv, "--state-dir", "x"])
    except SystemExit:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize(("where", "argv", "piped"), RUN, ids=[f"{w} agent {' '.join(a)}" for w, a, _ in RUN])
def test_commands_that_need_no_gpu_or_cluster_run(where: str, argv: list[str], piped: bool, tmp_path: Path) -> None:
    cmd = "agent " + " ".join(argv)
    run = _argv(argv, tmp_path)
    if run is None:
        pytest.skip(f"{where}: `{cmd}` names a host file this machine lacks and HOST_FILES has no stand-in for")
    prefix: list[str] = []
    if klass(argv) == NETNS:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("changes iptables: runs only as root, in a network namespace of its own")
        prefix = ["unshare", "--net"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KUBERNETES_", "KUBECONFIG", "NODE_HEALTH_AGENT_CONFIG"))}
    env |= {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "NODE_NAME": "docs-node",
            "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}
    stdin = (KERNEL_LOGS / "journalctl-k.log").open("rb") if piped else subprocess.DEVNULL
    try:
        res = subprocess.run([*prefix, sys.executable, "-m", "agent", *run], capture_output=True, text=True,
                             timeout=240, check=False, env=env, cwd=tmp_path, stdin=stdin)
    finally:
        if piped:
            stdin.close()  # type: ignore[union-attr]
    allowed = ALLOWED_EXIT.get(argv[0], (0,))
    assert res.returncode in allowed, f"{where}: `{cmd}` exited {res.returncode}: {res.stderr[-2000:]}"
    assert res.stdout.strip() or argv[0] == "run", f"{where}: `{cmd}` printed nothing"
