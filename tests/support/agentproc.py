"""Run `agent run` as a subprocess and watch it: /metrics, /healthz, logs, sd_notify."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from conftest import NO_HOST_KMSG
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = "") -> Any:
    """`pred()` until it is truthy (its value is returned); an exception from it counts as "not yet".
    Raises AssertionError naming `what` (default: the predicate's name) at the deadline."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last_exc = exc
        time.sleep(interval)
    what = what or getattr(pred, "__name__", "condition")
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))


class NotifySocket:
    """A datagram socket standing in for systemd's $NOTIFY_SOCKET."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="nha-notify-")
        self.path = os.path.join(self.dir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []

    def drain(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except (TimeoutError, BlockingIOError):
                return self.messages

    def close(self) -> None:
        self.sock.close()


# Agents under test run in the test machine's own network namespace: unless a
# test configures the traffic check itself, keep them off the host's firewall.
NO_TRAFFIC = "\n[checks.traffic]\nenabled = false\n"


class Agent:
    def __init__(
        self,
        tmp: Path,
        config: str | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        notify: NotifySocket | None = None,
        wrap: Sequence[str] = (),
        scheme: str = "http",
        config_path: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.base = f"{scheme}://127.0.0.1:{self.port}"
        self.config_path = config_path or tmp / "agent.toml"
        if config_path is None:  # else the test wrote it (a ConfigMap's symlinks, say)
            self.write_config(config or "")
        self.log_path = tmp / f"agent-{self.port}.log"
        cmd = [*wrap, sys.executable, "-m", "agent", "run", "--listen", f"127.0.0.1:{self.port}",
               "--state-dir", str(tmp / "state"), "--log-format", "json", *args]
        cmd += ["--config", str(self.config_path)]
        full_env = dict(os.environ, **(env or {}))
        if notify is not None:
            full_env["NOTIFY_SOCKET"] = notify.path
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)
        self._ctx = ssl._create_unverified_context() if scheme == "https" else None  # noqa: S323 - test certs

    def write_config(self, config: str) -> None:
        """Write the agent's config file (at start, or before a SIGHUP), keeping the
        agent off the host's firewall and kernel log unless the test configures them."""
        if "[checks.traffic]" not in config:
            config += NO_TRAFFIC
        if "[checks.gpu]" not in config:
            config += NO_HOST_KMSG
        self.config_path.write_text(config)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=5, context=self._ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, timeout: float = 30.0) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}:\n{self.logs()}")
            return self.get("/healthz")[0] == 200

        wait_for(up, timeout, what="/healthz")

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        code, body = self.get("/metrics")
        assert code == 200, body
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(body.decode()):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def value(self, name: str, **labels: str) -> float | None:
        for got, value in self.metrics().get(name, []):
            if all(got.get(k) == v for k, v in labels.items()):
                return value
        return None

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def agent_pid(self) -> int:
        """The agent's own pid: below a wrapper such as `nsenter --pid`, which forks
        (and above its own children, such as the probe worker)."""
        pid = self.proc.pid
        while True:
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"agent"]:
                    return pid
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                return pid
            if len(children) != 1:
                return pid
            pid = int(children[0])

    def signal(self, sig: int) -> None:
        os.kill(self.agent_pid(), sig)

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
