"""The burn on /metrics: every sample it emits is in the catalog with the
declared labels, and `agent run` reports the preflight end to end."""

from __future__ import annotations

import json
from pathlib import Path

from agentproc import Agent, wait_for
from burnfakes import NODE, sysfs
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.burn import publish
from agent.burn.model import BurnReport, Fault, GpuVerdict, Problem, Telemetry
from agent.metrics import build_registry
from agent.registry import CATALOG
from agent.store import Store


def report() -> BurnReport:
    ok = GpuVerdict(
        0,
        "pass",
        name="H100",
        gemm_flops=7e14,
        memory_bandwidth=2.9e12,
        telemetry=Telemetry(power_watts_mean=690.0, sm_clock_hz_mean=1.98e9, temperature_max_c=71, samples=60),
    )
    bad = GpuVerdict(1, "fail", name="H100", compute_errors=3, problems=(Problem(Fault.COMPUTE_MISMATCH, "3 of 9"),))
    untested = GpuVerdict(2, "unknown", notes=("MIG mode is on",))
    return BurnReport("builtin", 1000.0, 1062.5, (ok, bad, untested))


def scrape(store: Store) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(generate_latest(build_registry(store, CATALOG)).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_every_burn_sample_is_declared_with_its_labels() -> None:
    samples = publish.samples(report(), "failed", {("preflight", "fail"): 1})
    declared = CATALOG.metrics
    for s in samples:
        assert s.name in declared, s.name
        assert tuple(k for k, _ in s.labels) == declared[s.name].labels, s
    store = Store()
    store.set_sources({"burn": (("burn", "gpu1", "PreflightFailed"),)})
    store.set_events("burn", publish.findings(report(), "preflight"), samples)
    m = scrape(store)
    assert ({"gpu": "0"}, 1.0) in m["node_health_burn_gpu_pass"] and ({"gpu": "1"}, 0.0) in m[
        "node_health_burn_gpu_pass"
    ]
    assert all(labels["gpu"] != "2" for labels, _ in m["node_health_burn_gpu_pass"]), "an untested GPU has no result"
    assert ({"gpu": "1", "kind": "compute"}, 3.0) in m["node_health_burn_gpu_errors"]
    assert ({"gpu": "0"}, 7e14) in m["node_health_burn_gpu_gemm_flops_per_second"]
    assert ({"state": "failed"}, 1.0) in m["node_health_burn_preflight_state"]
    assert ({"kind": "preflight", "result": "fail"}, 1.0) in m["node_health_burn_runs_total"]
    assert m["node_health_burn_duration_seconds"] == [({}, 62.5)]
    findings = {(lab["subject"], lab["reason"]): v for lab, v in m["node_health_finding"]}
    assert findings[("gpu1", "PreflightFailed")] == 1 and findings[("backend", "BurnUnavailable")] == 1


def test_agent_run_reports_a_no_gpu_preflight(tmp_path: Path) -> None:
    root = sysfs(tmp_path, {"0000:00:1f.0": ("0x8086", "0x060100")})
    agent = Agent(tmp_path, '[checks.burn]\ninterval = "1s"\n', args=["--path.sysfs", str(root)])
    try:
        agent.wait_ready()
        wait_for(lambda: agent.value("node_health_burn_preflight_state", state="no_gpu") == 1, what="preflight no_gpu")
        assert agent.value("node_health_finding", check="burn", subject="preflight", reason="NotApplicable") == 1
        # not active (a warning: absent rather than 0 by default, [metrics] findings_at_zero)
        assert agent.value("node_health_finding", check="burn", subject="preflight", reason="PreflightPending") in (None, 0)
    finally:
        assert agent.stop() == 0, agent.logs()
    saved = json.loads((tmp_path / "state" / "burn.json").read_text())
    assert saved["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert saved["preflight"]["no_gpu"] is True


def test_agent_run_with_gpus_but_no_driver_says_unknown(tmp_path: Path) -> None:
    root = sysfs(tmp_path, NODE)
    agent = Agent(tmp_path, '[checks.burn]\ninterval = "1s"\n', args=["--path.sysfs", str(root)])
    try:
        agent.wait_ready()
        wait_for(
            lambda: agent.value("node_health_burn_preflight_state", state="unavailable") == 1,
            timeout=60,
            what="preflight unavailable",
        )
        assert agent.value("node_health_finding", check="burn", subject="backend", reason="BurnUnavailable") == 1
        assert agent.value("node_health_finding", check="burn", subject="gpu2", reason="PreflightFailed") == 0
    finally:
        assert agent.stop() == 0, agent.logs()
