"""What `agent run` and `agent selftest` share: options from the command line
laid over the config, the node's identity, and building the checks."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass

from .checks import Check, CheckContext, build_enabled
from .config import AgentSection, CheckConfig, Config, ConfigError, PathsSection, load
from .hostpaths import HostPaths

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = AgentSection().state_dir


@dataclass(frozen=True, slots=True)
class Overrides:
    """Command-line flags that win over the config file (kept across reloads)."""

    config_path: str | None = None
    listen: str | None = None
    web_config_file: str | None = None
    state_dir: str | None = None
    procfs: str | None = None
    sysfs: str | None = None
    rootfs: str | None = None
    log_format: str | None = None
    log_level: str | None = None


def load_config(ov: Overrides) -> Config:
    """Load the file (or the embedded defaults) and lay the flags over it."""
    cfg = load(ov.config_path)
    agent = cfg.agent
    if ov.state_dir:
        agent = dataclasses.replace(agent, state_dir=ov.state_dir)
    if ov.log_format:
        agent = dataclasses.replace(agent, log_format=ov.log_format)  # type: ignore[arg-type]
    if ov.log_level:
        agent = dataclasses.replace(agent, log_level=ov.log_level)  # type: ignore[arg-type]
    paths = PathsSection(
        procfs=ov.procfs or cfg.paths.procfs, sysfs=ov.sysfs or cfg.paths.sysfs, rootfs=ov.rootfs or cfg.paths.rootfs
    )
    metrics = cfg.metrics
    if ov.listen:
        from .config import host_port

        problem = host_port(ov.listen)
        if problem:
            raise ConfigError("--listen", None, problem)
        metrics = dataclasses.replace(metrics, listen=ov.listen)
    if ov.web_config_file:
        metrics = dataclasses.replace(metrics, web_config_file=ov.web_config_file)
    return dataclasses.replace(cfg, agent=agent, paths=paths, metrics=metrics)


def host_paths(cfg: Config) -> HostPaths:
    return HostPaths(procfs=cfg.paths.procfs, sysfs=cfg.paths.sysfs, rootfs=cfg.paths.rootfs)


def node_name(cfg: Config) -> str:
    return cfg.agent.node_name or os.environ.get("NODE_NAME", "") or socket.gethostname()


def state_dir(cfg: Config, explicit: bool) -> str:
    """The state dir; an ordinary user running with the default one gets a
    per-user dir instead (so `agent run` works without sudo), with a warning."""
    path = cfg.agent.state_dir
    if explicit or path != DEFAULT_STATE_DIR or os.geteuid() == 0:
        return path
    if os.access(os.path.dirname(path), os.W_OK) or os.access(path, os.W_OK):
        return path
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    fallback = os.path.join(base, "node-health-agent")
    log.warning("not root and %s is not writable: keeping state in %s", path, fallback)
    return fallback


def build_checks(
    cfg: Config, state: str, only: list[str] | None = None, dry_run: bool = False
) -> list[tuple[Check, CheckConfig]]:
    ctx = CheckContext(paths=host_paths(cfg), state_dir=state, config=cfg, dry_run=dry_run)
    return build_enabled(ctx, only)
