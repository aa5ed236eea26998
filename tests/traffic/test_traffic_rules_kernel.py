"""`agent rules install|show|remove` against the real kernel, in namespaces the
tests create, with both backends: idempotent, ours only, nothing left behind."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import require_tool
from traffic_lab import FOREIGN, OUR_LINE, Netns, namespaces, without_ours

pytestmark = pytest.mark.privileged
BACKENDS = [pytest.param("legacy", id="legacy"), pytest.param("nft", id="nft")]


@pytest.fixture
def node():
    require_tool("iptables-legacy")
    require_tool("iptables-nft")
    with namespaces("node") as ns:
        yield ns["node"]


def dumps(node: Netns, backend: str) -> str:
    """Both families, every table, as iptables-save prints them (counters zeroed)."""
    text = node.save(backend, "-c") + node.run(f"ip6tables-{backend}-save", "-c").stdout
    return re.sub(r"\[\d+:\d+\]", "[]", "\n".join(line for line in text.splitlines() if not line.startswith("#")))


def ours(node: Netns, backend: str) -> list[str]:
    return [line for line in dumps(node, backend).splitlines() if OUR_LINE.search(line)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_install_is_idempotent(node: Netns, backend: str) -> None:
    first = node.agent("rules", "install", "--backend", backend)
    assert "ipv4: installed" in first.stdout
    installed = dumps(node, backend)
    assert len(ours(node, backend)) == 16  # 4 chains (internet, pod), 4 jumps, 2 x (loopback, internal, count, pod jump)
    again = node.agent("rules", "install", "--backend", backend)
    assert "ipv4: already in place" in again.stdout
    assert dumps(node, backend) == installed  # same rules, same generation: counters keep counting
    # python-iptables probes every table to resolve a jump; no legacy table but mangle may appear
    assert re.findall(r"^\*(\w+)", node.save("legacy"), re.M) == (["mangle"] if backend == "legacy" else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_foreign_rules_untouched_by_install_repair_remove(node: Netns, backend: str) -> None:
    node.run(f"iptables-{backend}-restore", "--noflush", stdin=FOREIGN.encode())
    theirs = without_ours(dumps(node, backend))
    assert any("cni: pod egress" in line for line in theirs)

    node.agent("rules", "install", "--backend", backend)
    assert without_ours(dumps(node, backend)) == theirs
    ipt = f"iptables-{backend}"
    node.run(ipt, "-t", "mangle", "-D", "OUTPUT", "-m", "comment", "--comment", "node-health-agent:internet-out:jump",
             "-j", "NODE-HEALTH-INTERNET-OUT")
    node.run(ipt, "-t", "mangle", "-F", "NODE-HEALTH-INTERNET-IN")
    repaired = node.agent("rules", "install", "--backend", backend)
    assert "ipv4: repaired" in repaired.stdout
    assert without_ours(dumps(node, backend)) == theirs
    assert len(ours(node, backend)) == 16

    node.agent("rules", "remove", "--backend", backend)
    assert without_ours(dumps(node, backend)) == theirs
    assert ours(node, backend) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_remove_leaves_nothing_of_ours(node: Netns, backend: str, tmp_path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[checks.traffic]\ninternal_ranges = ["10.0.0.0/8", "fd00::/8"]\n')
    node.agent("rules", "install", "--backend", backend, "--config", str(cfg))
    lines = ours(node, backend)
    assert any("fd00::/8" in line for line in lines) and any("10.0.0.0/8" in line for line in lines)
    node.run(f"iptables-{backend}", "-t", "mangle", "-A", "PREROUTING", "-m", "comment", "--comment",
             "node-health-agent:internet-in:jump", "-j", "NODE-HEALTH-INTERNET-IN")  # a stray copy
    res = node.agent("rules", "remove")
    assert "ipv4: removed" in res.stdout and "ipv6: removed" in res.stdout
    assert ours(node, backend) == []
    assert "nothing of ours" in node.agent("rules", "remove").stdout


def test_never_in_both_backends(node: Netns) -> None:
    node.agent("rules", "install", "--backend", "legacy")
    res = node.agent("rules", "install", "--backend", "nft")
    assert "removed the rules of ours from iptables-legacy ipv4" in res.stdout
    assert ours(node, "legacy") == [] and len(ours(node, "nft")) == 16


@pytest.mark.parametrize("backend", BACKENDS)
def test_show_json(node: Netns, backend: str) -> None:
    assert json.loads(node.agent("rules", "show", "--json", "--backend", backend).stdout) == {
        "backend": backend, "rules": []
    }
    node.agent("rules", "install", "--backend", backend)
    shown = json.loads(node.agent("rules", "show", "--json", "--backend", backend).stdout)
    assert shown["backend"] == backend
    assert [(r["name"], r["family"], r["chain"]) for r in shown["rules"]] == [
        ("internet-in", "ipv4", "NODE-HEALTH-INTERNET-IN"),
        ("internet-out", "ipv4", "NODE-HEALTH-INTERNET-OUT"),
    ]
    assert all(isinstance(r["bytes"], int) and isinstance(r["packets"], int) for r in shown["rules"])
    text = node.agent("rules", "show", "--backend", backend).stdout
    assert f"backend: iptables-{backend}" in text and "ipv4: in place" in text


@pytest.mark.parametrize(("backend", "imported"), [("legacy", True), ("nft", False)])
def test_python_iptables_only_for_legacy(node: Netns, backend: str, imported: bool) -> None:
    code = (
        "import sys; from agent.cli import main; "
        f"assert main(['rules', 'install', '--backend', '{backend}']) == 0; print('iptc' in sys.modules)"
    )
    res = node.run(sys.executable, "-c", code)
    assert res.stdout.strip().splitlines()[-1] == str(imported)


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_net_admin(node: Netns, backend: str) -> None:
    require_tool("setpriv")
    drop = ("setpriv", "--inh-caps=-all", "--bounding-set=-net_admin")
    res = node.agent("rules", "install", "--backend", backend, check=False, prefix=drop)
    assert res.returncode == 1
    assert "CAP_NET_ADMIN" in res.stderr and "Traceback" not in res.stderr
    assert ours(node, backend) == []
