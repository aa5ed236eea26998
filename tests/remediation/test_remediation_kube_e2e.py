"""`agent run` against the fake API server: the whole ladder on a Kubernetes node.
An Xid 79 (action reboot) → a disruption slot → the node drained through the
Eviction API (a PodDisruptionBudget of maxUnavailable 1 holds; the DaemonSet
pod stays) → one reboot → a new boot ID, the fault gone → the slot freed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentproc import Agent, wait_for
from fakebins import FakeBins, FakeProc
from test_remediation_e2e import XID79

from fakeapi import FakeApiServer
from kube_support import AGENT_KUBE_CONFIG, NODE, fake  # noqa: F401 - fixture

DISRUPTION_NS, DISRUPTION_QUOTA = "node-health-disruption", "node-health-disruption-budget"


def config(proc: FakeProc, root: Path, sys_dir: Path, remediation: str) -> str:
    return AGENT_KUBE_CONFIG + f"""
[kubernetes.drain]
poll_interval = "1s"
retry_interval = "1s"
retry_max = "2s"
qps = 50.0
burst = 50
[paths]
procfs = "{proc.root}"
sysfs = "{sys_dir}"
rootfs = "{root}"
[checks.disk]
enabled = false
[checks.network]
enabled = false
[checks.burn]
enabled = false
[checks.traffic]
enabled = false
[checks.gpu]
interval = "1s"
nvml_library = "/no-driver/libnvidia-ml.so.1"
kmsg_path = "/kmsg"
[remediation]
interval = "1s"
reboot_after = "0s"
{remediation}
"""


ENFORCE = """mode = "enforce"
actions = ["drain", "reboot"]
[remediation.reboot]
settle = "2s"
"""


class Node:
    def __init__(self, fake: FakeApiServer, tmp: Path) -> None:
        self.fake, self.tmp = fake, tmp
        self.bins, self.proc = FakeBins(tmp), FakeProc(tmp)
        self.root, self.sys = tmp / "root", tmp / "sys"
        self.root.mkdir()
        self.sys.mkdir()
        (self.root / "kmsg").write_text(XID79)
        fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
        fake.set_quota("node-health-disrupted", "node-health-disrupted", 30)  # the fleet breaker's records
        fake.add_node("spare-node")
        fake.add_replicaset("team-a", "web", 2, NODE, labels={"app": "web"}, ready_after=0.5, grace=1)
        fake.add_pdb("team-a", "web", {"app": "web"}, max_unavailable=1)
        fake.add_pod("monitoring", "exporter-x", NODE, owner=("DaemonSet", "exporter"))
        self.kubeconfig = fake.kubeconfig(str(tmp / "kubeconfig"))

    def agent(self, remediation: str) -> Agent:
        env = {"PATH": self.bins.env_path(), "NODE_NAME": NODE}
        return Agent(self.tmp, config(self.proc, self.root, self.sys, remediation), ("--kubeconfig", self.kubeconfig),
                     env=env, log_format="text")

    def web_on_node(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.fake.pods(NODE) if p["metadata"]["namespace"] == "team-a")

    def leases(self) -> list[str]:
        return [o["metadata"]["name"] for o in self.fake.objects("coordination.k8s.io", "leases", DISRUPTION_NS)]


def evictions(fake: FakeApiServer) -> list[Any]:
    return [r for r in fake.log() if r.path.endswith("/eviction")]


def test_reboot_fault_drains_through_the_pdb_reboots_once_and_frees_the_slot(fake: FakeApiServer, tmp_path: Path) -> None:
    node = Node(fake, tmp_path)
    a = node.agent(ENFORCE)
    try:
        a.wait_ready()
        wait_for(lambda: node.bins.calls("systemctl") == [["reboot"]], timeout=60, what="systemctl reboot")
        assert node.web_on_node() == [], "the reboot came after the drain"
        assert [p["metadata"]["name"] for p in fake.pods(NODE) if p["metadata"]["namespace"] == "monitoring"] == ["exporter-x"]
        accepted = [r for r in evictions(fake) if r.status == 201]
        assert len(accepted) == 2 and any(r.status == 429 for r in evictions(fake)), "one at a time: the PDB refused one"
        assert node.leases() == [NODE], "the slot is held through the reboot"
    finally:
        a.stop()
    node.proc.boot("22222222-2222-2222-2222-222222222222")
    node.proc.uptime(5.0)
    (node.root / "kmsg").write_text("")
    a.start()
    try:
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_step", step="idle") == 1, timeout=60, what="released")
        wait_for(lambda: node.leases() == [], what="the slot freed")
        assert node.bins.calls("systemctl") == [["reboot"]]
    finally:
        assert a.stop() == 0, a.logs()


def test_the_kill_switch_pauses_the_ladder_on_a_cluster(fake: FakeApiServer, tmp_path: Path) -> None:
    node = Node(fake, tmp_path)
    fake.set_configmap("node-health", "ks", {"paused": "true"})
    a = node.agent(ENFORCE)
    try:
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_would", action="reboot", cause="kill_switch") == 1,
               timeout=60, what="would reboot (kill switch)")
        assert evictions(fake) == [] and node.leases() == [] and node.bins.calls() == []
        fake.set_configmap("node-health", "ks", {"paused": "false"})
        wait_for(lambda: node.bins.calls("systemctl") == [["reboot"]], timeout=60, what="resumed")
    finally:
        assert a.stop() == 0, a.logs()


def test_observe_mode_lists_the_pods_it_would_evict_and_evicts_none(fake: FakeApiServer, tmp_path: Path) -> None:
    node = Node(fake, tmp_path)
    a = node.agent("")
    try:
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_would", action="drain", cause="observe") == 1, timeout=60,
               what="would drain")
        wait_for(lambda: "team-a/web-0" in a.logs(), what="the pods named in the log")
        assert "exporter-x" not in a.logs().split("would:")[-1]
        assert evictions(fake) == [] and node.leases() == [] and node.bins.calls() == []
    finally:
        assert a.stop() == 0, a.logs()


def test_the_same_fault_after_two_reboots_retires_the_node_on_the_cluster(fake: FakeApiServer, tmp_path: Path) -> None:
    node = Node(fake, tmp_path)
    a = node.agent(ENFORCE.replace('actions = ["drain", "reboot"]', 'actions = ["drain", "reboot", "retire"]')
                   + 'min_uptime = "0s"\n')
    try:
        for n, boot in enumerate(("22222222-0000-0000-0000-000000000000", "33333333-0000-0000-0000-000000000000"), 1):
            a.wait_ready()
            wait_for(lambda n=n: len(node.bins.calls("systemctl")) == n, timeout=60, what=f"reboot {n}")
            a.stop()
            node.proc.boot(boot)  # the fault is back after the boot: the kernel log still has the Xid
            a.start()
        a.wait_ready()
        wait_for(lambda: fake.node(NODE)["metadata"].get("labels", {}).get("node-health-agent/retired") == "true",
                 timeout=60, what="the retired label")
        conds = {c["type"]: c["status"] for c in fake.node(NODE)["status"]["conditions"]}
        assert conds.get("NodeHealthNeedsHardwareRepair") == "True"
        # the event is written after the label (set_retired): waited for, not raced
        wait_for(lambda: any(e.get("reason") == "NodeRetired" for e in fake.events()), what="the NodeRetired event")
        wait_for(lambda: node.leases() == [], what="the slot released at retirement")
        assert len(node.bins.calls("systemctl")) == 2, "no third reboot"
    finally:
        assert a.stop() == 0, a.logs()


def test_waiting_for_a_slot_is_one_finding_one_event_one_metric(fake: FakeApiServer, tmp_path: Path) -> None:
    node = Node(fake, tmp_path)
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 0)  # every slot held elsewhere
    a = node.agent(ENFORCE)
    try:
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_waiting", on="slot") == 1, timeout=60, what="waiting on a slot")
        a.poll(lambda _: a.value("node_health_finding", check="remediation", subject="slot", reason="DisruptionSlotWaiting",
                                 severity="warning") == 1, what="the one finding")
        text = a.text()
        assert "DisruptionBudgetExhausted" not in text and "DisruptionBudgetMissing" not in text
        assert "node_health_kube_disruption_budget" not in text
        wait_for(lambda: [e["reason"] for e in fake.events() if "Disruption" in e.get("reason", "")] == ["DisruptionSlotWaiting"],
                 what="one event")
        assert evictions(fake) == [] and node.bins.calls() == []
    finally:
        assert a.stop() == 0, a.logs()


def test_a_tripped_fleet_breaker_holds_the_ladder_and_taints_go_on(fake: FakeApiServer, tmp_path: Path) -> None:
    """issue 24: the breaker tripped in the kill-switch ConfigMap (by another node): the agent taints its node
    as always, but claims no slot, evicts nothing and never reboots; it says why (RemediationHeld, breaker)."""
    node = Node(fake, tmp_path)
    fake.set_configmap("node-health", "ks", {"paused": "false", "breaker": "tripped",
                                             "breaker-reason": "31 nodes disrupted within 6 h", "breaker-node": "node-7"})
    a = node.agent(ENFORCE)
    try:
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_waiting", on="breaker") == 1, timeout=60, what="held by the breaker")
        assert a.value("node_health_kube_breaker", state="tripped", signal="unknown") == 1
        taints = [t["key"] for t in fake.node(NODE)["spec"].get("taints") or []]
        assert any(k.startswith("node-health-agent/") for k in taints), "detection and taints go on"
        assert evictions(fake) == [] and node.leases() == [] and node.bins.calls() == []
        assert "31 nodes disrupted within 6 h (tripped by node-7" in a.logs()
    finally:
        assert a.stop() == 0, a.logs()


def test_no_drain_while_the_taint_budget_withholds_the_nodes_taint(fake: FakeApiServer, tmp_path: Path) -> None:
    """issue 24: the taint budget exhausted, the node's taint withheld (it stays schedulable): no drain, no
    reboot; RemediationHeld (taint) says why."""
    node = Node(fake, tmp_path)
    fake.set_quota("node-health-budget", "node-health-taint-budget", 0)
    a = node.agent(ENFORCE)
    try:
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_waiting", on="taint") == 1, timeout=60, what="held: no taint")
        assert not [t for t in fake.node(NODE)["spec"].get("taints") or [] if t["key"].startswith("node-health-agent/")]
        assert evictions(fake) == [] and node.bins.calls() == []
        assert "no drain while the node lacks its taint: the taint budget withholds" in a.logs()
    finally:
        assert a.stop() == 0, a.logs()
