"""The Xid source running: a followed kernel log (a file of /dev/kmsg records)
and NVML events from the fake library, deduplicated into one stream; restarts
and reboots; the one-shot scan of `agent selftest`."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator

import pytest
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

from kmsglog import Collector, Log

from agent.checks.gpu import GpuCheck
from agent.findings import Severity
from agent.gpu.xid_source import XidSource

XID79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=2231, name=python3, GPU has fallen off the bus."
XID13 = "NVRM: Xid (PCI:0000:18:00): 13, pid=2231, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"


@pytest.fixture
def log(tmp_path) -> Log:
    return Log(str(tmp_path / "kmsg"))


@pytest.fixture
def start(gpu_context, host, log: Log) -> Iterator[Callable[..., tuple[XidSource, Collector]]]:
    host.add_gpu("0000:18:00")
    host.add_gpu("0000:28:00")
    running: list[XidSource] = []

    def make(kmsg: str | None = None) -> tuple[XidSource, Collector]:
        ctx, cfg = gpu_context(f'kmsg_path = "{kmsg or log.path}"\n')
        src, out = XidSource(ctx, cfg), Collector()
        src.start(out)
        running.append(src)
        return src, out

    yield make
    for src in running:
        src.stop()


def nvml_ready(out: Collector) -> bool:
    return out.value("node_health_nvml_events_up") == 1


def test_xid_line_in_the_followed_log_is_a_critical_finding(start, scenario, log: Log) -> None:
    scenario.set([h100(0), h100(1)])
    _, out = start()
    log.add("usb 1-1: new high-speed USB device number 2 using xhci_hcd")
    log.add(XID79)
    out.wait(lambda o: ("gpu0", "Xid79") in o.active())
    assert out.active()[("gpu0", "Xid79")] is Severity.CRITICAL
    assert out.value("node_health_gpu_xid_errors_total", gpu="0", xid="79") == 1
    out.wait(lambda o: o.value("node_health_kmsg_records_read_total") == 2)


@pytest.mark.parametrize("line", [
    pytest.param("NVRM: Xid (PCI:XXXX:XX:XX): 79, pid=2231, name=python3, GPU has fallen off the bus.", id="X-ed out"),
    pytest.param("NVRM: Xid (<redacted>): 79, pid=2231, name=python3, GPU has fallen off the bus.", id="<redacted>"),
    pytest.param("NVRM: Xid: 79, pid=2231, name=python3, GPU has fallen off the bus.", id="no address at all"),
])
def test_an_xid_without_a_device_address_counts_for_an_unknown_gpu(start, scenario, log: Log, line: str) -> None:
    scenario.set([h100(0), h100(1)])
    _, out = start()
    log.add(line)
    out.wait(lambda o: ("gpu", "Xid79") in o.active())
    assert out.active()[("gpu", "Xid79")] is Severity.CRITICAL
    assert out.value("node_health_gpu_xid_errors_total", gpu="unknown", xid="79") == 1
    assert not any(subject.startswith("gpu0") or subject.startswith("gpu1") for subject, _ in out.active())


def test_nvidia_lines_a_process_wrote_are_counted_and_logged_once_never_findings(start, scenario, log: Log, caplog) -> None:
    """What a process writes to /dev/kmsg reads back with a facility other than
    kern: a plain write as 12 (user.warning), <0> as 8, <30> as 30 (daemon)."""
    scenario.set([h100(0), h100(1)])
    caplog.set_level(logging.WARNING, logger="agent.gpu.xid_source")
    _, out = start()
    for prio in (12, 8, 30):
        log.add(XID79, prio=prio)
    log.add("NVRM: The NVIDIA GPU 0000:28:00.0", prio=12)  # a forged first line never lends its PCI address
    log.add("NVRM: fallen off the bus and is not responding to commands.")  # a kernel line: no PCI of its own
    log.add(XID13)  # the kernel's own line still counts
    out.wait(lambda o: o.value("node_health_kmsg_records_read_total") == 6 and ("gpu0", "Xid13") in o.active())
    assert out.value("node_health_kmsg_not_kernel_events_total") == 3
    assert ("gpu0", "Xid79") not in out.active() and ("gpu1", "Xid79") not in out.active()
    assert out.value("node_health_gpu_xid_errors_total", gpu="0", xid="79") is None
    assert out.value("node_health_gpu_xid_errors_total", gpu="1", xid="79") is None
    log.add(XID79, prio=12)
    out.wait(lambda o: o.value("node_health_kmsg_not_kernel_events_total") == 4)
    said = [r for r in caplog.records if "written by a process" in r.getMessage()]
    assert len(said) == 1 and "facility user" in said[0].getMessage()


def test_nvml_xid_79_event_is_a_critical_finding(start, scenario) -> None:
    scenario.set([h100(0), h100(1)])
    _, out = start()
    out.wait(nvml_ready)
    scenario.xid(1, 79)
    out.wait(lambda o: ("gpu1", "Xid79") in o.active())
    assert out.value("node_health_gpu_xid_source_events_total", source="nvml") == 1


def test_xid_from_both_sources_is_one_finding(start, scenario, log: Log) -> None:
    scenario.set([h100(0), h100(1)])
    _, out = start()
    out.wait(nvml_ready)
    scenario.xid(0, 79)
    log.add(XID79)
    out.wait(lambda o: o.value("node_health_gpu_xid_source_events_total", source="kmsg") == 1
             and o.value("node_health_gpu_xid_source_events_total", source="nvml") == 1)
    assert [f.reason for f in out.findings] == ["Xid79"]
    assert out.value("node_health_gpu_xid_errors_total", gpu="0", xid="79") == 1


def test_restart_resumes_without_refiring(start, scenario, log: Log) -> None:
    scenario.set([])
    src, out = start()
    log.add(XID79)
    log.add(XID13)
    out.wait(lambda o: o.value("node_health_gpu_xid_errors_total", gpu="0", xid="13") == 1)
    src.stop()
    _, out2 = start()  # the same boot, the same log: nothing is new
    out2.wait(lambda o: o.emits >= 1)
    assert out2.value("node_health_gpu_xid_errors_total", gpu="0", xid="79") == 1
    assert out2.active()[("gpu0", "Xid79")] is Severity.CRITICAL  # still active: it needs a reboot
    log.add(XID79)  # a new one after the restart is counted ...
    out2.wait(lambda o: o.value("node_health_gpu_xid_source_events_total", source="kmsg") >= 1)
    # ... and, read after the old records, proves those were read again and not re-fired
    assert out2.value("node_health_gpu_xid_source_events_total", source="kmsg") == 1
    assert out2.value("node_health_gpu_xid_errors_total", gpu="0", xid="79") == 2
    assert out2.value("node_health_gpu_xid_errors_total", gpu="0", xid="13") == 1


def test_reboot_starts_afresh(start, scenario, log: Log, host) -> None:
    scenario.set([])
    src, out = start()
    log.add(XID79)
    out.wait(lambda o: ("gpu0", "Xid79") in o.active())
    src.stop()
    host.reboot()
    open(log.path, "w").close()
    log.seq = 0
    log.add("Linux version 6.1.0")
    _, out2 = start()
    out2.wait(lambda o: o.value("node_health_kmsg_records_read_total") == 1)
    assert out2.active() == {}
    assert out2.value("node_health_gpu_xid_errors_total", gpu="0", xid="79") is None


def test_sequence_gap_is_reported_as_lost_coverage(start, scenario, log: Log) -> None:
    scenario.set([])
    _, out = start()
    log.add("first")
    log.add("after a wrap", seq=40)
    out.wait(lambda o: ("kmsg", "KmsgCoverageLost") in o.active())
    assert out.value("node_health_kmsg_records_lost_total") == 39
    assert out.value("node_health_kmsg_gaps_total") == 1


def test_nvml_events_not_supported_is_info_and_kmsg_still_works(start, scenario, log: Log) -> None:
    scenario.set([h100(0)], events=3)
    _, out = start()
    out.wait(lambda o: ("nvml-events", "NvmlEventsUnsupported") in o.active())
    log.add(XID79)
    out.wait(lambda o: ("gpu0", "Xid79") in o.active())


def test_unreadable_kernel_log_is_unknown(start, scenario, tmp_path) -> None:
    scenario.set([])
    _, out = start(f"{tmp_path}/absent")
    out.wait(lambda o: ("kmsg", "KmsgUnavailable") in o.active())
    assert all(f.unknown for f in out.findings)


def test_selftest_scans_the_current_boot_once(gpu_context, scenario, host, log: Log) -> None:
    host.add_gpu("0000:18:00")
    scenario.set([h100(0)])
    log.add(XID13)
    log.add(XID79)
    ctx, cfg = gpu_context(f'kmsg_path = "{log.path}"\n')
    obs = GpuCheck(ctx, cfg).run()
    assert {(f.check, f.subject, f.reason) for f in obs.findings} == {("xid", "gpu0", "Xid79"), ("xid", "gpu0", "Xid13")}, \
        "under the source's name, as the daemon exports them (check=\"xid\")"
    assert "2 kernel log records" in obs.subjects["kmsg"]


XID119 = "NVRM: Xid (PCI:0000:18:00): 119, pid=2231, name=python3, Timeout after 6s of waiting for RPC response from GPU0 GSP!"
XID119_GPU1 = XID119.replace("0000:18:00", "0000:28:00")


def test_a_verified_reset_clears_that_gpus_reset_xids_for_good_until_a_new_one(start, scenario, log: Log, gpu_context) -> None:
    """The ladder tells through agent.gpu.resets (a state file and a listener): that GPU's reset_gpu
    finding goes at once, stays gone across a restart (the backlog read again), and a new Xid counts."""
    from agent.gpu import resets
    from agent.statedir import StateDir, boot_id

    scenario.set([])
    src, out = start()
    log.add(XID119)
    log.add(XID119_GPU1)
    log.add(XID79)
    out.wait(lambda o: {("gpu0", "Xid119"), ("gpu1", "Xid119"), ("gpu0", "Xid79")} <= set(o.active()))
    ctx, _ = gpu_context()
    resets.record(StateDir(ctx.state_dir), boot_id(ctx.paths), "GPU-x", pci="00000000:18:00.0", gpu="0", at=time.monotonic())
    out.wait(lambda o: ("gpu0", "Xid119") not in o.active())
    assert set(out.active()) == {("gpu1", "Xid119"), ("gpu0", "Xid79")}, "only that GPU, only reset_gpu findings"
    src.stop()
    os.unlink(src.state.file("xid-stream.json"))  # even with the stream state lost: the backlog is read again
    _, out2 = start()
    out2.wait(lambda o: o.value("node_health_kmsg_records_read_total") == 3)
    assert set(out2.active()) == {("gpu1", "Xid119"), ("gpu0", "Xid79")}, "a restart does not bring it back"
    log.add(XID119)
    out2.wait(lambda o: ("gpu0", "Xid119") in o.active())
    assert out2.value("node_health_gpu_xid_errors_total", gpu="0", xid="119") == 2


FALLEN_3_LINES = (
    "NVRM: The NVIDIA GPU 0000:28:00.0",
    "NVRM: (PCI ID: 10de:2330) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
)
XID79_GPU1 = "NVRM: Xid (PCI:0000:28:00): 79, GPU has fallen off the bus."


@pytest.mark.parametrize("when", ["backlog", "live"])
def test_a_gpu_falling_off_the_bus_counts_once_from_the_backlog_and_live(start, scenario, log: Log, when: str) -> None:
    """The driver's three-line "fallen off the bus" message and its Xid 79 line
    are one event, read from the ring buffer at start or as they come."""
    scenario.set([])
    lines = [XID79_GPU1, *FALLEN_3_LINES]
    if when == "backlog":
        for line in lines:
            log.add(line)
    _, out = start()
    if when == "live":
        out.wait(lambda o: o.emits >= 1)
        for line in lines:
            log.add(line)
    out.wait(lambda o: o.value("node_health_kmsg_records_read_total") == 4 and ("gpu1", "Xid79") in o.active())
    assert out.value("node_health_gpu_xid_errors_total", gpu="1", xid="79") == 1
    assert out.active()[("gpu1", "Xid79")] is Severity.CRITICAL
