"""Internet-only egress shaping, the pure part: which pods are limited, their classes, their mangle rules.

A shaped pod gets one HTB class ``<major>:<minor>`` on each uplink and, per
address of the pod, one rule in the agent's ``NODE-HEALTH-SHAPE`` chain::

    -A NODE-HEALTH-SHAPE -s 10.88.0.2/32 -m comment --comment "node-health-agent:shape:<pod uid>" \\
       -j CLASSIFY --set-class 4e48:0007

That chain hangs from the end of NODE-HEALTH-INTERNET-OUT (a `SubChain`), so
only packets to destinations outside the internal ranges reach it: cluster
traffic keeps the priority it had and leaves through HTB's direct queue,
unlimited. CLASSIFY sets skb->priority, which survives SNAT and which HTB maps
straight to the class of that id: no mark bits (kube-proxy's 0x4000/0x8000,
Calico's 0xffff0000, Cilium's 0x0f00) and no tc filter.

A pod's minor is kept while it is shaped (read back from the rules after a
restart), so classes do not flap.
"""

from __future__ import annotations

import ipaddress
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..pods import Address, PodAddr, excerpt, vet
from .rules import COMMENT_PREFIX, Current, Spec, SubChain, parse_spec
from .settings import RateError, ShapingConfig, parse_rate

CHAIN = "NODE-HEALTH-SHAPE"
ROLE = "shape"
MAX_MINOR = 0xFFF0  # ffff: is the ingress/clsact handle; leaves are <minor>:, so minors stay below it


@dataclass(frozen=True, slots=True)
class Limit:
    namespace: str
    pod: str
    uid: str
    ips: tuple[str, ...]
    bits: int  # bits per second
    source: str  # "annotation", "namespace default", "namespace default (binding)"; ", capped by max_rate"


@dataclass(frozen=True, slots=True)
class Invalid:
    namespace: str
    pod: str
    why: str


def limits(pods: Iterable[PodAddr], cfg: ShapingConfig) -> tuple[list[Limit], list[Invalid]]:
    """The pods to shape (with at least one address of their own), and the pods whose limit cannot be used.
    Pods `agent.pods.vet` refuses (bad uid or name; an address not one IP, or listed by two pods) get no rule
    for what is refused (the keeper reports them). One pod's input never stops the others: whatever it holds
    becomes an `Invalid` of that pod."""
    out: list[Limit] = []
    bad: list[Invalid] = []
    for pod, addrs in vet(pods).pods:
        try:
            lim = _limit(pod, addrs, cfg)
        except RateError as exc:
            bad.append(Invalid(pod.namespace, pod.name, f"{_where(pod, cfg)}: {exc}; the pod is not shaped"))
        except Exception as exc:  # a tenant's input fails alone, whatever it is
            bad.append(Invalid(pod.namespace, pod.name, f"{_where(pod, cfg)}: {type(exc).__name__}: "
                               f"{excerpt(str(exc))}; the pod is not shaped"))
        else:
            if isinstance(lim, Invalid):
                bad.append(lim)
            elif lim is not None:
                out.append(lim)
    return out, bad


def _where(pod: PodAddr, cfg: ShapingConfig) -> str:
    return f"annotation {cfg.annotation}" if cfg.annotation in pod.annotations else "namespace default"


def _limit(pod: PodAddr, addrs: Sequence[Address], cfg: ShapingConfig) -> Limit | Invalid | None:
    value = pod.annotations.get(cfg.annotation)
    source = "annotation"
    default = cfg.namespace_defaults.get(pod.namespace)
    if value is None:
        value, source = default, "namespace default"
    if value is None:
        return None
    bits = parse_rate(value)
    if pod.namespace in cfg.binding_namespaces and source == "annotation" and default is not None:
        floor = parse_rate(default)  # a binding default: the annotation may only lower the limit
        if floor is not None and (bits is None or bits > floor):
            bits, source = floor, "namespace default (binding)"
    ceiling = cfg.ceiling
    if ceiling is not None and bits is not None and bits > ceiling:
        bits, source = ceiling, f"{source}, capped by max_rate"
    if bits is None:
        return None
    if pod.host_network:
        if cfg.annotation in pod.annotations:  # a namespace default does not claim host-network pods
            return Invalid(pod.namespace, pod.name, "a host-network pod's traffic is the node's and cannot be "
                           "told apart per pod; the pod is not shaped")
        return None
    if not addrs:
        return None
    return Limit(pod.namespace, pod.name, pod.uid, tuple(str(a) for a in addrs), bits, source)


def assign(wanted: Sequence[Limit], current: Mapping[str, int], major: int) -> tuple[dict[str, int], list[Limit]]:
    """A minor per shaped pod: the one it has, else one derived from its uid (probing on); and the pods left
    without one (more pods than minors)."""
    taken: dict[int, str] = {}
    out: dict[str, int] = {}
    for lim in wanted:
        minor = current.get(lim.uid)
        if minor is not None and _usable(minor, major) and minor not in taken:
            taken[minor] = lim.uid
            out[lim.uid] = minor
    left: list[Limit] = []
    for lim in sorted(wanted, key=lambda x: x.uid):
        if lim.uid in out:
            continue
        start = zlib.crc32(lim.uid.encode()) % MAX_MINOR
        for step in range(MAX_MINOR):
            minor = (start + step) % MAX_MINOR + 1
            if _usable(minor, major) and minor not in taken:
                taken[minor] = lim.uid
                out[lim.uid] = minor
                break
        else:
            left.append(lim)
    return out, left


def _usable(minor: int, major: int) -> bool:
    return 0 < minor <= MAX_MINOR and minor != major


def uid_of(comment: str) -> str | None:
    prefix = f"{COMMENT_PREFIX}{ROLE}:"
    rest = comment[len(prefix):] if comment.startswith(prefix) else ""
    return rest if rest and rest != "jump" else None


def class_text(major: int, minor: int) -> str:
    """As iptables-save prints CLASSIFY's --set-class."""
    return f"{major:x}:{minor:04x}"


def assigned(cur: Current, major: int) -> dict[str, int]:
    """uid -> minor, from the shaping rules found in a family's mangle table."""
    out: dict[str, int] = {}
    for rec in cur.rules.get(CHAIN, ()):
        uid = uid_of(rec.comment)
        spec = parse_spec(rec.rule)
        if uid is None or spec is None or spec.target != "CLASSIFY" or len(spec.target_opts) != 2:
            continue
        maj, _, mnr = spec.target_opts[1].partition(":")
        try:
            if int(maj, 16) == major:
                out.setdefault(uid, int(mnr, 16))
        except ValueError:
            continue
    return out


def subchain(family: str, wanted: Sequence[Limit], minors: Mapping[str, int], major: int) -> SubChain:
    """The NODE-HEALTH-SHAPE chain of `family`: one CLASSIFY rule per address of each shaped pod."""
    version = 4 if family == "ipv4" else 6
    rules: list[Spec] = []
    for lim in sorted(wanted, key=lambda x: (x.namespace, x.pod, x.uid)):
        minor = minors.get(lim.uid)
        if minor is None:
            continue
        for ip in sorted(lim.ips):
            try:
                addr = ipaddress.ip_address(ip)
            except ValueError:
                continue
            if addr.version != version:
                continue
            rules.append(Spec(f"{COMMENT_PREFIX}{ROLE}:{lim.uid}", "CLASSIFY", src=f"{addr}/{addr.max_prefixlen}",
                              target_opts=("--set-class", class_text(major, minor))))
    return SubChain("internet-out", CHAIN, ROLE, tuple(rules))
