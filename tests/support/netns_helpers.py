"""Network namespaces, veth pairs and a network check running inside a namespace.

Every name is random (other people run tests on the same kernel at the same
time); everything is removed on exit, even when the test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import require_root, require_tool

RUNNER = str(Path(__file__).with_name("netns_runner.py"))


def unique(prefix: str) -> str:
    """A name of at most 15 bytes (IFNAMSIZ - 1)."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.strip()}")
    return res


@dataclass
class NetNS:
    name: str

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.name, *cmd, check=check)

    def ip(self, *args: str) -> None:
        self.run("ip", *args)

    def etc(self, filename: str, text: str) -> None:
        """A file `ip netns exec` bind-mounts over /etc/<filename> inside this namespace."""
        path = Path("/etc/netns", self.name, filename)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@contextmanager
def netns() -> Iterator[NetNS]:
    require_root()
    require_tool("ip")
    ns = NetNS(unique("nha"))
    sh("ip", "netns", "add", ns.name)
    try:
        ns.ip("link", "set", "lo", "up")
        yield ns
    finally:
        sh("ip", "netns", "del", ns.name, check=False)
        shutil.rmtree(Path("/etc/netns", ns.name), ignore_errors=True)


@dataclass
class VethPair:
    a: NetNS
    b: NetNS
    a_if: str
    b_if: str
    a_addr: str = "10.199.0.1"
    b_addr: str = "10.199.0.2"


@contextmanager
def veth_pair() -> Iterator[VethPair]:
    """Two namespaces joined by a veth pair, both ends up and addressed (10.199.0.1 ↔ .2)."""
    with ExitStack() as stack:
        a, b = stack.enter_context(netns()), stack.enter_context(netns())
        pair = VethPair(a, b, unique("nva"), unique("nvb"))
        sh("ip", "link", "add", pair.a_if, "netns", a.name, "type", "veth", "peer", "name", pair.b_if, "netns", b.name)
        a.ip("addr", "add", f"{pair.a_addr}/30", "dev", pair.a_if)
        b.ip("addr", "add", f"{pair.b_addr}/30", "dev", pair.b_if)
        a.ip("link", "set", pair.a_if, "up")
        b.ip("link", "set", pair.b_if, "up")
        yield pair


def write_config(path: Path, network: Mapping[str, Any], extra: str = "") -> str:
    # Off the host's kernel log (other tests remount loop devices read-only there: FilesystemReadOnly).
    lines = ["[checks.disk]", "enabled = false", "", "[checks.gpu]", "xid_events = false", "",
             "[checks.kernel]", "enabled = false", "", "[checks.network]"]
    for key, value in network.items():
        lines.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(lines) + "\n" + extra)
    return str(path)


class Runner:
    """One network check object living inside a namespace; `run()` runs it once."""

    def __init__(self, ns: NetNS, config: str, state_dir: str, env: Mapping[str, str] | None = None,
                 args: Sequence[str] = ()) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns.name, sys.executable, RUNNER, config, state_dir, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )

    def run(self) -> Result:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"runner exited: {self.proc.stderr.read() if self.proc.stderr else ''}")
        return Result(json.loads(line))

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def runner(ns: NetNS, config: str, state_dir: str, env: Mapping[str, str] | None = None,
           args: Sequence[str] = ()) -> Iterator[Runner]:
    """`args`: a check name and a pods file (see netns_runner.py), for checks other than network."""
    r = Runner(ns, config, state_dir, env, args)
    try:
        yield r
    finally:
        r.close()


@dataclass
class Result:
    data: dict[str, Any]

    @property
    def reasons(self) -> set[tuple[str, str]]:
        return {(f["subject"], f["reason"]) for f in self.data["findings"]}

    def finding(self, subject: str, reason: str) -> dict[str, Any]:
        return next(f for f in self.data["findings"] if f["subject"] == subject and f["reason"] == reason)

    def sample(self, name: str, **labels: str) -> float | None:
        for s in self.data["samples"]:
            if s["name"] == name and s["labels"] == labels:
                return float(s["value"])
        return None
