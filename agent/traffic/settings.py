"""The ``[checks.traffic]`` section."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Literal

from ..pods import excerpt
from ..schema import CheckConfig, opt

MAX_RANGES = 256
MAX_STATIC = 1024
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")  # a DNS label (dots allowed), as a pod name
ANNOTATION = "node-health-agent/internet-egress-bandwidth"
MIN_RATE, MAX_RATE = 8_000, 10**13  # bits per second: 8 kbit/s .. 10 Tbit/s (HTB's 64-bit rates)
UNLIMITED = "unlimited"
_RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(k|K|M|G|T|Ki|Mi|Gi|Ti)?", re.ASCII)
_FACTOR = {None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
RATE_FORMAT = (f'a rate in bits per second: a number with an optional suffix k, M, G, T (powers of 1000) or Ki, Mi, '
               f'Gi, Ti (powers of 1024), e.g. "200M" or "1.5G", between 8k and 10T; or "{UNLIMITED}"')


MAX_RATE_TEXT = 32  # characters: "1.5G" needs 4; anything longer is refused before it is parsed


class RateError(ValueError):
    """A rate that is not one the agent accepts; its message quotes at most a short, escaped excerpt."""


def parse_rate(text: str) -> int | None:
    """A rate as the shaping annotation and config give it, in bits per second; None for "unlimited".
    The units are Kubernetes quantities' (as in kubernetes.io/egress-bandwidth). Raises RateError (a
    ValueError) for anything else, whatever the text (309 nines, NaN, unicode digits, newlines)."""
    if not isinstance(text, str) or len(text) > MAX_RATE_TEXT:
        raise RateError(f"expected {RATE_FORMAT}, got {excerpt(text)}")
    value = text.strip()
    if value == UNLIMITED:
        return None
    m = _RATE.fullmatch(value)
    if m is None:
        raise RateError(f"expected {RATE_FORMAT}, got {excerpt(text)}")
    bits = round(Fraction(m.group(1)) * _FACTOR[m.group(2)])  # exact: no float overflow, no NaN
    if not MIN_RATE <= bits <= MAX_RATE:
        raise RateError(f"expected a rate between 8k and 10T bits per second, got {excerpt(text)}")
    return bits


def _rate(value: str) -> str | None:
    try:
        parse_rate(value)
    except ValueError as exc:
        return str(exc)
    return None


def _finite_rate(value: str) -> str | None:
    problem = _rate(value)
    if problem is None and parse_rate(value) is None:
        return f'expected a rate (not "{UNLIMITED}"), got "{value}"'
    return problem


def _namespace(value: str) -> str | None:
    if re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
        return None
    return f'expected a namespace name (a DNS-1123 label), got "{value}"'


def _annotation(value: str) -> str | None:
    prefix, _, name = value.rpartition("/")
    if re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", name) and (
        not prefix or re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", prefix)
    ):
        return None
    return f'expected an annotation key such as "{ANNOTATION}", got "{value}"'


def _interface(value: str) -> str | None:
    if 0 < len(value.encode()) < 16 and not any(c in "/: " for c in value):
        return None
    return f'expected an interface name (1-15 bytes, no "/", ":" or spaces), got "{value}"'


@dataclass(frozen=True)
class ShapingConfig:
    enabled: bool = opt(
        False,
        "Shape pods' internet egress (docs/traffic.md, Shaping): mangle CLASSIFY rules and an HTB qdisc the agent "
        "owns on the uplinks. Off: nothing of tc is touched.",
    )
    annotation: str = opt(
        ANNOTATION, 'Pod annotation holding a pod\'s internet egress limit in bits per second ("200M", "1G", "unlimited").',
        check=_annotation,
    )
    namespace_defaults: Mapping[str, str] = opt(
        MappingProxyType({}), 'Limit for the pods of a namespace without the annotation: { "batch" = "100M" }.'
    )
    binding_namespaces: tuple[str, ...] = opt(
        (), "Namespaces whose default binds: a pod's annotation there may only lower its limit (\"unlimited\" or a "
        "higher rate gets the namespace default). Each must have a namespace_defaults entry.", check=_namespace,
    )
    max_rate: str = opt(
        "", 'Operator ceiling: the highest limit any pod gets, whatever its annotation or namespace default says '
        '(e.g. "1G"; "10T" is capped to it). Empty: no ceiling. "unlimited" outside a binding namespace still '
        "opts a pod out.", check=lambda v: None if v == "" else _finite_rate(v),
    )
    interfaces: tuple[str, ...] = opt(
        (), "Uplinks to shape on; empty: the devices of the default routes (IPv4 and IPv6).", check=_interface
    )
    qdisc_major: int = opt(
        0x4E48,
        "Major number of the agent's root HTB qdisc on each uplink (its handle; 0x4e48, \"NH\"); its classes are "
        "<major>:<n>, one per shaped pod, and the mangle rules set that class as the packet's priority.",
        min=1,
        max=0xFFFE,
    )

    def validate(self) -> tuple[str, str] | None:
        for ns, value in self.namespace_defaults.items():
            problem = _rate(value)
            if problem:
                return f"namespace_defaults.{ns}", problem
        for ns in self.binding_namespaces:
            if ns not in self.namespace_defaults:
                return "binding_namespaces", f'expected namespaces with a namespace_defaults entry, got "{ns}" without one'
            if parse_rate(self.namespace_defaults[ns]) is None:
                return "binding_namespaces", f'expected namespaces whose default is a rate, got "{ns}" = "unlimited"'
        return None

    @property
    def ceiling(self) -> int | None:
        """max_rate in bits per second; None: no ceiling."""
        return parse_rate(self.max_rate) if self.max_rate else None



def _network(value: str) -> str | None:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        return f'expected a network such as "10.0.0.0/8" or "fd00::/8", got "{value}" ({exc})'
    return None


@dataclass(frozen=True)
class PodsSection:
    enabled: bool = opt(
        True, "Count each pod's internet traffic (one rule per pod address and direction; only counts, never "
        "changes a packet's fate). Pods come from the cluster; without one, from `static`.",
    )
    static: Mapping[str, str] = opt(
        MappingProxyType({}), 'Without a cluster: named networks counted as pods, e.g. { "build-farm" = '
        '"192.168.50.0/24" } (exported with namespace "" and pod "build-farm"). Ignored where the agent has a cluster.',
    )

    def validate(self) -> tuple[str, str] | None:
        if len(self.static) > MAX_STATIC:
            return "static", f"expected at most {MAX_STATIC} entries, got {len(self.static)}"
        nets: dict[str, ipaddress.IPv4Network | ipaddress.IPv6Network] = {}
        for name, cidr in self.static.items():
            if not _NAME.match(name):
                return f"static.{name}", f'expected a name of lowercase letters, digits, "-" and "." (at most 63), got "{name}"'
            if not isinstance(cidr, str) or (problem := _network(cidr)):
                return f"static.{name}", problem or f"expected a network string, got {cidr!r}"
            net = ipaddress.ip_network(cidr)
            clash = next((n for n, other in nets.items() if other.version == net.version and other.overlaps(net)), None)
            if clash:
                return f"static.{name}", f'expected networks that do not overlap, got "{cidr}" overlapping "{clash}"'
            nets[name] = net
        return None


@dataclass(frozen=True)
class TrafficConfig(CheckConfig):
    enabled: bool = opt(True, "Run this check: it installs iptables mangle rules of its own on the host (they never change a packet's fate).")
    interval: float = opt(
        15.0, "Time between reconciles: rules verified and repaired, counters read.", duration=True, min=1
    )
    backend: Literal["auto", "legacy", "nft"] = opt(
        "auto", "iptables backend: auto detects it as kube-proxy's iptables-wrapper does."
    )
    internal_ranges: tuple[str, ...] = opt(
        ("10.0.0.0/8",),
        "Cluster-internal networks (IPv4 and IPv6); traffic with anything else counts as internet. "
        "A family without a range gets no rules.",
        check=_network,
    )

    datapath_window: float = opt(
        300.0,
        "Window over which the bytes the uplinks carried are compared with the bytes the iptables hooks saw; "
        "more than half unseen is TrafficDatapathBypass.",
        duration=True,
        min=1,
    )
    datapath_min_bytes: int = opt(
        64 << 20, "Bytes the uplinks must carry in a window before it is judged; a quieter window keeps the last verdict.", min=1
    )
    cilium_socket: str = opt(
        "/run/cilium/cilium.sock",
        "Cilium agent API socket (host path), asked for its host routing mode where a cilium_host device exists.",
    )
    pods: PodsSection = field(default_factory=PodsSection, metadata={"doc": "Per-pod internet accounting."})
    shaping: ShapingConfig = field(
        default_factory=ShapingConfig, metadata={"doc": "Opt-in internet-only egress shaping per pod."}
    )

    def validate(self) -> tuple[str, str] | None:
        if len(self.internal_ranges) > MAX_RANGES:
            return "internal_ranges", f"expected at most {MAX_RANGES} ranges, got {len(self.internal_ranges)}"
        seen = [str(ipaddress.ip_network(r)) for r in self.internal_ranges]
        dup = next((r for i, r in enumerate(seen) if r in seen[:i]), None)
        if dup:
            return "internal_ranges", f'expected each range once, got "{dup}" twice'
        return None
