"""Link state over netlink, on the real kernel: veth pairs in namespaces the test creates."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require_tool
from netns_helpers import Result, VethPair, runner, unique, veth_pair, write_config

from agent.check import CheckContext
from agent.network import links
from agent.network.links import REMEMBERED, FlapWindow, _remembered, interface_name
from agent.checks.network import NetworkCheck, NetworkConfig
from agent.config import defaults
from agent.hostpaths import HostPaths


def until(run, predicate, tries: int = 50, pause: float = 0.1) -> Result:
    """Run the check until `predicate` holds: operstate follows carrier through the
    kernel's linkwatch work, up to a second later (net/core/link_watch.c)."""
    res = run()
    for _ in range(tries):
        if predicate(res):
            return res
        time.sleep(pause)
        res = run()
    return res


@pytest.fixture
def pair():
    with veth_pair() as p:
        yield p


@pytest.mark.privileged
def test_peer_down_is_link_down_and_back_up_clears(pair: VethPair, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "agent.toml", {"interfaces": [pair.a_if]})
    with runner(pair.a, cfg, str(tmp_path)) as r:
        first = r.run()
        assert first.reasons == set()
        assert first.sample("node_health_network_link_carrier", device=pair.a_if) == 1
        assert first.sample("node_health_network_link_operstate", device=pair.a_if, operstate="up") == 1
        assert first.data["subjects"][pair.a_if].startswith("up, carrier")

        pair.b.ip("link", "set", pair.b_if, "down")
        down = until(r.run, lambda res: (pair.a_if, "LinkDown") in res.reasons)
        assert (pair.a_if, "LinkDown") in down.reasons
        assert down.finding(pair.a_if, "LinkDown")["severity"] == "critical"
        assert "no carrier" in down.finding(pair.a_if, "LinkDown")["message"]
        assert down.sample("node_health_network_link_carrier", device=pair.a_if) == 0
        assert down.sample("node_health_network_link_admin_up", device=pair.a_if) == 1

        pair.b.ip("link", "set", pair.b_if, "up")
        back = until(r.run, lambda res: not res.reasons)
        assert back.reasons == set()
        assert back.sample("node_health_network_link_operstate", device=pair.a_if, operstate="up") == 1


@pytest.mark.privileged
def test_own_end_set_down_is_admin_down_not_link_down(pair: VethPair, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "agent.toml", {"interfaces": [pair.a_if]})
    with runner(pair.a, cfg, str(tmp_path)) as r:
        pair.a.ip("link", "set", pair.a_if, "down")
        res = r.run()
        assert res.reasons == {(pair.a_if, "LinkAdminDown")}
        assert res.sample("node_health_network_link_admin_up", device=pair.a_if) == 0


@pytest.mark.privileged
def test_configured_interface_that_does_not_exist_is_missing(pair: VethPair, tmp_path: Path) -> None:
    ghost = unique("ngh")
    cfg = write_config(tmp_path / "agent.toml", {"interfaces": [pair.a_if, ghost]})
    with runner(pair.a, cfg, str(tmp_path)) as r:
        res = r.run()
        assert res.reasons == {(ghost, "InterfaceMissing")}
        assert res.finding(ghost, "InterfaceMissing")["severity"] == "critical"
        # the peer is moved away (as a driver unbind or a rename would): missing, then back
        pair.a.ip("link", "set", pair.a_if, "name", ghost)
        res = r.run()
        assert res.reasons == {(pair.a_if, "InterfaceMissing")}


@pytest.mark.privileged
def test_bouncing_carrier_is_flapping_within_the_window(pair: VethPair, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "agent.toml", {"interfaces": [pair.a_if], "flap_threshold": 2, "flap_window": "1h"})
    with runner(pair.a, cfg, str(tmp_path)) as r:
        assert r.run().reasons == set()
        for _ in range(2):  # two bounces: four carrier changes
            pair.b.ip("link", "set", pair.b_if, "down")
            pair.b.ip("link", "set", pair.b_if, "up")
        res = until(r.run, lambda res: (pair.a_if, "LinkDown") not in res.reasons)
        assert (pair.a_if, "LinkFlapping") in res.reasons
        assert "4 carrier changes" in res.finding(pair.a_if, "LinkFlapping")["message"]
        # a later run with no new change still sees them inside the window
        assert (pair.a_if, "LinkFlapping") in r.run().reasons


@pytest.mark.privileged
def test_runs_leak_no_file_descriptor_or_thread(pair: VethPair, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "agent.toml", {"interfaces": [pair.a_if]})
    with runner(pair.a, cfg, str(tmp_path)) as r:
        first = r.run()
        for _ in range(30):
            last = r.run()
        assert (last.data["fds"], last.data["threads"]) == (first.data["fds"], first.data["threads"])


@pytest.mark.privileged
def test_selftest_in_the_namespace_exits_1_on_link_down(pair: VethPair, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "agent.toml", {"interfaces": [pair.a_if]})
    cmd = ["ip", "netns", "exec", pair.a.name, sys.executable, "-m", "agent", "selftest", "--json", "--config", cfg]
    ok = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    pair.b.ip("link", "set", pair.b_if, "down")
    bad = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1, bad.stderr
    report = json.loads(bad.stdout)
    assert not report["healthy"]
    assert [(f["subject"], f["reason"]) for f in report["findings"] if f["check"] == "network"] == [
        (pair.a_if, "LinkDown")
    ]


@pytest.mark.privileged
def test_without_any_capability_the_check_still_sees_links(pair: VethPair, tmp_path: Path) -> None:
    """Part 7: nothing here needs a capability, so nothing may turn unknown without them."""
    setpriv = require_tool("setpriv")
    cfg = write_config(tmp_path / "agent.toml", {"interfaces": [pair.a_if]})
    pair.b.ip("link", "set", pair.b_if, "down")
    drop = [setpriv, "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--"]
    cmd = [
        "ip",
        "netns",
        "exec",
        pair.a.name,
        *drop,
        sys.executable,
        "-m",
        "agent",
        "selftest",
        "--json",
        "--config",
        cfg,
    ]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    findings = json.loads(res.stdout)["findings"]
    network = [(f["subject"], f["reason"], f["unknown"]) for f in findings if f["check"] == "network"]
    assert network == [(pair.a_if, "LinkDown", False)]


def fake_sysfs(root: Path, physical: list[str], virtual: list[str]) -> str:
    for name in physical + virtual:
        (root / "class/net" / name).mkdir(parents=True)
    for name in physical:
        (root / "class/net" / name / "device").symlink_to("../../../devices/pci0000:00/0000:00:03.0")
    return str(root)


@pytest.mark.privileged
def test_default_watches_physical_links_up_at_start_and_remembers_them(pair: VethPair, tmp_path: Path) -> None:
    # The veth stands in for a NIC: the fixture sysfs gives it a `device`; a second
    # "NIC" that netlink does not have, and a virtual one, are not chosen.
    absent = unique("nab")
    sysfs = fake_sysfs(tmp_path / "sys", physical=[pair.a_if, absent], virtual=[unique("nbr")])
    cfg = write_config(tmp_path / "agent.toml", {}, extra=f'\n[paths]\nsysfs = "{sysfs}"\n')
    state = tmp_path / "state"
    state.mkdir()
    with runner(pair.a, cfg, str(state)) as r:
        res = r.run()
        assert [tuple(k) for k in res.data["known"] if k[1] == "LinkDown"] == [(pair.a_if, "LinkDown")]
        assert res.reasons == set() and pair.a_if in res.data["subjects"]
    assert json.loads((state / REMEMBERED).read_text())["interfaces"] == [pair.a_if]

    pair.b.ip("link", "set", pair.b_if, "down")
    with runner(pair.a, cfg, str(state)) as r:  # a restart during the outage keeps watching the link
        assert (pair.a_if, "LinkDown") in r.run().reasons
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with runner(pair.a, cfg, str(fresh)) as r:  # without the memory, a down link is not chosen
        assert r.run().data["known"] == []


def test_memory_of_another_boot_is_ignored(tmp_path: Path) -> None:
    (tmp_path / REMEMBERED).write_text(json.dumps({"boot_id": "other-boot", "interfaces": ["eth9"]}))
    assert _remembered(str(tmp_path), "this-boot") == set()
    assert _remembered(str(tmp_path), "other-boot") == {"eth9"}


def test_corrupt_memory_is_ignored(tmp_path: Path) -> None:
    (tmp_path / REMEMBERED).write_text('{"boot_id": "b", "interfaces": ["ok0", "bad/name"]}')
    assert _remembered(str(tmp_path), "b") == {"ok0"}, "a name that cannot be an interface is left out"
    (tmp_path / REMEMBERED).write_text('{"boot_id": "b", "interfaces": ["ok0", 3]}')
    assert _remembered(str(tmp_path), "b") == set(), "another shape: set aside, started afresh"
    (tmp_path / REMEMBERED).write_text("{not json")
    assert _remembered(str(tmp_path), "b") == set()
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(f"{REMEMBERED}.bad-")]) == 2


def test_missing_interface_on_this_host_unprivileged(tmp_path: Path) -> None:
    ghost = unique("ngh")
    cfg = NetworkConfig(interfaces=("lo", ghost))
    check = NetworkCheck(CheckContext(HostPaths(), str(tmp_path), defaults()), cfg)
    obs = check.run()
    assert {(f.subject, f.reason) for f in obs.findings} == {(ghost, "InterfaceMissing")}
    assert "lo" in obs.subjects  # loopback: operstate "unknown" with carrier is a working link


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param([(0, 1, 7)], 0, id="first sample has no baseline"),
        pytest.param([(0, 1, 7), (15, 1, 9)], 2, id="one bounce"),
        pytest.param([(0, 1, 7), (15, 1, 9), (400, 1, 9)], 0, id="bounce slid out of the window"),
        pytest.param([(0, 1, 7), (200, 1, 9), (400, 1, 11)], 4, id="two bounces within the window"),
        pytest.param([(0, 1, 7), (15, 2, 1)], 0, id="re-created link: new ifindex"),
        pytest.param([(0, 1, 7), (15, 1, 3)], 0, id="counter went backwards"),
    ],
)
def test_flap_window(samples: list[tuple[float, int, int]], expected: int) -> None:
    w = FlapWindow(300)
    changes = [w.changes(t, idx, total) for t, idx, total in samples]
    assert changes[-1] == expected


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        pytest.param("eth0", True, id="plain"),
        pytest.param("enp65s0f0np0", True, id="predictable name"),
        pytest.param("x" * 15, True, id="15 bytes"),
        pytest.param("x" * 16, False, id="16 bytes"),
        pytest.param("", False, id="empty"),
        pytest.param("eth0:1", False, id="alias colon"),
        pytest.param("a/b", False, id="slash"),
        pytest.param("eth 0", False, id="space"),
        pytest.param("..", False, id="dot dot"),
    ],
)
def test_interface_names(name: str, ok: bool) -> None:
    assert (interface_name(name) is None) is ok


@pytest.mark.parametrize("interfaces", [pytest.param((), id="default set"), pytest.param(("lo",), id="configured")])
def test_without_a_netlink_socket_links_are_unknown_not_faults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, interfaces: tuple[str, ...]
) -> None:
    def refused(*args: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(links.socket, "socket", refused)  # as a seccomp profile without AF_NETLINK would
    check = NetworkCheck(CheckContext(HostPaths(), str(tmp_path), defaults()), NetworkConfig(interfaces=interfaces))
    for _ in range(2):  # the default set is retried on every run
        [f] = check.run().findings
        assert (f.reason, f.unknown) == ("LinkStateUnknown", True)
        assert "cannot open a netlink socket: Permission denied" in f.message


# Answers the kernel could send, and what the reader makes of them (a bad one raises OSError,
# which the reader turns into LinkError and the check into LinkStateUnknown).
def _msg(kind: int, seq: int, body: bytes) -> bytes:
    data = links.NLMSGHDR.pack(links.NLMSGHDR.size + len(body), kind, 0, seq, 0) + body
    return data + b"\0" * (-len(data) % 4)


def _attr(kind: int, value: bytes) -> bytes:
    data = links.RTATTR.pack(links.RTATTR.size + len(value), kind) + value
    return data + b"\0" * (-len(data) % 4)


_LINK = links.IFINFOMSG.pack(0, 1, 7, links.IFF_UP | links.IFF_LOWER_UP, 0)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(_msg(links.RTM_NEWLINK, 5, _LINK + _attr(links.IFLA_OPERSTATE, b"\x06")
                          + _attr(links.IFLA_CARRIER, b"\x01") + _attr(links.IFLA_CARRIER_CHANGES, struct.pack("=I", 9))),
                     {"index": 7, "flags": 0x10001, "IFLA_OPERSTATE": 6, "IFLA_CARRIER": 1, "IFLA_CARRIER_CHANGES": 9},
                     id="a link"),
        pytest.param(_msg(links.RTM_NEWLINK, 5, _LINK + _attr(links.IFLA_OPERSTATE | 0x8000, b"\x02")),
                     {"index": 7, "flags": 0x10001, "IFLA_OPERSTATE": 2}, id="flag bits of the type are masked"),
        pytest.param(_msg(links.RTM_NEWLINK, 5, _LINK + links.RTATTR.pack(200, links.IFLA_CARRIER)),
                     {"index": 7, "flags": 0x10001}, id="an attribute longer than the message ends the list"),
        pytest.param(_msg(links.RTM_NEWLINK, 5, _LINK + _attr(links.IFLA_CARRIER_CHANGES, b"\x01")),
                     {"index": 7, "flags": 0x10001}, id="a short value is left out"),
        pytest.param(_msg(links.NLMSG_ERROR, 5, struct.pack("=i", -errno.ENODEV)), errno.ENODEV, id="no such device"),
        pytest.param(_msg(links.NLMSG_ERROR, 4, struct.pack("=i", -errno.ENODEV)), None, id="another request's answer"),
        pytest.param(_msg(links.NLMSG_ERROR, 5, struct.pack("=i", 0)), None, id="an acknowledgement"),
        pytest.param(b"", None, id="empty"),
        pytest.param(_msg(links.NLMSG_ERROR, 4, struct.pack("=i", -1)) + _msg(links.NLMSG_ERROR, 5, struct.pack("=i", -errno.EPERM)),
                     errno.EPERM, id="the second of two"),
    ],
)
def test_answers(data: bytes, expected: object) -> None:
    assert links.parse_answer(data, 5) == expected


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(links.NLMSGHDR.pack(400, links.RTM_NEWLINK, 0, 5, 0) + _LINK, id="longer than the datagram"),
        pytest.param(links.NLMSGHDR.pack(4, links.RTM_NEWLINK, 0, 5, 0), id="shorter than its header"),
        pytest.param(_msg(links.NLMSG_ERROR, 5, b"\x01"), id="a truncated error"),
    ],
)
def test_malformed_answers_raise_oserror(data: bytes) -> None:
    with pytest.raises(OSError):
        links.parse_answer(data, 5)


def test_the_request_names_the_link() -> None:
    data = links.request("eth0", 3)
    length, kind, flags, seq, _ = links.NLMSGHDR.unpack_from(data)
    assert (length, kind, flags, seq) == (len(data), links.RTM_GETLINK, links.NLM_F_REQUEST, 3)
    assert len(data) % 4 == 0
    assert data[links.NLMSGHDR.size + links.IFINFOMSG.size:] == _attr(links.IFLA_IFNAME, b"eth0\0")


_PARITY = """
import json, os
from pyroute2 import IPRoute
from agent.network.links import LinkReader
rows = []
with IPRoute(groups=0) as ipr, LinkReader() as reader:
    for name in sorted(os.listdir("/sys/class/net")):
        m = ipr.link("get", ifname=name)[0]
        flags, carrier, changes = int(m["flags"]), m.get("IFLA_CARRIER"), m.get("IFLA_CARRIER_CHANGES")
        theirs = [name, int(m["index"]), bool(flags & 0x1), bool(carrier), str(m.get("IFLA_OPERSTATE")).lower(), changes]
        s = reader.get(name)
        rows.append([theirs, [s.name, s.index, s.admin_up, s.carrier, s.operstate, s.carrier_changes]])
print(json.dumps(rows))
"""


@pytest.mark.privileged
def test_the_reader_answers_what_pyroute2_answers(pair: VethPair) -> None:
    """The twin of the pyroute2 reader it replaced (issue 29): the same fields for every link of the
    namespace: lo, one end whose peer is down (no carrier), a second veth pair admin down."""
    pair.a.ip("link", "add", "nhadown0", "type", "veth", "peer", "name", "nhadown1")
    pair.b.ip("link", "set", pair.b_if, "down")
    time.sleep(0.5)  # linkwatch sets operstate shortly after the carrier
    rows = json.loads(pair.a.run(sys.executable, "-c", _PARITY).stdout)
    assert sorted(r[0][0] for r in rows) == sorted(["lo", pair.a_if, "nhadown0", "nhadown1"])
    for theirs, ours in rows:
        assert ours == theirs
    states = {tuple(r[1][2:5]) for r in rows}  # (admin up, carrier, operstate)
    assert states == {(True, True, "unknown"), (True, False, "down"), (False, False, "down")}


def test_pyroute2_is_not_imported_even_when_links_are_read() -> None:
    code = (
        "import sys, agent.registry, agent.config;"
        "agent.registry.CATALOG.metrics; agent.config.defaults();"
        "from agent.network.links import LinkReader; LinkReader().get('lo');"
        "print('pyroute2' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert out.stdout.strip() == "False", out.stderr
