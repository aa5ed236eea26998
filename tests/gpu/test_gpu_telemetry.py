"""The GPU telemetry check against the real pynvml loading the fake libnvidia-ml.so.1:
units, per-field fallbacks, absent fields, NVLink per link, GPM, lost and hung GPUs."""

from __future__ import annotations

import pytest
from agentproc import wait_for
from fakenvml import consumer, h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

from agent.checks.gpu_telemetry import GpuTelemetryCheck
from agent.findings import Observation

GPM = ("sm_activity", "sm_occupancy", "tensor_activity", "dram_bandwidth_utilization")


def make(gpu_context, extra: str = "") -> GpuTelemetryCheck:
    ctx, _ = gpu_context("xid_events = false\n[checks.gpu_telemetry]\n" + extra)
    return GpuTelemetryCheck(ctx, ctx.config.checks["gpu_telemetry"])


def values(obs: Observation, name: str, gpu: str = "0") -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of `name` for `gpu`, by their other labels."""
    return {s.labels[1:]: s.value for s in obs.samples if s.name == name and s.labels[0] == ("gpu", gpu)}


def value(obs: Observation, name: str, gpu: str = "0", **labels: str) -> float | None:
    return values(obs, name, gpu).get(tuple(labels.items()))


def test_an_h100_in_base_units(gpu_context, scenario) -> None:
    scenario.set([h100(0), h100(1)])
    check = make(gpu_context)
    check.run()
    obs = check.run()
    assert obs.findings == ()
    assert value(obs, "node_health_gpu_telemetry_up", "1") == 1
    assert [s.labels for s in obs.samples if s.name == "node_health_gpu_driver_info"] == [(("version", "570.86.15"),)]
    assert value(obs, "node_health_gpu_power_watts") == 312.0
    assert value(obs, "node_health_gpu_power_limit_watts") == 700.0
    assert value(obs, "node_health_gpu_energy_joules_total") == 1_234_567.0
    assert value(obs, "node_health_gpu_memory_temperature_celsius") == 48
    assert value(obs, "node_health_gpu_clock_hertz", clock="sm") == 1980e6
    assert value(obs, "node_health_gpu_clock_hertz", clock="memory") == 2619e6
    assert value(obs, "node_health_gpu_utilization_ratio") == pytest.approx(0.87)
    assert value(obs, "node_health_gpu_memory_utilization_ratio") == pytest.approx(0.41)
    assert value(obs, "node_health_gpu_codec_utilization_ratio", engine="decoder") == 0
    assert value(obs, "node_health_gpu_memory_total_bytes") == 81559 << 20
    assert value(obs, "node_health_gpu_memory_used_bytes") == 21032 << 20
    assert value(obs, "node_health_gpu_memory_free_bytes") == 60000 << 20
    assert value(obs, "node_health_gpu_memory_reserved_bytes") == 527 << 20
    assert value(obs, "node_health_gpu_performance_state") == 0
    assert value(obs, "node_health_gpu_pcie_bytes_total", direction="tx") == 9_000_000
    assert value(obs, "node_health_gpu_pcie_replay_total") == 0
    assert values(obs, "node_health_gpu_pcie_throughput_bytes_per_second") == {}  # the counters exist
    assert len(values(obs, "node_health_gpu_clock_event_seconds_total")) == 9
    nvlink = values(obs, "node_health_gpu_nvlink_bytes_total", "1")
    assert len(nvlink) == 36 and nvlink[(("link", "17"), ("direction", "tx"))] == 2048 * 1024
    assert value(obs, "node_health_gpu_sm_activity_ratio") == pytest.approx(0.715)
    assert value(obs, "node_health_gpu_tensor_activity_ratio") == pytest.approx(0.5225)


def test_counters_scale_to_seconds_and_bytes(gpu_context, scenario) -> None:
    scenario.set([h100(0, **{"field.270": 2_500_000_000, "field.139@3": 10, "field.94": 7})])
    obs = make(gpu_context).run()
    assert value(obs, "node_health_gpu_clock_event_seconds_total", reason="hw_thermal_slowdown") == 2.5
    assert value(obs, "node_health_gpu_nvlink_bytes_total", link="3", direction="rx") == 10 * 1024
    assert value(obs, "node_health_gpu_nvlink_bytes_total", link="4", direction="rx") == 1024 * 1024
    assert value(obs, "node_health_gpu_pcie_replay_total") == 7


@pytest.mark.parametrize(
    ("fields", "metric", "labels", "expected"),
    [
        pytest.param({"field.186": "NS", "power": 250_000}, "node_health_gpu_power_watts", {}, 250.0, id="power from the older call"),
        pytest.param({"field.186": "NS"}, "node_health_gpu_power_watts", {}, None, id="power nowhere: absent"),
        pytest.param({"field.190": "ERR 2", "power.limit": 650_000}, "node_health_gpu_power_limit_watts", {}, 650.0, id="a field id the driver does not know"),
        pytest.param({"field.83": "NS", "energy": 5000}, "node_health_gpu_energy_joules_total", {}, 5.0, id="energy from the older call"),
        pytest.param({"field.82": "NS"}, "node_health_gpu_memory_temperature_celsius", {}, None, id="no memory temperature: absent"),
        pytest.param({"field.75": "NS", "violation.1": 3_000_000_000}, "node_health_gpu_clock_event_seconds_total", {"reason": "thermal"}, 3.0, id="violation counter from the older call"),
        pytest.param({"field.270": "NS"}, "node_health_gpu_clock_event_seconds_total", {"reason": "hw_thermal_slowdown"}, None, id="no older call for 270"),
        pytest.param({"field.94": "NS", "pcie.replay": 3}, "node_health_gpu_pcie_replay_total", {}, 3.0, id="replays from the older call"),
        pytest.param({"clock.mem": "NS"}, "node_health_gpu_clock_hertz", {"clock": "memory"}, None, id="no memory clock: absent"),
        pytest.param({"util": "NS"}, "node_health_gpu_utilization_ratio", {}, None, id="no utilisation: absent"),
        pytest.param({"pstate": 32}, "node_health_gpu_performance_state", {}, None, id="unknown pstate: absent"),
    ],
)
def test_a_field_the_gpu_lacks_falls_back_or_is_absent(gpu_context, scenario, fields, metric, labels, expected) -> None:
    scenario.set([h100(0, **fields)])
    obs = make(gpu_context).run()
    assert value(obs, metric, **labels) == expected
    assert obs.findings == ()
    assert value(obs, "node_health_gpu_power_limit_watts") is not None  # the rest is read


def test_an_unexpected_nvml_error_on_one_field_is_a_finding_and_the_field_absent(gpu_context, scenario) -> None:
    scenario.set([h100(0, **{"field.82": "ERR 999"})])
    obs = make(gpu_context).run()
    assert value(obs, "node_health_gpu_memory_temperature_celsius") is None
    assert [(f.subject, f.reason, f.unknown) for f in obs.findings] == [("gpu0", "NvmlError", True)]
    assert "field 82" in obs.findings[0].message


def test_a_field_that_stops_being_supported_disappears(gpu_context, scenario) -> None:
    scenario.set([h100(0)])
    check = make(gpu_context)
    assert value(check.run(), "node_health_gpu_memory_temperature_celsius") == 48
    scenario.gpu(0, **{"field.82": "NS"})
    assert value(check.run(), "node_health_gpu_memory_temperature_celsius") is None
    scenario.gpu(0, **{"field.82": 51})
    assert value(check.run(), "node_health_gpu_memory_temperature_celsius") == 51


def test_a_driver_without_field_values_is_read_through_the_older_calls(gpu_context, scenario) -> None:
    old = {"power": 200_000, "power.limit": 400_000, "energy": 9000, "pcie.replay": 1, "pcie.tx_kbps": 100, "pcie.rx_kbps": 50}
    scenario.set([h100(0, **old)], **{"missing.nvmlDeviceGetFieldValues": 1, "missing.nvmlDeviceGetMemoryInfo_v2": 1})
    check = make(gpu_context)
    check.run()
    obs = check.run()
    assert obs.findings == ()
    assert value(obs, "node_health_gpu_power_watts") == 200.0
    assert value(obs, "node_health_gpu_energy_joules_total") == 9.0
    assert value(obs, "node_health_gpu_pcie_throughput_bytes_per_second", direction="tx") == 100 * 1024
    assert values(obs, "node_health_gpu_pcie_bytes_total") == {}
    assert values(obs, "node_health_gpu_nvlink_bytes_total") == {}
    assert value(obs, "node_health_gpu_memory_temperature_celsius") is None  # no older call
    assert value(obs, "node_health_gpu_memory_reserved_bytes") is None  # v1 has none
    assert value(obs, "node_health_gpu_memory_used_bytes") == (21032 + 527) << 20  # v1 counts reserved as used
    assert "field82" in obs.subjects["gpu0"]


def test_a_consumer_gpu_exports_only_what_it_has(gpu_context, scenario) -> None:
    scenario.set([consumer(0, **{"field.186": 350_000, "util": "5 1"})])
    check = make(gpu_context)
    check.run()
    obs = check.run()
    names = {s.name for s in obs.samples}
    assert names == {"node_health_gpu_driver_info", "node_health_gpu_telemetry_up", "node_health_gpu_power_watts", "node_health_gpu_utilization_ratio",
                     "node_health_gpu_memory_utilization_ratio"}
    assert obs.findings == ()


def test_gpm_ratios_come_from_the_second_poll_on(gpu_context, scenario) -> None:
    scenario.set([h100(0, **{"gpm.3": "NS"})])
    check = make(gpu_context)
    first = check.run()
    assert not any(values(first, f"node_health_gpu_{m}_ratio") for m in GPM)
    second = check.run()
    assert value(second, "node_health_gpu_sm_activity_ratio") == pytest.approx(0.715)
    assert value(second, "node_health_gpu_dram_bandwidth_utilization_ratio") == pytest.approx(0.64)
    assert value(second, "node_health_gpu_sm_occupancy_ratio") is None  # the metric answered NOT_SUPPORTED
    scenario.gpu(0, **{"gpm.2": 100.5})  # ratios stay within 0..1
    assert value(check.run(), "node_health_gpu_sm_activity_ratio") == 1.0


@pytest.mark.parametrize(
    ("extra", "fields", "globals_"),
    [
        pytest.param("gpm = false\n", {}, {}, id="off in the config"),
        pytest.param("", {"gpm": 0}, {}, id="not a Hopper"),
        pytest.param("", {}, {"missing.nvmlGpmQueryDeviceSupport": 1}, id="a driver without GPM"),
    ],
)
def test_no_gpm_series_where_gpm_is_off_or_absent(gpu_context, scenario, extra, fields, globals_) -> None:
    scenario.set([h100(0, **fields)], **globals_)
    check = make(gpu_context, extra)
    check.run()
    obs = check.run()
    assert not any(values(obs, f"node_health_gpu_{m}_ratio") for m in GPM)
    assert value(obs, "node_health_gpu_power_watts") == 312.0
    assert obs.findings == ()


def test_a_lost_gpu_has_no_telemetry_and_the_others_do(gpu_context, scenario) -> None:
    scenario.set([h100(0), h100(1, lost=1)])
    obs = make(gpu_context).run()
    assert value(obs, "node_health_gpu_telemetry_up", "1") == 0
    assert value(obs, "node_health_gpu_telemetry_up", "0") == 1
    assert {s.labels[0] for s in obs.samples if s.name not in ("node_health_gpu_telemetry_up", "node_health_gpu_driver_info")} == {("gpu", "0")}
    assert obs.findings == ()  # GpuLost is the GPU check's finding


def test_a_hung_call_leaves_the_gpu_out_until_it_returns(gpu_context, scenario) -> None:
    scenario.set([h100(0), h100(1)])
    check = make(gpu_context, 'call_timeout = "200ms"\n')
    assert value(check.run(), "node_health_gpu_telemetry_up", "1") == 1
    scenario.set(**{"hang.nvmlGpmSampleGet": 3})  # every GPU's next GPM sample sleeps 3 s in the "driver"
    hung = check.run()
    assert [(f.subject, f.reason) for f in hung.findings] == [("gpu0", "NvmlCallHung"), ("gpu1", "NvmlCallHung")]
    assert {s.name for s in hung.samples} == {"node_health_gpu_driver_info", "node_health_gpu_telemetry_up"}
    again = check.run()  # still hung: not asked again (no second stuck thread per GPU)
    assert sorted(k for k in check.prober.hung()) == [("gpu", 0), ("gpu", 1)]
    assert [f.reason for f in again.findings] == ["NvmlCallHung", "NvmlCallHung"]
    scenario.unset("hang.nvmlGpmSampleGet")
    wait_for(lambda: not check.prober.hung(), timeout=10, what="the stuck calls to return")
    back = check.run()
    assert back.findings == () and value(back, "node_health_gpu_power_watts", "1") == 312.0


def test_no_nvml_means_no_telemetry_and_no_finding(gpu_context, scenario) -> None:
    ctx, _ = gpu_context("xid_events = false\n", lib="/nonexistent/libnvidia-ml.so.1")
    obs = GpuTelemetryCheck(ctx, ctx.config.checks["gpu_telemetry"]).run()
    assert obs.samples == () and obs.findings == ()
    assert "no telemetry" in obs.subjects["nvml"]
