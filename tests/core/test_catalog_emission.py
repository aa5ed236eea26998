"""The catalog is checked where a value is made, never where it is scraped.

A check that emits an undeclared metric, or a declared one with the wrong
labels, fails its own run (CheckFailed, counted in its own series); /metrics
skips whatever undeclared value reaches the store by another path, counts it
in node_health_render_dropped_total and still serves every other series.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

import pytest
from agentproc import free_port
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.catalog import CatalogError
from agent.config import CheckConfig, MetricsSection, TLSSection
from agent.findings import Finding, Observation, ObservationBuilder, Sample, Severity
from agent.metrics import AgentCollector, RenderDrops, TextRenderer, build_registry, collect_series
from agent.web.server import MetricsServer
from agent.registry import CATALOG
from agent.scheduler import Scheduler
from agent.store import Store


@dataclass
class EmittingCheck:
    """A check whose run emits one sample given by the test, beside a good one."""

    name: str
    bad: Sample | None = None

    def run(self) -> Observation:
        b = ObservationBuilder(self.name, CATALOG)
        b.subject("sda", "fine")
        b.sample("node_health_disk_mounted", 1, mountpoint="/")
        if self.bad is not None:
            b.sample(self.bad.name, self.bad.value, **dict(self.bad.labels))
        return b.build()


def _cfg() -> CheckConfig:
    return CheckConfig(enabled=True, interval=60, timeout=5)


def _values(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


# ---------------------------------------------------------------- at emission


@pytest.mark.parametrize(
    ("sample", "says"),
    [
        pytest.param(Sample("node_health_disk_mountd", 1, (("mountpoint", "/"),)), "not in the catalog", id="undeclared name"),
        pytest.param(Sample("node_health_disk_mounted", 1, (("path", "/"),)), "declares ['mountpoint']", id="wrong label"),
        pytest.param(Sample("node_health_disk_mounted", 1), "declares ['mountpoint']", id="missing label"),
        pytest.param(
            Sample("node_health_disk_mounted", 1, (("mountpoint", "/"), ("device", "sda"))), "declares ['mountpoint']", id="extra label"
        ),
    ],
)
def test_a_sample_the_catalog_does_not_declare_fails_its_checks_run(sample: Sample, says: str) -> None:
    store = Store()
    sched = Scheduler(store, CATALOG)
    sched.configure([(EmittingCheck("typo", sample), _cfg()), (EmittingCheck("good"), _cfg())], immediate=True)
    sched.run_once()
    snap = store.snapshot()
    typo, good = snap.checks["typo"], snap.checks["good"]
    assert (typo.ok, typo.runs, typo.failures) == (False, 1, 1)
    (f,) = typo.findings
    assert (f.reason, f.severity, f.unknown) == ("CheckFailed", Severity.WARNING, True)
    assert "CatalogError" in f.message and says in f.message
    assert typo.samples == ()  # none of the failed run's samples is exported
    assert (good.ok, good.failures, len(good.samples)) == (True, 0, 1)


def test_check_observation_names_an_undeclared_finding_reason() -> None:
    obs = Observation(findings=(Finding("disk", "/", "DiskFul", Severity.CRITICAL, "m"),))
    with pytest.raises(CatalogError, match="'DiskFul' is not in the catalog"):
        CATALOG.check_observation(obs)


def test_check_observation_accepts_declared_samples_in_the_catalogs_label_order() -> None:
    CATALOG.check_observation(Observation(samples=(Sample("node_health_check_stuck", 0, (("check", "disk"),)),)))
    spec = CATALOG.metric("node_health_finding")
    reordered = Sample("node_health_finding", 1, tuple((k, "x") for k in reversed(spec.labels)))
    assert "declares" in (CATALOG.sample_problem(reordered) or "")


# ---------------------------------------------------------------- the factory


def test_the_finding_factory_takes_severity_and_unknown_from_the_catalog() -> None:
    f = CATALOG.finding("gpu", "kmsg", "KmsgCoverageLost", "lost 3 records")
    entry = CATALOG.reason("KmsgCoverageLost")
    assert (f.severity, f.unknown) == (entry.severity, entry.unknown) == (Severity.WARNING, True)
    assert CATALOG.finding("gpu", "gpu0", "Xid79", "m", severity=Severity.WARNING).severity is Severity.WARNING
    with pytest.raises(CatalogError):
        CATALOG.finding("gpu", "gpu0", "NoSuchReason", "m")


# ---------------------------------------------------------------- at render


def test_the_renderer_skips_and_counts_undeclared_samples_and_reasons() -> None:
    store = Store()
    store.set_checks(["disk"], {"disk": (("/", "NotApplicable"), ("/", "NoSuchReason"))})
    store.set_events(
        "xid",
        [Finding("gpu", "gpu0", "NoSuchReason", Severity.WARNING, "m")],
        [Sample("node_health_undeclared", 1), Sample("node_health_check_stuck", 0, (("chek", "x"),)),
         Sample("node_health_check_stuck", 1, (("check", "x"),))],
    )
    drops = RenderDrops()
    series = collect_series(store.snapshot(), CATALOG, drops)
    assert drops.total == 4  # a known reason, an active finding, a name, a label
    assert series["node_health_render_dropped_total"] == [((), 4)]
    assert ((("check", "x"),), 1) in series["node_health_check_stuck"]
    assert all(labels[0][0] == "check" for labels, _ in series["node_health_check_stuck"])
    assert "node_health_undeclared" not in series
    assert {labels for labels, _ in series["node_health_finding"]} == {
        (("check", "disk"), ("subject", "/"), ("reason", "NotApplicable"), ("severity", "info"), ("gpu", ""))
    }
    assert "node_health_render_dropped_total 8.0\n" in TextRenderer(CATALOG, drops).render(store.snapshot())  # 4 more


def test_both_renderers_skip_the_same_and_write_the_same_bytes() -> None:
    store = Store()
    store.set_checks(["disk"], {"disk": (("/", "NoSuchReason"),)})
    store.set_events("xid", [], [Sample("node_health_undeclared", 1), Sample("node_health_check_stuck", 0)])
    text_drops, lib_drops = RenderDrops(), RenderDrops()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(store, CATALOG, lib_drops))
    assert TextRenderer(CATALOG, text_drops).render(store.snapshot()).encode() == generate_latest(registry)
    assert text_drops.total == lib_drops.total == 3


def test_the_dropped_counter_is_exported_at_zero() -> None:
    store = Store()
    values = _values(generate_latest(build_registry(store, CATALOG)).decode())
    assert values[("node_health_render_dropped_total", frozenset())] == 0
    assert CATALOG.metric("node_health_render_dropped_total").kind == "counter"


# ---------------------------------------------------------------- over HTTP


def test_metrics_answers_200_with_every_other_series_while_a_check_emits_an_undeclared_sample() -> None:
    store = Store()
    sched = Scheduler(store, CATALOG)
    sched.configure(
        [(EmittingCheck("typo", Sample("node_health_disk_mountd", 1, (("mountpoint", "/"),))), _cfg()),
         (EmittingCheck("good"), _cfg())],
        immediate=True,
    )
    sched.run_once()
    # And one that reaches the store by another path than a check (an event source's sample).
    store.set_events("xid", [], [Sample("node_health_gpu_xid_error_total", 1, (("gpu", "0"),))])
    port = free_port()
    server = MetricsServer(MetricsSection(listen=f"127.0.0.1:{port}", tls=TLSSection()), build_registry(store, CATALOG), store)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            status, body = resp.status, resp.read().decode()
    finally:
        server.stop()
    assert status == 200
    values = _values(body)

    def value(name: str, **labels: str) -> float | None:
        return values.get((name, frozenset(labels.items())))

    assert value("node_health_check_success", check="typo") == 0
    assert value("node_health_check_failures_total", check="typo") == 1
    assert value("node_health_finding", check="typo", subject="typo", reason="CheckFailed", severity="warning", gpu="") == 1
    assert value("node_health_check_success", check="good") == 1
    assert value("node_health_disk_mounted", mountpoint="/") == 1  # the good check's sample is served
    assert value("node_health_render_dropped_total") == 1  # the event source's typo, skipped
    assert not any(name.startswith(("node_health_disk_mountd", "node_health_gpu_xid_error_total")) for name, _ in values)
    assert any(name == "node_health_build_info" for name, _ in values)
