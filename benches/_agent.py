"""Start `agent run` as a subprocess for the benchmarks, and read its /proc figures."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Agent:
    pid: int
    url: str

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def status(self) -> dict[str, int]:
        """The kB fields of /proc/<pid>/status (VmRSS, VmHWM, RssAnon, ...)."""
        out = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0])
        return out

    def cpu_seconds(self) -> float:
        """utime + stime of the process, all its threads (/proc/<pid>/stat fields 14 and 15)."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def thread_cpu_seconds(self) -> dict[int, float]:
        """utime + stime of each thread of the process, by thread id (/proc/<pid>/task/<tid>/stat)."""
        out = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{tid}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:  # the thread ended meanwhile
                continue
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_agent(config: str | None, timeout: float = 60.0, root: str | None = None) -> Iterator[Agent]:
    """`agent run` on a free loopback port with a throwaway state dir, up (/healthz 200) when yielded.
    `root`: the agent of another checkout (first on PYTHONPATH, and the working directory)."""
    port = free_port()
    env = None
    if root:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    with tempfile.TemporaryDirectory(prefix="nha-bench-") as state:
        cmd = [sys.executable, "-m", "agent", "run", "--listen", f"127.0.0.1:{port}", "--state-dir", state]
        cmd += ["--log-format", "json", "--log-level", "warning"] + (["--config", config] if config else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=root)
        agent = Agent(proc.pid, f"http://127.0.0.1:{port}")
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"agent exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
                try:
                    if agent.get("/healthz")[0] == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"agent not up after {timeout:.0f}s")
                time.sleep(0.1)
            yield agent
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
