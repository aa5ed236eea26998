"""`agent run` as a subprocess: endpoints, signals, reload, systemd notify."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from agentproc import Agent, NotifySocket, wait_for

# The one time that is a requirement itself: the agent exits on SIGTERM before
# systemd's TimeoutStopSec (15s, systemd/node-health-agent.service) sends
# SIGKILL. It takes well under a second; the full 15s is the bound, generous
# enough for a loaded 2-core machine.
STOP_WITHIN = 15.0

BASE = """
[checks.disk]
interval = "1s"
paths = ["/"]
[checks.network]
interval = "1s"
"""


@pytest.fixture
def notify():
    sock = NotifySocket()
    yield sock
    sock.close()


def test_metrics_healthz_notify_and_clean_sigterm(tmp_path: Path, notify: NotifySocket) -> None:
    agent = Agent(tmp_path, BASE, notify=notify, env={"WATCHDOG_USEC": "1000000"})
    try:
        agent.wait_ready()
        assert agent.get("/healthz") == (200, b"ok\n")
        m = agent.metrics()
        (labels, value), = m["node_health_build_info"]
        assert value == 1 and labels["native"] in ("true", "false") and labels["version"]
        wait_for(lambda: agent.value("node_health_check_runs_total", check="disk"), what="a disk run")
        assert agent.value("node_health_check_success", check="network") == 1
        assert agent.get("/nope")[0] == 404
        msgs = wait_for(lambda: [m for m in notify.drain() if "WATCHDOG=1" in m], what="watchdog pings")
        assert msgs
        ready = [m for m in notify.messages if "READY=1" in m]
        assert ready and "STATUS=" in ready[0]
    finally:
        code = agent.stop(timeout=STOP_WITHIN)  # past it: SIGKILL, and the code is -9
    assert code == 0, agent.logs()
    assert any("STOPPING=1" in m for m in notify.drain())


def test_sighup_with_a_broken_config_keeps_the_running_one(tmp_path: Path) -> None:
    agent = Agent(tmp_path, BASE)
    try:
        agent.wait_ready()
        agent.write_config('[checks.disk]\ninterval = "soon"\n')
        agent.signal(signal.SIGHUP)
        wait_for(lambda: agent.value("node_health_config_reloads_total", result="failure") == 1, what="failed reload")
        assert agent.value("node_health_config_last_reload_successful") == 0
        assert agent.proc.poll() is None
        errors = [json.loads(line) for line in agent.logs().splitlines() if '"level": "error"' in line]
        assert len(errors) == 1 and "checks.disk.interval" in errors[0]["msg"], errors
        runs = agent.value("node_health_check_runs_total", check="disk") or 0
        wait_for(lambda: (agent.value("node_health_check_runs_total", check="disk") or 0) > runs + 1,
                 what="disk check still running on the old config")
        # A good file is picked up by the next SIGHUP.
        agent.write_config(BASE.replace('interval = "1s"\npaths', 'interval = "2s"\npaths'))
        agent.signal(signal.SIGHUP)
        wait_for(lambda: agent.value("node_health_config_reloads_total", result="success") == 1, what="reload")
        assert agent.value("node_health_config_last_reload_successful") == 1
    finally:
        assert agent.stop() == 0


def test_bad_flag_and_bad_config_exit_2_without_traceback(tmp_path: Path) -> None:
    agent = Agent(tmp_path, "[checks.disk]\nenabled = 3\n")
    assert agent.proc.wait(30) == 2
    agent.stop()
    out = agent.logs()
    assert "checks.disk.enabled" in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1


def test_second_agent_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    first = Agent(tmp_path, BASE)
    try:
        first.wait_ready()
        second = Agent(tmp_path, BASE)
        assert second.proc.wait(30) == 3  # not 2: the first may be stopping, so systemd retries
        second.stop()
        assert "another agent holds its lock" in second.logs()
    finally:
        first.stop()


@pytest.mark.privileged
def test_a_hung_check_yields_check_timeout_while_the_others_keep_running(tmp_path: Path, mount_ns) -> None:
    """A disk check stuck in statfs on a dead (FUSE) mount: the whole run hangs past its
    timeout (probe_timeout is longer on purpose), the network check goes on, /healthz stays up."""
    from fuse_hang import FuseHangProcess

    dead = tmp_path / "dead"
    dead.mkdir()
    fs = FuseHangProcess(str(dead), prefix=mount_ns.cmd([]))
    cfg = f"""
[checks.disk]
interval = "1s"
timeout = "2s"
probe_timeout = "1h"
paths = ["{dead}"]
include_state_dir = false
[checks.network]
interval = "1s"
"""
    agent = Agent(tmp_path, cfg, wrap=mount_ns.cmd([]))
    try:
        agent.wait_ready()
        wait_for(lambda: agent.value("node_health_check_stuck", check="disk") == 1, what="disk stuck")
        assert agent.value("node_health_finding", check="disk", subject="disk", reason="CheckTimeout") == 1
        assert agent.value("node_health_check_success", check="disk") == 0
        runs = agent.value("node_health_check_runs_total", check="network") or 0
        wait_for(lambda: (agent.value("node_health_check_runs_total", check="network") or 0) >= runs + 2,
                 what="network keeps running")
        wait_for(lambda: (agent.value("node_health_check_skipped_total", check="disk") or 0) >= 1,
                 what="a due run skipped while stuck")
        assert fs.hung_count("statfs") == 1, "the stuck check was not started again"
        assert agent.get("/healthz")[0] == 200
        fs.release(heal=True)  # the mount answers again: the stuck run returns
        wait_for(lambda: agent.value("node_health_check_stuck", check="disk") == 0, what="disk unstuck")
        # Cleared: gone (a warning is not exported at 0 by default, [metrics] findings_at_zero).
        wait_for(lambda: agent.value("node_health_finding", check="disk", subject="disk", reason="CheckTimeout") in (None, 0),
                 what="CheckTimeout cleared")
    finally:
        fs.close()  # a held FUSE request would keep the agent from exiting
        code = agent.stop(timeout=STOP_WITHIN)  # past it: SIGKILL, and the code is -9
    assert code == 0, agent.logs()


class CountingSource:
    name = "counting"

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def start(self, emit) -> None:  # type: ignore[no-untyped-def]
        self.log.append("start")

    def stop(self) -> None:
        self.log.append("stop")

    def known_findings(self) -> list[tuple[str, str]]:
        return []


def test_sighup_restarts_event_sources_only_when_their_config_changed(tmp_path: Path, monkeypatch) -> None:
    """A reload must not cancel a running preflight burn or re-open the kernel log for nothing."""
    from agent import daemon
    from agent.runtime import Overrides, load_config

    events: list[str] = []
    monkeypatch.setattr(daemon, "build_sources", lambda ctx: [CountingSource(events)])
    path = tmp_path / "agent.toml"
    path.write_text(BASE)
    ov = Overrides(config_path=str(path), state_dir=str(tmp_path / "state"))
    d = daemon.Daemon(load_config(ov), ov, daemon.RunOptions())
    d._start_sources()
    d.reload()  # the same file
    assert events == ["start"]
    path.write_text(BASE.replace('interval = "1s"\npaths', 'interval = "2s"\npaths'))
    d.reload()
    assert events == ["start", "stop", "start"]
    d._stop_sources()


def test_free_memory_is_given_back_once_after_the_first_pass(tmp_path: Path) -> None:
    """glibc keeps what start-up freed; the daemon hands it back once the checks have all run (issue 29)."""
    from agent.daemon import release_free_memory, vm_rss_kb

    assert release_free_memory() is True  # glibc here; musl has no malloc_trim and gets False
    assert vm_rss_kb() > 0
    agent = Agent(tmp_path, BASE, args=["--log-level", "debug"])
    try:
        agent.wait_ready()
        wait_for(lambda: "gave the allocator's free memory back" in agent.logs(), what="the trim's log line")
        wait_for(lambda: (agent.value("node_health_check_runs_total", check="disk") or 0) >= 3, what="more runs")
    finally:
        agent.stop(timeout=STOP_WITHIN)
    assert agent.logs().count("gave the allocator's free memory back") == 1
