"""End to end: `agent run` with 8 fake H100s: every telemetry family on /metrics,
in the catalog's units and types, unsupported fields absent, promtool silent;
and /metrics keeps answering while every NVML field-values call hangs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agentproc import Agent
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures
from promql import promtool_lint

from agent.gpu.catalog import TELEMETRY_METRICS

pytestmark = pytest.mark.slow

GPUS = 8
# Only where the driver lacks the PCIe byte counters (these H100s have them).
FALLBACK_ONLY = {"node_health_gpu_pcie_throughput_bytes_per_second"}
MIG_ONLY = {"node_health_gpu_mig_memory_total_bytes", "node_health_gpu_mig_memory_used_bytes"}  # no MIG here
# GPU 7 lacks these (a field answering NOT_SUPPORTED, and no GPM).
ABSENT_ON_7 = {"node_health_gpu_memory_temperature_celsius", "node_health_gpu_sm_activity_ratio",
               "node_health_gpu_sm_occupancy_ratio", "node_health_gpu_tensor_activity_ratio",
               "node_health_gpu_dram_bandwidth_utilization_ratio", "node_health_gpu_graphics_engine_activity_ratio"}


@pytest.fixture
def agent(tmp_path, host, scenario, fake_nvml_lib) -> Iterator[Agent]:
    for i in range(GPUS):
        host.add_gpu(f"0000:{0x18 + 0x10 * i:02x}:00")
    scenario.set([h100(i) for i in range(GPUS - 1)] + [h100(GPUS - 1, **{"field.82": "NS", "gpm": 0})])
    toml = host.toml(str(tmp_path / "state"), 'interval = "2s"\nxid_events = false\n', fake_nvml_lib)
    toml += '[checks.gpu_telemetry]\ninterval = "1s"\ncall_timeout = "300ms"\n'
    toml += '[metrics]\nnvlink_per_link = true\nfindings_at_zero = "all"\n'  # every family as the checks make it
    a = Agent(tmp_path, toml.replace("[agent]\n", "[agent]\njitter = 0.0\n"))
    yield a
    a.stop()


def test_eight_h100s_show_every_family_in_base_units(agent: Agent) -> None:
    agent.poll(lambda t: f'node_health_gpu_sm_activity_ratio{{gpu="{GPUS - 2}"}}' in t, "GPM ratios (second poll)")
    text = agent.text()
    metrics = agent.metrics()
    assert agent.value("node_health_gpu_driver_info", version="570.86.15") == 1
    for spec in TELEMETRY_METRICS:
        if "gpu" not in spec.labels:
            continue
        gpus = {labels["gpu"] for labels, _ in metrics.get(spec.name, [])}
        if spec.name in FALLBACK_ONLY | MIG_ONLY:
            assert gpus == set(), spec.name
            continue
        want = {str(i) for i in range(GPUS)} - ({str(GPUS - 1)} if spec.name in ABSENT_ON_7 else set())
        assert gpus == want, f"{spec.name}: {sorted(gpus)}"
        assert f"# TYPE {spec.name} {spec.kind}" in text
    assert agent.value("node_health_gpu_power_watts", gpu="3") == 312.0
    assert agent.value("node_health_gpu_clock_hertz", gpu="3", clock="sm") == 1.98e9
    assert agent.value("node_health_gpu_memory_used_bytes", gpu="3") == 21032 << 20
    assert agent.value("node_health_gpu_energy_joules_total", gpu="3") == 1_234_567.0
    assert len([1 for labels, _ in metrics["node_health_gpu_nvlink_bytes_total"] if labels["gpu"] == "0"]) == 36
    assert agent.value("node_health_finding", check="gpu_telemetry", reason="NvmlCallHung", subject="gpu0") == 0
    assert promtool_lint(text) == ""
    series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) == len(set(series)), "a series exported twice (two checks emitting one metric)"


def test_a_hung_nvml_call_does_not_hold_up_metrics(agent: Agent, scenario) -> None:
    """Order, not wall time: every scrape returns while the telemetry is hung, and
    the telemetry comes back after the stuck calls return (benches/bench_gpu.py has the latency figures)."""
    agent.poll(lambda t: 'node_health_gpu_power_watts{gpu="7"}' in t, "telemetry of every GPU")
    scenario.set(**{"hang.nvmlDeviceGetFieldValues": 8})  # the GPU check's field 230 hangs with it, as in a real driver
    agent.poll(lambda t: all(f'node_health_gpu_telemetry_up{{gpu="{i}"}} 0.0' in t for i in range(GPUS)), "every GPU hung")
    during = [agent.get("/metrics") for _ in range(30)]
    assert [code for code, _ in during] == [200] * 30
    assert all(b'node_health_gpu_telemetry_up{gpu="0"} 0.0' in body for _, body in during)  # hung throughout
    last = during[-1][1].decode()
    assert 'node_health_gpu_power_watts{' not in last  # absent while hung, not stale
    assert 'node_health_check_stuck{check="gpu_telemetry"} 0.0' in last  # the poll itself finished
    assert 'node_health_finding{check="gpu_telemetry",gpu="0",reason="NvmlCallHung",severity="warning",subject="gpu0"} 1.0' in last
    scenario.unset("hang.nvmlDeviceGetFieldValues")
    agent.poll(lambda t: 'node_health_gpu_telemetry_up{gpu="0"} 1.0' in t and 'node_health_gpu_power_watts{gpu="0"}' in t,
               "telemetry back once the stuck calls returned", timeout=40)
