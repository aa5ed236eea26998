"""What `agent run` and `agent selftest` share: options from the command line
laid over the config, the node's identity, and building the checks."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .check import Check, CheckContext
from .config import Config, load
from .hostpaths import HostPaths
from .registry import CHECKS
from .schema import CheckConfig, ConfigError, host_port
from .settings import AgentSection, PathsSection, telemetry_path
from .sources import EventSource

if TYPE_CHECKING:
    from .pods import PodView

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = AgentSection().state_dir


@dataclass(frozen=True, slots=True)
class Overrides:
    """Command-line flags that win over the config file (kept across reloads)."""

    config_path: str | None = None
    listen: str | None = None
    telemetry_path: str | None = None
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
        problem = host_port(ov.listen)
        if problem:
            raise ConfigError("--listen", None, problem)
        metrics = dataclasses.replace(metrics, listen=ov.listen)
    if ov.telemetry_path:
        problem = telemetry_path(ov.telemetry_path)
        if problem:
            raise ConfigError("--web.telemetry-path", None, problem)
        metrics = dataclasses.replace(metrics, telemetry_path=ov.telemetry_path)
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
    cfg: Config, state: str, only: list[str] | None = None, dry_run: bool = False, pods: PodView | None = None,
    single_pass: bool = False,
) -> list[tuple[Check, CheckConfig]]:
    ctx = CheckContext(
        paths=host_paths(cfg), state_dir=state, config=cfg, dry_run=dry_run, pods=pods, single_pass=single_pass
    )
    return build_enabled(ctx, only)


def needs_pods(cfg: Config, only: Iterable[str] | None = None) -> bool:
    """Whether a check that will run (enabled, or named in `only`) reads the node's pods as configured
    (its CheckSpec.needs_pods): only then is the one pod watch started."""
    wanted = set(only) if only else None
    for name, spec in CHECKS.items():
        c = cfg.checks[name]
        if spec.needs_pods is not None and ((wanted is None and c.enabled) or (wanted is not None and name in wanted)):
            if spec.needs_pods(c):
                return True
    return False


def pod_annotations(cfg: Config, only: Iterable[str] | None = None) -> frozenset[str]:
    """The pod annotation keys the checks that will run read (CheckSpec.pod_annotations): the only ones the pod
    watch keeps (a pod's other annotations, up to 256 KiB of a tenant's text each, are never held)."""
    wanted = set(only) if only else None
    out: set[str] = set()
    for name, spec in CHECKS.items():
        c = cfg.checks[name]
        if spec.pod_annotations is not None and ((wanted is None and c.enabled) or (wanted is not None and name in wanted)):
            out.update(spec.pod_annotations(c))
    return frozenset(out)


def pods_once(cfg: Config, kubeconfig: str | None = None, only: Iterable[str] | None = None) -> PodView | None:
    """For a single pass (`agent run --once`, `agent selftest`): the node's pods from one LIST when a check
    needs them and a cluster is configured (no watch for one run); None otherwise."""
    if not needs_pods(cfg, only) or not cfg.kubernetes.enabled:
        return None
    from .kube.actuator import pods_once as list_pods

    return list_pods(cfg.kubernetes, node_name(cfg), kubeconfig, pod_annotations(cfg, only))


def build_enabled(ctx: CheckContext, only: Iterable[str] | None = None) -> list[tuple[Check, CheckConfig]]:
    """Instantiate the enabled checks (or exactly `only`, enabled or not)."""
    wanted = set(only) if only else None
    out = []
    for name, spec in CHECKS.items():
        cfg = ctx.config.checks[name]
        if (wanted is None and cfg.enabled) or (wanted is not None and name in wanted):
            out.append((spec.build(ctx, cfg), cfg))
    return out


def build_sources(ctx: CheckContext) -> list[EventSource]:
    """The event sources of the enabled checks."""
    out: list[EventSource] = []
    for name, spec in CHECKS.items():
        cfg = ctx.config.checks[name]
        if cfg.enabled and spec.sources is not None:
            out.extend(spec.sources(ctx, cfg))
    return out
