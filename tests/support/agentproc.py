"""Run `agent run` as a subprocess and watch it: /metrics, /healthz, logs, sd_notify.

The one launcher of the tests: a command prefix (`wrap`: `nsenter ...`, `setpriv ...`),
a network namespace (`netns`: run under `ip netns exec` and scrape through a socket
made in it), extra env and args, a log file of the test's choosing, stop and start again."""

from __future__ import annotations

import contextlib
import http.client
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
from typing import Any, Protocol

from conftest import NO_HOST_XID, NO_KERNEL_LOG
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


class NetnsLike(Protocol):
    name: str

    def socket(self) -> socket.socket: ...


_EXITED = object()


class Agent:
    """`agent run` listening on 127.0.0.1:<a free port>, state in tmp/state, logs (stdout and
    stderr) appended to `log_path`. `netns`: run in that network namespace (`ip netns exec`,
    then `wrap`) and talk to it through sockets made there. `log_format=None`: the config's.
    `start=False`: call start() (again after stop(), as often as wanted)."""

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
        netns: NetnsLike | None = None,
        log_path: Path | None = None,
        log_format: str | None = "json",
        start: bool = True,
    ) -> None:
        self.port = free_port()
        self.base = f"{scheme}://127.0.0.1:{self.port}"
        self.netns = netns
        self.config_path = config_path or tmp / "agent.toml"
        if config_path is None:  # else the test wrote it (a ConfigMap's symlinks, say)
            self.write_config(config or "")
        self.log_path = log_path or tmp / f"agent-{self.port}.log"
        prefix = ["ip", "netns", "exec", netns.name] if netns is not None else []
        self.cmd = [*prefix, *wrap, sys.executable, "-m", "agent", "run", "--listen", f"127.0.0.1:{self.port}",
                    "--state-dir", str(tmp / "state"), *(["--log-format", log_format] if log_format else []), *args]
        self.cmd += ["--config", str(self.config_path)]
        self.env = dict(os.environ, **(env or {}))
        if notify is not None:
            self.env["NOTIFY_SOCKET"] = notify.path
        self._ctx = ssl._create_unverified_context() if scheme == "https" else None  # noqa: S323 - test certs
        if start:
            self.start()

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)

    def write_config(self, config: str) -> None:
        """Write the agent's config file (at start, or before a SIGHUP), keeping the
        agent off the host's firewall and kernel log unless the test configures them."""
        if "[checks.traffic]" not in config:
            config += NO_TRAFFIC
        if "[checks.gpu]" not in config:
            config += NO_HOST_XID
        if "[checks.kernel" not in config:
            config += NO_KERNEL_LOG
        self.config_path.write_text(config)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        if self.netns is not None:
            return self._get_in_netns(path, headers or {})
        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=5, context=self._ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def _get_in_netns(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        assert self.netns is not None and self._ctx is None, "plain http only in a namespace"
        sock = self.netns.socket()
        try:
            sock.settimeout(5)
            sock.connect(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            raise
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        conn.sock = sock
        with contextlib.closing(conn):
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()

    def wait_ready(self, timeout: float = 30.0) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}:\n{self.logs()}")
            return self.get("/healthz")[0] == 200

        wait_for(up, timeout, what="/healthz")

    def text(self) -> str:
        """The body of /metrics (an error while the agent does not answer)."""
        code, body = self.get("/metrics")
        assert code == 200, body
        return body.decode()

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """/metrics as {(name, sorted label items): value}."""
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(self.text())
            for s in fam.samples
        }

    def poll(self, pred: Callable[[Any], Any], what: str = "", timeout: float = 30.0, read: Callable[[], Any] | None = None,
             show: Callable[[Any], Any] = lambda v: v, interval: float = 0.1) -> Any:
        """pred(read()) (read: text() by default) until it is truthy, returning its value: wait_for
        that fails at once if the agent exits (with its logs) and at the deadline with show(last read)."""
        read = read or self.text
        last: list[Any] = []

        def once() -> Any:
            if self.proc.poll() is not None:
                return _EXITED
            last[:] = [read()]
            return pred(last[0])

        try:
            value = wait_for(once, timeout, interval, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last read: {show(last[0]) if last else None}\n{self.logs()}") from None
        if value is _EXITED:
            raise AssertionError(f"agent exited with {self.proc.returncode}:\n{self.logs()}")
        return value

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
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

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
