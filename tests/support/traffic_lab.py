"""Network namespaces for the traffic tests: a node, its peers, real TCP.

Every namespace and veth gets a random name (other people run tests on the
same machine at the same time) and is deleted on exit, even after a failure.
iptables runs inside the namespaces only (``ip netns exec``): the host's own
tables are never touched. Sockets are opened inside a namespace from a
short-lived thread that enters it (setns changes the calling thread only), so
the test process itself talks TCP between namespaces without helpers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from agentproc import Agent
from conftest import require_tool

CLONE_NEWNET = 0x40000000
T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)
REPO = Path(__file__).resolve().parent.parent.parent
OUR_LINE = re.compile(r"node-health-agent:|NODE-HEALTH-")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Netns:
    name: str

    def run(self, *cmd: str, stdin: bytes | None = None, check: bool = True, timeout: float = 60,
            prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            ["ip", "netns", "exec", self.name, *prefix, *cmd], input=stdin.decode() if stdin else None,
            capture_output=True, text=True, timeout=timeout, check=False,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} in {self.name}: exit {res.returncode}\n{res.stdout}\n{res.stderr}")
        return res

    def agent(self, *args: str, check: bool = True, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-m", "agent", *args, check=check, prefix=prefix)

    def socket(self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket (TCP unless told) that lives in this namespace."""
        return self.call(lambda: socket.socket(family, kind))

    def call(self, fn: Callable[[], T]) -> T:
        """fn() in a short-lived thread inside this namespace: the sockets it makes (and the threads it starts)
        live here, e.g. a fake API server that an agent in this namespace reaches on 127.0.0.1."""
        out: dict[str, object] = {}

        def enter() -> None:
            fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
                out["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                out["err"] = exc
            finally:
                os.close(fd)

        t = threading.Thread(target=enter)
        t.start()
        t.join()
        if "err" in out:
            raise out["err"]  # type: ignore[misc]
        return out["value"]  # type: ignore[return-value]

    def save(self, mode: str, *args: str) -> str:
        return self.run(f"iptables-{mode}-save", *args).stdout


@contextlib.contextmanager
def namespaces(*roles: str) -> Iterator[dict[str, Netns]]:
    require_tool("ip")
    tag = secrets.token_hex(3)
    made: dict[str, Netns] = {}
    try:
        for role in roles:
            ns = Netns(f"nha-{role}-{tag}")
            _ip("netns", "add", ns.name)
            made[role] = ns
            ns.run("ip", "link", "set", "lo", "up")
        yield made
    finally:
        for ns in made.values():
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=30, check=False)


def link(a: Netns, a_addr: str, b: Netns, b_addr: str) -> tuple[str, str]:
    """A veth pair between two namespaces with one address (CIDR) on each end; (a's device, b's device)."""
    tag = secrets.token_hex(4)
    ea, eb = f"va{tag}", f"vb{tag}"
    _ip("link", "add", ea, "netns", a.name, "type", "veth", "peer", "name", eb, "netns", b.name)
    for ns, dev, addr in ((a, ea, a_addr), (b, eb, b_addr)):
        ns.run("ip", "addr", "add", addr, "dev", dev)
        ns.run("ip", "link", "set", dev, "up")
    return ea, eb


@dataclass
class Lab:
    """node: the host the agent runs on; it routes for pod. cluster: 10.77.0.2;
    internet: 198.51.100.2 (TEST-NET-2); pod: 10.88.0.2, reaching both through node."""

    ns: dict[str, Netns]
    addr: dict[str, str] = field(
        default_factory=lambda: {"cluster": "10.77.0.2", "internet": "198.51.100.2", "pod": "10.88.0.2"}
    )

    @property
    def node(self) -> Netns:
        return self.ns["node"]


@contextlib.contextmanager
def lab() -> Iterator[Lab]:
    with namespaces("node", "cluster", "internet", "pod") as ns:
        link(ns["node"], "10.77.0.1/24", ns["cluster"], "10.77.0.2/24")
        link(ns["node"], "198.51.100.1/24", ns["internet"], "198.51.100.2/24")
        link(ns["pod"], "10.88.0.2/24", ns["node"], "10.88.0.1/24")
        ns["pod"].run("ip", "route", "add", "default", "via", "10.88.0.1")
        ns["cluster"].run("ip", "route", "add", "10.88.0.0/24", "via", "10.77.0.1")
        ns["internet"].run("ip", "route", "add", "10.88.0.0/24", "via", "198.51.100.1")
        ns["node"].run("sysctl", "-qw", "net.ipv4.ip_forward=1")
        yield Lab(ns)


@dataclass
class PodLab(Lab):
    """`Lab` with pods: pod<i> (i = 0, 1, ...) at 10.88.<i+1>.2, each behind its own veth pair that the node
    routes (the routed CNI style: Calico, Azure's VMSS/native networking, AWS VPC CNI)."""

    devs: dict[str, str] = field(default_factory=dict)  # pod -> its end of the veth pair, inside the pod

    def pod_addr(self, pod: str) -> str:
        return self.addr[pod]

    def l3_bytes(self, pod: str) -> tuple[int, int]:
        """(received, sent) IP bytes on the pod's device so far: the interface's bytes less 14 bytes of Ethernet
        header per frame (an independent witness of what netfilter should have counted)."""
        def stat(name: str) -> int:
            return int(self.ns[pod].run("cat", f"/sys/class/net/{self.devs[pod]}/statistics/{name}").stdout)

        return (stat("rx_bytes") - 14 * stat("rx_packets"), stat("tx_bytes") - 14 * stat("tx_packets"))


@contextlib.contextmanager
def pod_lab(pods: int = 3) -> Iterator[PodLab]:
    """A node namespace routing for `pods` pod namespaces, a cluster peer (10.77.0.2, inside 10.0.0.0/8) and an
    internet peer (198.51.100.2, outside it)."""
    names = [f"pod{i}" for i in range(pods)]
    with namespaces("node", "cluster", "internet", *names) as ns:
        link(ns["node"], "10.77.0.1/24", ns["cluster"], "10.77.0.2/24")
        link(ns["node"], "198.51.100.1/24", ns["internet"], "198.51.100.2/24")
        L = PodLab(ns, addr={"cluster": "10.77.0.2", "internet": "198.51.100.2"})
        for i, name in enumerate(names):
            net = f"10.88.{i + 1}"
            L.devs[name], _ = link(ns[name], f"{net}.2/24", ns["node"], f"{net}.1/24")
            L.addr[name] = f"{net}.2"
            ns[name].run("ip", "route", "add", "default", "via", f"{net}.1")
        for peer, via in (("cluster", "10.77.0.1"), ("internet", "198.51.100.1")):
            ns[peer].run("ip", "route", "add", "10.88.0.0/16", "via", via)
        ns["node"].run("sysctl", "-qw", "net.ipv4.ip_forward=1")
        yield L


def send(src: Netns, dst: Netns, dst_addr: str, nbytes: int) -> None:
    """nbytes of payload over one TCP connection from src to dst; returns when dst has read them all."""
    srv = dst.socket()
    cli = src.socket()
    got: list[int] = []
    with srv, cli:
        srv.bind((dst_addr, 0))
        srv.listen(1)
        srv.settimeout(30)

        def receive() -> None:
            conn, _ = srv.accept()
            with conn:
                total = 0
                while chunk := conn.recv(1 << 20):
                    total += len(chunk)
                got.append(total)

        t = threading.Thread(target=receive)
        t.start()
        cli.settimeout(30)
        cli.connect((dst_addr, srv.getsockname()[1]))
        block = b"\0" * (1 << 20)
        left = nbytes
        while left:
            left -= cli.send(block[: min(left, len(block))])
        cli.shutdown(socket.SHUT_WR)
        t.join(30)
    assert got == [nbytes], f"received {got}, sent {nbytes}"


@contextlib.contextmanager
def steady(src: Netns, dst: Netns, dst_addr: str, piece: int = 4_000_000) -> Iterator[list[int]]:
    """Load: `piece`-byte TCP transfers from src to dst one after another until the block ends; yields the
    list of completed transfers' sizes (grows while the block runs)."""
    done: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                send(src, dst, dst_addr, piece)
                done.append(piece)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    t = threading.Thread(target=loop)
    t.start()
    try:
        yield done
    finally:
        stop.set()
        t.join(60)
    if errors:
        raise errors[0]


def without_ours(dump: str) -> list[str]:
    """An iptables-save dump minus our lines, comments and counters: what others own."""
    out = []
    for line in dump.splitlines():
        if line.startswith("#") or OUR_LINE.search(line):
            continue
        out.append(re.sub(r"\[\d+:\d+\]", "[]", line))
    return out


# ---------------------------------------------------------------- the daemon


def lab_agent(node: Netns, tmp: Path, config: Path, log: Path, wrap: Sequence[str] = ()) -> Agent:
    """agentproc's Agent in `node` (state in tmp/state, the config's log format), not started yet."""
    return Agent(tmp, config_path=config, netns=node, wrap=wrap, log_path=log, log_format=None, start=False)


def until(agent: Agent, what: str, predicate, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    """Poll /metrics until predicate(samples) is truthy; returns its value."""
    return agent.poll(predicate, what, timeout, read=agent.samples, show=_traffic, interval=0.2)


def _traffic(samples: dict) -> dict:  # type: ignore[type-arg]
    return {k: v for k, v in samples.items() if "traffic" in k[0] or k[0] == "node_health_check_runs_total"}


def metric(samples: dict, name: str, **labels: str) -> float | None:  # type: ignore[type-arg]
    return samples.get((name, tuple(sorted(labels.items()))))


# ---------------------------------------------------------------- rulesets

# What a kube-proxy + CNI node holds in mangle (and elsewhere): kubelet's hint
# chains, per-service chains with kube-proxy's quoted comments, a CNI's marks,
# verdicts in built-in chains. None of it may change under install, repair or remove.
FOREIGN = """\
*mangle
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:CNI-MARKS - [0:0]
-A PREROUTING -m comment --comment "cni: classify pod traffic" -j CNI-MARKS
-A CNI-MARKS -s 10.88.0.0/16 -m comment --comment "cni: pod egress" -j MARK --set-xmark 0x4000/0x4000
-A CNI-MARKS -m mark --mark 0x4000/0x4000 -j RETURN
-A INPUT -p tcp -m tcp --dport 22 -m comment --comment "ssh \\"admin\\" access" -j ACCEPT
-A FORWARD -m comment --comment "kube-proxy: forward mark" -j MARK --set-xmark 0x1/0x1
-A OUTPUT -o lo -m comment --comment node-local -j RETURN
-A POSTROUTING -m mark --mark 0x4000/0x4000 -m comment --comment "cni: masquerade hint" -j MARK --set-xmark 0x0/0x4000
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets" -m mark --mark 0x8000/0x8000 -j DROP
COMMIT
*nat
:KUBE-SERVICES - [0:0]
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j RETURN
COMMIT
"""


def kube_mangle(n: int) -> str:
    """An iptables-restore batch of `n` kube-proxy-style rules in mangle (services with quoted comments)."""
    lines = ["*mangle"]
    chains = max(1, n // 10)
    lines += [f":KUBE-SVC-{i:012X} - [0:0]" for i in range(chains)]
    for i in range(n):
        svc = i % chains
        lines.append(
            f'-A KUBE-SVC-{svc:012X} -d 10.96.{i // 250 % 250}.{i % 250}/32 -p tcp '
            f'-m comment --comment "ns-{svc}/service-{i}:https cluster IP" -m tcp --dport {1000 + i % 60000} '
            f"-j MARK --set-xmark 0x{i % 4096:x}/0xfff"
        )
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- shaping (issue 15 item 2)

# MSS of a 1500-byte MTU with TCP timestamps, and the headers each segment carries on the wire as HTB
# counts it (Ethernet 14 + IPv4 20 + TCP 32): payload rates are turned into the rates the shaper limits.
SEGMENT_OVERHEAD = 66


@dataclass
class ShapeLab:
    """node routes for three pods (pod-a 10.88.1.2, pod-b 10.88.2.2, pod-c 10.88.3.2, each behind its own
    veth) through ONE uplink (`uplink`, the node's default route) to a fabric namespace that routes on to the
    cluster peer 10.77.0.2 and the internet peer 198.51.100.2: cluster and internet traffic leave the node
    through the same device, as on a real node."""

    ns: dict[str, Netns]
    uplink: str
    addr: dict[str, str] = field(default_factory=lambda: {
        "cluster": "10.77.0.2", "internet": "198.51.100.2",
        "pod-a": "10.88.1.2", "pod-b": "10.88.2.2", "pod-c": "10.88.3.2",
    })

    @property
    def node(self) -> Netns:
        return self.ns["node"]

    def qdiscs(self) -> str:
        """`tc qdisc show` of every device of the node (what the tests compare before and after)."""
        return self.node.run("tc", "qdisc", "show").stdout

    def classes(self) -> str:
        return self.node.run("tc", "class", "show", "dev", self.uplink).stdout


def _link_named(a: Netns, a_if: str, a_addr: str, b: Netns, b_addr: str) -> None:
    """A veth pair with a known name on a's end."""
    b_if = f"vb{secrets.token_hex(4)}"
    _ip("link", "add", a_if, "netns", a.name, "type", "veth", "peer", "name", b_if, "netns", b.name)
    for ns, dev, addr in ((a, a_if, a_addr), (b, b_if, b_addr)):
        ns.run("ip", "addr", "add", addr, "dev", dev)
        ns.run("ip", "link", "set", dev, "up")


@contextlib.contextmanager
def shape_lab() -> Iterator[ShapeLab]:
    pods = ("pod-a", "pod-b", "pod-c")
    with namespaces("node", "fabric", "cluster", "internet", *pods) as ns:
        uplink = f"up{secrets.token_hex(4)}"
        _link_named(ns["node"], uplink, "192.168.77.1/30", ns["fabric"], "192.168.77.2/30")
        link(ns["fabric"], "10.77.0.1/24", ns["cluster"], "10.77.0.2/24")
        link(ns["fabric"], "198.51.100.1/24", ns["internet"], "198.51.100.2/24")
        for i, pod in enumerate(pods, start=1):
            link(ns[pod], f"10.88.{i}.2/24", ns["node"], f"10.88.{i}.1/24")
            ns[pod].run("ip", "route", "add", "default", "via", f"10.88.{i}.1")
        ns["node"].run("ip", "route", "add", "default", "via", "192.168.77.2")
        ns["fabric"].run("ip", "route", "add", "10.88.0.0/16", "via", "192.168.77.1")
        ns["cluster"].run("ip", "route", "add", "default", "via", "10.77.0.1")
        ns["internet"].run("ip", "route", "add", "default", "via", "198.51.100.1")
        for router in ("node", "fabric"):
            ns[router].run("sysctl", "-qw", "net.ipv4.ip_forward=1")
        yield ShapeLab(ns, uplink)


class Stream:
    """One TCP connection from src to dst that sends as fast as it may until stopped; the receiver samples
    the bytes it has read every `tick` seconds."""

    def __init__(self, src: Netns, dst: Netns, dst_addr: str, tick: float = 0.5) -> None:
        self.srv, self.cli = dst.socket(), src.socket()
        self.srv.bind((dst_addr, 0))
        self.srv.listen(1)
        self.srv.settimeout(30)
        self.tick = tick
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.mss = 1448
        self._rx = threading.Thread(target=self._receive, daemon=True)
        self._tx = threading.Thread(target=self._send, daemon=True)
        self._rx.start()
        self.cli.settimeout(30)
        self.cli.connect((dst_addr, self.srv.getsockname()[1]))
        self.mss = self.cli.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG) or 1448
        self._tx.start()

    def _receive(self) -> None:
        conn, _ = self.srv.accept()
        conn.settimeout(1)
        total, nxt = 0, time.monotonic()
        self.samples.append((nxt, 0))
        with conn:
            while True:
                try:
                    chunk = conn.recv(1 << 20)
                except TimeoutError:
                    if self.stop.is_set():
                        break
                    continue
                if not chunk:
                    break
                total += len(chunk)
                now = time.monotonic()
                if now >= nxt + self.tick:
                    nxt = now
                    self.samples.append((now, total))

    def _send(self) -> None:
        block = b"\0" * (1 << 18)
        try:
            while not self.stop.is_set():
                self.cli.send(block)
        except OSError:
            pass
        finally:
            try:
                self.cli.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self._tx.join(30)
        self._rx.join(30)
        self.cli.close()
        self.srv.close()

    def rate(self, skip: float = 1.0) -> float:
        """Median of the per-tick rates after the first `skip` seconds, in bits per second on the wire
        (payload plus SEGMENT_OVERHEAD per MSS-sized segment)."""
        t0 = self.samples[0][0] + skip
        pts = [s for s in self.samples if s[0] >= t0]
        rates = [(b2 - b1) * 8 / (t2 - t1) for (t1, b1), (t2, b2) in zip(pts, pts[1:], strict=False) if t2 > t1]
        assert len(rates) >= 3, f"too few samples to judge a rate: {self.samples}"
        rates.sort()
        payload = rates[len(rates) // 2]
        return payload * (self.mss + SEGMENT_OVERHEAD) / self.mss


def measure(lab: ShapeLab, flows: Sequence[tuple[str, str]], seconds: float = 8.0) -> list[float]:
    """Run the flows (pod, peer) at the same time for `seconds`; each one's median rate (bit/s)."""
    streams = [Stream(lab.ns[src], lab.ns[dst], lab.addr[dst]) for src, dst in flows]
    try:
        time.sleep(seconds)
    finally:
        for s in streams:
            s.close()
    return [s.rate() for s in streams]
