"""Issue 25 item 4: each parser of what a tenant or a peer controls (kmsg records any process can write with
/dev/kmsg, cgroup paths a container runtime names, the Cilium agent's answer) returns a value or its typed,
bounded error for any input, never another exception. The PodResources decoders: tests/gpu/test_gpu_podresources.py;
pod metadata and annotations: tests/traffic/test_traffic_tenant.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.gpu import cgroups
from agent.kmsg import parse_record
from agent.traffic.datapath import MAX_MODE, CiliumError, routing_mode

SOCK = "/run/cilium/cilium.sock"


@given(st.binary(max_size=4096))
@settings(max_examples=400, deadline=None)
def test_any_kmsg_record_parses(raw: bytes) -> None:
    rec = parse_record(raw)
    assert b"\n" not in rec.message and len(rec.message) <= len(raw)


@given(st.text(max_size=2000) | st.lists(st.sampled_from(
    ["0::/", "kubepods", "kubepods-burstable-pod", "pod", "_", "-", ".slice", "/", ":", "\n", "cri-containerd-",
     "docker-", ".scope", "..", "0123456789abcdef", "slurm", "job_", "uid_"]), max_size=60).map("".join))
@settings(max_examples=400, deadline=None)
def test_any_cgroup_text_names_an_owner(text: str) -> None:
    owner = cgroups.parse(text)
    assert owner.kind in (cgroups.OTHER, cgroups.UNIT, cgroups.CONTAINER, cgroups.JOB, cgroups.POD)
    assert "\n" not in owner.name and len(owner.name) <= len(text)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("body", [_nested(100_000), b'{"a":' * 100_000, b"\xff\xfe\x00", b"", b"null", b"[1, 2]",
                                  b'{"routing": "x"}', b'{"routing": {"intra-host-routing-mode": 7}}'])
def test_cilium_garbage_is_none_or_a_cilium_error(body: bytes) -> None:
    """Deeply nested JSON (RecursionError before: the traffic check failed) and garbage: CiliumError naming the
    socket, or "does not say"."""
    try:
        assert routing_mode(body, SOCK) is None
    except CiliumError as exc:
        assert SOCK in str(exc) and len(str(exc)) < 400


@given(st.binary(max_size=2000) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=50),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.sampled_from(
        ["routing", "intra-host-routing-mode", "x"]), kids, max_size=3), max_leaves=30).map(
    lambda v: json.dumps(v).encode()))
@settings(max_examples=300, deadline=None)
def test_any_cilium_answer_is_a_mode_or_a_cilium_error(body: bytes) -> None:
    try:
        mode = routing_mode(body, SOCK)
    except CiliumError as exc:
        assert SOCK in str(exc) and len(str(exc)) < 400
    else:
        assert mode is None or (isinstance(mode, str) and 0 < len(mode) <= MAX_MODE)


def test_cilium_says_its_mode() -> None:
    assert routing_mode(b'{"routing": {"intra-host-routing-mode": "BPF"}}', SOCK) == "BPF"
