"""Error and drop rates from /proc/net/dev, on fixture procfs trees read through HostPaths."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.check import CheckContext
from agent.network.counters import RateTracker, read_net_dev
from agent.checks.network import NetworkCheck, NetworkConfig
from agent.config import defaults
from agent.hostpaths import HostPaths

HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
)


def net_dev(**ifaces: tuple[int, int, int, int, int, int, int, int]) -> str:
    """Lines in the kernel's format; per interface (rx bytes, packets, errs, drop, tx bytes, packets, errs, drop)."""
    lines = [HEADER]
    for name, (rb, rp, re, rd, tb, tp, te, td) in ifaces.items():
        lines.append(
            f"{name:>6}: {rb:>8} {rp:>7} {re:>4} {rd:>4}    0     0          0         0 "
            f"{tb:>8} {tp:>7} {te:>4} {td:>4}    0     0       0          0\n"
        )
    return "".join(lines)


class FixtureHost:
    """A procfs fixture tree the test rewrites between runs, and a clock it moves."""

    def __init__(self, root: Path) -> None:
        (root / "proc/net").mkdir(parents=True)
        self.paths = HostPaths(procfs=str(root / "proc"))
        self.file = root / "proc/net/dev"
        self.now = 1000.0

    def write(self, text: str, after: float = 0.0) -> None:
        self.file.write_text(text)
        self.now += after

    def check(self, tmp: Path, **cfg: object) -> NetworkCheck:
        # `lo` exists in every network namespace and passes traffic, so only the counters can raise findings.
        config = NetworkConfig(interfaces=("lo",), **cfg)  # type: ignore[arg-type]
        return NetworkCheck(CheckContext(self.paths, str(tmp), defaults()), config, clock=lambda: self.now)


@pytest.fixture
def host(tmp_path: Path) -> FixtureHost:
    return FixtureHost(tmp_path / "host")


def reasons(check: NetworkCheck) -> set[tuple[str, str]]:
    return {(f.subject, f.reason) for f in check.run().findings}


def test_fixture_is_parsed_through_host_paths(host: FixtureHost) -> None:
    host.write(net_dev(lo=(1, 2, 3, 4, 5, 6, 7, 8), eth0=(10, 20, 0, 0, 30, 40, 0, 0)))
    stats = read_net_dev(host.paths)
    assert set(stats) == {"lo", "eth0"}
    assert (stats["lo"].rx_errs, stats["lo"].rx_drop, stats["lo"].tx_errs, stats["lo"].tx_drop) == (3, 4, 7, 8)


@pytest.mark.parametrize(
    ("before", "after", "seconds", "errors", "drops"),
    [
        pytest.param(
            (0, 0, 10, 5, 0, 0, 20, 5), (0, 0, 40, 5, 0, 0, 20, 35), 15, 2.0, 2.0, id="rx errors and tx drops"
        ),
        pytest.param((0, 0, 10, 5, 0, 0, 20, 5), (0, 0, 10, 5, 0, 0, 20, 5), 15, 0.0, 0.0, id="quiet link"),
        pytest.param((0, 0, 0, 0, 0, 0, 0, 0), (0, 0, 3, 0, 0, 0, 3, 0), 2, 3.0, 0.0, id="rx plus tx errors"),
    ],
)
def test_rates(before, after, seconds: float, errors: float, drops: float) -> None:
    host_stats = [read(net_dev(lo=v))["lo"] for v in (before, after)]
    t = RateTracker()
    assert t.update("lo", host_stats[0], 100.0) is None
    r = t.update("lo", host_stats[1], 100.0 + seconds)
    assert r is not None and (r.errors, r.drops, r.seconds) == (errors, drops, seconds)


def read(text: str):
    from agent.native import parse_net_dev

    return {s.name: s for s in parse_net_dev(text.encode())}


@pytest.mark.parametrize(
    ("after", "ifindex"),
    [
        pytest.param((5, 1, 0, 0, 5, 1, 0, 0), 1, id="counters went back to near zero"),
        pytest.param((900, 90, 9, 9, 900, 90, 9, 9), 2, id="re-created: new ifindex, counters grew anyway"),
    ],
)
def test_reset_gives_no_rate_then_a_new_baseline(after, ifindex: int) -> None:
    t = RateTracker()
    t.update("eth0", read(net_dev(eth0=(800, 80, 8, 8, 800, 80, 8, 8)))["eth0"], 0.0, 1)
    assert t.update("eth0", read(net_dev(eth0=after))["eth0"], 15.0, ifindex) is None
    grown = tuple(v + 30 for v in after)
    r = t.update("eth0", read(net_dev(eth0=grown))["eth0"], 30.0, ifindex)
    assert r is not None and r.errors == 4.0 and r.drops == 4.0


def test_error_rate_raises_and_clears(host: FixtureHost, tmp_path: Path) -> None:
    check = host.check(tmp_path, error_rate_warning=1.0, drop_rate_warning=100.0)
    host.write(net_dev(lo=(0, 0, 100, 0, 0, 0, 0, 0)))
    assert reasons(check) == set()  # first run: a baseline, no rate
    host.write(net_dev(lo=(0, 0, 130, 0, 0, 0, 0, 0)), after=15)
    obs = check.run()
    [f] = obs.findings
    assert (f.subject, f.reason, f.severity.value) == ("lo", "LinkErrors", "warning")
    assert "2 errors/s (rx 2, tx 0) over 15s" in f.message
    host.write(net_dev(lo=(0, 0, 130, 0, 0, 0, 0, 0)), after=15)
    assert reasons(check) == set()


def test_drops_below_default_threshold_are_quiet(host: FixtureHost, tmp_path: Path) -> None:
    check = host.check(tmp_path)
    host.write(net_dev(lo=(0, 0, 0, 1000, 0, 0, 0, 0)))
    check.run()
    host.write(net_dev(lo=(0, 0, 0, 1750, 0, 0, 0, 0)), after=15)  # 50 drops/s: benign on a busy host
    assert reasons(check) == set()
    host.write(net_dev(lo=(0, 0, 0, 3250, 0, 0, 0, 300)), after=15)  # 120 drops/s
    assert reasons(check) == {("lo", "LinkDrops")}


def test_zero_threshold_turns_the_rate_off(host: FixtureHost, tmp_path: Path) -> None:
    check = host.check(tmp_path, error_rate_warning=0, drop_rate_warning=0)
    host.write(net_dev(lo=(0, 0, 0, 0, 0, 0, 0, 0)))
    check.run()
    host.write(net_dev(lo=(0, 0, 9000, 9000, 0, 0, 0, 0)), after=1)
    assert reasons(check) == set()
    assert not {r for _, r in check.known_findings()} & {"LinkErrors", "LinkDrops"}


def test_counter_reset_is_not_a_negative_rate(host: FixtureHost, tmp_path: Path) -> None:
    check = host.check(tmp_path, error_rate_warning=0.001, drop_rate_warning=0.001)
    host.write(net_dev(lo=(10**12, 10**9, 5000, 5000, 10**12, 10**9, 5000, 5000)))
    check.run()
    host.write(net_dev(lo=(100, 1, 0, 0, 100, 1, 0, 0)), after=15)  # driver reset
    assert reasons(check) == set()
    host.write(net_dev(lo=(200, 2, 0, 0, 200, 2, 0, 0)), after=15)
    assert reasons(check) == set()


def test_counters_exported_as_the_kernel_gives_them(host: FixtureHost, tmp_path: Path) -> None:
    check = host.check(tmp_path)
    host.write(net_dev(lo=(1, 2, 3, 4, 5, 6, 7, 8)))
    got = {s.name: s.value for s in check.run().samples if s.labels == (("device", "lo"),)}
    assert {
        k: v for k, v in got.items() if k.startswith(("node_health_network_receive", "node_health_network_transmit"))
    } == {
        "node_health_network_receive_bytes_total": 1,
        "node_health_network_receive_packets_total": 2,
        "node_health_network_receive_errors_total": 3,
        "node_health_network_receive_drops_total": 4,
        "node_health_network_transmit_bytes_total": 5,
        "node_health_network_transmit_packets_total": 6,
        "node_health_network_transmit_errors_total": 7,
        "node_health_network_transmit_drops_total": 8,
    }


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(None, "cannot read", id="file missing"),
        pytest.param(net_dev(eth0=(0,) * 8), "not in", id="interface absent from the file"),
    ],
)
def test_unreadable_counters_are_unknown_not_a_fault(host: FixtureHost, tmp_path: Path, content, expected: str) -> None:
    if content is not None:
        host.write(content)
    [f] = host.check(tmp_path).run().findings
    assert (f.subject, f.reason, f.unknown) == ("lo", "InterfaceCountersUnknown", True)
    assert expected in f.message
