"""The plan that makes a mangle table hold exactly our rules: computed from
dumps as iptables-save prints them, touching only what carries our comment or
lives in our chains."""

from __future__ import annotations

import ipaddress

import pytest

from agent.parsers.iptsave import parse
from agent.traffic.nft import restore_batch
from agent.traffic.rules import Current, Spec, desired, parse_spec, plan_ensure, plan_remove

V4 = desired("ipv4", [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("100.64.0.0/10")])
assert V4 is not None

IN, OUT = "NODE-HEALTH-INTERNET-IN", "NODE-HEALTH-INTERNET-OUT"
C = "node-health-agent:"

GOOD = f"""*mangle
:{IN} - [0:0]
:{OUT} - [0:0]
[0:0] -A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
[0:0] -A INPUT -m comment --comment "{C}internet-in:jump" -j {IN}
[0:0] -A FORWARD -m comment --comment "{C}internet-in:jump" -j {IN}
[0:0] -A FORWARD -m comment --comment "{C}internet-out:jump" -j {OUT}
[0:0] -A OUTPUT -m comment --comment "{C}internet-out:jump" -j {OUT}
[0:0] -A {IN} -i lo -m comment --comment "{C}internet-in:loopback" -j RETURN
[0:0] -A {IN} -s 10.0.0.0/8 -m comment --comment "{C}internet-in:internal" -j RETURN
[0:0] -A {IN} -s 100.64.0.0/10 -m comment --comment "{C}internet-in:internal" -j RETURN
[5:600] -A {IN} -m comment --comment "{C}internet-in:count:0badcafe"
[0:0] -A {OUT} -o lo -m comment --comment "{C}internet-out:loopback" -j RETURN
[0:0] -A {OUT} -d 10.0.0.0/8 -m comment --comment "{C}internet-out:internal" -j RETURN
[0:0] -A {OUT} -d 100.64.0.0/10 -m comment --comment "{C}internet-out:internal" -j RETURN
[7:900] -A {OUT} -m comment --comment "{C}internet-out:count:0badcafe"
COMMIT
"""


def current(dump: str) -> Current:
    return Current.of(parse(dump.encode()))


def edit(dump: str, old: str, new: str) -> str:
    assert old in dump
    return dump.replace(old, new, 1)


def test_in_place_means_no_plan() -> None:
    plan = plan_ensure(V4, current(GOOD), "12345678")
    assert not plan and plan.notes == ()


def test_empty_table_gets_everything() -> None:
    plan = plan_ensure(V4, current("*mangle\nCOMMIT\n"), "12345678")
    assert [c for c, _ in plan.rebuild] == [IN, OUT]
    assert [(c, s.target) for c, s in plan.insert] == [("FORWARD", IN), ("FORWARD", OUT), ("INPUT", IN), ("OUTPUT", OUT)]
    assert plan.rebuild[0][1][-1].comment == f"{C}internet-in:count:12345678"
    assert not plan.delete and not plan.drop


@pytest.mark.parametrize(
    ("old", "new", "rebuild", "delete", "insert"),
    [
        pytest.param(f'[0:0] -A OUTPUT -m comment --comment "{C}internet-out:jump" -j {OUT}\n', "", [], [],
                     [("OUTPUT", OUT)], id="jump deleted"),
        pytest.param(f"[0:0] -A {IN} -s 100.64.0.0/10", f"[0:0] -A {IN} -s 100.64.0.0/16", [IN], [], [],
                     id="range edited"),
        pytest.param(f"[5:600] -A {IN} -m comment", f"[0:0] -A {IN} -s 1.2.3.4/32 -j DROP\n[5:600] -A {IN} -m comment",
                     [IN], [], [], id="foreign rule slipped into our chain"),
        pytest.param(f"[0:0] -A {OUT} -o lo -m comment --comment \"{C}internet-out:loopback\" -j RETURN\n"
                     f"[0:0] -A {OUT} -d 10.0.0.0/8", f"[0:0] -A {OUT} -d 10.0.0.0/8", [OUT], [], [],
                     id="rule removed from our chain"),
        pytest.param("[0:0] -A INPUT -p tcp", f'[0:0] -A INPUT -m comment --comment "{C}internet-in:jump" -j {IN}\n'
                     f"[0:0] -A INPUT -p tcp", [], [("INPUT", 3)], [], id="duplicate jump"),
        pytest.param(f'-A INPUT -m comment --comment "{C}internet-in:jump" -j {IN}',
                     f'-A INPUT -p udp -m comment --comment "{C}internet-in:jump" -j {IN}', [], [("INPUT", 2)],
                     [("INPUT", IN)], id="jump altered"),
        pytest.param("COMMIT", f'[0:0] -A PREROUTING -m comment --comment "{C}internet-in:jump" -j {IN}\nCOMMIT',
                     [], [("PREROUTING", 1)], [], id="ours in a chain where it does not belong"),
        pytest.param("internet-in:count:0badcafe", "internet-in:count:deadbeef", [], [], [],
                     id="chains rebuilt at different times"),
        pytest.param("internet-in:count:0badcafe", "internet-in:count:nothex", [IN], [], [],
                     id="count rule with a foreign suffix"),
    ],
)
def test_drift(old: str, new: str, rebuild: list, delete: list, insert: list) -> None:
    plan = plan_ensure(V4, current(edit(GOOD, old, new)), "12345678")
    assert [c for c, _ in plan.rebuild] == rebuild
    assert [(d.chain, d.position) for d in plan.delete] == delete
    assert [(c, s.target) for c, s in plan.insert] == insert
    assert bool(plan) == bool(rebuild or delete or insert)


def test_jump_below_foreign_rules_is_not_drift() -> None:
    # A CNI that keeps its own rules first (Calico's insert mode) is not fought.
    moved = edit(GOOD, f'[0:0] -A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n[0:0] -A INPUT -m comment --comment "{C}internet-in:jump" -j {IN}',
                 f'[0:0] -A INPUT -m comment --comment "{C}internet-in:jump" -j {IN}\n[0:0] -A INPUT -p tcp -m tcp --dport 22 -j ACCEPT')
    assert not plan_ensure(V4, current(moved), "x")


def test_remove_takes_ours_only() -> None:
    plan = plan_remove(current(GOOD))
    assert [(d.chain, d.position) for d in plan.delete] == [("FORWARD", 1), ("FORWARD", 2), ("INPUT", 2), ("OUTPUT", 1)]
    assert plan.drop == (IN, OUT) and not plan.rebuild and not plan.insert
    batch = restore_batch(plan)
    assert "--dport 22" not in batch and ":INPUT" not in batch  # never a built-in chain's policy line
    assert not plan_remove(current("*mangle\n-A INPUT -j ACCEPT\nCOMMIT\n"))


def test_other_tables_are_ignored() -> None:
    dump = GOOD + f'*filter\n-A INPUT -m comment --comment "{C}internet-in:jump" -j ACCEPT\nCOMMIT\n'
    assert not plan_ensure(V4, current(dump), "x")


def test_family_without_ranges_wants_nothing() -> None:
    assert desired("ipv6", [ipaddress.ip_network("10.0.0.0/8")]) is None
    v6 = desired("ipv6", [ipaddress.ip_network("fd00::/8")])
    assert v6 is not None and v6.chains[IN][1] == Spec(f"{C}internet-in:internal", "RETURN", src="fd00::/8")


def test_restore_batch_of_a_repair() -> None:
    dump = edit(edit(GOOD, f"[0:0] -A {IN} -s 100.64.0.0/10", f"[0:0] -A {IN} -s 100.64.0.0/16"),
                f'[0:0] -A OUTPUT -m comment --comment "{C}internet-out:jump" -j {OUT}\n', "")
    batch = restore_batch(plan_ensure(V4, current(dump), "abcdef01"))
    assert batch == (
        "*mangle\n"
        f":{IN} - [0:0]\n"
        f'-A {IN} -i lo -m comment --comment "{C}internet-in:loopback" -j RETURN\n'
        f'-A {IN} -s 10.0.0.0/8 -m comment --comment "{C}internet-in:internal" -j RETURN\n'
        f'-A {IN} -s 100.64.0.0/10 -m comment --comment "{C}internet-in:internal" -j RETURN\n'
        f'-A {IN} -m comment --comment "{C}internet-in:count:abcdef01"\n'
        f'-I OUTPUT 1 -m comment --comment "{C}internet-out:jump" -j {OUT}\n'
        "COMMIT\n"
    )


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        pytest.param('-s 10.0.0.0/8 -m comment --comment "c" -j RETURN', Spec("c", "RETURN", src="10.0.0.0/8"), id="nft order"),
        pytest.param('-m comment --comment c -s 10.1.2.3/8 -j RETURN', Spec("c", "RETURN", src="10.0.0.0/8"), id="host bits"),
        pytest.param('-m comment --comment c', Spec("c"), id="count only"),
        pytest.param('! -s 10.0.0.0/8 -m comment --comment c', None, id="negation"),
        pytest.param('-p tcp -m comment --comment c', None, id="unknown option"),
        pytest.param('-s 10.0.0.0/8 -j RETURN', None, id="no comment"),
        pytest.param('-m comment --comment a -m comment --comment b', None, id="two comments"),
    ],
)
def test_parse_spec(text: str, spec: Spec | None) -> None:
    assert parse_spec(text) == spec
