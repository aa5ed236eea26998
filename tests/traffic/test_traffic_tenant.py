"""Issue 25: a tenant's pod (its annotations, its metadata as the API server hands it over) never becomes node
state, and no pod's input reaches an iptables-restore batch unvetted. Pure parts and the reconciler against the
fake API server; the real kernel in test_traffic_shaping.py and test_traffic_pods_e2e.py."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.kube.settings import PolicySection
from agent.pods import PodAddr, address, excerpt, vet
from agent.traffic.nft import restore_batch
from agent.traffic.perpod import from_pods, sub_chains
from agent.traffic.rules import Current, Plan, Spec, UnsafeRule, desired, plan_ensure
from agent.traffic.settings import ShapingConfig
from agent.traffic.shaping import limits, subchain
from fakeapi import FakeApiServer
from kube_support import (  # noqa: F401 (fake: the fixture)
    CATALOG, PREFIX, Clock, conditions, fake, make_reconciler, our_taints, settings as kube_settings, snapshot,
)

NETS = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")]
ANN = "node-health-agent/internet-egress-bandwidth"
INJECT = 'x" -j ACCEPT\n-I INPUT 1 -j DROP\n#'


def test_bad_annotation_never_taints_nor_sends_a_node_event(fake: FakeApiServer, tmp_path: Any) -> None:
    """Issue 25 item 3: with policy.warning = NoSchedule, a pod's bad annotation (1 KB of quotes, newlines and
    escapes) is a finding of that pod only: no taint, no budget Lease, no Node Event, no condition True."""
    hostile = ('"\n\x1b[2J' * 200)[:1024]
    _, bad = limits([PodAddr("team", "p", "uid-p", ("10.88.1.2",), False, {ANN: hostile})], ShapingConfig(enabled=True))
    [inv] = bad
    entry = CATALOG.reason("TrafficShapingAnnotationInvalid")
    f = CATALOG.finding("traffic", f"{inv.namespace}/{inv.pod}", "TrafficShapingAnnotationInvalid", inv.why)
    assert len(f.message) < 400 and "\n" not in f.message and "\x1b" not in f.message
    cfg = kube_settings(policy=PolicySection(warning="NoSchedule", critical="NoSchedule"))
    clock = Clock()
    rec = make_reconciler(fake, str(tmp_path), cfg, clock=clock)
    for runs in range(1, 4):
        rec.step(clock(), snapshot([f], runs=runs, check="traffic", known=("TrafficShapingAnnotationInvalid",)))
        clock.t += 30
    assert our_taints(fake) == []
    assert fake.events() == []
    assert fake.objects("coordination.k8s.io", "leases") == []
    assert all(c["status"] != "True" for t, c in conditions(fake).items() if t.startswith("NodeHealth"))
    assert not entry.unknown and entry.severity.value == "info"


def test_duplicate_and_cidr_addresses_get_no_rule() -> None:
    """Issue 25 items 2 and 6 (defence against a hostile API server): a CIDR, a zone, a loopback, an address two
    pods list: no count rule for it; a finding names the pods (both of them for a duplicate)."""
    pods = [
        PodAddr("team", "a", "uid-a", ("0.0.0.0/0", "10.88.1.2")),
        PodAddr("team", "b", "uid-b", ("10.88.1.3",)), PodAddr("team", "c", "uid-c", ("10.88.1.3", "fd00::c")),
        PodAddr("team", "d", "uid-d", ("fe80::1%eth0", "127.0.0.1", "::", "224.0.0.1")),
    ]
    counted, refused = from_pods(pods)
    assert [(c.pod, [str(n) for n in c.nets]) for c in counted] == [("a", ["10.88.1.2/32"]), ("c", ["fd00::c/128"])]
    said = {(r.subject, r.why) for r in refused}
    assert ("10.88.1.3", "10.88.1.3 is listed by 2 pods (team/b, team/c); no rule is written for it for any of "
            "them") in said
    assert ("team/a", 'status.podIPs: not a single IP address: "0.0.0.0/0"; no rule for it') in said
    assert sum(r.subject == "team/d" for r in refused) == 4


@pytest.mark.parametrize("uid", [INJECT, "a b", "", "x" * 65, "ü", "uid\x00"])
def test_a_crafted_uid_never_reaches_a_batch(uid: str) -> None:
    """Issue 25 item 2: a uid that is not a Kubernetes UID: the pod is refused whole (no count rule, no
    CLASSIFY rule), and a finding says so with an escaped excerpt."""
    pods = [PodAddr("team", "evil", uid, ("10.88.1.9",), False, {ANN: "10M"}),
            PodAddr("team", "ok", "0b9c6d1e-3c1a-4d52-9a4e-5f0e1d2c3b4a", ("10.88.1.10",), False, {ANN: "10M"})]
    counted, refused = from_pods(pods)
    assert [c.pod for c in counted] == ["ok"]
    [r] = refused
    assert r.subject == "team/evil" and "\n" not in r.why and "no rule is written" in r.why
    wanted, _ = limits(pods, ShapingConfig(enabled=True))
    assert [w.pod for w in wanted] == ["ok"]
    want = desired("ipv4", NETS, (*sub_chains("ipv4", counted), subchain("ipv4", wanted, {w.uid: 7 for w in wanted},
                                                                        0x4E48)))
    assert want is not None
    batch = restore_batch(plan_ensure(want, Current.of(()), "0000abcd"))
    assert "-j DROP" not in batch and "-j ACCEPT" not in batch and "evil" not in batch
    assert all(line.endswith(("-j NODE-HEALTH-INTERNET-IN", "-j NODE-HEALTH-INTERNET-OUT"))
               for line in batch.splitlines() if line.startswith("-I "))


def test_the_rules_writer_quotes_and_refuses_regardless() -> None:
    """Defence in depth: whatever reaches a Spec, its restore text is one line and each argument one token."""
    evil = Spec('node-health-agent:shape:a" -j DROP "b', "CLASSIFY", src="10.88.1.2/32",
                target_opts=("--set-class", "4e48:0007"))
    text = evil.restore_text()
    assert text.count('"') == 4 and '\\" -j DROP \\"' in text
    with pytest.raises(UnsafeRule):
        Spec("node-health-agent:shape:x\n-I INPUT 1 -j DROP", "RETURN").restore_text()
    with pytest.raises(UnsafeRule):
        restore_batch(Plan(append=(("NODE-HEALTH-SHAPE", Spec("node-health-agent:x\r", "RETURN")),)))


pod_text = st.text(max_size=80) | st.sampled_from(["10.0.0.1", "fd00::1", "0.0.0.0/0", "::/0", "1.2.3.4/32",
                                                   "fe80::1%eth0", "10.0.0.1 ", "", "uid-a"])


@given(st.lists(st.tuples(pod_text, pod_text, pod_text, st.lists(pod_text, max_size=4), st.booleans(),
                          pod_text), max_size=8))
@settings(max_examples=200, deadline=None)
def test_any_pod_metadata_vets_to_rules_or_refusals(raw: list[tuple[str, str, str, list[str], bool, str]]) -> None:
    """Issue 25 item 4: whatever the API server says of the pods, vetting returns pods and refusals, never an
    exception; every address kept is one IP, claimed once; the batches built from them hold only our rules."""
    pods = [PodAddr(ns, name, uid, tuple(ips), host, {ANN: ann}) for ns, name, uid, ips, host, ann in raw]
    vetted = vet(pods)
    kept = [a for _, addrs in vetted.pods for a in addrs]
    assert len(kept) == len(set(kept))
    assert all(len(r.why) < 600 and "\n" not in r.why and "\n" not in r.subject for r in vetted.refused)
    counted, _ = from_pods(pods)
    wanted, bad = limits(pods, ShapingConfig(enabled=True))
    assert all("\n" not in b.why for b in bad)
    want = desired("ipv4", NETS, (*sub_chains("ipv4", counted),
                                  subchain("ipv4", wanted, {w.uid: i + 1 for i, w in enumerate(wanted)}, 0x4E48)))
    assert want is not None
    for line in restore_batch(plan_ensure(want, Current.of(()), "0000abcd")).splitlines():
        assert line.startswith((":NODE-HEALTH-", "-A NODE-HEALTH-", "-I INPUT 1 ", "-I FORWARD 1 ", "-I OUTPUT 1 ",
                                "*mangle", "COMMIT")), line


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_any_address_text_is_one_ip_or_a_value_error(text: str) -> None:
    try:
        addr = address(text)
    except ValueError as exc:
        assert len(str(exc)) < 200
    else:
        assert "/" not in str(addr) and "%" not in str(addr)


def test_excerpt_is_short_and_escaped() -> None:
    assert excerpt("200M") == '"200M"'
    long = excerpt('"\n' * 500)
    assert long.startswith('"\\"\\n') and long.endswith("... (1000 characters)") and len(long) < 200
    assert excerpt("\u202e\x1b") == '"\\u202e\\u001b"'


def test_policy_override_cannot_make_a_tenant_finding_node_state() -> None:
    """Even an override naming the reason: an info finding never enters the hysteresis (only warning and up)."""
    from agent.kube.hysteresis import reports

    f = CATALOG.finding("traffic", "team/p", "TrafficPodInputRefused", "x")
    rep = reports(snapshot([f], check="traffic", known=()))["traffic"]
    assert rep.findings == {}
    assert dataclasses.replace(f).severity.value == "info"


V6_DEFAULT = ("00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
              "fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth0\n")


@pytest.mark.parametrize(("ranges", "v6_route", "v6_pod", "finding"), [
    (("10.0.0.0/8",), True, False, True), (("10.0.0.0/8",), False, True, True),
    (("10.0.0.0/8",), False, False, False), (("10.0.0.0/8", "fd00::/8"), True, True, False),
])
def test_a_family_left_out_is_said(tmp_path: Any, ranges: tuple[str, ...], v6_route: bool, v6_pod: bool,
                                   finding: bool) -> None:
    """Issue 25 item 5: with the default internal_ranges (IPv4 only) on a node with IPv6 (a default route, or
    pods with IPv6 addresses), IPv6 internet traffic is neither counted nor shaped: a finding and a metric say
    so, never silence."""
    from agent.check import CheckContext
    from agent.config import defaults
    from agent.findings import ObservationBuilder
    from agent.hostpaths import HostPaths
    from agent.registry import CATALOG as REGISTRY
    from agent.traffic.keeper import Keeper
    from agent.traffic.settings import TrafficConfig

    net = tmp_path / "proc/net"
    net.mkdir(parents=True)
    (net / "route").write_text("Iface\tDestination\tGateway\n")
    (net / "ipv6_route").write_text(V6_DEFAULT if v6_route else "")

    class View:
        def pods(self) -> list[PodAddr]:
            return [PodAddr("team", "a", "uid-a", ("10.88.1.2", "fd00::2") if v6_pod else ("10.88.1.2",))]

        def generation(self) -> int:
            return 0

    cfg = TrafficConfig(internal_ranges=ranges)
    keeper = Keeper(CheckContext(HostPaths(procfs=str(tmp_path / "proc")), str(tmp_path), defaults(),
                                 pods=View()), cfg)
    b = ObservationBuilder("traffic", REGISTRY)
    keeper._refuse(b)
    keeper._families(b)
    obs = b.build()
    got = [f for f in obs.findings if f.reason == "TrafficFamilyNotCounted"]
    assert [f.subject for f in got] == (["ipv6"] if finding else [])
    counted = {dict(s.labels)["family"]: s.value for s in obs.samples if s.name == "node_health_traffic_family_counted"}
    assert counted == {"ipv4": 1.0, "ipv6": 1.0 if len(ranges) == 2 else 0.0}
    assert ("ipv6", "TrafficFamilyNotCounted") in keeper.known_findings() or len(ranges) == 2


def test_the_shaper_run_survives_any_annotation(tmp_path: Any) -> None:
    """Issue 25 item 1, one level up: Shaper.begin (what the traffic check runs each cycle) with pods whose
    annotations are 309 nines, NaN and 1 KB of escapes beside a good one: no exception, one info finding per
    bad pod naming it, the good pod shaped (dry run on lo: nothing of tc is changed)."""
    from agent.findings import ObservationBuilder
    from agent.registry import CATALOG as REGISTRY
    from agent.traffic.shaper import Shaper

    bad = {"p-nines": "9" * 309, "p-nan": "NaN", "p-esc": ('"\n\x1b' * 400)[:1024]}
    pods = [PodAddr("team", n, f"uid-{n}", (f"10.88.1.{i + 2}",), False, {ANN: v}) for i, (n, v) in enumerate(bad.items())]
    pods.append(PodAddr("team", "good", "uid-good", ("10.88.1.9",), False, {ANN: "50M"}))

    class View:
        def pods(self) -> list[PodAddr]:
            return pods

        def generation(self) -> int:
            return 0

    shaper = Shaper(ShapingConfig(enabled=True, interfaces=("lo",)), View(), str(tmp_path), dry_run=True)
    b = ObservationBuilder("traffic", REGISTRY)
    try:
        subs = shaper.begin(b, lambda: {})
    finally:
        shaper.close()
    found = {f.subject: f for f in b.build().findings if f.reason == "TrafficShapingAnnotationInvalid"}
    assert set(found) == {f"team/{n}" for n in bad}
    assert all(f.severity.value == "info" and len(f.message) < 600 and "\n" not in f.message for f in found.values())
    assert [w.pod for w in shaper.wanted] == ["good"]
    assert [r.src for r in subs["ipv4"][0].rules] == ["10.88.1.9/32"]
