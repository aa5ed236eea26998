"""Shaping, the pure part: rates, which pods, class ids, the NODE-HEALTH-SHAPE chain in the plan."""

from __future__ import annotations

import ipaddress
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.parsers.iptsave import KIND_RULE, IptRecord
from agent.pods import PodAddr
from agent.traffic.nft import restore_batch
from agent.traffic.rules import Current, desired, parse_spec, plan_ensure, plan_remove
from agent.traffic.settings import MAX_RATE, MIN_RATE, RateError, ShapingConfig, parse_rate
from agent.traffic.shaping import CHAIN, MAX_MINOR, Limit, assign, assigned, limits, subchain

NETS = [ipaddress.ip_network("10.0.0.0/8")]
ANN = "node-health-agent/internet-egress-bandwidth"


@pytest.mark.parametrize(("text", "bits"), [
    ("200M", 200_000_000), ("1G", 10**9), ("1.5G", 1_500_000_000), ("50Mi", 50 * 2**20), ("500k", 500_000),
    ("500K", 500_000), ("8000", 8000), ("10T", 10**13), ("2Ti", 2 * 2**40), ("unlimited", None), (" 100M ", 10**8),
])
def test_rates(text: str, bits: int | None) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["", "fast", "200Mbit", "-1", "0", "1m", "7999", "11T", "1e9", "1,5G", "M",
                                  "9" * 309, "9" * 400 + "T", "NaN", "nan", "inf", "Infinity", "\u0661\u0660\u0660M",
                                  "100M\n-I INPUT 1 -j DROP", "\x1b[31m100M", "1" + "0" * 31, "0.000000001T", "\ud800"])
def test_bad_rates(text: str) -> None:
    with pytest.raises(RateError, match="expected") as err:
        parse_rate(text)
    said = str(err.value)
    assert "\n" not in said and "\x1b" not in said and len(said) < 400  # a short, escaped excerpt


@given(st.text(max_size=2000) | st.from_regex(r"[0-9]{1,400}(\.[0-9]{1,400})?(k|M|G|T|Ki|Mi|Gi|Ti)?", fullmatch=True))
@settings(max_examples=300, deadline=None)
def test_any_rate_text_is_a_rate_or_a_rate_error(text: str) -> None:
    """Issue 25 item 1: whatever a tenant writes, a value in range or RateError (never OverflowError & co)."""
    try:
        bits = parse_rate(text)
    except RateError as exc:
        assert len(str(exc)) < 400
    else:
        assert bits is None or MIN_RATE <= bits <= MAX_RATE


def test_one_pods_annotation_never_stops_the_others() -> None:
    """Issue 25 items 1 and 3: 309 nines (OverflowError before), NaN, 1 KB of control characters: each is that
    pod's Invalid with a short escaped excerpt; every other pod is shaped as before."""
    cfg = ShapingConfig(enabled=True)
    hostile = ["9" * 309, "NaN", "\"; rm -rf /\n" * 60, "\u202e100M", "1" * 1024]
    pods = [pod(f"bad-{i}", v) for i, v in enumerate(hostile)] + [pod("good", "50M")]
    got, bad = limits(pods, cfg)
    assert [(x.pod, x.bits) for x in got] == [("good", 50_000_000)]
    assert sorted(x.pod for x in bad) == [f"bad-{i}" for i in range(len(hostile))]
    for x in bad:
        assert len(x.why) < 400 and "\n" not in x.why and "\u202e" not in x.why, x.why


def test_duplicate_address_shapes_neither_pod() -> None:
    """Issue 25 item 6: two pods listing one address: no CLASSIFY rule for it, so one pod's limit never
    lands on the other; their other addresses are still shaped."""
    cfg = ShapingConfig(enabled=True)
    got, bad = limits([pod("a", "10M", ips=("10.88.1.9", "fd00::a")), pod("b", "50M", ips=("10.88.1.9",)),
                       pod("c", "20M", ips=("10.88.1.10",))], cfg)
    assert [(x.pod, x.ips) for x in got] == [("a", ("fd00::a",)), ("c", ("10.88.1.10",))] and not bad


def pod(name: str, ann: str | None = None, ns: str = "train", ips: tuple[str, ...] | None = None,
        host: bool = False) -> PodAddr:
    if ips is None:  # an address of its own (two pods listing one address get no rule: test_duplicate_address)
        ips = (f"10.88.{len(ns)}.{sum(map(ord, name)) % 250 + 2}",)
    return PodAddr(ns, name, f"uid-{name}", ips, host, {ANN: ann} if ann is not None else {})


def test_limits_annotation_wins_over_namespace_default() -> None:
    cfg = ShapingConfig(enabled=True, namespace_defaults=MappingProxyType({"batch": "20M"}))
    pods = [
        pod("a", "50M"), pod("b"), pod("c", ns="batch"), pod("d", "unlimited", ns="batch"), pod("e", "1G", ns="batch"),
        pod("f", "nope"), pod("g", "5M", host=True), pod("h", ns="batch", host=True), pod("i", "5M", ips=()),
    ]
    got, bad = limits(pods, cfg)
    assert [(x.pod, x.bits, x.source) for x in got] == [
        ("a", 50_000_000, "annotation"), ("c", 20_000_000, "namespace default"), ("e", 10**9, "annotation"),
    ]
    assert [(x.pod, x.why.split(":")[0]) for x in bad] == [
        ("f", f"annotation {ANN}"), ("g", "a host-network pod's traffic is the node's and cannot be told apart per pod; "
                                          "the pod is not shaped"),
    ]


def lim(uid: str) -> Limit:
    return Limit("ns", uid, uid, ("10.88.1.2",), 10**6, "annotation")


def test_class_ids_are_kept_and_unique() -> None:
    first, left = assign([lim("a"), lim("b"), lim("c")], {}, 0x4E48)
    assert not left and len(set(first.values())) == 3
    assert all(0 < m <= MAX_MINOR and m != 0x4E48 for m in first.values())
    # b leaves, d arrives: a and c keep theirs; the same set again gives the same ids (restart: from the rules)
    second, _ = assign([lim("c"), lim("d"), lim("a")], first, 0x4E48)
    assert second["a"] == first["a"] and second["c"] == first["c"]
    assert assign([lim("a"), lim("c"), lim("d")], second, 0x4E48)[0] == second
    # two pods claiming the same id (a hand-edited rule): one keeps it, the other gets a new one
    clash, _ = assign([lim("a"), lim("b")], {"a": 7, "b": 7}, 0x4E48)
    assert clash["a"] == 7 and clash["b"] != 7


def test_subchain_rules_per_family() -> None:
    both = Limit("ns", "p", "uid-p", ("10.88.1.2", "fd00::2"), 10**6, "annotation")
    v4 = subchain("ipv4", [both], {"uid-p": 0x1A}, 0x4E48)
    v6 = subchain("ipv6", [both], {"uid-p": 0x1A}, 0x4E48)
    assert [r.restore_text() for r in v4.rules] == [
        '-s 10.88.1.2/32 -m comment --comment "node-health-agent:shape:uid-p" -j CLASSIFY --set-class 4e48:001a'
    ]
    assert [r.src for r in v6.rules] == ["fd00::2/128"]


def records(want_chains: dict) -> list[IptRecord]:
    """What iptables-save would print for these chains (kind 0: a chain line; 1: a rule)."""
    out = []
    for chain, specs in want_chains.items():
        out.append(IptRecord(0, 0, 0, 0, "mangle", chain, "", ""))
        for i, s in enumerate(specs, start=1):
            out.append(IptRecord(KIND_RULE, i, 0, 0, "mangle", chain, s.comment, s.restore_text()))
    return out


def test_parse_spec_reads_classify_back() -> None:
    spec = subchain("ipv4", [lim("a")], {"a": 3}, 0x4E48).rules[0]
    text = '-s 10.88.1.2/32 -m comment --comment "node-health-agent:shape:a" -j CLASSIFY --set-class 4e48:0003'
    assert parse_spec(text) == spec


def test_subchain_hung_and_dropped() -> None:
    sub = subchain("ipv4", [lim("a")], {"a": 3}, 0x4E48)
    want = desired("ipv4", NETS, [sub])
    assert want is not None
    out = want.chains["NODE-HEALTH-INTERNET-OUT"]
    assert out[-1].target == CHAIN and out[-2].comment.startswith("node-health-agent:internet-out:count")
    plan = plan_ensure(want, Current.of([]), "00000001")
    batch = restore_batch(plan)
    assert batch.index(f":{CHAIN} -") < batch.index("-A NODE-HEALTH-INTERNET-OUT")  # declared before the jump
    # shaping turned off: the internet-out chain is rebuilt without the jump, then ours dropped after it
    have = Current.of(records(dict(want.chains)))
    assert assigned(have, 0x4E48) == {"a": 3}
    off = plan_ensure(desired("ipv4", NETS), have, "00000002")  # type: ignore[arg-type]
    assert [c for c, _ in off.rebuild] == ["NODE-HEALTH-INTERNET-OUT"] and off.drop == (CHAIN,)
    assert plan_remove(have).drop == ("NODE-HEALTH-INTERNET-IN", "NODE-HEALTH-INTERNET-OUT", CHAIN)


def test_shaping_wants_the_pod_watch() -> None:
    """With per-pod accounting off, shaping alone decides whether the traffic check reads pods."""
    from agent.registry import CHECKS
    from agent.traffic.settings import PodsSection, TrafficConfig

    needs = CHECKS["traffic"].needs_pods
    assert needs is not None
    off = PodsSection(enabled=False)
    assert needs(TrafficConfig(pods=off)) is False
    assert needs(TrafficConfig(pods=off, shaping=ShapingConfig(enabled=True))) is True


def test_operator_ceiling_and_binding_namespace_default() -> None:
    """Issue 25 item 5: max_rate caps every limit ("10T" gets 1G); in a binding namespace an annotation may only
    lower the default ("unlimited" and "10T" get the default); elsewhere "unlimited" still opts out."""
    cfg = ShapingConfig(enabled=True, namespace_defaults=MappingProxyType({"batch": "100M", "free": "100M"}),
                        binding_namespaces=("batch",), max_rate="1G")
    pods = [pod("a", "10T"), pod("b", "unlimited"), pod("c", "unlimited", ns="batch"), pod("d", "10T", ns="batch"),
            pod("e", "20M", ns="batch"), pod("f", ns="batch"), pod("g", "unlimited", ns="free"), pod("h", "5G", ns="free")]
    got, bad = limits(pods, cfg)
    assert not bad
    assert {x.pod: (x.bits, x.source) for x in got} == {
        "a": (10**9, "annotation, capped by max_rate"),
        "c": (10**8, "namespace default (binding)"), "d": (10**8, "namespace default (binding)"),
        "e": (20 * 10**6, "annotation"), "f": (10**8, "namespace default"),
        "h": (10**9, "annotation, capped by max_rate"),
    }


@pytest.mark.parametrize(("toml", "key", "said"), [
    ('binding_namespaces = ["batch"]', "binding_namespaces", "without one"),
    ('max_rate = "unlimited"', "max_rate", "not \"unlimited\""),
    ('max_rate = "fast"', "max_rate", "expected a rate"),
    ('namespace_defaults = { "b" = "unlimited" }\nbinding_namespaces = ["b"]', "binding_namespaces", "unlimited"),
])
def test_bad_ceiling_or_binding_is_refused_at_load(tmp_path, toml: str, key: str, said: str) -> None:
    from agent.config import ConfigError, load

    path = tmp_path / "agent.toml"
    path.write_text(f"[checks.traffic.shaping]\nenabled = true\n{toml}\n")
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert key in str(err.value) and said in str(err.value), str(err.value)
