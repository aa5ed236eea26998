"""The agent's own sections: ``[agent]``, ``[paths]`` and ``[metrics]``.

Features keep their sections in their own package (``agent/<feature>/settings.py``);
`agent.config` assembles all of them into one `Config`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from .schema import host_port, opt

# An absolute URL path of RFC 3986 path characters (no query, fragment, percent-escape or space).
_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@/-]*")
RESERVED_PATHS = ("/", "/healthz")  # the landing page and the probes' endpoint


def telemetry_path(value: str) -> str | None:
    """Validator for ``metrics.telemetry_path`` (node_exporter's --web.telemetry-path); None when fine."""
    if not _PATH.fullmatch(value) or len(value) > 256:
        return f'expected an absolute URL path such as "/metrics" (letters, digits and -._~!$&\'()*+,;=:@/), got "{value}"'
    if value in RESERVED_PATHS:
        return f'"{value}" is the agent\'s own ({", ".join(RESERVED_PATHS)} are kept); expected another path such as "/metrics"'
    return None


@dataclass(frozen=True)
class AgentSection:
    state_dir: str = opt("/var/lib/node-health-agent", "Directory for state that survives restarts (findings, cursors, boot id).")
    node_name: str = opt("", 'Name of this node; empty: $NODE_NAME, else the hostname.')
    log_level: Literal["debug", "info", "warning", "error"] = opt("info", "Log level.")
    log_format: Literal["auto", "text", "json"] = opt("auto", "auto: text on a terminal, JSON lines otherwise.")
    jitter: float = opt(0.1, "Fraction of each check's interval by which its runs are spread at random.", min=0, max=0.5)


@dataclass(frozen=True)
class PathsSection:
    procfs: str = opt("/proc", "Where the host's /proc is mounted (the DaemonSet mounts it under /host).")
    sysfs: str = opt("/sys", "Where the host's /sys is mounted.")
    rootfs: str = opt("/", "Where the host's root filesystem is mounted; host paths in checks are resolved under it.")


@dataclass(frozen=True)
class TLSSection:
    cert_file: str = opt("", "PEM certificate; with key_file, /metrics is served over HTTPS.")
    key_file: str = opt("", "PEM private key for cert_file.")
    client_ca_file: str = opt("", "PEM CA bundle; when set, clients must present a certificate it signed.")
    min_version: Literal["TLS12", "TLS13"] = opt("TLS12", "Lowest TLS version accepted.")


@dataclass(frozen=True)
class MetricsSection:
    listen: str = opt("0.0.0.0:9904", "Address of the /metrics and /healthz endpoint.", check=host_port)
    telemetry_path: str = opt(
        "/metrics", "Path the metrics are served at (node_exporter's --web.telemetry-path); /healthz and / stay where "
        "they are, and any other path answers 404.", check=telemetry_path,
    )
    tls: TLSSection = field(default_factory=TLSSection, metadata={"doc": "TLS, in the style of Prometheus exporters' web config."})
    basic_auth_users: Mapping[str, str] = opt(
        MappingProxyType({}), "user = bcrypt hash; when set, /metrics needs HTTP basic auth (/healthz does not)."
    )
    web_config_file: str = opt(
        "", "exporter-toolkit web config (YAML, as node_exporter's --web.config.file); replaces tls and basic_auth_users."
    )
    exclude: tuple[str, ...] = opt(
        (), 'Metric families not exported, as shell patterns (e.g. "node_health_gpu_clock_event_*"); the checks and '
        "their findings work all the same (docs/metrics.md, Lean by default)."
    )
    nvlink_per_link: bool = opt(
        False, "Export the NVLink series per link (node_health_gpu_nvlink_up, _errors_total, _bytes_total: 126 series "
        "per H100); false: per GPU, summed over its links (node_health_gpu_nvlink_links_active, _gpu_errors_total, "
        "_gpu_bytes_total)."
    )
    findings_at_zero: Literal["critical", "all", "none"] = opt(
        "critical", "Known findings not active are exported at 0 for: critical reasons (what NodeHealthCriticalFinding "
        "and the taints act on), all reasons, or none (only active findings, at 1)."
    )
