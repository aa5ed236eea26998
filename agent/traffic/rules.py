"""The rules we want, how the rules we find compare to them, and the plan that
makes the ``mangle`` table match.

Per address family with at least one internal range::

    -A INPUT   -m comment --comment "node-health-agent:internet-in:jump"  -j NODE-HEALTH-INTERNET-IN
    -A FORWARD -m comment --comment "node-health-agent:internet-in:jump"  -j NODE-HEALTH-INTERNET-IN
    -A FORWARD -m comment --comment "node-health-agent:internet-out:jump" -j NODE-HEALTH-INTERNET-OUT
    -A OUTPUT  -m comment --comment "node-health-agent:internet-out:jump" -j NODE-HEALTH-INTERNET-OUT
    -A NODE-HEALTH-INTERNET-IN -i lo -m comment --comment "node-health-agent:internet-in:loopback" -j RETURN
    -A NODE-HEALTH-INTERNET-IN -s 10.0.0.0/8 -m comment --comment "node-health-agent:internet-in:internal" -j RETURN
    -A NODE-HEALTH-INTERNET-IN -m comment --comment "node-health-agent:internet-in:count:3f09c2a1"
    (and the same for NODE-HEALTH-INTERNET-OUT with -o lo and -d)

The count rule has no target: it counts and the packet falls off the end of
our chain back into the built-in one. Its comment carries a generation, new
each time we (re)build the chain, so a rule re-created while the agent was
down is told apart from one that kept counting (see `agent.traffic.tally`).

A sub-feature (per-pod accounting, shaping) hangs a chain of its own from an
internet chain with a `SubChain`: one jump at the end of that chain (after the
count rule, so only traffic outside the internal ranges reaches it) and the
sub-chain's rules, kept like the rest. A sub-chain no longer wanted is emptied
and deleted with its jump. A sub-chain is either ordered (rebuilt whole when
it differs, like the internet chains) or a set (``ordered=False``: rules whose
order does not matter, added and deleted one by one, so that one pod coming or
going leaves every other rule, and its counter, alone). Count rules anywhere
are commented ``node-health-agent:<role>:count[:<key>]`` and stamped with a
generation when created (per-pod rules carry a key: `agent.traffic.perpod`).

Ours is what carries the ``node-health-agent:`` comment, plus every chain
named ``NODE-HEALTH-…``. A jump may sit anywhere in its built-in chain (we insert
at the top; a CNI that moves its own rules above ours is not fought), but must
be there exactly once; our chains must hold exactly our rules, in order.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import MappingProxyType

from ..parsers.iptsave import COMMENT_PREFIX as _PREFIX_BYTES
from ..parsers.iptsave import IptRecord, tokens
from ..parsers.text import decode

COMMENT_PREFIX = _PREFIX_BYTES.decode()
TABLE = "mangle"
DIRECTIONS = ("internet-in", "internet-out")
FAMILIES = ("ipv4", "ipv6")
CHAINS: Mapping[str, str] = MappingProxyType(
    {"internet-in": "NODE-HEALTH-INTERNET-IN", "internet-out": "NODE-HEALTH-INTERNET-OUT"}
)
HOOKS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"INPUT": ("internet-in",), "FORWARD": ("internet-in", "internet-out"), "OUTPUT": ("internet-out",)}
)
CHAIN_PREFIX = "NODE-HEALTH-"
KEY_HEX = 16  # length of a count rule's key (a generation is 8 hex digits: the two are told apart by length)
# node-health-agent:<role>:count[:<key>][:<generation>]
_COUNT = re.compile(r"^(node-health-agent:[a-z][a-z0-9-]*:count(?::[0-9a-f]{16})?)(?::([0-9a-f]{8}))?$")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Spec:
    """One rule as iptables-save prints it: only the options we ever use."""

    comment: str
    target: str = ""  # "": no target, the rule only counts
    src: str = ""
    dst: str = ""
    iif: str = ""
    oif: str = ""
    target_opts: tuple[str, ...] = ()  # the target's options as iptables-save prints them, e.g. ("--set-class", "4e48:000a")

    def args(self) -> list[str]:
        """The rule as command-line arguments (after ``-A CHAIN``)."""
        out: list[str] = []
        for flag, value in (("-s", self.src), ("-d", self.dst), ("-i", self.iif), ("-o", self.oif)):
            if value:
                out += [flag, value]
        out += ["-m", "comment", "--comment", self.comment]
        if self.target:
            out += ["-j", self.target, *self.target_opts]
        return out

    def restore_text(self) -> str:
        """The rule for iptables-restore, one line: the comment quoted, anything else that is not a plain token
        quoted too, quotes and backslashes escaped (iptables-restore reads ``\\"`` inside quotes as a quote).
        Our comments hold neither, and pod input is vetted before it gets here (`agent.pods.vet`); this holds
        whatever gets through. Raises UnsafeRule for a line break or a control character, which no quoting
        keeps on one line."""
        return " ".join(_restore_token(a, quote=a == self.comment) for a in self.args())

    def same_as(self, other: Spec) -> bool:
        """Equal, the generation of a count rule aside."""
        return _unstamped(self) == _unstamped(other)


class UnsafeRule(ValueError):
    """A rule argument iptables-restore cannot be given safely (a line break or control character)."""


_PLAIN = re.compile(r"[A-Za-z0-9_.:/+=@,-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _restore_token(arg: str, *, quote: bool) -> str:
    if _CONTROL.search(arg):
        raise UnsafeRule(f"a rule argument holds a control character: {arg[:60]!r}")
    if not quote and _PLAIN.fullmatch(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def checked_line(line: str) -> str:
    """A line of a restore batch built from text read back (a rule to delete): one line, or UnsafeRule."""
    if _CONTROL.search(line):
        raise UnsafeRule(f"a rule read back holds a control character: {line[:60]!r}")
    return line


def comment(direction: str, role: str, gen: str = "") -> str:
    return f"{COMMENT_PREFIX}{direction}:{role}" + (f":{gen}" if gen else "")


@lru_cache(maxsize=8192)
def generation(comment_text: str) -> str | None:
    """The generation of a count rule's comment ("" if it has none), None if it is not one."""
    m = _COUNT.match(comment_text)
    return None if m is None else (m.group(2) or "")


@lru_cache(maxsize=8192)
def count_key(comment_text: str) -> str:
    """The key of a count rule's comment ("" for none, or when it is not a count rule)."""
    m = _COUNT.match(comment_text)
    if m is None or m.group(1).endswith(":count"):
        return ""
    return m.group(1).rsplit(":", 1)[1]


def count_role(comment_text: str) -> str:
    """The role of a count rule's comment (``internet-in``, ``pod-out``); "" if it is not one."""
    m = _COUNT.match(comment_text)
    return "" if m is None else m.group(1)[len(COMMENT_PREFIX):].split(":", 1)[0]


def _strip_gen(text: str) -> str:
    m = _COUNT.match(text)
    return m.group(1) if m else text


def is_ours(comment_text: str) -> bool:
    return comment_text.startswith(COMMENT_PREFIX)


def is_our_chain(name: str) -> bool:
    return name.startswith(CHAIN_PREFIX)


def is_our_line(line: bytes) -> bool:
    """A saved rule line of ours (for counting other people's rules)."""
    return _PREFIX_BYTES in line or f"-A {CHAIN_PREFIX}".encode() in line


# ---------------------------------------------------------------- desired state


@dataclass(frozen=True, slots=True)
class SubChain:
    """A chain of a sub-feature, jumped to from the end of `direction`'s internet chain."""

    direction: str  # "internet-in" or "internet-out"
    name: str  # NODE-HEALTH-…
    role: str  # its comments' middle part: node-health-agent:<role>:…
    rules: tuple[Spec, ...]
    ordered: bool = True  # False: a set of rules, changed one by one (their order does not matter)

    def __post_init__(self) -> None:
        if not is_our_chain(self.name) or self.name in CHAINS.values() or self.direction not in CHAINS:
            raise ValueError(f"sub-chain {self.name} hung from {self.direction}")

    def jump(self) -> Spec:
        return Spec(f"{COMMENT_PREFIX}{self.role}:jump", self.name)


@dataclass(frozen=True, slots=True)
class Desired:
    family: str
    chains: Mapping[str, tuple[Spec, ...]]  # our chain -> its rules, in order
    jumps: Mapping[str, tuple[Spec, ...]]  # built-in chain -> the jumps it must hold
    unordered: frozenset[str] = frozenset()  # our chains whose rules are a set (SubChain.ordered False)


def family_of(net: Network) -> str:
    return "ipv4" if net.version == 4 else "ipv6"


def desired(family: str, ranges: Iterable[Network], subs: Sequence[SubChain] = ()) -> Desired | None:
    """What `family` must hold; None when it has no internal range (then nothing of ours belongs there).
    `subs`: sub-feature chains hung from the internet chains, in this order."""
    nets = [n for n in ranges if family_of(n) == family]
    if not nets:
        return None
    chains: dict[str, tuple[Spec, ...]] = {}
    for direction, chain in CHAINS.items():
        inbound = direction == "internet-in"
        lo = Spec(comment(direction, "loopback"), "RETURN", iif="lo" if inbound else "", oif="" if inbound else "lo")
        internal = [
            Spec(comment(direction, "internal"), "RETURN", src=str(n) if inbound else "", dst="" if inbound else str(n))
            for n in nets
        ]
        hung = [sub.jump() for sub in subs if sub.direction == direction]
        chains[chain] = (lo, *internal, Spec(comment(direction, "count")), *hung)
    for sub in subs:
        if sub.name in chains:
            raise ValueError(f"sub-chain {sub.name} given twice or named as an internet chain")
        chains[sub.name] = sub.rules
    jumps = {hook: tuple(Spec(comment(d, "jump"), CHAINS[d]) for d in dirs) for hook, dirs in HOOKS.items()}
    unordered = frozenset(sub.name for sub in subs if not sub.ordered)
    return Desired(family, MappingProxyType(chains), MappingProxyType(jumps), unordered)


# ---------------------------------------------------------------- what we find

_OPTIONS = {"-s": "src", "-d": "dst", "-i": "iif", "-o": "oif", "-j": "target", "--comment": "comment"}
_TARGET_OPTIONS = frozenset({"--set-class"})  # options of the targets our rules use (CLASSIFY), after -j


@lru_cache(maxsize=8192)
def parse_spec(text: str) -> Spec | None:
    """A rule's text after ``-A CHAIN`` as a Spec; None when it uses anything we never use (cached: the same
    rules are read back every run)."""
    toks = [decode(t) for t, _ in tokens(text.encode("utf-8", "surrogateescape"))]
    fields: dict[str, str] = {}
    opts: list[str] = []
    i = 0
    while i < len(toks):
        if toks[i] == "-m" and toks[i + 1 : i + 2] == ["comment"]:
            i += 2
            continue
        if toks[i] in _TARGET_OPTIONS and "target" in fields and i + 1 < len(toks):
            opts += toks[i : i + 2]
            i += 2
            continue
        name = _OPTIONS.get(toks[i])
        if name is None or name in fields or i + 1 >= len(toks):
            return None
        fields[name] = toks[i + 1]
        i += 2
    for key in ("src", "dst"):
        if key in fields:
            try:
                fields[key] = str(ipaddress.ip_network(fields[key], strict=False))
            except ValueError:
                return None
    if "comment" not in fields:
        return None
    return Spec(**fields, target_opts=tuple(opts))


@dataclass(frozen=True, slots=True)
class Current:
    """Ours in one family's mangle table, from a parsed dump."""

    chains: frozenset[str]  # our chains that exist
    rules: Mapping[str, tuple[IptRecord, ...]]  # chain -> our rules in it, in order

    @classmethod
    def of(cls, records: Iterable[IptRecord]) -> Current:
        chains: set[str] = set()
        rules: dict[str, list[IptRecord]] = {}
        for r in records:
            if r.table != TABLE:
                continue
            if r.kind == 0:
                if is_our_chain(r.chain):
                    chains.add(r.chain)
            elif is_our_chain(r.chain) or is_ours(r.comment):
                rules.setdefault(r.chain, []).append(r)
        return cls(frozenset(chains), MappingProxyType({k: tuple(v) for k, v in rules.items()}))

    @property
    def empty(self) -> bool:
        return not self.chains and not self.rules

    def count_rule(self, direction: str) -> IptRecord | None:
        """The count rule of `direction`'s chain, when the chain holds exactly one."""
        found = [r for r in self.rules.get(CHAINS[direction], ()) if generation(r.comment) is not None]
        return found[0] if len(found) == 1 else None

    def counted(self, chain: str) -> Iterable[IptRecord]:
        """The count rules of `chain` (with a key or not)."""
        return (r for r in self.rules.get(chain, ()) if generation(r.comment) is not None)


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Doomed:
    """A rule of ours to delete: where it is and how it was printed."""

    chain: str
    position: int  # 1-based, as in the dump the plan was made from
    rule: str


@dataclass(frozen=True, slots=True)
class Plan:
    rebuild: tuple[tuple[str, tuple[Spec, ...]], ...] = ()  # our chains to create or flush, then fill
    delete: tuple[Doomed, ...] = ()  # rules of ours to delete one by one (outside our chains, or in a set)
    insert: tuple[tuple[str, Spec], ...] = ()  # jumps to put at the top of their chain, in this order
    drop: tuple[str, ...] = ()  # our chains to flush and delete (after the deletes)
    notes: tuple[str, ...] = field(default=(), compare=False)  # why, for the log
    append: tuple[tuple[str, Spec], ...] = ()  # rules to add at the end of a set chain of ours (after the deletes)

    def __bool__(self) -> bool:
        return bool(self.rebuild or self.delete or self.append or self.insert or self.drop)

    def rebuilt(self, chain: str) -> bool:
        return any(c == chain for c, _ in self.rebuild)


def plan_ensure(want: Desired, cur: Current, gen: str) -> Plan:
    """Changes that make `cur` hold exactly `want`; `gen` stamps rebuilt count rules."""
    notes: list[str] = []
    rebuild = []
    delete: list[Doomed] = []
    append: list[tuple[str, Spec]] = []
    for chain, specs in want.chains.items():
        recs = cur.rules.get(chain, ())
        if chain in want.unordered and chain in cur.chains and all(is_ours(r.comment) for r in recs):
            gone, new = _set_diff(chain, specs, recs)
            delete += gone
            append += [(chain, _stamp(s, gen)) for s in new]
            if gone or new:
                notes.append(f"{chain}: {len(new)} rules to add, {len(gone)} to delete")
            continue
        got = [parse_spec(r.rule) for r in recs]
        if chain in cur.chains and _same(specs, got):
            continue
        notes.append(f"{chain} missing" if chain not in cur.chains else f"{chain} altered")
        rebuild.append((chain, tuple(_stamp(s, gen) for s in specs)))
    insert: list[tuple[str, Spec]] = []
    for chain in sorted(set(want.jumps) | set(cur.rules)):
        if chain in want.chains or is_our_chain(chain):  # ours and unwanted: dropped whole below
            continue
        missing = list(want.jumps.get(chain, ()))
        for r in cur.rules.get(chain, ()):
            spec = parse_spec(r.rule)
            hit = next((w for w in missing if spec is not None and w.same_as(spec)), None)
            if hit is None:
                delete.append(Doomed(chain, r.position, r.rule))
                notes.append(f"stray rule {chain} #{r.position}: {r.comment}")
            else:
                missing.remove(hit)
        insert += [(chain, s) for s in missing]
        notes += [f"{chain} lacks {s.comment}" for s in missing]
    drop = _drop_order(c for c in cur.chains if c not in want.chains)
    notes += [f"{c} no longer wanted" for c in drop]
    return Plan(tuple(rebuild), tuple(delete), tuple(insert), drop, tuple(notes), tuple(append))


def plan_remove(cur: Current) -> Plan:
    """Changes that leave nothing of ours: our rules in other chains, then our chains."""
    delete = tuple(
        Doomed(chain, r.position, r.rule) for chain, recs in sorted(cur.rules.items()) if not is_our_chain(chain)
        for r in recs
    )
    drop = _drop_order(cur.chains)
    return Plan(delete=delete, drop=drop, notes=("removing ours",) if delete or drop else ())


def plan_for(want: Desired | None, cur: Current, gen: str) -> Plan:
    return plan_remove(cur) if want is None else plan_ensure(want, cur, gen)


def _drop_order(chains: Iterable[str]) -> tuple[str, ...]:
    """The internet chains (which jump to sub-chains) before the rest, so no chain is deleted while referenced."""
    main = set(CHAINS.values())
    return tuple(sorted(chains, key=lambda c: (c not in main, c)))


def _set_diff(chain: str, specs: Sequence[Spec], recs: Sequence[IptRecord]) -> tuple[list[Doomed], list[Spec]]:
    """A set chain's rules to delete (altered, duplicated, not wanted) and the wanted ones it lacks."""
    left = {_unstamped(s): s for s in specs}
    gone = []
    for r in recs:
        spec = parse_spec(r.rule)
        if spec is None or left.pop(_unstamped(spec), None) is None:
            gone.append(Doomed(chain, r.position, r.rule))
    return gone, list(left.values())


@lru_cache(maxsize=8192)
def _unstamped(spec: Spec) -> Spec:
    return replace(spec, comment=_strip_gen(spec.comment))


def _same(want: Sequence[Spec], got: Sequence[Spec | None]) -> bool:
    return len(want) == len(got) and all(g is not None and w.same_as(g) for w, g in zip(want, got))


def _stamp(spec: Spec, gen: str) -> Spec:
    if generation(spec.comment) is None:
        return spec
    return replace(spec, comment=f"{_strip_gen(spec.comment)}:{gen}")
