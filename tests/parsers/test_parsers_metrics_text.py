"""The agent's own rendering of /metrics is byte for byte prometheus_client's.

`AgentRegistry.text()` formats the plain text format itself (a scrape of a
busy node has ~2,000 series and the library's formatter alone misses the
5 ms goal, see benches/). These tests hold its bytes equal to
`generate_latest` on stores with every awkward label value and float there
is, across renders that reuse formatted labels, and through the HTTP server.
"""

from __future__ import annotations

import math
import socket
import time
import urllib.request
from dataclasses import replace

import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest

from agent.catalog import Catalog, MetricSpec, Reason
from agent.config import MetricsSection
from agent.findings import Finding, Observation, Sample, Severity
from agent.metrics import AgentCollector, build_registry, render_families
from agent.web.server import MetricsServer
from agent.store import Store

METRICS = (
    MetricSpec("node_health_test_value", "gauge", "A gauge with \\ and\nnewline in its help.", ("device", "kind")),
    MetricSpec("node_health_test_events_total", "counter", "A counter.", ("device",)),
    MetricSpec("node_health_test_plain", "gauge", "No labels."),
)
REASONS = (Reason("TestBroken", Severity.CRITICAL, "test"), Reason("TestSlow", Severity.WARNING, "test"))
VALUES = [
    0.0,
    -0.0,
    1.0,
    -1.5,
    0.1,
    1e-7,
    123456.0,
    1234567.0,
    9999999.5,
    1e16,
    2.0**64,
    math.inf,
    -math.inf,
    math.nan,
    42,
]
LABELS = ["eth0", "", 'quo"te', "back\\slash", "new\nline", "tab\tx", "caf\u00e9", "\\n literally", "a,b=c}"]


# The agent's own entries and the test's (no catalog is shared with other tests).
CATALOG = Catalog.declare(REASONS, METRICS)


def store_with(samples: list[Sample], findings: tuple[Finding, ...] = ()) -> Store:
    store = Store()
    store.set_checks(["alpha", "beta"], {"alpha": (("eth0", "TestBroken"), ("sda", "TestSlow")), "beta": ()})
    obs = Observation(tuple(samples), findings)
    store.update_check(
        "alpha", lambda st: replace(st, observation=obs, ok=True, duration=0.25, finished_at=time.time(), runs=3)
    )
    store.update_check(
        "beta",
        lambda st: replace(
            st, error=Finding("beta", "beta", "CheckTimeout", Severity.WARNING, "slow"), timeouts=1, stuck=True
        ),
    )
    store.set_sources({"kmsg": (("alpha", "kmsg", "TestBroken"),)})
    return store


def library_bytes(store: Store) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(store, CATALOG))  # type: ignore[arg-type]
    return generate_latest(registry)


def awkward_samples(shift: float = 0.0) -> list[Sample]:
    out = [
        Sample("node_health_test_value", v + shift, (("device", label), ("kind", "k")))
        for v, label in zip(VALUES, LABELS * 2)
    ]
    out += [
        Sample("node_health_test_events_total", float(i) + shift, (("device", label),))
        for i, label in enumerate(LABELS)
    ]
    # (A sample with labels other than its spec's is skipped by both renderers alike:
    # tests/core/test_catalog_emission.py.)
    out += [Sample("node_health_test_plain", 7.0)]
    return out


def test_awkward_values_render_identically() -> None:
    store = store_with(awkward_samples(), (Finding("alpha", "eth0", "TestBroken", Severity.CRITICAL, "down"),))
    registry = build_registry(store, CATALOG)
    text = registry.renderer.render(store.snapshot()).encode()
    assert text == library_bytes(store)
    assert (
        b'device="quo\\"te"' in text
        and b'device="new\\nline"' in text
        and b" NaN\n" in text
        and b" 1.234567e+06\n" in text
    )
    assert registry.text().startswith(text)


def test_later_renders_with_new_values_and_subjects() -> None:
    store = store_with(awkward_samples())
    registry = build_registry(store, CATALOG)
    registry.renderer.render(store.snapshot())
    for shift, keep in ((1.0, None), (0.5, 4), (2.0, 0)):
        samples = awkward_samples(shift)[:keep]
        store.update_check("alpha", lambda st, s=samples: replace(st, observation=Observation(tuple(s))))
        assert registry.renderer.render(store.snapshot()).encode() == library_bytes(store)
    kept = sum(len(p) for p in registry.renderer._prefixes.values())
    assert kept == sum(len(f.samples) for f in render_families(store.snapshot(), CATALOG))


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        pytest.param("", "text", id="default-text"),
        pytest.param("text/plain; version=0.0.4", "text", id="text-0.0.4"),
        pytest.param("application/openmetrics-text; version=1.0.0", "openmetrics", id="openmetrics"),
    ],
)
def test_served_bytes(accept: str, expected: str) -> None:
    store = store_with(awkward_samples())
    with socket.socket() as probe:  # a free port (the config refuses port 0)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = MetricsServer(MetricsSection(listen=f"127.0.0.1:{port}"), build_registry(store, CATALOG), store)
    server.start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
        body = urllib.request.urlopen(req, timeout=10).read()
    finally:
        server.stop()
    if expected == "text":
        assert body.startswith(library_bytes(store))
    else:
        assert body.rstrip().endswith(b"# EOF") and b"node_health_test_events_total" in body
