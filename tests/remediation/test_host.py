"""The seams run real programs: fake nvidia-smi, systemctl, busctl, nsenter on PATH, a boot ID file."""

from __future__ import annotations

import pytest
from fakebins import FakeBins, FakeProc
from remediation_support import CATALOG, FakeCluster, Users, enforce, fault_list, finding

from agent.hostpaths import HostPaths
from agent.remediation.host import Host, under_root
from agent.remediation.ladder import Ladder
from agent.statedir import StateDir

UUID = "GPU-aaaa"


@pytest.fixture
def bins(tmp_path, monkeypatch):
    b = FakeBins(tmp_path)
    monkeypatch.setenv("PATH", b.env_path())
    return b


@pytest.fixture
def proc(tmp_path):
    return FakeProc(tmp_path)


def host(proc, rootfs="/", **raw) -> Host:
    return Host(enforce(**raw), HostPaths(procfs=str(proc.root), rootfs=rootfs))


def test_reset_turns_persistence_off_resets_that_uuid_and_restores_it(bins, proc):
    res = host(proc).reset_gpu(UUID)
    assert res.ok, res.detail
    smi = [c for c in bins.calls("nvidia-smi") if not any(a.startswith("--query") for a in c)]
    assert smi == [["-i", UUID, "-pm", "0"], ["--gpu-reset", "-i", UUID], ["-i", UUID, "-pm", "1"]]


def test_a_gpu_without_persistence_is_reset_without_toggling(bins, proc):
    bins.set("persistence", "Disabled")
    assert host(proc).reset_gpu(UUID).ok
    assert [c for c in bins.calls("nvidia-smi") if "-pm" in c] == []


def test_in_use_by_another_client_fails_the_reset_and_persistence_is_restored(bins, proc):
    bins.set("reset_fails", "")
    res = host(proc).reset_gpu(UUID)
    assert not res.ok and "exit 255" in res.detail and "In use by another client" in res.detail
    assert bins.calls("nvidia-smi")[-1] == ["-i", UUID, "-pm", "1"]


def test_processes_mig_and_an_unreadable_gpu(bins, proc):
    h = host(proc)
    assert h.gpu_processes(UUID) == ()
    bins.set("pids", "4242\n4343\n")
    bins.set("mig", "Enabled")
    assert h.gpu_processes(UUID) == (4242, 4343) and h.gpu_mig(UUID) is True
    assert ["--query-compute-apps=pid", "--format=csv,noheader,nounits", "-i", UUID] in bins.calls("nvidia-smi")
    bins.set("query_fails", "")
    assert h.gpu_processes(UUID) is None


def test_boot_id_and_uptime_come_from_the_procfs_root(proc):
    h = Host(enforce(), HostPaths(procfs=str(proc.root)))
    assert h.boot_id() == "11111111-1111-1111-1111-111111111111" and h.uptime() == 99_999.0
    proc.boot("22222222-2222-2222-2222-222222222222")
    assert h.boot_id().startswith("2222")


@pytest.mark.parametrize(
    ("reboot", "program", "argv"),
    [
        pytest.param({}, "systemctl", ["reboot"], id="systemd via systemctl"),
        pytest.param({"systemd_via": "logind"}, "busctl",
                     ["call", "org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager",
                      "Reboot", "b", "false"], id="systemd via logind D-Bus"),
        pytest.param({"host_namespaces": True}, "nsenter",
                     ["--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--", "systemctl", "reboot"],
                     id="from a pod, in PID 1's namespaces"),
    ],
)
def test_reboot_methods_run_the_right_program(bins, proc, reboot, program, argv):
    res = host(proc, reboot=reboot).reboot()
    assert res.ok and bins.calls(program) == [argv]


def test_reboot_by_command_and_a_failing_one(bins, proc):
    h = host(proc, reboot={"method": "command", "command": [bins.path("reboot-node"), "--now"]})
    assert h.reboot().ok and bins.calls("reboot-node") == [["--now"]]
    bins.set("fail_reboot-node", "")
    res = h.reboot()
    assert not res.ok and "exit 1" in res.detail


def test_kured_method_writes_the_sentinel_under_the_rootfs(tmp_path, proc):
    root = tmp_path / "host"
    h = host(proc, rootfs=str(root), reboot={"method": "kured"})
    assert h.reboot().ok
    assert (root / "var/run/reboot-required").exists()


def test_power_off_and_retire_command(bins, proc):
    h = host(proc, retire={"command": [bins.path("retire-node"), "ticket"]})
    assert h.power_off().ok and bins.calls("systemctl") == [["poweroff"]]
    assert h.retire_command().ok and bins.calls("retire-node") == [["ticket"]]


def test_ladder_end_to_end_on_the_seams_reset_then_reboot_on_failure(tmp_path, bins, proc):
    cfg = enforce(gpu_reset={"nvidia_smi": bins.path("nvidia-smi"), "verify_burn": "0s"}, reboot={"min_uptime": "30m"})
    state = StateDir(str(tmp_path / "state"))
    state.ensure()
    cluster = FakeCluster()
    h = Host(cfg, HostPaths(procfs=str(proc.root)))
    ladder = Ladder(cfg, state, h, cluster, catalog=CATALOG, users=Users({UUID: frozenset({"uid-a"})}, h))
    bins.set("pids", "999")
    faults = fault_list(finding("XidCritical48", "reset_gpu"))
    ladder.tick(faults)
    assert ("drain", ("uid-a",)) in cluster.calls and not any("--gpu-reset" in c for c in bins.calls("nvidia-smi"))
    bins.set("pids", "")
    bins.set("reset_fails", "")
    ladder.tick(faults)
    assert ["--gpu-reset", "-i", UUID] in bins.calls("nvidia-smi")
    assert bins.calls("systemctl") == [["reboot"]] and ladder.step == "rebooting"
    proc.boot("33333333-3333-3333-3333-333333333333")
    proc.uptime(40.0)
    ladder.tick([])
    assert ladder.step == "settle"
    ladder.tick(fault_list(finding("XidCritical48", "reset_gpu")))  # back after the reboot: counted
    assert [r.back for r in ladder.rec.reboots] == [True]
    assert ladder.step == "reboot" and len(bins.calls("systemctl")) == 1  # held: below min_uptime
    assert "uptime" in ladder.waiting


def test_kured_sentinel_follows_the_hosts_links_within_the_host_root(tmp_path, proc):
    """/var/run → /run on the host (absolute, as Debian and RHEL ship it): under the rootfs the
    sentinel lands in the host's /run, not in the /run of the process that writes it."""
    root = tmp_path / "host"
    (root / "run").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")
    h = host(proc, rootfs=str(root), reboot={"method": "kured"})
    res = h.reboot()
    assert res.ok, res.detail
    assert (root / "run/reboot-required").is_file() and (root / "var/run").is_symlink()
    assert str(root / "run/reboot-required") in h.describe_reboot()


@pytest.mark.parametrize(("links", "path", "want"), [
    ({"var/run": "../run"}, "/var/run/reboot-required", "run/reboot-required"),  # relative target
    ({"var/run": "/run", "run": "/state/run"}, "/var/run/x", "state/run/x"),  # a chain of links
    ({"a": "/../../../escape"}, "/a/f", "escape/f"),  # ".." stops at the host's root
    ({}, "/var/run/reboot-required", "var/run/reboot-required"),  # nothing there yet: created as written
])
def test_under_root_resolves_like_a_chroot(tmp_path, links, path, want):
    root = tmp_path / "host"
    root.mkdir()
    for link, target in links.items():
        (root / link).parent.mkdir(parents=True, exist_ok=True)
        (root / link).symlink_to(target)
    assert under_root(str(root), path) == str(root / want)


def test_under_root_stops_on_a_link_loop(tmp_path):
    root = tmp_path / "host"
    root.mkdir()
    (root / "a").symlink_to("/b")
    (root / "b").symlink_to("/a")
    assert under_root(str(root), "/a/f").startswith(str(root))


def test_a_reset_without_nvidia_smi_is_refused_before_anything_runs(tmp_path, proc, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    h = host(proc)
    why = h.reset_unavailable()
    assert why is not None and "nvidia-smi" in why and "nvidiaRuntime.enabled" in why
    res = h.reset_gpu(UUID)
    assert not res.ok and res.detail.startswith("GPU reset refused: nvidia-smi")


def test_nvidia_smi_present_is_no_refusal(bins, proc):
    assert host(proc).reset_unavailable() is None
