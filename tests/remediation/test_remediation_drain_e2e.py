"""`agent run` against the fake API server (issue 23): the drain's answers end to end. A PodDisruptionBudget
that never allows under on_timeout = "wait" holds the ladder (no reboot, RemediationHeld naming the pod and the
PDB); a 409 on an eviction (concurrent evictions racing on one PDB) is not taken for "gone"; the shipped drain
rate (qps 1, burst 10, no raised limits) retires a node cleanly."""

from __future__ import annotations

import time
from pathlib import Path

from agentproc import Agent, wait_for
from test_remediation_kube_e2e import ENFORCE, Node, config, evictions

from fakeapi import FakeApiServer
from kube_support import NODE, fake  # noqa: F401 - fixture


def agent(node: Node, remediation: str, *, drain: str = "", shipped_rate: bool = False) -> Agent:
    text = config(node.proc, node.root, node.sys, remediation)
    if shipped_rate:
        text = text.replace("qps = 50.0\nburst = 50\n", "")
    text = text.replace("[kubernetes.drain]\n", "[kubernetes.drain]\n" + drain)
    env = {"PATH": node.bins.env_path(), "NODE_NAME": NODE}
    return Agent(node.tmp, text, ("--kubeconfig", node.kubeconfig), env=env, log_format="text")


def test_a_pdb_that_never_allows_under_wait_never_reboots_and_holds_naming_pod_and_pdb(fake: FakeApiServer, tmp_path: Path) -> None:
    node = Node(fake, tmp_path)
    fake.add_pod("team-a", "db-0", NODE, labels={"app": "db"}, owner=("StatefulSet", "db"))
    fake.add_pdb("team-a", "db", {"app": "db"}, max_unavailable=0)
    a = agent(node, ENFORCE, drain='timeout = "1m"\n')  # the shortest allowed
    try:
        a.wait_ready()
        a.poll(lambda _: a.value("node_health_remediation_waiting", on="drain") == 1, timeout=150, what="held on the drain")
        a.poll(lambda _: a.value("node_health_finding", check="remediation", subject="drain", reason="RemediationHeld",
                                 severity="warning") == 1, what="RemediationHeld")
        wait_for(lambda: "team-a/db-0 (PodDisruptionBudget team-a/db)" in a.logs(), what="the pod and its PDB named")
        seen = len(evictions(fake))
        wait_for(lambda: len(evictions(fake)) > seen + 1, timeout=30, what="evictions go on while it holds")
        assert node.bins.calls("systemctl") == [], "no reboot over a pod the drain could not move"
        assert [p["metadata"]["name"] for p in fake.pods(NODE) if p["metadata"]["namespace"] == "team-a"] == ["db-0"]
        assert all(r.status == 429 for r in evictions(fake) if r.path.endswith("/db-0/eviction"))
    finally:
        assert a.stop() == 0, a.logs()


def test_an_eviction_answered_409_is_not_counted_as_gone(fake: FakeApiServer, tmp_path: Path) -> None:
    node = Node(fake, tmp_path)
    # The first eviction of web-0 races another node's eviction on the same PDB: kube-apiserver answers 409.
    fake.before(lambda r: r.path.endswith("/web-0/eviction"), lambda: setattr(fake.workloads, "pdb_conflicts", 1))
    a = agent(node, ENFORCE)
    try:
        a.wait_ready()
        wait_for(lambda: node.bins.calls("systemctl") == [["reboot"]], timeout=60, what="systemctl reboot")
        assert node.web_on_node() == [], "the reboot came after both pods were evicted, the 409 one included"
        web0 = [r.status for r in evictions(fake) if r.path.endswith("/web-0/eviction")]
        assert web0[0] == 409 and 201 in web0, web0
        assert a.value("node_health_kube_evictions_total", result="conflict") == 1
        assert a.value("node_health_kube_evictions_total", result="gone") == 0
        assert a.value("node_health_kube_evictions_total", result="evicted") == 2
    finally:
        assert a.stop() == 0, a.logs()


def test_the_shipped_drain_rate_retires_cleanly(fake: FakeApiServer, tmp_path: Path) -> None:
    """The same fault after two reboots retires the node with qps 1 / burst 10 (as shipped): the label and the
    condition are set, the slot is released, and the record loads back (nothing set aside)."""
    node = Node(fake, tmp_path)
    a = agent(node, ENFORCE.replace('actions = ["drain", "reboot"]', 'actions = ["drain", "reboot", "retire"]')
              + 'min_uptime = "0s"\n', shipped_rate=True)
    try:
        for n, boot in enumerate(("22222222-0000-0000-0000-000000000000", "33333333-0000-0000-0000-000000000000"), 1):
            a.wait_ready()
            wait_for(lambda n=n: len(node.bins.calls("systemctl")) == n, timeout=90, what=f"reboot {n}")
            a.stop()
            node.proc.boot(boot)  # the fault is back after the boot: the kernel log still has the Xid
            a.start()
        a.wait_ready()
        wait_for(lambda: fake.node(NODE)["metadata"].get("labels", {}).get("node-health-agent/retired") == "true",
                 timeout=90, what="the retired label")
        wait_for(lambda: node.leases() == [], timeout=90, what="the slot released at retirement")
        a.poll(lambda _: a.value("node_health_remediation_step", step="retired") == 1, timeout=30, what="retired")
        assert len(node.bins.calls("systemctl")) == 2, "no third reboot"
        # Retired → restarted → a new boot with the fault still there: no reboot, the label kept. Then the same
        # with the local record gone (a reinstalled disk): the Node's label says retired, and it is.
        for boot, lose_record in (("44444444-0000-0000-0000-000000000000", False), ("55555555-0000-0000-0000-000000000000", True)):
            assert a.stop() == 0, a.logs()
            state = [p.name for p in (tmp_path / "state").iterdir()]
            assert "remediation.json" in state and not [n for n in state if ".bad" in n], state
            if lose_record:
                (tmp_path / "state" / "remediation.json").unlink()
            node.proc.boot(boot)
            before = len(evictions(fake))
            a.start()
            a.wait_ready()
            a.poll(lambda _: a.value("node_health_remediation_step", step="retired") == 1, timeout=60, what="still retired")
            time.sleep(3)  # a few of the ladder's 1 s ticks with the fault standing
            assert a.value("node_health_remediation_retired") == 1
            assert len(node.bins.calls("systemctl")) == 2, f"no reboot after the new boot {boot}"
            assert fake.node(NODE)["metadata"]["labels"].get("node-health-agent/retired") == "true", "label kept"
            assert len(evictions(fake)) == before, "nothing drained"
    finally:
        assert a.stop() == 0, a.logs()
