"""What the commands share: the usage error, the parser class, the common
flags and how they lay over the config (`Overrides`)."""

from __future__ import annotations

import argparse
import difflib
import os
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from ..runtime import Overrides


CONFIG_ENV = "NODE_HEALTH_AGENT_CONFIG"
DEFAULT_CONFIG = "/etc/node-health-agent/agent.toml"  # where the systemd unit and the DaemonSet put it
CONFIG_HELP = f"config file (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG} if it exists, else the embedded defaults)"


def config_path(flag: str | None) -> str | None:
    """The config a command reads: the flag, else $NODE_HEALTH_AGENT_CONFIG, else the deployed file where it
    exists, else None (the embedded defaults). So `agent selftest` on a host, or `kubectl exec ... agent
    selftest` in the DaemonSet (which sets the variable), judges the node with the agent's own config."""
    if flag:
        return flag
    env = os.environ.get(CONFIG_ENV, "")
    if env:
        return env
    return DEFAULT_CONFIG if os.path.isfile(DEFAULT_CONFIG) else None


class UsageError(Exception):
    """Bad input from the command line: exit 2 with one line."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def common_flags(p: argparse.ArgumentParser) -> None:
    config_flag(p)
    p.add_argument("--path.procfs", dest="procfs", metavar="DIR", help="host /proc (default /proc)")
    p.add_argument("--path.sysfs", dest="sysfs", metavar="DIR", help="host /sys (default /sys)")
    p.add_argument("--path.rootfs", dest="rootfs", metavar="DIR", help="host / (default /)")
    p.add_argument("--log-format", "--log.format", dest="log_format", choices=("text", "json"),
                   help="text on a terminal, JSON lines otherwise by default")
    p.add_argument("--log-level", "--log.level", dest="log_level", choices=("debug", "info", "warning", "error"))


def config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help=CONFIG_HELP)


def overrides(args: argparse.Namespace) -> Overrides:
    """The flags of `common_flags` (and --listen, --state-dir where a command has them) as `Overrides`."""
    from ..runtime import Overrides


    return Overrides(
        config_path=config_path(args.config),
        listen=getattr(args, "listen", None),
        telemetry_path=getattr(args, "telemetry_path", None),
        web_config_file=getattr(args, "web_config_file", None),
        state_dir=getattr(args, "state_dir", None),
        procfs=args.procfs,
        sysfs=args.sysfs,
        rootfs=args.rootfs,
        log_format=args.log_format,
        log_level=args.log_level,
    )


def did_you_mean(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f' (did you mean "{close[0]}"?)' if close else f"; expected one of {', '.join(choices)}"
