"""The pods on this node, as features other than `kube` may see them.

`agent.kube` learns them (one watch on pods with ``spec.nodeName=<node>``);
features such as `traffic` read them through `PodView` without importing
`kube` (features do not import each other): the runtime hands a view to the
checks in `CheckContext.pods`. A node without a cluster has no view (None).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class PodAddr:
    """One pod on this node: who it is, its addresses, and the annotations features act on."""

    namespace: str
    name: str
    uid: str
    ips: tuple[str, ...]  # status.podIPs (IPv4 and/or IPv6); empty until the CNI has given it one
    host_network: bool = False  # spec.hostNetwork: its traffic is the node's, never counted per pod
    annotations: Mapping[str, str] = field(default_factory=dict)


class PodView(Protocol):
    def pods(self) -> Sequence[PodAddr] | None:
        """The node's pods now; None while not known (not yet listed, or the watch is down past its staleness
        limit): a caller then reports "unknown", never "no pods"."""
        ...

    def generation(self) -> int:
        """Changes whenever the set of pods or any of their addresses or annotations changes (cheap change test)."""
        ...


# ---------------------------------------------------------------- what features may trust

MAX_EXCERPT = 40  # characters of tenant text a log line or a finding quotes
_UID = re.compile(r"[0-9A-Za-z][-0-9A-Za-z]{0,63}")  # a UUID as the API server makes them (fakes use other letters)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS-1123 label
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a DNS-1123 subdomain
MAX_IP_TEXT = 45  # the longest IPv6 text form (IPv4-mapped)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def excerpt(text: object, limit: int = MAX_EXCERPT) -> str:
    """Tenant or peer text as a log line or a finding may quote it: at most `limit` characters, in double
    quotes, with quotes, backslashes, control and non-ASCII characters escaped (JSON's escapes), and its full
    length when cut. Never raises."""
    s = text if isinstance(text, str) else repr(text)
    parts, size = [], 0
    for ch in s[:limit]:
        part = json.dumps(ch, ensure_ascii=True)[1:-1]
        if size + len(part) > 2 * limit:  # escapes take room: at most twice `limit` shown
            break
        parts.append(part)
        size += len(part)
    shown = '"' + "".join(parts) + '"'
    return shown if len(parts) == len(s) else f"{shown}... ({len(s)} characters)"


def who(pod: PodAddr) -> str:
    """The pod as a finding's subject: namespace/name when both are valid names, else an escaped excerpt."""
    if _NAMESPACE.fullmatch(pod.namespace) and _POD_NAME.fullmatch(pod.name):
        return f"{pod.namespace}/{pod.name}"
    return excerpt(f"{pod.namespace}/{pod.name}")


def address(text: str) -> Address:
    """One pod address as status.podIPs gives it: a single IPv4 or IPv6 address, never a network, a zone or
    a loopback, multicast or unspecified address. Raises ValueError."""
    if not isinstance(text, str) or len(text) > MAX_IP_TEXT or "/" in text or "%" in text:
        raise ValueError(f"not a single IP address: {excerpt(text)}")
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"not a single IP address: {excerpt(text)}") from None
    if addr.is_unspecified or addr.is_loopback or addr.is_multicast:
        raise ValueError(f"not a pod address: {addr}")
    return addr


def problem(pod: PodAddr) -> str | None:
    """Why no rule may be written for `pod` (its uid or names are not what Kubernetes gives), or None."""
    if not _UID.fullmatch(pod.uid):
        return f"uid {excerpt(pod.uid)} is not a Kubernetes UID"
    if not _NAMESPACE.fullmatch(pod.namespace):
        return f"namespace {excerpt(pod.namespace)} is not a DNS-1123 label"
    if not _POD_NAME.fullmatch(pod.name):
        return f"name {excerpt(pod.name)} is not a DNS-1123 subdomain"
    return None


@dataclass(frozen=True, slots=True)
class Refused:
    """A pod, or an address, that no rule is written for, and why (a bounded, escaped message)."""

    subject: str  # namespace/pod, or the address claimed twice
    why: str


@dataclass(frozen=True, slots=True)
class Vetted:
    """The pods whose uid, names and addresses are what Kubernetes gives; each address its pod's alone."""

    pods: tuple[tuple[PodAddr, tuple[Address, ...]], ...]
    refused: tuple[Refused, ...]


def vet(pods: Iterable[PodAddr]) -> Vetted:
    """Pods as features may write rules for them: a pod with a bad uid or name is refused whole, an address
    that is not a single IP is dropped, and an address two pods list goes to neither (a finding names both).
    Host-network pods pass with no address (their traffic is the node's)."""
    refused: list[Refused] = []
    claims: dict[Address, list[PodAddr]] = {}
    kept: list[tuple[PodAddr, list[Address]]] = []
    for pod in pods:
        why = problem(pod)
        if why is not None:
            refused.append(Refused(who(pod), why + "; no rule is written for this pod"))
            continue
        addrs: list[Address] = []
        for ip in () if pod.host_network else pod.ips:
            try:
                addr = address(ip)
            except ValueError as exc:
                refused.append(Refused(who(pod), f"status.podIPs: {exc}; no rule for it"))
                continue
            if addr not in addrs:
                addrs.append(addr)
                claims.setdefault(addr, []).append(pod)
        kept.append((pod, addrs))
    for addr, holders in claims.items():
        if len(holders) > 1:
            names = ", ".join(sorted(who(p) for p in holders)[:4]) + (" and more" if len(holders) > 4 else "")
            refused.append(Refused(str(addr), f"{addr} is listed by {len(holders)} pods ({names}); "
                                   "no rule is written for it for any of them"))
    out = tuple((p, tuple(a for a in addrs if len(claims[a]) == 1)) for p, addrs in kept)
    return Vetted(out, tuple(refused))
