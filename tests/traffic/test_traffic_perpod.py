"""Per-pod accounting rules, without a kernel: what is counted, the set chains
hung from the internet chains, the incremental plan when pods come and go,
and the per-pod tallies."""

from __future__ import annotations

import ipaddress

import pytest

from agent.config import ConfigError, load
from agent.parsers.iptsave import parse
from agent.pods import PodAddr
from agent.traffic.nft import restore_batch
from agent.traffic.perpod import from_pods, from_static, sub_chains
from agent.traffic.rules import Current, Plan, SubChain, count_key, count_role, desired, generation, plan_ensure, plan_remove
from agent.traffic.tally import Tallies

NETS = [ipaddress.ip_network("10.0.0.0/8")]
IN, OUT, PIN, POUT = "NODE-HEALTH-INTERNET-IN", "NODE-HEALTH-INTERNET-OUT", "NODE-HEALTH-POD-IN", "NODE-HEALTH-POD-OUT"


def pod(name: str, *ips: str, host: bool = False, ns: str = "team") -> PodAddr:
    return PodAddr(ns, name, f"uid-{name}", ips, host_network=host)


def want(*pods: PodAddr):  # type: ignore[no-untyped-def]
    counted, _ = from_pods(pods)
    w = desired("ipv4", NETS, sub_chains("ipv4", counted))
    assert w is not None
    return w


def dump_of(plan: Plan, counters: dict[str, tuple[int, int]] | None = None) -> str:
    """The table a plan makes from an empty one, as iptables-save -c prints it."""
    lines = ["*mangle"] + [f":{c} - [0:0]" for c, _ in plan.rebuild]
    lines += [f"[0:0] -A {chain} {s.restore_text()}" for chain, s in plan.insert]
    for chain, specs in plan.rebuild:
        for s in specs:
            pk, by = (counters or {}).get(s.comment, (0, 0))
            lines.append(f"[{pk}:{by}] -A {chain} {s.restore_text()}")
    return "\n".join([*lines, "COMMIT", ""])


def current(text: str) -> Current:
    return Current.of(parse(text.encode()))


def test_what_is_counted() -> None:
    counted, notes = from_pods([
        pod("a", "10.88.1.2", "fd00::2"), pod("host", "192.0.2.10", host=True), pod("pending"),
        pod("b", "10.88.1.3"), pod("c", "10.88.1.3"), pod("bad", "not-an-ip", "10.88.1.4"),
    ])
    assert [(c.pod, [str(n) for n in c.nets]) for c in counted] == [
        ("a", ["10.88.1.2/32", "fd00::2/128"]), ("bad", ["10.88.1.4/32"])
    ]
    assert [(r.subject, r.why) for r in notes] == [
        ("team/bad", 'status.podIPs: not a single IP address: "not-an-ip"; no rule for it'),
        ("10.88.1.3", "10.88.1.3 is listed by 2 pods (team/b, team/c); no rule is written for it for any of them"),
    ]
    assert [(c.namespace, c.pod, str(c.nets[0])) for c in from_static({"farm": "192.168.50.0/24"})] == [
        ("", "farm", "192.168.50.0/24")
    ]


def test_sub_chains_hang_after_the_count_rule() -> None:
    w = want(pod("a", "10.88.1.2", "fd00::2"))
    assert [s.target for s in w.chains[IN]] == ["RETURN", "RETURN", "", PIN]
    assert w.chains[IN][-1].comment == "node-health-agent:pod-in:jump"
    [rin] = w.chains[PIN]
    [rout] = w.chains[POUT]
    assert (rin.dst, rin.target, rout.src) == ("10.88.1.2/32", "RETURN", "10.88.1.2/32")
    assert count_role(rin.comment) == "pod-in" and len(count_key(rin.comment)) == 16 and generation(rin.comment) == ""
    assert w.unordered == {PIN, POUT}


def test_same_address_new_pod_is_a_new_rule() -> None:
    [a] = want(pod("a", "10.88.1.2")).chains[PIN]
    [b] = want(pod("b", "10.88.1.2")).chains[PIN]
    assert a.dst == b.dst and count_key(a.comment) != count_key(b.comment)


def test_stamped_comments_parse_back() -> None:
    plan = plan_ensure(want(pod("a", "10.88.1.2")), current("*mangle\nCOMMIT\n"), "abcdef01")
    rebuilt = dict(plan.rebuild)
    [rule] = rebuilt[PIN]
    assert generation(rule.comment) == "abcdef01" and len(count_key(rule.comment)) == 16
    internet = rebuilt[IN][-2].comment
    assert generation(internet) == "abcdef01" and count_key(internet) == "" and count_role(internet) == "internet-in"


def test_pods_coming_and_going_change_only_their_rules() -> None:
    pods = [pod(f"p{i}", f"10.88.1.{i}") for i in range(1, 111)]
    first = plan_ensure(want(*pods), current("*mangle\nCOMMIT\n"), "00000001")
    table = current(dump_of(first))
    assert not plan_ensure(want(*pods), table, "00000002")  # in place: nothing to do

    churned = [*pods[1:], pod("new", "10.88.2.1")]  # p1 leaves, "new" arrives
    plan = plan_ensure(want(*churned), table, "00000002")
    assert not plan.rebuild and not plan.insert and not plan.drop  # no chain rebuilt: counters kept
    assert sorted((d.chain, d.position) for d in plan.delete) == [(PIN, 1), (POUT, 1)]
    assert [(c, s.dst or s.src) for c, s in plan.append] == [(PIN, "10.88.2.1/32"), (POUT, "10.88.2.1/32")]
    assert all(generation(s.comment) == "00000002" for _, s in plan.append)
    batch = restore_batch(plan)
    assert f"-D {PIN} -d 10.88.1.1/32" in batch and f"-A {POUT} -s 10.88.2.1/32" in batch and f":{PIN}" not in batch


def test_flushed_pod_chain_is_refilled_and_foreign_rule_means_rebuild() -> None:
    w = want(pod("a", "10.88.1.2"), pod("b", "10.88.1.3"))
    text = dump_of(plan_ensure(w, current("*mangle\nCOMMIT\n"), "00000001"))
    flushed = "\n".join(line for line in text.splitlines() if f"-A {PIN} " not in line)
    plan = plan_ensure(w, current(flushed), "00000002")
    assert [c for c, _ in plan.append] == [PIN, PIN] and not plan.rebuild
    foreign = text.replace("COMMIT", f"[0:0] -A {PIN} -s 1.2.3.4/32 -j DROP\nCOMMIT")
    plan = plan_ensure(w, current(foreign), "00000002")
    assert [c for c, _ in plan.rebuild] == [PIN] and not plan.delete


def test_disabling_drops_the_sub_chains_after_unhooking_them() -> None:
    text = dump_of(plan_ensure(want(pod("a", "10.88.1.2")), current("*mangle\nCOMMIT\n"), "00000001"))
    plain = desired("ipv4", NETS)
    assert plain is not None
    plan = plan_ensure(plain, current(text), "00000002")
    assert [c for c, _ in plan.rebuild] == [IN, OUT] and plan.drop == (PIN, POUT)
    batch = restore_batch(plan)
    assert batch.index(f"-F {PIN}") < batch.index(f"-X {PIN}") and batch.index(f"-F {POUT}") < batch.index(f"-X {PIN}")
    removal = plan_remove(current(text))
    assert set(removal.drop) == {IN, OUT, PIN, POUT}


def test_sub_chain_must_be_ours() -> None:
    with pytest.raises(ValueError):
        SubChain("internet-out", "KUBE-SERVICES", "x", ())
    with pytest.raises(ValueError):
        SubChain("internet-out", IN, "x", ())


def test_a_second_sub_chain_hangs_after_the_first() -> None:
    counted, _ = from_pods([pod("a", "10.88.1.2")])
    shape = SubChain("internet-out", "NODE-HEALTH-SHAPE", "shape", ())
    w = desired("ipv4", NETS, (*sub_chains("ipv4", counted), shape))
    assert w is not None
    assert [s.target for s in w.chains[OUT]][-2:] == [POUT, "NODE-HEALTH-SHAPE"]


def test_pod_tallies_are_forgotten(tmp_path) -> None:
    tallies = Tallies(str(tmp_path))
    tallies.named("pod-in/ipv4/0123456789abcdef").observe("aaaaaaaa", 1, 100)
    tallies.get("internet-in", "ipv4").observe("bbbbbbbb", 2, 200)
    tallies.save()
    again = Tallies(str(tmp_path))
    assert again.named("pod-in/ipv4/0123456789abcdef").total_bytes == 100
    again.forget(["pod-in/ipv4/0123456789abcdef"])
    assert set(again.tallies) == {"internet-in/ipv4"}


@pytest.mark.parametrize(
    ("static", "key", "expected"),
    [
        ('{ "Farm" = "192.168.50.0/24" }', "static.Farm", "a name of lowercase"),
        ('{ "farm" = "192.168.50.1/24" }', "static.farm", "host bits set"),
        ('{ "a" = "192.168.50.0/24", "b" = "192.168.50.128/25" }', "static.b", "do not overlap"),
    ],
)
def test_bad_static_entries(tmp_path, static: str, key: str, expected: str) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f"[checks.traffic.pods]\nstatic = {static}\n")
    with pytest.raises(ConfigError) as err:
        load(str(cfg))
    assert key in str(err.value) and expected in str(err.value)


def test_static_entries_load(tmp_path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[checks.traffic.pods]\nstatic = { "build-farm" = "192.168.50.0/24", "v6" = "fd00:50::/64" }\n')
    pods = load(str(cfg)).checks["traffic"].pods
    assert pods.enabled and dict(pods.static) == {"build-farm": "192.168.50.0/24", "v6": "fd00:50::/64"}


class Pods:
    def __init__(self, pods: list[PodAddr] | None) -> None:
        self.now, self.gen = pods, 1

    def pods(self) -> list[PodAddr] | None:
        return self.now

    def generation(self) -> int:
        return self.gen


def keeper_with(tmp_path, view: Pods | None, **cfg: object):  # type: ignore[no-untyped-def]
    from agent.check import CheckContext
    from agent.config import defaults
    from agent.hostpaths import HostPaths
    from agent.traffic.keeper import Keeper
    from agent.traffic.settings import TrafficConfig

    k = Keeper(CheckContext(HostPaths(), str(tmp_path), defaults(), pods=view), TrafficConfig(**cfg))  # type: ignore[arg-type]
    k.tallies = Tallies(str(tmp_path))
    return k


def exported(k) -> tuple[dict[tuple[str, ...], float], set[tuple[str, str]]]:  # type: ignore[no-untyped-def]
    from agent.findings import ObservationBuilder
    from agent.traffic.catalog import CATALOG

    b = ObservationBuilder("traffic", CATALOG)
    k._pods(b)
    k._export(b)
    obs = b.build()
    series = {(s.name, *dict(s.labels).values()): s.value for s in obs.samples if s.name.startswith("node_health_pod_")}
    return series, {(f.subject, f.reason) for f in obs.findings}


def test_series_per_pod_summed_over_its_addresses(tmp_path) -> None:
    from agent.traffic.perpod import TAGS, tally_key

    v6 = ipaddress.ip_network("fd00::/8")
    k = keeper_with(tmp_path, Pods([pod("a", "10.88.1.2", "fd00::2"), pod("h", "10.88.1.9", host=True)]),
                    internal_ranges=("10.0.0.0/8", str(v6)))
    series, findings = exported(k)
    assert series[("node_health_pod_traffic_bytes_total", "team", "a", "internet-out")] == 0
    [c] = k.counted
    for net, n in zip(c.nets, (100, 50)):
        k.tallies.named(tally_key(TAGS["internet-out"], "ipv4" if net.version == 4 else "ipv6", c.key(net))).observe(
            "aaaaaaaa", 1, n)
    series, findings = exported(k)
    assert series[("node_health_pod_traffic_bytes_total", "team", "a", "internet-out")] == 150
    assert series[("node_health_pod_traffic_packets_total", "team", "a", "internet-out")] == 2
    assert not any("h" in key for key in series)  # host network: the node's
    assert series[("node_health_pod_traffic_accounting_up",)] == 1 and not findings
    assert series[("node_health_pod_traffic_rules",)] == 4


def test_unknown_never_zero(tmp_path) -> None:
    from agent.traffic.datapath import Verdict

    view = Pods([pod("a", "10.88.1.2")])
    k = keeper_with(tmp_path, view)
    assert len(exported(k)[0]) == 2 + 4
    k.verdict = Verdict(True, "Cilium eBPF host routing")
    series, _ = exported(k)
    assert series == {("node_health_pod_traffic_accounting_up",): 0, ("node_health_pod_traffic_rules",): 2}
    k.verdict = None
    view.now = None  # the pod watch is down past its staleness limit
    series, findings = exported(k)
    assert series[("node_health_pod_traffic_accounting_up",)] == 0 and len(series) == 2
    assert findings == {("pods", "PodTrafficUnknown")} and k.pod_rules == 2  # the last known pods count on
    k._forget_pods()
    assert k.counted  # nothing forgotten while unknown


def test_disabled_or_no_cluster(tmp_path) -> None:
    from agent.traffic.settings import PodsSection

    k = keeper_with(tmp_path, Pods([pod("a", "10.88.1.2")]), pods=PodsSection(enabled=False))
    assert exported(k)[0] == {} and "NODE-HEALTH-POD-IN" not in k.wanted["ipv4"].chains
    k = keeper_with(tmp_path, None, pods=PodsSection(static={"farm": "192.168.50.0/24"}))
    series, _ = exported(k)
    assert series[("node_health_pod_traffic_bytes_total", "", "farm", "internet-in")] == 0
    assert ("pods", "PodTrafficUnknown") not in k.known_findings()


def test_needs_pods() -> None:
    from agent.checks.traffic import SPEC
    from agent.traffic.settings import PodsSection, TrafficConfig

    assert SPEC.needs_pods is not None
    assert SPEC.needs_pods(TrafficConfig()) is True
    assert SPEC.needs_pods(TrafficConfig(pods=PodsSection(enabled=False))) is False
