"""Every failure at start-up is one line on stderr and an exit code that
says whether a restart can help (2: fix the config; 3: try again), never a
traceback. Each case was measured ending in a traceback, or in exit 0 for a
kubeconfig that does not exist, before it was mended."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import bcrypt
import pytest
from agentproc import NO_TRAFFIC, free_port
from conftest import NO_HOST_KMSG, require_root, require_tool
from webcerts import Certs, make_certs

QUIET = NO_TRAFFIC + NO_HOST_KMSG


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def agent(tmp: Path, *args: str, config: str = "", wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "agent.toml"
    cfg.write_text(config + QUIET)
    argv = [*wrap, sys.executable, "-m", "agent", *args]
    if args[0] == "run":
        argv += ["--config", str(cfg), "--state-dir", str(tmp / "state"), "--log-format", "text"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp)


def one_line(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = err.splitlines()
    assert proc.returncode == code, (proc.returncode, err)
    assert lines and all(w in lines[-1] for w in words), err
    assert sum(1 for line in lines if line.startswith("agent:")) == 1, err
    return lines[-1]


def test_unresolvable_listen_host(tmp_path: Path) -> None:
    try:
        socket.getaddrinfo("no-such-host.invalid", 9904)
        pytest.skip("this resolver answers for .invalid")
    except socket.gaierror as exc:
        code = 3 if exc.errno == socket.EAI_AGAIN else 2  # no DNS server reachable: worth a retry
    proc = agent(tmp_path, "run", "--listen", "no-such-host.invalid:9904")
    one_line(proc, code, "--listen", 'cannot resolve "no-such-host.invalid"')


def test_port_already_in_use_exits_3_so_systemd_tries_again(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = agent(tmp_path, "run", "--listen", f"127.0.0.1:{port}")
    line = one_line(proc, 3, f"127.0.0.1:{port}", "already in use")
    assert line.startswith("agent: --listen:")


def test_state_dir_locked_by_another_agent_exits_3_so_systemd_tries_again(tmp_path: Path) -> None:
    """With RestartPreventExitStatus=2, a lock still held by the stopping agent must not end the retries."""
    (tmp_path / "state").mkdir(mode=0o700)
    with open(tmp_path / "state" / "agent.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = agent(tmp_path, "run", "--listen", f"127.0.0.1:{free_port()}")
    one_line(proc, 3, "another agent holds its lock")


def test_privileged_port_as_non_root() -> None:
    require_root()  # to become nobody
    require_tool("setpriv")
    tmp = Path(tempfile.mkdtemp(prefix="nha-nobody-"))  # pytest's tmp_path is root's alone
    try:
        os.chmod(tmp, 0o777)
        nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all")
        proc = agent(tmp, "run", "--listen", "127.0.0.1:80", wrap=nobody)
        one_line(proc, 2, "127.0.0.1:80", "permission denied", "CAP_NET_BIND_SERVICE")
    finally:
        shutil.rmtree(tmp)


def test_missing_tls_files_in_the_toml(tmp_path: Path) -> None:
    config = '[metrics.tls]\ncert_file = "/nonexistent/tls.crt"\nkey_file = "/nonexistent/tls.key"\n'
    proc = agent(tmp_path, "run", "--listen", f"127.0.0.1:{free_port()}", config=config)
    one_line(proc, 2, "metrics.tls.cert_file", "cannot read /nonexistent/tls.crt")


def test_missing_tls_files_in_the_web_config(tmp_path: Path) -> None:
    (tmp_path / "web.yml").write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    proc = agent(tmp_path, "run", "--listen", f"127.0.0.1:{free_port()}", "--web.config.file", str(tmp_path / "web.yml"))
    one_line(proc, 2, "web.yml: tls_server_config.cert_file", f"cannot read {tmp_path}/tls.crt")


def test_a_missing_web_config_file(tmp_path: Path) -> None:
    proc = agent(tmp_path, "run", "--web.config.file", "/nonexistent/web.yml")
    one_line(proc, 2, "/nonexistent/web.yml", "cannot read the web config file")


@pytest.mark.parametrize(("config", "words"), [
    pytest.param('[metrics.tls]\ncert_file = "/nonexistent.crt"\nkey_file = "/nonexistent.key"\n',
                 ("metrics.tls.cert_file", "cannot read /nonexistent.crt"), id="missing cert and key files"),
    pytest.param('[metrics.basic_auth_users]\nprometheus = "s3cret"\n',
                 ("metrics.basic_auth_users.prometheus", "expected a bcrypt hash"), id="a hash that is not bcrypt"),
    pytest.param('[metrics]\nlisten = "no-such-host.invalid:9904"\n',
                 ("metrics.listen", "cannot resolve"), id="a listen host that does not resolve"),
])
def test_config_check_refuses_what_would_fail_at_start(tmp_path: Path, config: str, words: tuple[str, ...]) -> None:
    (tmp_path / "bad.toml").write_text(config)
    proc = agent(tmp_path, "config", "check", str(tmp_path / "bad.toml"))
    one_line(proc, 2, str(tmp_path / "bad.toml"), *words)


def test_config_check_reads_the_web_config(tmp_path: Path, certs: Certs) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.server[0]}\n  key_file: {certs.server[1]}\n"
                   f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    (tmp_path / "agent.toml").write_text("")
    ok = agent(tmp_path, "config", "check", str(tmp_path / "agent.toml"), "--web.config.file", str(web))
    assert ok.returncode == 0 and "web config" in ok.stdout, ok.stderr
    web.write_text("basic_auth_users:\n  prometheus: plaintext\n")
    bad = agent(tmp_path, "config", "check", str(tmp_path / "agent.toml"), "--web.config.file", str(web))
    one_line(bad, 2, f"{web}: basic_auth_users.prometheus", "bcrypt")


def test_once_with_a_kubeconfig_that_does_not_exist(tmp_path: Path) -> None:
    proc = agent(tmp_path, "run", "--once", "--kubeconfig", "/nonexistent")
    one_line(proc, 2, "/nonexistent", "cannot load the cluster credentials")


def test_version_flag_is_version_command(tmp_path: Path) -> None:
    flag = subprocess.run([sys.executable, "-m", "agent", "--version"], capture_output=True, text=True, timeout=60)
    cmd = subprocess.run([sys.executable, "-m", "agent", "version"], capture_output=True, text=True, timeout=60)
    assert flag.returncode == cmd.returncode == 0 and flag.stdout == cmd.stdout
    assert flag.stdout.startswith("node-health-agent ")
