"""A ConfigMap edit reaches the running agent: the kubelet swaps the mounted
``..data`` symlink, the agent sees the file behind the path change and
reloads as on SIGHUP; a bad new config keeps the running one."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import bcrypt
from agentproc import NO_TRAFFIC, Agent, wait_for
from conftest import NO_HOST_KMSG


def configmap_update(d: Path, version: str, text: str) -> None:
    """The kubelet's atomic writer: files in a new ``..<timestamp>`` dir, then
    ``..data`` re-pointed by rename(2); ``agent.toml`` links to ``..data/agent.toml``."""
    ts = d / f"..{version}"
    ts.mkdir()
    (ts / "agent.toml").write_text(text + NO_TRAFFIC + NO_HOST_KMSG)
    os.symlink(ts.name, d / "..data_tmp")
    os.rename(d / "..data_tmp", d / "..data")
    if not (d / "agent.toml").is_symlink():
        os.symlink("..data/agent.toml", d / "agent.toml")


def test_a_configmap_swap_reloads_and_a_bad_one_keeps_the_running_config(tmp_path: Path) -> None:
    cm = tmp_path / "configmap"
    cm.mkdir()
    configmap_update(cm, "2026_11_25_01", "")
    agent = Agent(tmp_path, config_path=cm / "agent.toml")
    try:
        agent.wait_ready()
        assert agent.value("node_health_config_reloads_total", result="success") == 0
        scrapes = wait_for(lambda: (agent.value("node_health_http_requests_total", handler="metrics", code="200") or 0)
                           >= 3 and 3, what="three scrapes counted")

        hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
        configmap_update(cm, "2026_11_25_02", f'[metrics.basic_auth_users]\nprometheus = "{hashed}"\n')
        wait_for(lambda: agent.get("/metrics")[0] == 401, what="the new config's basic auth")
        auth = {"Authorization": "Basic " + base64.b64encode(b"prometheus:s3cret").decode()}
        code, body = agent.get("/metrics", auth)
        assert code == 200 and b'node_health_config_reloads_total{result="success"} 1.0' in body
        # The server was made anew for the new settings; its counters were not reset.
        after = re.search(rb'node_health_http_requests_total\{code="200",handler="metrics"\} (\S+)', body)
        assert after is not None and float(after.group(1)) >= scrapes  # one authorized scrape since: not reset
        assert b'node_health_http_requests_total{code="401",handler="metrics"}' in body

        configmap_update(cm, "2026_11_25_03", "[checks.no_such_check]\n")
        wait_for(lambda: b'node_health_config_reloads_total{result="failure"} 1.0' in agent.get("/metrics", auth)[1],
                 what="the failed reload")
        assert b"node_health_config_last_reload_successful 0.0" in agent.get("/metrics", auth)[1]
        assert agent.get("/metrics")[0] == 401, "the running config (with its basic auth) is kept"
        assert "checks.no_such_check" in agent.logs() and "changed on disk" in agent.logs()
    finally:
        assert agent.stop() == 0


def test_a_change_is_read_only_once_it_has_settled(tmp_path: Path) -> None:
    """A file written in place is seen changing on one look and read on the next
    look that finds it the same, never while it is still being written."""
    from agent.filewatch import FileWatcher

    path = tmp_path / "agent.toml"
    path.write_text("a = 1\n")
    calls: list[str] = []
    watcher = FileWatcher(
        lambda: (str(path),), lambda: calls.append(path.read_text() if path.exists() else "gone"), interval=3600
    )
    assert not watcher.look()  # nothing changed
    path.write_text("")  # truncated: an editor or `cat >` in the middle of writing
    assert not watcher.look()
    path.write_text("a = 2\n")
    assert not watcher.look()  # changed again since the last look: not settled
    assert watcher.look() and calls == ["a = 2\n"]
    assert not watcher.look() and calls == ["a = 2\n"]  # once per change
    path.unlink()
    assert not watcher.look() and watcher.look() and calls[-1] == "gone"  # gone is a change too, once settled
