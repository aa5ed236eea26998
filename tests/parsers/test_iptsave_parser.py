"""The iptables-save parser: native and Python twins agree on real dumps and
generated input, and pick out exactly our chains and rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import native_loaded, native_vs_twin
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import native
from agent.parsers import iptsave

FIXTURES = Path(__file__).parent.parent / "fixtures" / "iptables"
REAL = sorted(FIXTURES.glob("*.txt"))
twin = native.PYTHON_TWINS["iptables_save"]


@pytest.fixture(scope="module")
def native_parse():
    native_loaded()
    return native.parse_iptables_save


@pytest.mark.parametrize("path", REAL, ids=[p.stem for p in REAL])
def test_real_dumps_agree(native_parse, path: Path) -> None:
    data = path.read_bytes()
    native_vs_twin("iptables_save", data, native_parse)


@pytest.mark.parametrize("backend", ["legacy", "nft"])
def test_real_dump_selects_ours_with_counters(backend: str) -> None:
    recs = twin((FIXTURES / f"{backend}-save-c.txt").read_bytes())
    assert {(r.chain, r.kind) for r in recs if r.kind == iptsave.KIND_CHAIN} == {
        ("NODE-HEALTH-INTERNET-IN", 0),
        ("NODE-HEALTH-INTERNET-OUT", 0),
    }
    rules = [r for r in recs if r.kind != iptsave.KIND_CHAIN]
    assert all(r.table == "mangle" and r.kind == iptsave.KIND_RULE for r in rules)
    assert all(r.comment.startswith("node-health-agent:") for r in rules)
    # kube-proxy's and the CNI's rules (quoted comments, marks) are not ours
    assert not any("cni" in r.rule or "kube" in r.rule for r in rules)
    count_out = [r for r in rules if r.comment.startswith("node-health-agent:internet-out:count:")]
    assert len(count_out) == 1 and count_out[0].bytes > 500_000 and count_out[0].packets > 0
    udp = [r for r in rules if r.chain == "INPUT" and "-p udp" in r.rule]
    assert len(udp) == 1 and udp[0].position == 3  # the hand-added duplicate, after the foreign ssh rule


def test_mangle_without_counters() -> None:
    recs = twin((FIXTURES / "nft-save-mangle.txt").read_bytes())
    assert {r.kind for r in recs} == {iptsave.KIND_CHAIN, iptsave.KIND_RULE_NO_COUNTERS}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            '[7:420] -A OUTPUT -m comment --comment "node-health-agent:internet-out:jump" -j NODE-HEALTH-INTERNET-OUT',
            (1, 1, 7, 420, "OUTPUT", "node-health-agent:internet-out:jump"),
            id="quoted comment",
        ),
        pytest.param(
            "-A INPUT -m comment --comment node-health-agent:x -j RETURN",
            (2, 1, 0, 0, "INPUT", "node-health-agent:x"),
            id="bare comment, no counters",
        ),
        pytest.param(
            '[1:2] -A INPUT -m comment --comment "node-health-agent:a \\"b\\" \\\\ c"',
            (1, 1, 1, 2, "INPUT", 'node-health-agent:a "b" \\ c'),
            id="escapes as xtables_save_string writes them",
        ),
        pytest.param(
            '[1:2] -A INPUT -m comment --comment "node-"health-agent:spliced',
            None,
            id="closing quote ends the token",
        ),
        pytest.param(
            '[1:2] -A INPUT -m comment --comment node-"health-agent:x y"',
            (1, 1, 1, 2, "INPUT", "node-health-agent:x y"),
            id="opening quote inside a token",
        ),
        pytest.param(
            '[1:2] -A NODE-HEALTH-INTERNET-IN -s 10.0.0.0/8 -j RETURN',
            (1, 1, 1, 2, "NODE-HEALTH-INTERNET-IN", ""),
            id="rule in our chain without a comment",
        ),
        pytest.param('[1:2] -A INPUT -m comment --comment "node-health-agent:open', None, id="unclosed quote"),
        pytest.param("[1:x] -A INPUT -m comment --comment node-health-agent:x", None, id="bad counters"),
        pytest.param("[18446744073709551616:0] -A INPUT --comment node-health-agent:x", None, id="counter overflow"),
        pytest.param("[1:2] -I INPUT --comment node-health-agent:x", None, id="not an append"),
        pytest.param('-A INPUT -m comment --comment "kube: node-health-agent:x"', None, id="prefix not at start"),
        pytest.param("-A INPUT --log-prefix --comment -j LOG", None, id="comment option without ours"),
    ],
)
def test_rule_lines(line: str, expected: tuple | None) -> None:
    recs = native_vs_twin("iptables_save", f"*mangle\n{line}\nCOMMIT\n".encode())
    got = [(r.kind, r.position, r.packets, r.bytes, r.chain, r.comment) for r in recs]
    assert got == ([] if expected is None else [expected])


def test_index_counts_every_rule_of_the_chain() -> None:
    dump = b"""*mangle
:NODE-HEALTH-INTERNET-IN - [3:4]
[0:0] -A INPUT -j FOREIGN
[0:0] -A INPUT -m comment --comment "node-health-agent:internet-in:jump" -j NODE-HEALTH-INTERNET-IN
[0:0] -A OUTPUT -m comment --comment "node-health-agent:internet-out:jump" -j NODE-HEALTH-INTERNET-OUT
COMMIT
*filter
[0:0] -A OUTPUT -m comment --comment "node-health-agent:elsewhere"
COMMIT
"""
    recs = native_vs_twin("iptables_save", dump)
    assert [(r.table, r.chain, r.position) for r in recs] == [
        ("mangle", "NODE-HEALTH-INTERNET-IN", 0),
        ("mangle", "INPUT", 2),
        ("mangle", "OUTPUT", 1),
        ("filter", "OUTPUT", 1),
    ]
    assert (recs[0].packets, recs[0].bytes, recs[0].rule) == (3, 4, "-")


_FRAGMENTS = [
    b" ", b"\t", b'"', b"\\", b"[", b"]", b":", b"0", b"42", b"-A", b"--comment", b"-j", b"\n", b"\r", b"\0",
    b"NODE-HEALTH-", b"node-health-agent:", b"*mangle", b"*", b"COMMIT", b"#", b"18446744073709551616", b"\xff",
    b"INPUT", b"'",
]
_LINES = st.lists(st.sampled_from(_FRAGMENTS), max_size=24).map(b"".join)


@pytest.mark.native_fallback  # a NUL in a string: the twin answers, checked per call
@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_LINES, max_size=10).map(b"\n".join))
def test_generated_dumps_agree(native_parse, data: bytes) -> None:
    native_vs_twin("iptables_save", data, native_parse)


@pytest.mark.native_fallback  # a NUL in a string: the twin answers, checked per call
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_agree(native_parse, data: bytes) -> None:
    native_vs_twin("iptables_save", data, native_parse)
