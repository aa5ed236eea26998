"""EDAC memory-error counts from fixture sysfs trees (per controller, per DIMM,
per chip-select row on older drivers): counters, the uncorrected finding, the
24 h corrected rate kept across restarts, counter resets and reboots."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.findings import ObservationBuilder, Severity
from agent.hostpaths import HostPaths
from agent.kernel.catalog import CATALOG
from agent.kernel.edac import EdacMonitor, read_controllers
from agent.statedir import StateDir


class Host:
    def __init__(self, root: Path) -> None:
        self.sys, self.proc = root / "sys", root / "proc"
        (self.proc / "sys/kernel/random").mkdir(parents=True)
        self.boot("boot-1")
        self.paths = HostPaths(procfs=str(self.proc), sysfs=str(self.sys))

    def boot(self, boot_id: str) -> None:
        (self.proc / "sys/kernel/random/boot_id").write_text(boot_id + "\n")

    def mc(self, n: int, files: dict[str, int | str]) -> None:
        base = self.sys / "devices/system/edac/mc" / f"mc{n}"
        for name, value in files.items():
            (base / name).parent.mkdir(parents=True, exist_ok=True)
            (base / name).write_text(f"{value}\n")


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path / "host")


class Clock:
    now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def run(mon: EdacMonitor) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, str], tuple[Severity, str, str]], dict[str, str]]:
    b = ObservationBuilder("kernel", CATALOG)
    mon.run(b)
    obs = b.build()
    samples = {(s.name, *(v for _, v in s.labels)): s.value for s in obs.samples}
    findings = {(f.subject, f.reason): (f.severity, f.action, f.message) for f in obs.findings}
    return samples, findings, dict(obs.subjects)


SKYLAKE = {  # skx_edac: per-DIMM directories (drivers/edac/edac_mc_sysfs.c "dimm%d")
    "ce_count": 0, "ue_count": 0, "ce_noinfo_count": 0, "ue_noinfo_count": 0,
    "dimm0/dimm_ce_count": 0, "dimm0/dimm_ue_count": 0, "dimm0/dimm_label": "CPU_SrcID#0_MC#0_Chan#0_DIMM#0",
    "dimm1/dimm_ce_count": 0, "dimm1/dimm_ue_count": 0, "dimm1/dimm_label": "CPU_SrcID#0_MC#0_Chan#1_DIMM#0",
}


def test_no_edac_driver_is_one_line_and_no_finding(host: Host, tmp_path: Path) -> None:
    samples, findings, subjects = run(EdacMonitor(host.paths, StateDir(str(tmp_path / "state")), 10))
    assert (samples, findings) == ({}, {}) and "no EDAC memory controllers" in subjects["edac"]


def test_counts_are_counters_per_controller_and_dimm(host: Host, tmp_path: Path) -> None:
    host.mc(0, SKYLAKE | {"ce_count": 3, "dimm1/dimm_ce_count": 3})
    host.mc(1, {"ce_count": 0, "ue_count": 0, "csrow0/ce_count": 0, "csrow0/ue_count": 0, "csrow0/ch0_ce_count": 0})
    (host.sys / "devices/system/edac/mc/power").mkdir()  # not a controller
    samples, findings, _ = run(EdacMonitor(host.paths, StateDir(str(tmp_path / "state")), 10))
    assert samples[("node_health_edac_errors_total", "mc0", "ce")] == 3
    assert samples[("node_health_edac_dimm_errors_total", "mc0", "dimm1", "ce")] == 3
    assert samples[("node_health_edac_dimm_errors_total", "mc1", "csrow0", "ue")] == 0
    assert ("node_health_edac_errors_total", "mc1", "ce_noinfo") not in samples  # absent file: no sample
    assert findings == {}
    assert [c.name for c in read_controllers(host.paths)] == ["mc0", "mc1"]


def test_any_uncorrected_error_this_boot_is_critical(host: Host, tmp_path: Path) -> None:
    host.mc(0, SKYLAKE | {"ue_count": 1, "dimm1/dimm_ue_count": 1})
    host.mc(1, {"ce_count": 0, "ue_count": 0, "ue_noinfo_count": 2})
    _, findings, _ = run(EdacMonitor(host.paths, StateDir(str(tmp_path / "state")), 10))
    sev, action, msg = findings[("mc0", "EdacUncorrectable")]
    assert (sev, action) == (Severity.CRITICAL, "drain_and_diagnose")
    assert "dimm1 (CPU_SrcID#0_MC#0_Chan#1_DIMM#0)" in msg
    assert findings[("mc1", "EdacUncorrectable")][0] is Severity.CRITICAL  # not attributed to a DIMM still counts


def test_corrected_rate_counts_within_24_hours_across_restarts(host: Host, tmp_path: Path) -> None:
    clock, state = Clock(), StateDir(str(tmp_path / "state"))
    state.ensure()
    host.mc(0, SKYLAKE | {"dimm1/dimm_ce_count": 500})  # before the agent started: no rate known
    assert run(EdacMonitor(host.paths, state, 10, clock))[1] == {}
    clock.now += 3600
    host.mc(0, SKYLAKE | {"dimm1/dimm_ce_count": 505})
    assert run(EdacMonitor(host.paths, state, 10, clock))[1] == {}  # a restart: the window goes on
    clock.now += 3600
    host.mc(0, SKYLAKE | {"dimm1/dimm_ce_count": 510})
    mon = EdacMonitor(host.paths, state, 10, clock)  # another restart
    _, findings, _ = run(mon)
    sev, action, msg = findings[("mc0/dimm1", "EdacCorrectedRate")]
    assert (sev, action) == (Severity.WARNING, "none") and msg.startswith("10 corrected memory errors on mc0/dimm1")
    clock.now += 25 * 3600  # the errors leave the window
    assert run(mon)[1] == {}


def test_a_counter_reset_or_a_reboot_starts_the_window_afresh(host: Host, tmp_path: Path) -> None:
    clock, state = Clock(), StateDir(str(tmp_path / "state"))
    state.ensure()
    mon = EdacMonitor(host.paths, state, 10, clock)
    host.mc(0, SKYLAKE | {"ce_count": 40, "dimm0/dimm_ce_count": 40})
    run(mon)
    clock.now += 700
    host.mc(0, SKYLAKE | {"ce_count": 2, "dimm0/dimm_ce_count": 2})  # echo 1 > reset_counters
    assert run(mon)[1] == {}
    clock.now += 700
    host.mc(0, SKYLAKE | {"ce_count": 12, "dimm0/dimm_ce_count": 12})
    assert ("mc0/dimm0", "EdacCorrectedRate") in run(mon)[1]
    host.boot("boot-2")
    assert run(EdacMonitor(host.paths, state, 10, clock))[1] == {}  # a new boot: no window carried over


def test_a_controller_without_dimm_counts_is_judged_as_a_whole(host: Host, tmp_path: Path) -> None:
    clock, state = Clock(), StateDir(str(tmp_path / "state"))
    state.ensure()
    mon = EdacMonitor(host.paths, state, 10, clock)
    host.mc(2, {"ce_count": 0, "ue_count": 0})
    run(mon)
    clock.now += 600
    host.mc(2, {"ce_count": 11, "ue_count": 0})
    assert run(mon)[1][("mc2", "EdacCorrectedRate")][0] is Severity.WARNING
    assert EdacMonitor(host.paths, state, 0, clock) is not None
    assert run(EdacMonitor(host.paths, state, 0, clock))[1] == {}  # 0: never
