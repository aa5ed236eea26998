"""Port state, rate, count and vanished devices, on fixture sysfs trees (tests/support/ibtree.py).
Each finding's severity and action come from the catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from ibtree import DISABLED, DOWN, HDR, INIT, LINK_UP, POLLING, CX6DX, Clock, IbTree, make_check, reasons, value

from agent.findings import Severity
from agent.infiniband.catalog import CATALOG


@pytest.fixture
def tree(tmp_path: Path) -> IbTree:
    return IbTree(tmp_path / "host")


def test_a_healthy_node_of_8_ndr_ports_has_no_finding_and_exports_every_port(tree: IbTree, tmp_path: Path) -> None:
    tree.node(8)
    obs = make_check(tree, tmp_path / "state", Clock()).run()
    assert obs.findings == ()
    assert value(obs, "node_health_infiniband_ports", state="active") == 8
    assert value(obs, "node_health_infiniband_ports", state="present") == 8
    for i in range(8):
        labels = {"device": f"mlx5_{i}", "port": "1"}
        assert value(obs, "node_health_infiniband_port_active", **labels) == 1
        assert value(obs, "node_health_infiniband_port_state", **labels) == 4
        assert value(obs, "node_health_infiniband_port_phys_state", **labels) == 5
        assert value(obs, "node_health_infiniband_port_rate_bytes_per_second", **labels) == 50e9
        assert value(obs, "node_health_infiniband_port_info", **labels, link_layer="InfiniBand") == 1
    assert obs.subjects["mlx5_3/1"] == "ACTIVE, 400 Gb/s, InfiniBand"
    assert obs.subjects["infiniband"] == "8 of 8 ports ACTIVE"


def test_data_counters_are_exported_in_bytes_from_4_byte_words(tree: IbTree, tmp_path: Path) -> None:
    tree.node(1)
    tree.counters("mlx5_0", 1, port_xmit_data=1_000_000, port_rcv_data=250, port_xmit_packets=7)
    obs = make_check(tree, tmp_path / "state", Clock()).run()
    assert value(obs, "node_health_infiniband_port_transmit_bytes_total", device="mlx5_0") == 4_000_000
    assert value(obs, "node_health_infiniband_port_receive_bytes_total", device="mlx5_0") == 1000
    assert value(obs, "node_health_infiniband_port_transmit_packets_total", device="mlx5_0") == 7
    assert value(obs, "node_health_infiniband_port_errors_total", device="mlx5_0", counter="symbol_error") == 0
    assert value(obs, "node_health_infiniband_port_errors_total", device="mlx5_0", counter="rnr_nak_retry_err") == 0


@pytest.mark.parametrize(
    ("state", "phys", "reason"),
    [
        pytest.param(DOWN, POLLING, "IbPortDown", id="down, polling (no peer)"),
        pytest.param(DOWN, DISABLED, "IbPortDisabled", id="disabled"),
        pytest.param(INIT, LINK_UP, "IbPortInitializing", id="init: waiting for the subnet manager"),
    ],
)
def test_one_port_of_eight_not_active_is_an_outlier_among_its_peers(
    tree: IbTree, tmp_path: Path, state: str, phys: str, reason: str
) -> None:
    tree.node(8)
    tree.set("mlx5_5", 1, state=state, phys_state=phys)
    obs = make_check(tree, tmp_path / "state", Clock()).run()
    (f,) = obs.findings
    assert (f.subject, f.reason) == ("mlx5_5/1", reason)
    assert "7 of its 8 peers" in f.message
    entry = CATALOG.reason(reason)
    assert (f.severity, f.action) == (entry.severity, entry.action)
    assert value(obs, "node_health_infiniband_port_active", device="mlx5_5") == 0
    assert value(obs, "node_health_infiniband_ports", state="active") == 7


def test_a_port_down_past_drop_after_is_dropped_and_the_down_time_survives_a_restart(tree: IbTree, tmp_path: Path) -> None:
    tree.node(8)
    clock = Clock()
    make_check(tree, tmp_path / "state", clock).run()
    tree.set("mlx5_2", 1, state=DOWN, phys_state=POLLING)
    clock.advance(30)
    first = make_check(tree, tmp_path / "state", clock).run()
    assert reasons(first) >= {("mlx5_2/1", "IbPortDown")}
    clock.advance(210)  # a new check object: the agent restarted; the down spell is in the state dir
    still = make_check(tree, tmp_path / "state", clock).run()
    assert ("mlx5_2/1", "IbPortDown") in reasons(still)
    clock.advance(30)
    dropped = make_check(tree, tmp_path / "state", clock).run()
    f = next(f for f in dropped.findings if f.subject == "mlx5_2/1" and f.reason.startswith("IbPort"))
    assert (f.reason, f.severity, f.action) == ("IbPortDropped", Severity.CRITICAL, "drain_and_diagnose")
    assert "for 4m" in f.message


def test_a_port_at_200_among_400_is_rate_low(tree: IbTree, tmp_path: Path) -> None:
    tree.node(8)
    tree.set("mlx5_6", 1, rate=HDR)
    obs = make_check(tree, tmp_path / "state", Clock()).run()
    (f,) = obs.findings
    assert (f.subject, f.reason, f.severity, f.action) == ("mlx5_6/1", "IbPortRateLow", Severity.CRITICAL, "drain_and_diagnose")
    assert "200 Gb/s" in f.message and "400 Gb/s" in f.message


def test_min_rate_gbps_replaces_the_peers(tree: IbTree, tmp_path: Path) -> None:
    tree.node(2)
    tree.set("mlx5_0", 1, rate=HDR)
    tree.set("mlx5_1", 1, rate=HDR)
    assert make_check(tree, tmp_path / "s1", Clock()).run().findings == ()  # peers agree: all at 200
    obs = make_check(tree, tmp_path / "s2", Clock(), min_rate_gbps=400.0).run()
    assert reasons(obs) == {("mlx5_0/1", "IbPortRateLow"), ("mlx5_1/1", "IbPortRateLow")}


def test_fewer_active_ports_than_expected(tree: IbTree, tmp_path: Path) -> None:
    tree.node(7)
    obs = make_check(tree, tmp_path / "state", Clock(), expected_ports=8).run()
    (f,) = obs.findings
    assert (f.subject, f.reason, f.severity) == ("infiniband", "IbPortsMissing", Severity.CRITICAL)
    assert f.message.startswith("7 of 8 expected ports ACTIVE")
    assert value(obs, "node_health_infiniband_ports", state="expected") == 8


def test_a_port_never_active_whose_peers_are_down_too_is_not_a_finding(tree: IbTree, tmp_path: Path) -> None:
    """An uncabled, unused dual-port card: nothing says it should be up."""
    tree.node(8)
    tree.device("mlx5_8", CX6DX, ports=2, state=DOWN, phys=POLLING, link_layer="Ethernet")
    obs = make_check(tree, tmp_path / "state", Clock()).run()
    assert obs.findings == ()
    assert value(obs, "node_health_infiniband_port_info", device="mlx5_8", port="2", link_layer="Ethernet") == 1


def test_a_port_that_was_active_before_is_expected_even_without_peers(tree: IbTree, tmp_path: Path) -> None:
    tree.device("mlx5_0", CX6DX, ports=2, link_layer="Ethernet")
    clock = Clock()
    assert make_check(tree, tmp_path / "state", clock).run().findings == ()
    tree.set("mlx5_0", 1, state=DOWN, phys_state=POLLING)
    tree.set("mlx5_0", 2, state=DOWN, phys_state=POLLING)
    clock.advance(30)
    obs = make_check(tree, tmp_path / "state", clock).run()
    assert {("mlx5_0/1", "IbPortDown"), ("mlx5_0/2", "IbPortDown")} <= reasons(obs)
    assert all("it was ACTIVE before" in f.message for f in obs.findings if f.reason == "IbPortDown")


def test_a_roce_port_is_judged_among_roce_peers_only(tree: IbTree, tmp_path: Path) -> None:
    tree.node(8)
    tree.device("mlx5_8", CX6DX, ports=1, link_layer="Ethernet", rate="100 Gb/sec (4X EDR)")
    obs = make_check(tree, tmp_path / "state", Clock()).run()
    assert obs.findings == ()  # 100 Gb/s is not "below its peers": it has none of its kind
    assert value(obs, "node_health_infiniband_port_info", device="mlx5_8", link_layer="Ethernet") == 1
    assert obs.subjects["mlx5_8/1"] == "ACTIVE, 100 Gb/s, Ethernet"


def test_a_vanished_device_is_missing_after_a_restart_and_a_reboot(tree: IbTree, tmp_path: Path) -> None:
    tree.node(8)
    clock = Clock()
    make_check(tree, tmp_path / "state", clock).run()
    tree.remove("mlx5_4")
    tree.boot("a-new-boot")
    clock.advance(600)
    check = make_check(tree, tmp_path / "state", clock)
    assert ("mlx5_4", "IbDeviceMissing") in set(check.known_findings())
    obs = check.run()
    (f,) = obs.findings
    assert (f.subject, f.reason, f.severity, f.action) == ("mlx5_4", "IbDeviceMissing", Severity.CRITICAL, "reboot")
    assert value(obs, "node_health_infiniband_ports", state="present") == 7


def test_include_and_exclude_choose_the_ports(tree: IbTree, tmp_path: Path) -> None:
    tree.node(8)
    tree.set("mlx5_7", 1, state=DOWN, phys_state=POLLING)
    obs = make_check(tree, tmp_path / "state", Clock(), exclude=("mlx5_7",)).run()
    assert obs.findings == ()
    assert value(obs, "node_health_infiniband_ports", state="present") == 7
    obs = make_check(tree, tmp_path / "s2", Clock(), include=("mlx5_[0-3]/1",), expected_ports=4).run()
    assert value(obs, "node_health_infiniband_ports", state="present") == 4
    assert obs.findings == ()


def test_no_infiniband_class_is_not_applicable(tmp_path: Path) -> None:
    tree = IbTree(tmp_path / "host")
    tree.cls.rmdir()
    obs = make_check(tree, tmp_path / "state", Clock()).run()
    (f,) = obs.findings
    assert (f.reason, f.severity) == ("NotApplicable", Severity.INFO)


@pytest.mark.parametrize(
    ("attr", "text", "says"),
    [
        pytest.param("state", "ACTIVE", "cannot parse state", id="state without its number"),
        pytest.param("rate", "400 Gbps", "cannot parse rate", id="rate in another unit"),
    ],
)
def test_an_unparsable_attribute_is_unknown_not_a_fault(tree: IbTree, tmp_path: Path, attr: str, text: str, says: str) -> None:
    tree.node(2)
    tree.set("mlx5_1", 1, **{attr: text})
    (f,) = make_check(tree, tmp_path / "state", Clock()).run().findings
    assert (f.subject, f.reason, f.unknown) == ("mlx5_1/1", "IbPortUnreadable", True)
    assert says in f.message
