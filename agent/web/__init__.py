"""The HTTP endpoint (/metrics, /healthz) as Prometheus exporters serve it.

`settings` reads the exporter-toolkit web configuration file
(``--web.config.file``) or builds the same settings from the TOML
``[metrics.tls]`` and ``[metrics.basic_auth_users]`` sections; `tls` makes the
`ssl.SSLContext` and keeps it current as the certificate files change on
disk; `server` serves HTTP/1.1 with keep-alive. What the server counts is
declared here for the catalog.
"""

from __future__ import annotations

from ..catalog import Catalog, MetricSpec

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_http_requests_total",
        "counter",
        "HTTP requests answered by the agent's endpoint, by handler (metrics, healthz, root, other) and status code.",
        ("handler", "code"),
    ),
    MetricSpec(
        "node_health_http_connections_closed_total",
        "counter",
        "Connections the endpoint closed or refused, by reason: client_limit, total_limit, local_limit (refused "
        "when accepted, before any handshake), evicted (the oldest of the address holding the most, to make room "
        "when the total is full), handshake, request, write (past their deadline), idle (a kept-alive "
        "connection idle too long), tls (a failed handshake).",
        ("reason",),
    ),
    MetricSpec(
        "node_health_web_config_reloads_total",
        "counter",
        "Reloads of the web config file or its certificate files after they changed on disk, by result "
        "(a failed one keeps the running certificate and settings).",
        ("result",),
    ),
    MetricSpec(
        "node_health_web_config_last_reload_successful",
        "gauge",
        "1 if the web config and certificate files on disk are the ones being served, 0 after a change that failed to load.",
    ),
)

CATALOG = Catalog.declare((), METRICS)
