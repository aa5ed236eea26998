"""Reachability: real TCP listeners on loopback and in namespaces the test creates."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from netns_helpers import VethPair, netns, runner, unique, veth_pair, write_config

from agent.check import CheckContext
from agent.network.reach import default_targets, target
from agent.checks.network import NetworkCheck, NetworkConfig
from agent.config import defaults
from agent.hostpaths import HostPaths


def make_check(tmp: Path, targets: list[str], connect_timeout: float = 0.5) -> NetworkCheck:
    cfg = NetworkConfig(interfaces=("lo",), targets=tuple(targets), connect_timeout=connect_timeout, connect_interval=0)
    return NetworkCheck(CheckContext(HostPaths(), str(tmp), defaults()), cfg)


def findings(check: NetworkCheck) -> dict[tuple[str, str], str]:
    return {(f.subject, f.reason): f.message for f in check.run().findings}


def listening(family: int = socket.AF_INET, host: str = "127.0.0.1", backlog: int = 16) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen(backlog)
    return s


def test_listener_reachable_closed_reopened(tmp_path: Path) -> None:
    with ExitStack() as stack:
        first = stack.enter_context(listening())
        port = first.getsockname()[1]
        t = f"127.0.0.1:{port}"
        check = make_check(tmp_path, [t])
        obs = check.run()
        assert not obs.findings
        samples = {s.name: s.value for s in obs.samples if s.labels == (("target", t),)}
        assert samples["node_health_network_target_reachable"] == 1
        assert samples["node_health_network_target_connect_duration_seconds"] > 0
        assert obs.subjects[t].startswith("reachable in")

        first.close()
        holder = stack.enter_context(socket.socket())  # keeps the port: bound, not listening, so refused
        holder.bind(("127.0.0.1", port))
        got = findings(check)
        assert set(got) == {(t, "TargetUnreachable")}
        assert got[(t, "TargetUnreachable")] == "connection refused (127.0.0.1)"

        holder.listen(16)
        assert findings(check) == {}


def test_ipv6_loopback_target(tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        s = listening(socket.AF_INET6, "::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with s:
        assert findings(make_check(tmp_path, [f"[::1]:{s.getsockname()[1]}"])) == {}


def test_full_backlog_connect_is_bounded_by_connect_timeout(tmp_path: Path) -> None:
    # A listener whose accept queue is full drops SYNs (tcp_conn_request: "sk_acceptq_is_full"):
    # the connect hangs in SYN_SENT exactly as against a blackholed address.
    with ExitStack() as stack:
        server = stack.enter_context(listening(backlog=0))
        addr = server.getsockname()
        while True:
            c = stack.enter_context(socket.socket())
            c.settimeout(0.2)
            try:
                c.connect(addr)
            except TimeoutError:
                break
        t = f"127.0.0.1:{addr[1]}"
        got = findings(make_check(tmp_path, [t], connect_timeout=0.3))
        # not TargetProbeHung: the probe's own timeout ended it, not the prober's deadline
        assert got == {(t, "TargetUnreachable"): "connect timed out after 0.3s (127.0.0.1)"}


def test_many_targets_probed_at_once(tmp_path: Path) -> None:
    with ExitStack() as stack:
        live = [stack.enter_context(listening()) for _ in range(3)]
        targets = [f"127.0.0.1:{s.getsockname()[1]}" for s in live]
        check = make_check(tmp_path, targets)
        obs = check.run()
        assert not obs.findings and all(t in obs.subjects for t in targets)
        assert sorted(check.known_findings()) == sorted(
            [
                ("lo", r)
                for r in (
                    "InterfaceMissing",
                    "LinkAdminDown",
                    "LinkDown",
                    "LinkFlapping",
                    "LinkStateUnknown",
                    "InterfaceCountersUnknown",
                    "LinkErrors",
                    "LinkDrops",
                )
            ]
            + [(t, r) for t in targets for r in ("TargetUnreachable", "TargetProbeHung")]
        )


def test_connect_interval_reuses_the_last_probe(tmp_path: Path) -> None:
    now = [0.0]
    with listening() as s:
        t = f"127.0.0.1:{s.getsockname()[1]}"
        cfg = NetworkConfig(interfaces=(), targets=(t,), connect_timeout=0.5, connect_interval=60)
        check = NetworkCheck(CheckContext(HostPaths(), str(tmp_path), defaults()), cfg, clock=lambda: now[0])
        assert not check.run().findings
    now[0] = 30.0
    assert not check.run().findings  # closed since, but not probed again yet
    now[0] = 61.0
    assert [(f.subject, f.reason) for f in check.run().findings] == [(t, "TargetUnreachable")]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
            ("10.96.0.1:443",),
            id="in a pod",
        ),
        pytest.param(
            {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"},
            ("[fd00:10:96::1]:443",),
            id="IPv6 cluster",
        ),
        pytest.param({}, (), id="not in a cluster"),
        pytest.param({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, (), id="no port"),
        pytest.param(
            {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "https"}, (), id="port not a number"
        ),
    ],
)
def test_default_target_is_the_api_server_in_a_pod(env: dict[str, str], expected: tuple[str, ...]) -> None:
    assert default_targets(env) == expected


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        pytest.param("10.0.0.1:443", True, id="IPv4"),
        pytest.param("api.example.com:6443", True, id="name"),
        pytest.param("[::1]:443", True, id="IPv6 in brackets"),
        pytest.param("[fe80::1%eth0]:22", True, id="IPv6 with zone"),
        pytest.param("::1:443", False, id="IPv6 without brackets"),
        pytest.param("[api.example.com]:443", False, id="name in brackets"),
        pytest.param("10.0.0.1", False, id="no port"),
        pytest.param("10.0.0.1:0", False, id="port 0"),
        pytest.param("10.0.0.1:65536", False, id="port too large"),
        pytest.param(":443", False, id="no host"),
        pytest.param("a b:443", False, id="space in host"),
    ],
)
def test_target_validation(value: str, ok: bool) -> None:
    assert (target(value) is None) is ok


# ---------------------------------------------------------------- in namespaces


@pytest.fixture
def pair() -> Iterator[VethPair]:
    with veth_pair() as p:
        yield p


@pytest.mark.privileged
def test_dropped_syns_time_out_and_no_route_is_named(pair: VethPair, tmp_path: Path) -> None:
    pair.b.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "443", "-j", "DROP")
    blackholed, unrouted = f"{pair.b_addr}:443", "192.0.2.1:80"
    cfg = write_config(
        tmp_path / "agent.toml",
        {
            "interfaces": [pair.a_if],
            "targets": [blackholed, unrouted],
            "connect_timeout": "300ms",
            "connect_interval": "0s",
        },
    )
    with runner(pair.a, cfg, str(tmp_path)) as r:
        res = r.run()
        assert res.reasons == {(blackholed, "TargetUnreachable"), (unrouted, "TargetUnreachable")}
        assert (
            res.finding(blackholed, "TargetUnreachable")["message"] == f"connect timed out after 0.3s ({pair.b_addr})"
        )
        assert res.finding(unrouted, "TargetUnreachable")["message"] == "network unreachable (no route) (192.0.2.1)"
        assert res.sample("node_health_network_target_reachable", target=blackholed) == 0


@pytest.mark.privileged
def test_name_that_does_not_resolve_is_unreachable(tmp_path: Path) -> None:
    with netns() as ns:
        ns.etc(
            "resolv.conf", "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
        )  # nothing answers: refused at once
        t = f"{unique('nha-')}.example:443"
        cfg = write_config(tmp_path / "agent.toml", {"interfaces": ["lo"], "targets": [t], "connect_interval": "0s"})
        with runner(ns, cfg, str(tmp_path)) as r:
            res = r.run()
            assert res.reasons == {(t, "TargetUnreachable")}
            assert res.finding(t, "TargetUnreachable")["message"].startswith("DNS resolution failed: ")


@pytest.mark.privileged
def test_resolver_that_never_answers_times_out_then_is_a_stuck_probe(tmp_path: Path) -> None:
    with netns() as ns:
        ns.etc("resolv.conf", "nameserver 127.0.0.1\noptions timeout:2 attempts:1\n")
        ns.run("iptables", "-A", "INPUT", "-p", "udp", "--dport", "53", "-j", "DROP")
        t = f"{unique('nha-')}.example:443"
        cfg = write_config(
            tmp_path / "agent.toml",
            {
                "interfaces": ["lo"],
                "targets": [t],
                "connect_timeout": "200ms",
                "connect_interval": "0s",
            },
        )
        with runner(ns, cfg, str(tmp_path)) as r:
            res = r.run()
            assert res.reasons == {(t, "TargetUnreachable")}
            assert res.finding(t, "TargetUnreachable")["message"] == "DNS resolution timed out after 0.2s"
            # getaddrinfo cannot be interrupted: while it runs, the target is not probed
            # again (one thread, not one per run) and the result is unknown
            stuck = r.run()
            assert stuck.reasons == {(t, "TargetProbeHung")} and stuck.data["threads"] == res.data["threads"]
            f = stuck.finding(t, "TargetProbeHung")
            assert f["unknown"] and f["message"].startswith("the previous probe is still resolving the name after")
            assert stuck.sample("node_health_network_target_reachable", target=t) is None
            # once the resolver gave up (2 s), the next run probes again
            for _ in range(100):
                time.sleep(0.1)
                res = r.run()
                if res.reasons != {(t, "TargetProbeHung")}:
                    break
            assert res.reasons == {(t, "TargetUnreachable")}
