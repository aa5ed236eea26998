"""metrics.telemetry_path and node_exporter's --web.telemetry-path: the metrics are served at the configured
path and nowhere else (/metrics then answers 404), /healthz and / stay; the flag wins over the config and is
kept across a reload; a bad path is one line and exit 2 (docs/web.md)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agentproc import Agent, wait_for

from agent.config import parse
from agent.schema import ConfigError


def _served(agent: Agent, path: str) -> bool:
    code, body = agent.get(path)
    return code == 200 and b"node_health_build_info{" in body


def test_the_flag_moves_the_metrics_and_only_them(tmp_path: Path) -> None:
    agent = Agent(tmp_path, '[metrics]\ntelemetry_path = "/from-config"\n', args=["--web.telemetry-path", "/node/metrics"])
    try:
        agent.wait_ready()
        assert _served(agent, "/node/metrics"), "the flag's path serves the metrics"
        assert agent.get("/metrics")[0] == 404 and agent.get("/from-config")[0] == 404
        assert agent.get("/node/metrics/")[0] == 404, "the path as given, not a prefix"
        assert agent.get("/healthz") == (200, b"ok\n")
        assert agent.get("/") == (200, b"node-health-agent: /node/metrics /healthz\n")
        wait_for(lambda: 'node_health_http_requests_total{code="404",handler="other"} 3.0' in
                 agent.get("/node/metrics?x=1")[1].decode(), 20, what="the 404s counted as other")
        assert 'node_health_http_requests_total{code="200",handler="metrics"}' in agent.get("/node/metrics")[1].decode()
        agent.write_config('[metrics]\ntelemetry_path = "/changed"\n')
        agent.signal(signal.SIGHUP)
        wait_for(lambda: 'node_health_config_reloads_total{result="success"} 1.0' in agent.get("/node/metrics")[1].decode(),
                 20, what="the reload")
        assert _served(agent, "/node/metrics") and agent.get("/changed")[0] == 404, "the flag is kept across a reload"
    finally:
        agent.stop()


def test_the_config_key_and_its_live_reload(tmp_path: Path) -> None:
    agent = Agent(tmp_path, '[metrics]\ntelemetry_path = "/x/metrics"\n')
    try:
        agent.wait_ready()
        assert _served(agent, "/x/metrics") and agent.get("/metrics")[0] == 404
        agent.write_config('[metrics]\ntelemetry_path = "/metrics"\n')
        agent.signal(signal.SIGHUP)
        wait_for(lambda: _served(agent, "/metrics"), 20, what="/metrics after the reload")
        assert agent.get("/x/metrics")[0] == 404
    finally:
        agent.stop()


@pytest.mark.parametrize(("value", "said"), [
    pytest.param("metrics", "expected an absolute URL path", id="relative"),
    pytest.param("/healthz", "the agent's own", id="the probes' path"),
    pytest.param("/", "the agent's own", id="the landing page"),
    pytest.param("/metrics?x=1", "expected an absolute URL path", id="a query"),
    pytest.param("/my metrics", "expected an absolute URL path", id="a space"),
])
def test_a_bad_path_is_refused_in_the_config_and_on_the_command_line(tmp_path: Path, value: str, said: str) -> None:
    with pytest.raises(ConfigError, match="metrics.telemetry_path") as exc:
        parse(f'[metrics]\ntelemetry_path = "{value}"\n', "agent.toml")
    assert said in str(exc.value)
    res = subprocess.run([sys.executable, "-m", "agent", "run", "--once", "--state-dir", str(tmp_path),
                          "--web.telemetry-path", value], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("agent: --web.telemetry-path: ") and said in res.stderr, res.stderr
