"""The measured case: `agent run` with [metrics.tls], the certificate files
replaced at the same paths. Before, the old certificate was served even after
SIGHUP; now the new one is served from the next connection, no signal needed."""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
from pathlib import Path

from agentproc import Agent, wait_for
from webcerts import make_certs, make_leaf


def served_cert(port: int) -> bytes:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_new_certificate_files_at_the_same_paths_are_served_without_a_restart(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(certs.server[0], live / "tls.crt")
    shutil.copy(certs.server[1], live / "tls.key")
    config = f'[metrics.tls]\ncert_file = "{live}/tls.crt"\nkey_file = "{live}/tls.key"\n'
    agent = Agent(tmp_path, config, scheme="https")
    try:
        agent.wait_ready()
        assert served_cert(agent.port) == certs.fingerprint(certs.server[0])
        renewed = make_leaf(tmp_path, "renewed", (certs.ca, certs.dir / "ca.key"))
        shutil.copy(renewed[1], live / "tls.key")
        shutil.copy(renewed[0], live / "tls.crt")
        assert served_cert(agent.port) == certs.fingerprint(renewed[0])  # no SIGHUP
        agent.signal(signal.SIGHUP)  # and a SIGHUP with the same paths keeps serving it
        wait_for(lambda: agent.value("node_health_config_reloads_total", result="success") == 1, what="the reload")
        assert served_cert(agent.port) == certs.fingerprint(renewed[0])
        assert agent.value("node_health_web_config_reloads_total", result="success") == 1
    finally:
        assert agent.stop() == 0
