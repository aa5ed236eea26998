"""A GPU that stops answering is a definite fault (issue 13, item 4): NVML calls
hung for `hung_polls` polls in a row, or processes stuck in D state on
/dev/nvidia* for as long, are critical; a single timeout stays unknown."""

from __future__ import annotations

import os

import pytest
from agentproc import wait_for
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

from agent.checks.gpu import GpuCheck
from agent.findings import Observation, Severity
from agent.gpu.stuck import Stuck, StuckTracker, parse_stat, scan
from agent.hostpaths import HostPaths


def found(obs: Observation) -> dict[tuple[str, str], tuple[Severity, bool]]:
    return {(f.subject, f.reason): (f.severity, f.unknown) for f in obs.findings}


def sample(obs: Observation, name: str, **labels: str) -> float | None:
    for s in obs.samples:
        if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items()):
            return s.value
    return None


HUNG = ("NvmlCallHung", (Severity.WARNING, True))
DEAD = ("GpuUnresponsive", (Severity.CRITICAL, False))


def make(gpu_context, polls: int = 3, warm: bool = True) -> GpuCheck:
    """The check, with NVML initialised by a first healthy poll (loading the
    library can take longer than the short call timeout on a loaded machine)."""
    ctx, cfg = gpu_context(f'xid_events = false\ncall_timeout = "300ms"\nhung_polls = {polls}\n')
    check = GpuCheck(ctx, cfg)
    if warm:
        assert found(check.run()) == {}
    return check


def unhang(scenario, check: GpuCheck, key: str) -> None:
    """Let the stuck call return (the fake polls its scenario) and wait for its thread."""
    scenario.unset(key)
    wait_for(lambda: not check.prober.hung(), what="the hung NVML call to return")


def test_a_gpu_hung_for_n_polls_is_critical_and_unknown_before(gpu_context, scenario) -> None:
    scenario.set([h100(0), h100(1)])
    check = make(gpu_context, polls=3)
    scenario.set(**{"hang.nvmlDeviceGetTemperature": -1})
    try:
        for n in (1, 2):
            obs = check.run()
            assert found(obs) == {("gpu0", HUNG[0]): HUNG[1], ("gpu1", HUNG[0]): HUNG[1]}, f"poll {n}"
            assert sample(obs, "node_health_nvml_hung_polls", subject="gpu0") == n
        obs = check.run()
        assert found(obs) == {("gpu0", DEAD[0]): DEAD[1], ("gpu1", DEAD[0]): DEAD[1]}
        assert "3 polls in a row" in obs.findings[0].message
        assert {f.action for f in obs.findings} == {"reboot"}
        assert len(check.prober.hung()) == 2, "one stuck thread per GPU, not one per poll"
    finally:
        unhang(scenario, check, "hang.nvmlDeviceGetTemperature")
    obs = check.run()
    assert found(obs) == {}, "a GPU that answers again is no longer a fault, and its count starts afresh"
    assert sample(obs, "node_health_nvml_hung_polls", subject="gpu0") == 0


def test_one_gpu_hung_the_other_still_polled(gpu_context, scenario, host) -> None:
    """...and the hung one is not also GpuMissing: it is on the bus and NVML counts it."""
    host.add_gpu("0000:18:00")
    host.add_gpu("0000:28:00")
    scenario.set([h100(0), h100(1, **{"nvlink.links": "NS"})])  # gpu1: a board without NVLink
    check = make(gpu_context, polls=2)
    # The fake hangs NvLinkErrorCounter for every GPU, but only gpu0 has links to ask about.
    scenario.set(**{"hang.nvmlDeviceGetNvLinkErrorCounter": -1})
    try:
        assert found(check.run()) == {("gpu0", HUNG[0]): HUNG[1]}
        obs = check.run()
        assert found(obs) == {("gpu0", DEAD[0]): DEAD[1]}
        assert sample(obs, "node_health_gpu_up", gpu="1") == 1
    finally:
        unhang(scenario, check, "hang.nvmlDeviceGetNvLinkErrorCounter")


def test_the_count_survives_an_agent_restart(gpu_context, scenario) -> None:
    """The stuck thread never comes back; a new agent whose first call hangs again goes on counting."""
    scenario.set([h100(0)])
    first = make(gpu_context, polls=3)
    scenario.set(**{"hang.nvmlDeviceGetTemperature": -1})
    second = None
    try:
        first.run()
        first.run()
        second = make(gpu_context, polls=3, warm=False)  # same state dir, new prober: a restarted agent
        assert found(second.run()) == {("gpu0", DEAD[0]): DEAD[1]}
    finally:
        scenario.unset("hang.nvmlDeviceGetTemperature")
        wait_for(lambda: not first.prober.hung() and not (second and second.prober.hung()), what="hung calls to return")


def test_a_call_that_answers_in_between_starts_the_count_again(gpu_context, scenario) -> None:
    scenario.set([h100(0)])
    check = make(gpu_context, polls=3)
    scenario.set(**{"hang.nvmlDeviceGetTemperature": -1})
    check.run()
    check.run()
    unhang(scenario, check, "hang.nvmlDeviceGetTemperature")
    assert found(check.run()) == {}
    scenario.set(**{"hang.nvmlDeviceGetTemperature": -1})
    try:
        assert found(check.run()) == {("gpu0", HUNG[0]): HUNG[1]}, "1 of 3, not 3 of 3"
    finally:
        unhang(scenario, check, "hang.nvmlDeviceGetTemperature")


def test_zero_polls_means_never_critical(gpu_context, scenario) -> None:
    scenario.set([h100(0)])
    check = make(gpu_context, polls=0)
    scenario.set(**{"hang.nvmlDeviceGetTemperature": -1})
    try:
        for _ in range(4):
            assert found(check.run()) == {("gpu0", HUNG[0]): HUNG[1]}
    finally:
        unhang(scenario, check, "hang.nvmlDeviceGetTemperature")


def test_nvml_init_that_hangs_is_a_hung_call_not_no_nvml(gpu_context, scenario) -> None:
    scenario.set([h100(0)], **{"hang.nvmlInitWithFlags": -1})
    check = make(gpu_context, polls=2, warm=False)
    try:
        obs = check.run()
        assert found(obs) == {("nvml", HUNG[0]): HUNG[1]}
        assert sample(obs, "node_health_nvml_up") == 0
        assert found(check.run()) == {("nvml", DEAD[0]): DEAD[1]}
    finally:
        unhang(scenario, check, "hang.nvmlInitWithFlags")
    assert found(check.run()) == {}


def test_device_count_that_hangs(gpu_context, scenario) -> None:
    scenario.set([h100(0)])
    check = make(gpu_context, polls=2)
    scenario.set(**{"hang.nvmlDeviceGetCount_v2": -1})
    try:
        assert found(check.run()) == {("gpus", HUNG[0]): HUNG[1]}
        assert found(check.run()) == {("gpus", DEAD[0]): DEAD[1]}
    finally:
        unhang(scenario, check, "hang.nvmlDeviceGetCount_v2")


# ---------------------------------------------------------------- processes in D state


def stat_line(pid: int, comm: str, state: str, start: int = 4242) -> str:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice num_threads itrealvalue starttime ...
    return f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 {start} 1000 50 " + "0 " * 30


def add_process(proc: str, pid: int, comm: str, state: str, files: list[str], start: int = 4242) -> None:
    d = os.path.join(proc, str(pid))
    os.makedirs(os.path.join(d, "fd"), exist_ok=True)
    with open(os.path.join(d, "stat"), "w") as fh:
        fh.write(stat_line(pid, comm, state, start) + "\n")
    for fd in os.listdir(os.path.join(d, "fd")):
        os.unlink(os.path.join(d, "fd", fd))
    for n, target in enumerate(files):
        os.symlink(target, os.path.join(d, "fd", str(n + 3)))


@pytest.mark.parametrize(
    ("comm", "state", "files", "stuck"),
    [
        pytest.param("nvidia-smi", "D", ["/dev/nvidiactl", "/dev/nvidia0"], ("/dev/nvidia0", "/dev/nvidiactl"), id="nvidia-smi in D"),
        pytest.param("python3", "D", ["/dev/null", "/dev/nvidia-uvm", "/dev/nvidia-uvm"], ("/dev/nvidia-uvm",), id="CUDA job in D, uvm"),
        pytest.param("pt_main (x) y", "D", ["/dev/nvidia3"], ("/dev/nvidia3",), id="comm with spaces and parentheses"),
        pytest.param("nvidia-smi", "S", ["/dev/nvidia0"], (), id="near miss: sleeping, not stuck"),
        pytest.param("nvidia-smi", "R", ["/dev/nvidia0"], (), id="near miss: running"),
        pytest.param("jbd2/sda1-8", "D", ["/dev/sda1"], (), id="near miss: in D on a disk"),
        pytest.param("nvme", "D", ["/dev/nvme0n1", "socket:[1234]"], (), id="near miss: /dev/nvme is not /dev/nvidia"),
        pytest.param("nvidia-smi", "Z", [], (), id="near miss: zombie"),
    ],
)
def test_stuck_process_table(tmp_path, comm: str, state: str, files: list[str], stuck: tuple[str, ...]) -> None:
    proc = str(tmp_path / "proc")
    add_process(proc, 4711, comm, state, files)
    add_process(proc, 1, "systemd", "S", ["/dev/kmsg"])
    got = scan(HostPaths(procfs=proc))
    assert [(s.pid, s.comm, s.devices) for s in got] == ([(4711, comm, stuck)] if stuck else [])


def test_parse_stat_rejects_garbage() -> None:
    assert parse_stat(b"") is None
    assert parse_stat(b"12 (x") is None
    assert parse_stat(b"12 (x) D 1 2") is None
    assert parse_stat(stat_line(7, "a) (b", "D", 99).encode()) == ("a) (b", "D", 99)


def test_tracker_counts_polls_in_a_row_and_tells_a_reused_pid_apart() -> None:
    t = StuckTracker()
    a = Stuck(10, 100, "nvidia-smi", ("/dev/nvidia0",))
    assert [n for _, n in t.update([a])] == [1]
    assert [n for _, n in t.update([a])] == [2]
    assert [n for _, n in t.update([Stuck(10, 555, "nvidia-smi", ("/dev/nvidia0",))])] == [1], "pid reused"
    assert t.update([]) == []
    assert [n for _, n in t.update([a])] == [1], "out of D once: counted afresh"


def test_process_stuck_for_n_polls_is_critical(gpu_context, scenario, host) -> None:
    scenario.set([h100(0)])
    add_process(host.proc, 4711, "nvidia-smi", "D", ["/dev/nvidiactl", "/dev/nvidia0"])
    add_process(host.proc, 4712, "python3", "D", ["/dev/sda"])  # stuck, but not on a GPU
    check = make(gpu_context, polls=3, warm=False)
    for _ in range(2):
        obs = check.run()
        assert found(obs) == {}, "D state for fewer polls than hung_polls is no finding"
        assert sample(obs, "node_health_gpu_stuck_processes") == 1
    obs = check.run()
    assert found(obs) == {("gpus", "GpuProcessStuck"): (Severity.CRITICAL, False)}
    assert obs.findings[0].action == "reboot"
    assert "nvidia-smi (pid 4711, 3 polls" in obs.findings[0].message
    add_process(host.proc, 4711, "nvidia-smi", "S", ["/dev/nvidiactl", "/dev/nvidia0"])
    obs = check.run()
    assert found(obs) == {}
    assert sample(obs, "node_health_gpu_stuck_processes") == 0


def test_without_nvml_or_a_gpu_on_the_bus_there_is_no_process_walk_and_no_rewrite(
    gpu_context, host, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: a GPU-less node's poll neither walks /proc nor rewrites an unchanged poll state;
    a GPU on the bus brings the walk back."""
    from agent.gpu import poller
    from agent.statedir import StateDir

    add_process(host.proc, 4711, "nvidia-smi", "D", ["/dev/nvidiactl", "/dev/nvidia0"])
    scans: list[int] = []
    real_scan = poller.scan
    monkeypatch.setattr(poller, "scan", lambda paths: scans.append(1) or real_scan(paths))
    writes: list[str] = []
    real_write = StateDir.write_bytes
    monkeypatch.setattr(StateDir, "write_bytes", lambda self, name, data: writes.append(name) or real_write(self, name, data))
    ctx, cfg = gpu_context("xid_events = false\nhung_polls = 1\n", lib=str(tmp_path / "no-libnvidia-ml.so.1"))
    check = GpuCheck(ctx, cfg)
    for _ in range(3):
        obs = check.run()
        assert sample(obs, "node_health_gpu_stuck_processes") == 0
        assert ("gpus", "GpuProcessStuck") not in found(obs)
    assert scans == []
    assert writes == [poller.POLL_STATE]  # the first poll's, then nothing changed
    host.add_gpu("0000:17:00.0")
    obs = check.run()
    assert scans == [1]
    assert ("gpus", "GpuProcessStuck") in found(obs)


def test_a_poll_state_removed_behind_the_agent_is_written_again(gpu_context, tmp_path) -> None:
    ctx, cfg = gpu_context("xid_events = false\n", lib=str(tmp_path / "no-libnvidia-ml.so.1"))
    check = GpuCheck(ctx, cfg)
    check.run()
    path = os.path.join(ctx.state_dir, "gpu-poll.json")
    assert os.path.exists(path)
    os.unlink(path)
    check.run()
    assert os.path.exists(path)
