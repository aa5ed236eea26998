"""Whether the iptables hooks our counters hang on see this node's traffic at all.

A datapath can carry pod traffic past netfilter: Cilium with eBPF host routing
redirects packets between the pods' devices and the uplink in tc BPF, so the
host's FORWARD chain never sees them; SR-IOV, XDP and other offloads do the
same. Our counters would then read (almost) zero while the node is busy, and a
dashboard would believe them. Two witnesses say so instead:

* **Cilium's own word.** Where the node has Cilium (its ``cilium_host``
  device) and its agent's API socket (``/var/run/cilium/cilium.sock``, i.e. ``/run/cilium/cilium.sock`` on the
  host) answers, ``GET /v1/healthz`` returns the agent's status, whose
  ``routing.intra-host-routing-mode`` is ``BPF`` or ``Legacy``. ``BPF``: pod
  traffic bypasses the host's iptables (the agent may fall back to legacy on a
  kernel without the needed BPF helpers, which is why the running agent is
  asked rather than its configuration read).
* **The counters against the interfaces.** Every packet sent or received on
  an uplink (an interface with a default route) passes the host's INPUT,
  FORWARD or OUTPUT hook, where our jump rules count every packet, internal
  or not. Over a window (``datapath_window``), the bytes the jumps saw (less
  twice the loopback bytes, which pass both INPUT and OUTPUT; less the IPv6
  octets, ``/proc/net/snmp6``, when IPv6 has no rules of ours) are compared
  with the bytes the uplinks carried. More than half of those bytes unseen, with
  at least ``datapath_min_bytes`` carried, means a datapath passes them by.
  Interface bytes include link-layer headers that iptables does not count
  (14 of at least 66 bytes per frame, at most a fifth), hence "half", not "all".
  Traffic between pods of the same node never touches an uplink, so Cilium
  redirecting it (as it does in any mode) is no false alarm; nor is RDMA,
  which no netdev counter sees either.

A window with less traffic than that says nothing new: the last verdict stands.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from ..hostpaths import HostPaths, read_bounded
from ..native import IptRecord, parse_net_dev
from ..pods import excerpt
from .rules import HOOKS

log = logging.getLogger(__name__)

UNSEEN_LIMIT = 0.5
CILIUM_DEVICE = "cilium_host"


@dataclass(frozen=True, slots=True)
class Verdict:
    bypass: bool
    why: str
    unseen: float | None = None  # the last judged window's unseen fraction


# ---------------------------------------------------------------- Cilium


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class CiliumError(Exception):
    """Cilium's agent socket answered something unusable (garbage, JSON nested past the parser, a broken
    stream): a bounded message naming the socket."""


_said: dict[str, str] = {}  # socket -> the last problem logged (logged once per change, not every run)


def cilium_routing(paths: HostPaths, sock_path: str, timeout: float = 2.0) -> str | None:
    """Cilium's intra-host routing mode ("BPF", "Legacy"), or None where Cilium is absent or does not say
    (a broken or hostile answer is logged once, naming the socket, and counts as "does not say": the byte
    witness still judges the datapath)."""
    if not os.path.exists(paths.sys("class/net", CILIUM_DEVICE)):
        return None
    try:
        mode = _ask_cilium(paths.root(sock_path), timeout)
    except CiliumError as exc:
        if _said.get(sock_path) != str(exc):
            _said[sock_path] = str(exc)
            log.warning("%s", exc)
        return None
    _said.pop(sock_path, None)
    return mode


def _ask_cilium(sock: str, timeout: float) -> str | None:
    conn = _UnixHTTPConnection(sock, timeout)
    try:
        conn.request("GET", "/v1/healthz", headers={"Accept": "application/json"})
        resp = conn.getresponse()
        body = resp.read(1 << 20)
        if resp.status != 200:
            log.debug("cilium agent %s: HTTP %d", sock, resp.status)
            return None
    except (OSError, http.client.HTTPException) as exc:
        log.debug("cilium agent %s: %s", sock, exc)  # no agent there (yet): quiet, as before
        return None
    except Exception as exc:  # a hostile or broken peer: whatever it is, it fails alone
        raise CiliumError(f"cilium agent {sock}: {type(exc).__name__}: {excerpt(str(exc))}") from None
    finally:
        conn.close()
    return routing_mode(body, sock)


MAX_MODE = 32  # characters of a routing mode kept ("BPF", "Legacy")


def routing_mode(body: bytes, sock: str) -> str | None:
    """The ``routing.intra-host-routing-mode`` of a ``/v1/healthz`` answer; None where it is not said.
    Raises CiliumError (naming `sock`) for anything that is not JSON, whatever it is."""
    try:
        status = json.loads(body)
    except (ValueError, RecursionError, MemoryError) as exc:
        raise CiliumError(f"cilium agent {sock}: /v1/healthz is not JSON ({type(exc).__name__}: "
                          f"{excerpt(str(exc))})") from None
    routing = status.get("routing") if isinstance(status, dict) else None
    mode = routing.get("intra-host-routing-mode") if isinstance(routing, dict) else None
    return mode[:MAX_MODE] if isinstance(mode, str) and mode else None


# ---------------------------------------------------------------- the counters against the interfaces


def default_route(paths: HostPaths, version: int) -> bool:
    """Whether the node has a default route of IP `version` (4: /proc/net/route, 6: /proc/net/ipv6_route)."""
    try:
        if version == 4:
            lines = read_bounded(paths.proc("net/route"), 1 << 22).decode("ascii", "replace").splitlines()[1:]
            return any(len(f) >= 8 and f[1] == "00000000" and f[7] == "00000000" for f in map(str.split, lines))
        lines = read_bounded(paths.proc("net/ipv6_route"), 1 << 22).decode("ascii", "replace").splitlines()
        return any(len(f) >= 10 and f[0] == "0" * 32 and f[1] == "00" and f[9] != "lo" for f in map(str.split, lines))
    except (OSError, ValueError):
        return False


def uplinks(paths: HostPaths) -> set[str]:
    """Interfaces with a default route (IPv4 /proc/net/route, IPv6 /proc/net/ipv6_route)."""
    out: set[str] = set()
    try:
        for line in read_bounded(paths.proc("net/route"), 1 << 22).decode("ascii", "replace").splitlines()[1:]:
            f = line.split()
            if len(f) >= 8 and f[1] == "00000000" and f[7] == "00000000":
                out.add(f[0])
    except (OSError, ValueError):
        pass
    try:
        for line in read_bounded(paths.proc("net/ipv6_route"), 1 << 22).decode("ascii", "replace").splitlines():
            f = line.split()
            if len(f) >= 10 and f[0] == "0" * 32 and f[1] == "00" and f[9] != "lo":
                out.add(f[9])
    except (OSError, ValueError):
        pass
    return out


def ipv6_octets(paths: HostPaths) -> int:
    """Ip6InOctets + Ip6OutOctets of this network namespace (0 when unreadable)."""
    try:
        text = read_bounded(paths.proc("net/snmp6"), 1 << 20).decode("ascii", "replace")
    except (OSError, ValueError):
        return 0
    total = 0
    for line in text.splitlines():
        if line.startswith(("Ip6InOctets", "Ip6OutOctets")):  # of ~90 lines, split only these two
            f = line.split()
            if len(f) >= 2 and f[0] in ("Ip6InOctets", "Ip6OutOctets") and f[1].isdigit():
                total += int(f[1])
    return total


def jump_bytes(family: str, rules: Iterable[IptRecord]) -> dict[Hashable, int]:
    """Bytes counted by our jump rules in the built-in chains: every packet through the hook."""
    return {(family, r.chain, r.comment): r.bytes for r in rules if r.chain in HOOKS and r.comment.endswith(":jump")}


class Deltas:
    """The growth of a set of counters between two reads. A counter seen for the
    first time is a baseline (it grew before we knew it); one that went back
    was re-created or zeroed, and all of its value is new."""

    def __init__(self) -> None:
        self.last: dict[Hashable, int] = {}

    def add(self, values: Mapping[Hashable, int]) -> int:
        grew = 0
        for key, v in values.items():
            old = self.last.get(key)
            if old is not None:
                grew += v - old if v >= old else v
        self.last = dict(values)
        return grew


class Witness:
    """Bytes carried by the uplinks and bytes seen by our jumps, summed per run,
    judged over a window."""

    def __init__(self, window: float, min_bytes: int) -> None:
        self.window, self.min_bytes = window, min_bytes
        self.iface, self.lo, self.nf, self.v6 = Deltas(), Deltas(), Deltas(), Deltas()
        self.carried = self.seen = 0  # running totals
        self.marks: list[tuple[float, int, int]] = []  # (monotonic time, carried, seen)
        self.verdict: Verdict | None = None

    def observe(self, paths: HostPaths, jumps: Mapping[Hashable, int], v6_unruled: bool, now: float | None = None) -> Verdict | None:
        """One run's reads; the verdict after it (None: never judged yet)."""
        now = time.monotonic() if now is None else now
        try:
            dev = {s.name: s for s in parse_net_dev(read_bounded(paths.proc("net/dev"), 1 << 22))}
        except (OSError, ValueError) as exc:
            log.debug("traffic datapath: cannot read net/dev: %s", exc)
            return self.verdict
        ups = uplinks(paths) - {"lo"}
        carried = self.iface.add({n: dev[n].rx_bytes + dev[n].tx_bytes for n in ups if n in dev})
        lo = self.lo.add({"lo": dev["lo"].rx_bytes} if "lo" in dev else {})
        v6 = self.v6.add({"v6": ipv6_octets(paths)} if v6_unruled else {})
        seen = self.nf.add(jumps) - 2 * lo
        self.carried += max(0, carried - v6)
        self.seen += max(0, seen)
        self.marks.append((now, self.carried, self.seen))
        return self._judge(now, sorted(ups))

    def _judge(self, now: float, ups: list[str]) -> Verdict | None:
        start = [m for m in self.marks if m[0] <= now - self.window]
        if not start:
            return self.verdict
        t0, c0, s0 = start[-1]
        self.marks = [m for m in self.marks if m[0] >= t0]
        carried, seen = self.carried - c0, self.seen - s0
        if carried < self.min_bytes:
            return self.verdict
        unseen = max(0.0, (carried - seen) / carried)
        where = ", ".join(ups) or "none"
        why = (f"{carried} bytes on the uplinks ({where}) in {now - t0:.0f}s, {seen} seen by the iptables hooks "
               f"({unseen:.0%} unseen)")
        self.verdict = Verdict(unseen > UNSEEN_LIMIT, why, unseen)
        return self.verdict
