"""The `agent` command.

Exit codes everywhere: 0 healthy or done, 1 a warning or critical finding,
2 bad usage, bad config or bad input (one line on stderr, no traceback).
Feature commands (scan-log and xid, rules, burn) live in their own modules
of this package (`gpu`, `traffic`, `burn`, `remediation`); each has ``register(subparsers)``
and sets ``func``. What they share is in `agent.cli.shared`.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

from .. import __version__
from .shared import Parser, UsageError, common_flags, config_flag, config_path, did_you_mean, overrides


def _web_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--web.config.file", dest="web_config_file", metavar="FILE",
                   help="exporter-toolkit web config (YAML: TLS, basic auth, headers), as node_exporter takes it")


class _Version(argparse.Action):
    """`agent --version`, the same as `agent version`."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        cmd_version(argparse.Namespace())
        parser.exit(0)


def build_parser() -> Parser:
    parser = Parser(prog="agent", description="Per-node health agent for GPU clusters on Kubernetes.")
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version and exit (as agent version)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    run = sub.add_parser("run", help="run the agent (the daemon)", description="Run the agent until SIGTERM.")
    common_flags(run)
    run.add_argument("--listen", "--web.listen-address", dest="listen", metavar="HOST:PORT",
                     help="address for /metrics and /healthz")
    run.add_argument("--telemetry-path", "--web.telemetry-path", dest="telemetry_path", metavar="PATH",
                     help="path of the metrics (default /metrics; config metrics.telemetry_path)")
    _web_config_flag(run)
    run.add_argument("--state-dir", metavar="DIR", help="state directory (default /var/lib/node-health-agent)")
    run.add_argument("--once", action="store_true", help="run every check once, installing nothing (as selftest), then exit 0 (healthy) or 1")
    run.add_argument("--dry-run", action="store_true", help="decide but change nothing on the node or cluster")
    run.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig of the cluster (default: $KUBECONFIG, else in-cluster)")
    run.set_defaults(func=cmd_run)

    st = sub.add_parser("selftest", help="run every enabled check once and print a table")
    common_flags(st)
    st.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    st.add_argument("--only", nargs="+", metavar="CHECK",
                    help="run only these checks (enabled or not); a finding's check label names one (xid: the gpu check)")
    st.add_argument("--state-dir", metavar="DIR",
                    help="the agent's state directory, read only (default: the config's agent.state_dir)")
    st.add_argument("--burn", type=float, metavar="SECONDS", help="also burn every GPU for SECONDS (see agent burn)")
    st.set_defaults(func=cmd_selftest)

    cfg = sub.add_parser("config", help="check or show configuration")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="ACTION", parser_class=Parser)
    cfg_sub.required = True
    check = cfg_sub.add_parser("check", help="validate a config file (exit 0 ok, 2 bad)")
    check.add_argument("file", metavar="FILE")
    _web_config_flag(check)
    check.set_defaults(func=cmd_config_check)
    show = cfg_sub.add_parser("show", help="print the effective config, defaults filled in")
    config_flag(show)
    show.set_defaults(func=cmd_config_show)

    ver = sub.add_parser("version", help="print version, parser implementation and Python version")
    ver.set_defaults(func=cmd_version)

    docs = sub.add_parser("docs", help="print a reference table for the README")
    docs.add_argument("what", choices=("config", "metrics", "reasons", "actions", "patterns", "xids"))
    docs.add_argument("feature", nargs="?", help="only what this feature declares (disk, gpu, kube, …)")
    docs.set_defaults(func=cmd_docs)

    # Imported here, inside main()'s error handling: they import the parsers,
    # so a bad NODE_HEALTH_AGENT_PARSERS surfaces as one line.
    from . import burn, gpu, remediation, traffic

    for command in (gpu, traffic, burn, remediation):
        command.register(sub)
    return parser


# ---------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace) -> int:
    from .. import logs
    from ..daemon import Daemon, RunOptions
    from ..runtime import load_config

    ov = overrides(args)
    cfg = load_config(ov)
    logs.setup(cfg.agent.log_level, cfg.agent.log_format)
    if args.kubeconfig:
        _check_kubeconfig(args.kubeconfig, once=args.once)
    return Daemon(cfg, ov, RunOptions(once=args.once, dry_run=args.dry_run, kubeconfig=args.kubeconfig)).run()


def cmd_selftest(args: argparse.Namespace) -> int:
    from .. import logs, selftest
    from ..registry import CHECKS, FINDING_SOURCES, catalog_for
    from ..runtime import build_checks, load_config, pods_once, state_dir
    from ..scheduler import Scheduler
    from ..statedir import read_only_process
    from ..store import Store

    read_only_process()  # a selftest changes nothing: every state file is read, none renamed, moved or written
    cfg = load_config(overrides(args))
    logs.setup(args.log_level or "warning", cfg.agent.log_format)
    only = _only_checks(args.only, CHECKS, FINDING_SOURCES)
    store = Store()
    sched = Scheduler(store, catalog_for(cfg.checks))
    # A selftest looks and changes nothing (no rules installed, no state written); a check that reads the
    # node's pods gets them from one LIST (no watch), where a cluster is configured.
    pods = pods_once(cfg, only=only)
    state = state_dir(cfg, explicit=bool(args.state_dir))
    sched.configure(build_checks(cfg, state, only, dry_run=True, pods=pods, single_pass=True), immediate=True)
    sched.run_once()
    sched.close()
    if args.burn is not None:
        from .burn import selftest_burn

        selftest_burn(cfg, store, args.burn)
    return selftest.render(store.snapshot(), args.json)


def _only_checks(names: Sequence[str] | None, checks: Iterable[str], sources: Mapping[str, str]) -> list[str] | None:
    """`--only`'s names as checks: a check's own name, or the name its event source's findings carry
    (`check="xid"` in /metrics: the gpu check, whose single pass reads the kernel log for Xids)."""
    if not names:
        return None
    known = [*checks, *sources]
    out: list[str] = []
    for name in names:
        if name not in known:
            raise UsageError(f"--only: unknown check \"{name}\"{did_you_mean(name, known)}")
        check = sources.get(name, name)
        if check not in out:
            out.append(check)
    return out


def _check_kubeconfig(path: str, once: bool) -> None:
    """A --kubeconfig that cannot be loaded is refused at start, --once included."""
    from ..kube.connect import ClusterSource, build_client

    build_client(ClusterSource("kubeconfig", path))  # ConfigError: one line, exit 2
    if once:
        logging.getLogger("agent").info("--once: checks run once; node state is not written to the cluster")


def cmd_config_check(args: argparse.Namespace) -> int:
    """Everything that can be known before binding: the file, the web config
    and the files it names, bcrypt hashes, that the listen address resolves."""
    import dataclasses

    from ..config import load
    from ..web.listen import check_listen
    from ..web.tls import resolve

    cfg = load(args.file)
    metrics = cfg.metrics
    if args.web_config_file:
        metrics = dataclasses.replace(metrics, web_config_file=args.web_config_file)
    web = resolve(metrics, cfg.source)
    check_listen(metrics.listen, cfg.source)
    print(f"{args.file}: ok" + (f" (web config {web.source}: ok)" if web.from_file else ""))
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from ..config import load, to_toml
    from ..statedir import read_only_process

    read_only_process()  # a read-only command: no state file is ever written, renamed or moved
    cfg = load(config_path(args.config))
    sys.stdout.write(f"# effective configuration from {cfg.source}\n{to_toml(cfg)}")
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    from .. import native

    print(f"node-health-agent {__version__}")
    print(f"parsers: {native.describe()}")
    print(f"python: {platform.python_version()} ({sys.executable})")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from .. import docs

    if args.feature is not None and args.what in ("actions", "patterns", "xids"):
        raise UsageError(f"docs {args.what}: takes no feature (it is one table)")
    try:
        table = docs.render(args.what, args.feature)
    except ValueError as exc:
        raise UsageError(f"docs {args.what}: {exc}") from None
    sys.stdout.write(table)
    return 0


# ---------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    from ..schema import ConfigError
    from ..statedir import StateDirError
    from ..web.listen import ListenError

    try:
        # Feature command modules import the parsers: a bad NODE_HEALTH_AGENT_PARSERS
        # surfaces here, before any argument is parsed.
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except ConfigError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    except StateDirError as exc:  # 3 for a lock held by an agent that may be stopping
        print(f"agent: {exc}", file=sys.stderr)
        return exc.exit_code
    except UsageError as exc:
        print(f"agent {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ListenError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `agent selftest --json | head`: the reader left. Point stdout at /dev/null so the interpreter's
        # final flush cannot raise again, and end quietly as other Unix tools do.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the pipe


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
