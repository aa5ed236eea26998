"""The kernel-fault source on a followed log (a file of /dev/kmsg records):
thresholds and holds, the facility rule, restarts and reboots, and the one
reader it shares with the GPU check's Xid follower."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakenvml.fixtures import *  # noqa: F403 - fixtures
from kmsglog import Collector, Log

from agent import kmsg_follower
from agent.check import CheckContext
from agent.checks.kernel import KernelCheck
from agent.config import parse
from agent.findings import Severity
from agent.gpu.xid_source import XidSource
from agent.kernel.catalog import PATTERNS
from agent.kernel.faults import FaultTracker
from agent.kernel.patterns import DEFAULT, build
from agent.kernel.source import KernelLogSource

HUNG = "INFO: task python3:4242 blocked for more than 122 seconds."
LOCKUP = "watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [python3:4242]"
MLX5 = "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count"
XID79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=2231, name=python3, GPU has fallen off the bus."


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_threshold_counts_matches_within_the_window_only() -> None:
    clock = Clock()
    table = build([("hung_task", {"threshold": 3, "window": 600.0})])
    t = FaultTracker(table, clock)
    p = table.by_name["hung_task"]
    for at in (0.0, 700.0, 1400.0):  # three matches, never three within 10 minutes
        clock.now = 1000.0 + at
        t.add(p, HUNG.encode(), clock.now)
    assert t.findings() == [] and t.counts["hung_task"] == 3
    for at in (1500.0, 1600.0):
        clock.now = 1000.0 + at
        t.add(p, HUNG.encode(), clock.now)
    [f] = t.findings()
    assert (f.subject, f.reason, f.severity, f.check) == ("hung_task", "KernelHungTask", Severity.WARNING, "kernel-log")


def test_a_finding_stays_its_hold_after_the_last_match_or_until_reboot() -> None:
    clock = Clock()
    t = FaultTracker(DEFAULT, clock)
    t.add(DEFAULT.by_name["hung_task"], HUNG.encode(), clock.now)
    t.add(DEFAULT.by_name["mlx5_fatal"], MLX5.encode(), clock.now)
    clock.now += 29 * 60
    assert not t.expire() and {f.subject for f in t.findings()} == {"hung_task", "mlx5_fatal"}
    t.add(DEFAULT.by_name["hung_task"], HUNG.encode(), clock.now)  # a second match extends the hold
    clock.now += 29 * 60
    assert not t.expire()
    clock.now += 2 * 60
    assert t.expire() and [f.subject for f in t.findings()] == ["mlx5_fatal"]  # until the node reboots
    clock.now += 30 * 86400
    assert not t.expire() and "2 matches" not in t.findings()[0].message


def test_an_old_match_from_the_backlog_is_counted_not_raised() -> None:
    clock = Clock()
    clock.now = 100_000.0
    t = FaultTracker(DEFAULT, clock)
    t.add(DEFAULT.by_name["hung_task"], HUNG.encode(), 50.0)  # its 30 min hold ended long ago
    t.add(DEFAULT.by_name["kernel_oops"], b"Oops: 0000 [#1] SMP", 50.0)  # until reboot: raised whenever it was
    assert t.counts == {"hung_task": 1, "kernel_oops": 1}
    assert [f.reason for f in t.findings()] == ["KernelOops"]


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(str(tmp_path / "kmsg"))


def _context(host, tmp_path: Path, toml: str) -> CheckContext:  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    cfg = parse(f'[agent]\nstate_dir = "{state}"\n[paths]\nprocfs = "{host.proc}"\nsysfs = "{host.sys}"\n{toml}', "test.toml")
    return CheckContext(host.paths, str(state), cfg)


@pytest.fixture
def kernel(host, tmp_path: Path, log: Log) -> Iterator[Callable[..., tuple[KernelLogSource, Collector]]]:  # type: ignore[no-untyped-def]
    running: list[KernelLogSource] = []

    def make(extra: str = "", kmsg: str | None = None) -> tuple[KernelLogSource, Collector]:
        ctx = _context(host, tmp_path, f'[checks.kernel]\nkmsg_path = "{kmsg or log.path}"\n{extra}')
        src, out = KernelLogSource(ctx, ctx.config.checks["kernel"]), Collector()
        src.start(out)
        running.append(src)
        return src, out

    yield make
    for src in running:
        src.stop()
    assert kmsg_follower.readers() == 0


def faults(out: Collector, fault: str) -> float | None:
    return out.value("node_health_kernel_faults_total", fault=fault)


def test_kernel_records_raise_findings_and_a_process_record_does_not(kernel, log: Log) -> None:
    log.add(HUNG, prio=3)  # kern.err
    log.add(LOCKUP, prio=12)  # user.warning: a process wrote it
    log.add(MLX5, prio=3)
    src, out = kernel()
    out.wait(lambda o: o.value("node_health_kernel_faults_not_kernel_total") == 1 and faults(o, "mlx5_fatal") == 1)
    assert out.active() == {("hung_task", "KernelHungTask"): Severity.WARNING, ("mlx5_fatal", "Mlx5Fatal"): Severity.CRITICAL}
    assert {f.subject: f.action for f in out.findings} == {"hung_task": "none", "mlx5_fatal": "reboot"}
    assert faults(out, "soft_lockup") == 0 and out.value("node_health_kernel_log_up") == 1
    log.add(LOCKUP, prio=0)  # the kernel's own: now it is one
    out.wait(lambda o: ("soft_lockup", "KernelSoftLockup") in o.active())


def test_a_restart_resumes_after_the_last_record_and_a_reboot_starts_afresh(kernel, log: Log, host) -> None:  # type: ignore[no-untyped-def]
    log.add(HUNG, prio=3)
    log.add(MLX5, prio=3)
    src, out = kernel()
    out.wait(lambda o: faults(o, "mlx5_fatal") == 1)
    src.stop()
    log.add(HUNG, prio=3)
    src2, out2 = kernel()
    out2.wait(lambda o: faults(o, "hung_task") == 2)  # the first two records not counted again
    assert faults(out2, "mlx5_fatal") == 1 and ("mlx5_fatal", "Mlx5Fatal") in out2.active()
    src2.stop()
    host.reboot()
    open(log.path, "w").close()
    log.seq = 0
    log.add(LOCKUP, prio=0)
    src3, out3 = kernel()
    out3.wait(lambda o: faults(o, "soft_lockup") == 1)
    assert faults(out3, "hung_task") == 0 and set(out3.active()) == {("soft_lockup", "KernelSoftLockup")}


def test_an_unreadable_log_is_one_unknown_finding(kernel, tmp_path: Path) -> None:
    src, out = kernel(kmsg=f"{tmp_path}/no-such-kmsg")
    out.wait(lambda o: bool(o.findings))
    [f] = out.findings
    assert out.value("node_health_kernel_log_up") == 0
    assert (f.subject, f.reason, f.unknown) == ("kmsg", "KernelLogUnavailable", True)


@pytest.fixture
def xid(gpu_context, host, log: Log) -> Iterator[Callable[[], tuple[XidSource, Collector]]]:  # type: ignore[no-untyped-def]
    host.add_gpu("0000:18:00")
    running: list[XidSource] = []

    def make() -> tuple[XidSource, Collector]:
        ctx, cfg = gpu_context(f'kmsg_path = "{log.path}"\n')
        src, out = XidSource(ctx, cfg), Collector()
        src.start(out)
        running.append(src)
        return src, out

    yield make
    for src in running:
        src.stop()


def test_one_reader_serves_the_xid_follower_and_the_fault_table(xid, kernel, log: Log) -> None:
    log.add(XID79, prio=3)
    log.add(HUNG, prio=3)
    xsrc, xout = xid()
    xout.wait(lambda o: o.value("node_health_gpu_xid_errors_total", gpu="0", xid="79") == 1)
    # The kernel source joins a follower that has read the ring already: it gets the backlog too,
    # and the Xid follower, made to read it again, counts nothing twice.
    ksrc, kout = kernel()
    kout.wait(lambda o: faults(o, "hung_task") == 1)
    assert kmsg_follower.readers() == 1
    log.add(MLX5, prio=3)
    log.add(XID79.replace("79,", "48,"), prio=3)
    kout.wait(lambda o: faults(o, "mlx5_fatal") == 1)
    xout.wait(lambda o: o.value("node_health_gpu_xid_errors_total", gpu="0", xid="48") == 1)
    assert xout.value("node_health_gpu_xid_errors_total", gpu="0", xid="79") == 1
    assert xout.value("node_health_kmsg_records_read_total") == 4  # the ring read again for the newcomer: not counted twice
    xsrc.stop()
    log.add(HUNG, prio=3)
    kout.wait(lambda o: faults(o, "hung_task") == 2)  # the reader lives on for the one left
    assert kmsg_follower.readers() == 1


def test_operator_pattern_from_the_config_raises_its_own_severity(kernel, log: Log) -> None:
    log.add("nvidia-modeset: ERROR: GPU:0: Idling display engine timed out", prio=3)
    src, out = kernel('[checks.kernel.patterns.display_idle]\npattern = "nvidia-modeset: ERROR: GPU:\\\\d+: Idling"\nseverity = "critical"\naction = "reboot"\n')
    out.wait(lambda o: faults(o, "display_idle") == 1)
    [f] = out.findings
    assert (f.subject, f.reason, f.severity, f.action) == ("display_idle", "KernelLogPattern", Severity.CRITICAL, "reboot")


def test_selftest_scans_the_log_once(host, tmp_path: Path, log: Log) -> None:  # type: ignore[no-untyped-def]
    log.add(HUNG, prio=3)
    log.add("Oops: 0000 [#1] SMP", prio=12)
    ctx = _context(host, tmp_path, f'[checks.kernel]\nkmsg_path = "{log.path}"\n')
    obs = KernelCheck(ctx, ctx.config.checks["kernel"]).run()
    assert [(f.subject, f.reason) for f in obs.findings] == [("hung_task", "KernelHungTask")]
    assert "1 written by processes ignored" in obs.subjects["kernel-log"]


def test_known_findings_are_the_faults_that_stay_until_reboot() -> None:
    assert {p.name for p in PATTERNS if p.hold is None} >= {"hard_lockup", "kernel_oops", "mlx5_fatal", "edac_ue"}
