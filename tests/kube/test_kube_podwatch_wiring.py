"""The runtime starts the one pod watch only when kubernetes is on and an enabled check reads pods
(CheckSpec.needs_pods), hands it to the checks and their sources (CheckContext.pods), and stops or rebuilds it
on reload and stop; a single pass (`run --once`, `selftest`) lists once instead."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import pytest

from agent import runtime
from agent.daemon import Daemon, RunOptions
from agent.kube.podwatch import PodSnapshot, PodWatch
from agent.registry import CHECKS
from agent.runtime import Overrides, build_checks, load_config, needs_pods, pods_once
from fakeapi import FakeApiServer
from kube_support import NODE, fake, wait_for  # noqa: F401 - fixture

# Only the disk check runs; a test gives it a needs_pods (no real check sets one yet).
OTHERS = "".join(f"[checks.{name}]\nenabled = false\n" for name in CHECKS if name != "disk")


def config(tmp: Any, *, disk: bool = True, qps: float = 100.0) -> str:
    return f"""
[agent]
node_name = "{NODE}"
state_dir = "{tmp}/state"
[kubernetes]
startup_jitter = "0s"
qps = {qps}
burst = 100
[kubernetes.kill_switch]
name = ""
[checks.disk]
enabled = {str(disk).lower()}
""" + OTHERS


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The disk check reads pods while enabled; every CheckContext.pods it is built with."""
    seen: list[Any] = []
    spec = CHECKS["disk"]

    def build(ctx: Any, cfg: Any) -> Any:
        seen.append(ctx.pods)
        return spec.build(ctx, cfg)

    patched = dataclasses.replace(spec, build=build, needs_pods=lambda c: c.enabled)
    monkeypatch.setattr(runtime, "CHECKS", MappingProxyType({**CHECKS, "disk": patched}))
    return seen


@pytest.fixture
def daemon(fake: FakeApiServer, tmp_path: Any) -> Iterator[Any]:
    made: list[Daemon] = []

    def start(text: str) -> Daemon:
        path = tmp_path / "agent.toml"
        path.write_text(text)
        ov = Overrides(config_path=str(path))
        d = Daemon(load_config(ov), ov, RunOptions(kubeconfig=fake.kubeconfig(str(tmp_path / "kc"))))
        made.append(d)
        # What Daemon.run does before its loop (run() itself installs signal handlers: main thread only).
        d.state.ensure()
        d._start_kube()
        d._start_pods()
        d.scheduler.configure(build_checks(d.cfg, d.state.path, pods=d.pods))
        d._start_sources()
        if d.kube is not None:
            d.kube.offer(d.store.snapshot())
        return d

    yield start
    for d in made:  # as Daemon.run's finally: nothing of it left running (a reload may start the ladder's thread)
        d._stop_sources()
        d._stop_remediation()
        d._stop_kube()


def pod_watches(fake: FakeApiServer) -> list[Any]:
    return [w for w in fake.cluster.watchers if w.plural == "pods"]


def reload(d: Daemon, tmp: Any, text: str) -> None:
    (tmp / "agent.toml").write_text(text)
    d.reload()


def test_no_check_reads_pods_no_watch(fake: FakeApiServer, daemon: Any, tmp_path: Any, built: list[Any]) -> None:
    d = daemon(config(tmp_path, disk=False))
    assert d.kube is not None and d.pods is None and d.kube.pod_watch is None
    wait_for(lambda: fake.log(verbs=("list",)), what="the actuator talking to the server")
    assert not [r for r in fake.log() if "/pods" in r.path]
    assert built == []


def test_the_watch_runs_while_a_check_needs_it_and_is_rebuilt_on_reload(
    fake: FakeApiServer, daemon: Any, tmp_path: Any, built: list[Any]
) -> None:
    fake.add_pod("team-a", "a", NODE)
    d = daemon(config(tmp_path))
    first = d.pods
    assert isinstance(first, PodWatch) and built == [first]
    wait_for(lambda: [p.name for p in first.pods() or ()] == ["a"])
    wait_for(lambda: len(pod_watches(fake)) == 1)
    assert ("pods", "PodsUnknown") in tuple(d.kube.source.known_findings())
    wait_for(lambda: [p["metadata"]["name"] for p in d.kube.watched_pods() or ()] == ["a"], what="the drain's view")

    reload(d, tmp_path, config(tmp_path, disk=False))  # the one check that read pods is off: the watch stops
    assert d.pods is None and d.kube.pod_watch is None and first._thread is not None and not first._thread.is_alive()
    wait_for(lambda: not pod_watches(fake), what="the watch closed on the server")
    assert ("pods", "PodsUnknown") not in tuple(d.kube.source.known_findings())
    assert d.kube.watched_pods() is None  # the drain lists for itself

    reload(d, tmp_path, config(tmp_path))  # on again: a new watch, handed to the rebuilt check
    second = d.pods
    assert isinstance(second, PodWatch) and second is not first and built[-1] is second
    wait_for(lambda: len(pod_watches(fake)) == 1)

    reload(d, tmp_path, config(tmp_path, qps=50.0))  # [kubernetes] changed: a new actuator, a new watch
    third = d.pods
    assert isinstance(third, PodWatch) and third is not second and built[-1] is third
    assert second._thread is not None and not second._thread.is_alive()
    wait_for(lambda: [p.name for p in third.pods() or ()] == ["a"])

    reload(d, tmp_path, config(tmp_path, qps=50.0))  # nothing changed: the same watch goes on
    assert d.pods is third and built[-1] is third

    d._stop_sources()
    d._stop_remediation()
    d._stop_kube()
    assert d.pods is None and third._thread is not None and not third._thread.is_alive()
    wait_for(lambda: not pod_watches(fake), what="the watch closed on stop")


def test_kubernetes_off_no_watch_even_if_a_check_reads_pods(fake: FakeApiServer, daemon: Any, tmp_path: Any,
                                                          built: list[Any]) -> None:
    d = daemon(config(tmp_path).replace("[kubernetes]\n", "[kubernetes]\nenabled = false\n"))
    assert d.kube is None and d.pods is None and built == [None]


def test_a_single_pass_lists_once(fake: FakeApiServer, tmp_path: Any, built: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add_pod("team-a", "a", NODE)
    kc = fake.kubeconfig(str(tmp_path / "kc"))
    path = tmp_path / "agent.toml"
    path.write_text(config(tmp_path, disk=False))
    cfg = load_config(Overrides(config_path=str(path)))
    assert not needs_pods(cfg) and pods_once(cfg, kc) is None
    path.write_text(config(tmp_path))
    cfg = load_config(Overrides(config_path=str(path)))
    assert needs_pods(cfg) and not needs_pods(cfg, only=["network"])  # `selftest --only network`: disk does not run
    assert pods_once(cfg, kc, only=["network"]) is None
    view = pods_once(cfg, kc)
    assert isinstance(view, PodSnapshot) and [p.name for p in view.pods() or ()] == ["a"]
    assert [r.verb for r in fake.log() if "/pods" in r.path] == ["list"]  # one LIST, no watch
    monkeypatch.setenv("KUBECONFIG", kc)
    monkeypatch.chdir(tmp_path)
    assert Daemon(cfg, Overrides(config_path=str(path)), RunOptions(once=True, kubeconfig=kc)).run() in (0, 1)
    assert isinstance(built[-1], PodSnapshot) and [p.name for p in built[-1].pods() or ()] == ["a"]
    assert [r.verb for r in fake.log() if "/pods" in r.path] == ["list", "list"]
    assert os.path.isdir(tmp_path / "state")


def test_agent_run_watches_the_nodes_pods_only_while_traffic_reads_them(
    fake: FakeApiServer, tmp_path: Any, host_firewall_untouched: None
) -> None:
    """End to end, `agent run` as a subprocess: per-pod accounting and shaping read pods (needs_pods), so the one
    watch runs, its metrics follow the node's pods, and a SIGHUP that turns both off closes it. --dry-run: the traffic
    check only looks (nothing of the host's firewall or tc is changed), the watch only reads anyway."""
    import signal

    from agentproc import Agent

    fake.add_pod("team-a", "a", NODE)
    fake.add_pod("team-b", "elsewhere", "gpu-node-2")
    kc = fake.kubeconfig(str(tmp_path / "kc"))
    others = "".join(f"[checks.{name}]\nenabled = false\n" for name in CHECKS if name != "traffic")

    def conf(pods: bool) -> str:
        on = str(pods).lower()
        return (f'[kubernetes]\nstartup_jitter = "0s"\n[kubernetes.kill_switch]\nname = ""\n'
                f"[checks.traffic]\nenabled = true\n[checks.traffic.pods]\nenabled = {on}\n"
                f'[checks.traffic.shaping]\nenabled = {on}\ninterfaces = ["lo"]\n' + others)

    agent = Agent(tmp_path, conf(True), ("--kubeconfig", kc, "--dry-run"), env={"NODE_NAME": NODE}, log_format="text")
    try:
        agent.poll(lambda t: agent.value("node_health_kube_pod_watch_pods") == 1.0, "one pod known", timeout=60)
        assert agent.value("node_health_kube_pod_watch_up") == 1.0
        assert agent.value("node_health_kube_pod_watch_relists_total", reason="initial") == 1.0
        fake.add_pod("team-a", "b", NODE)
        agent.poll(lambda t: agent.value("node_health_kube_pod_watch_pods") == 2.0, "the new pod seen", timeout=30)
        assert len(pod_watches(fake)) == 1
        agent.write_config(conf(False))
        agent.signal(signal.SIGHUP)
        agent.poll(lambda t: agent.value("node_health_kube_pod_watch_up") is None, "the watch's metrics gone", timeout=30)
        wait_for(lambda: not pod_watches(fake), what="the watch closed on the server")
        pods_reqs = [r.verb for r in fake.log() if r.path == "/api/v1/pods"]
        assert pods_reqs == ["list", "watch"]  # one list, one watch: nothing per scrape or per check run
    finally:
        assert agent.stop() == 0
