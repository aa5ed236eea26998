"""The GPU check against the real pynvml loading the fake libnvidia-ml.so.1."""

from __future__ import annotations


import pytest
from fakenvml import consumer, h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

from agent.checks.gpu import GpuCheck
from agent.findings import Observation, Severity


def run(gpu_context, extra: str = "", lib: str | None = None) -> tuple[GpuCheck, Observation]:
    ctx, cfg = gpu_context('xid_events = false\n' + extra, lib)
    check = GpuCheck(ctx, cfg)
    return check, check.run()


def reasons(obs: Observation) -> dict[tuple[str, str], Severity]:
    return {(f.subject, f.reason): f.severity for f in obs.findings}


def sample(obs: Observation, name: str, **labels: str) -> float | None:
    for s in obs.samples:
        if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items()):
            return s.value
    return None


def test_healthy_h100s_have_no_findings(gpu_context, scenario, host) -> None:
    scenario.set([h100(0), h100(1)])
    host.add_gpu("0000:18:00")
    host.add_gpu("0000:28:00")
    _, obs = run(gpu_context)
    assert obs.findings == ()
    assert sample(obs, "node_health_gpus", source="nvml") == 2
    assert sample(obs, "node_health_gpu_info", gpu="0", pci_bus_id="00000000:18:00.0", model="NVIDIA H100 80GB HBM3") == 1
    assert sample(obs, "node_health_gpu_nvlink_up", gpu="1", link="17") == 1
    assert sample(obs, "node_health_gpu_temperature_threshold_celsius", gpu="0", threshold="slowdown") == 87


def test_uncorrectable_ecc_increment_is_critical(gpu_context, scenario) -> None:
    scenario.set([h100(0)])
    check, obs = run(gpu_context)
    assert obs.findings == ()
    scenario.gpu(0, **{"ecc.unc.vol": 1, "ecc.unc.agg": 1})
    obs = check.run()
    assert reasons(obs) == {("gpu0", "EccUncorrectable"): Severity.CRITICAL}


def test_aggregate_ecc_growth_counts_when_volatile_is_unsupported(gpu_context, scenario) -> None:
    """MIG: volatile counters through the device handle are not supported (nvml.h)."""
    scenario.set([h100(0, **{"ecc.unc.vol": "NS", "ecc.unc.agg": 7})])
    check, obs = run(gpu_context)
    assert obs.findings == ()  # 7 from earlier boots: not new
    scenario.gpu(0, **{"ecc.unc.agg": 8})
    assert reasons(check.run()) == {("gpu0", "EccUncorrectable"): Severity.CRITICAL}


def test_consumer_gpu_without_ecc_or_nvlink_is_no_failure(gpu_context, scenario, host) -> None:
    scenario.set([consumer(0)])
    host.add_gpu("0000:01:00", cls="0x030000")
    _, obs = run(gpu_context)
    assert obs.findings == ()
    assert "fields not applicable" in obs.subjects["gpu0"]
    assert sample(obs, "node_health_gpu_ecc_errors_total") is None


def test_old_driver_without_functions_is_no_failure(gpu_context, scenario) -> None:
    """FUNCTION_NOT_FOUND (13) is what pynvml raises for a symbol an old driver lacks;
    a field id the driver does not know comes back as INVALID_ARGUMENT (2)."""
    scenario.set([h100(0, remapped="ERR 13", **{"field.230": "ERR 2", "clocks_event": "ERR 13"})])
    _, obs = run(gpu_context)
    assert obs.findings == ()


def test_lost_gpu_is_critical_and_others_still_polled(gpu_context, scenario) -> None:
    scenario.set([h100(0), h100(1, lost=1)])
    _, obs = run(gpu_context)
    assert reasons(obs) == {("gpu1", "GpuLost"): Severity.CRITICAL}
    assert sample(obs, "node_health_gpu_up", gpu="0") == 1
    assert sample(obs, "node_health_gpu_up", gpu="1") == 0


def test_gpu_lost_in_the_middle_of_a_read(gpu_context, scenario) -> None:
    scenario.set([h100(0, temp="LOST")])
    _, obs = run(gpu_context)
    assert reasons(obs) == {("gpu0", "GpuLost"): Severity.CRITICAL}


def test_no_nvml_is_one_info_finding(gpu_context, scenario, tmp_path) -> None:
    _, obs = run(gpu_context, lib=str(tmp_path / "absent" / "libnvidia-ml.so.1"))
    assert [(f.subject, f.reason, f.severity) for f in obs.findings] == [("nvml", "NvmlUnavailable", Severity.INFO)]
    assert sample(obs, "node_health_nvml_up") == 0


def test_driver_not_loaded_is_one_info_finding(gpu_context, scenario) -> None:
    scenario.set([h100(0)], init=9)
    _, obs = run(gpu_context)
    assert [(f.reason, f.severity) for f in obs.findings] == [("NvmlUnavailable", Severity.INFO)]
    assert "not loaded" in obs.findings[0].message


def test_hung_call_is_reported_and_the_check_finishes(gpu_context, scenario) -> None:
    scenario.set([h100(0), h100(1)], **{"hang.nvmlDeviceGetNvLinkState": 30})
    check, obs = run(gpu_context, 'call_timeout = "300ms"\n')
    assert len(check.prober.hung()) == 2, "the check returned while both GPUs' NVML calls (30 s) still hang"
    assert reasons(obs) == {("gpu0", "NvmlCallHung"): Severity.WARNING, ("gpu1", "NvmlCallHung"): Severity.WARNING}
    assert all(f.unknown for f in obs.findings)
    obs = check.run()  # still stuck: reported again at once, no second thread per GPU
    assert ("gpu0", "NvmlCallHung") in reasons(obs)
    assert len(check.prober.hung()) == 2


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"remapped": "3 1 0 1"}, {"RowRemapFailure": Severity.CRITICAL}, id="row remap failure"),
        pytest.param({"remapped": "3 1 1 0"}, {"RowRemapPending": Severity.WARNING}, id="row remap pending"),
        pytest.param({"retired.pending": 1}, {"RetiredPagesPending": Severity.WARNING}, id="retired pages pending"),
        pytest.param({"temp": 88}, {"GpuTemperatureSlowdown": Severity.WARNING}, id="at slowdown temperature"),
        pytest.param({"temp": 93}, {"GpuTemperatureShutdown": Severity.CRITICAL}, id="at shutdown temperature"),
        pytest.param({"clocks_event": 0x8, "pcie.gen": 5}, {"GpuHwSlowdown": Severity.WARNING}, id="hw slowdown"),
        pytest.param({"clocks_event": 0x80, "pcie.gen": 5}, {"GpuHwSlowdown": Severity.WARNING}, id="power brake"),
        pytest.param({"clocks_event": 0x4, "pcie.gen": 5}, {}, id="sw power cap is not a fault"),
        pytest.param({"clocks_event": 0x0, "pcie.gen": 3}, {"PcieLinkDegraded": Severity.WARNING}, id="pcie gen low under load"),
        pytest.param({"clocks_event": 0x0, "pcie.gen": 5, "pcie.width": 8}, {"PcieLinkDegraded": Severity.WARNING}, id="pcie x8 under load"),
        pytest.param({"clocks_event": 0x1, "pcie.gen": 1}, {}, id="pcie gen 1 while idle is normal"),
        pytest.param({"field.230": 1}, {"GpuRecoveryAction": Severity.CRITICAL}, id="recovery action gpu reset"),
        pytest.param({"field.230": 3}, {"GpuRecoveryAction": Severity.WARNING}, id="recovery action drain p2p"),
        pytest.param({"temp": "ERR 999"}, {"NvmlError": Severity.WARNING}, id="unexpected nvml error"),
    ],
)
def test_poll_findings(gpu_context, scenario, fields: dict[str, object], expected: dict[str, Severity]) -> None:
    scenario.set([h100(0, **fields)])
    _, obs = run(gpu_context)
    assert {r: s for (_, r), s in reasons(obs).items()} == expected


def test_nvlink_down_and_errors_are_deltas(gpu_context, scenario) -> None:
    scenario.set([h100(0)])
    check, obs = run(gpu_context)
    assert obs.findings == ()
    scenario.gpu(0, **{"nvlink.3.state": 0, "nvlink.5.recovery": 2})
    assert set(reasons(check.run())) == {("gpu0", "NvLinkDown"), ("gpu0", "NvLinkErrors")}
    assert set(reasons(check.run())) == {("gpu0", "NvLinkDown")}  # no new recovery errors


def test_corrected_ecc_rate_survives_a_restart(gpu_context, scenario) -> None:
    scenario.set([h100(0, **{"ecc.cor.vol": 10})])
    run(gpu_context)
    scenario.gpu(0, **{"ecc.cor.vol": 100000})
    _, obs = run(gpu_context, "ecc_corrected_rate = 10.0\n")  # a new check object: the previous value comes from the state dir
    assert reasons(obs) == {("gpu0", "EccCorrectedRate"): Severity.WARNING}


def test_gpu_on_the_bus_but_not_in_nvml(gpu_context, scenario, host) -> None:
    scenario.set([h100(0)])
    host.add_gpu("0000:18:00")
    host.add_gpu("0000:28:00", driver=None)  # failed probe: no driver bound
    host.add_gpu("0000:38:00", driver="vfio-pci")  # passed through to a VM: not NVML's
    _, obs = run(gpu_context)
    [f] = obs.findings
    assert (f.subject, f.reason, f.severity) == ("gpus", "GpuMissing", Severity.CRITICAL)
    assert "0000:28:00" in f.message and "0000:38:00" not in f.message


def test_expected_count_from_config(gpu_context, scenario) -> None:
    scenario.set([h100(0)])
    _, obs = run(gpu_context, "expected_count = 8\n")
    assert reasons(obs) == {("gpus", "GpuMissing"): Severity.CRITICAL}


def test_gpu_seen_earlier_this_boot_stays_expected(gpu_context, scenario, host, caplog) -> None:
    scenario.set([h100(0), h100(1)])
    run(gpu_context)
    scenario.set([h100(0)])  # gone from NVML and from the bus
    _, obs = run(gpu_context)
    assert reasons(obs) == {("gpus", "GpuMissing"): Severity.CRITICAL}
    host.reboot()
    with caplog.at_level("INFO", logger="agent.statedir"):
        _, obs = run(gpu_context)
    assert obs.findings == ()  # a new boot: the node has one GPU now
    # the earlier boot's gpu-poll.json is dropped in one line, never silently (issue 25 item 6)
    assert [r.getMessage() for r in caplog.records if "gpu-poll.json is ignored (kept in boot" in r.getMessage()]


def test_a_failed_nvml_init_is_tried_again_only_after_retry_after(gpu_context, scenario, monkeypatch) -> None:
    """Issue 29: on a node without a driver each NVML reader (gpu, gpu_telemetry, gpu_pods, the Xid thread)
    used to load and fail nvmlInit on every run, each in a probe thread; now the failure is remembered for
    nvml.RETRY_AFTER and said again without a thread, and a driver loaded later is found after it."""
    from agent.checks.gpu_telemetry import GpuTelemetryCheck
    from agent.gpu import nvml

    scenario.set([h100(0)], init=9)
    check, obs = run(gpu_context)
    assert "not loaded" in obs.findings[0].message
    scenario.unset("init")  # the driver is loaded now
    probes = []
    real = check.prober.call
    monkeypatch.setattr(check.prober, "call", lambda key, *a: (probes.append(key), real(key, *a))[1])
    obs = check.run()
    assert [f.reason for f in obs.findings] == ["NvmlUnavailable"] and "not loaded" in obs.findings[0].message
    assert "init" not in probes  # no probe thread for an init that failed a moment ago
    ctx, _ = gpu_context("xid_events = false\n")
    telemetry = GpuTelemetryCheck(ctx, ctx.config.checks["gpu_telemetry"])
    assert "not loaded" in telemetry.run().subjects["nvml"]  # one memory for every reader
    monkeypatch.setattr(nvml, "RETRY_AFTER", 0.0)
    assert check.run().findings == () and "init" in probes
    assert telemetry.run().samples
