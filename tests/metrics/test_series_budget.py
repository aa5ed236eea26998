"""Lean by default: the series an idle GPU node exports, counted on /metrics of
`agent run` with the fake NVML's 8 H100s (18 NVLinks each), held under the
budget docs/metrics.md states. The same node with everything on
(`nvlink_per_link`, `findings_at_zero = "all"`) shows what the defaults save,
and `exclude` drops whole families."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from agentproc import Agent
from fakenvml import h100
from fakenvml.fixtures import *  # noqa: F403 - fixtures

pytestmark = pytest.mark.slow

GPUS = 8
# The default series budget of an idle 8-GPU node (docs/metrics.md, "Lean by default"):
# the agent's own series excluded (process_*, which every Python exporter has).
BUDGET = 700
NVLINK_PER_LINK = ("node_health_gpu_nvlink_up", "node_health_gpu_nvlink_errors_total", "node_health_gpu_nvlink_bytes_total")


def families(text: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line and not line.startswith(("#", "process_")):
            out[line.split("{", 1)[0].split(" ", 1)[0]] += 1
    return out


@pytest.fixture
def run(tmp_path, host, scenario, fake_nvml_lib) -> Iterator[Callable[[str], Counter[str]]]:  # type: ignore[no-untyped-def]
    for i in range(GPUS):
        host.add_gpu(f"0000:{0x18 + 0x10 * i:02x}:00")
    scenario.set([h100(i) for i in range(GPUS)])
    agents: list[Agent] = []

    def start(metrics: str) -> Counter[str]:
        toml = host.toml(str(tmp_path / f"state{len(agents)}"), 'interval = "1s"\nxid_events = false\n', fake_nvml_lib)
        toml += '[checks.gpu_telemetry]\ninterval = "1s"\n[checks.burn]\nenabled = false\n'
        toml += "[metrics]\n" + metrics
        (tmp_path / f"a{len(agents)}").mkdir()
        agent = Agent(tmp_path / f"a{len(agents)}", toml.replace("[agent]\n", "[agent]\njitter = 0.0\n"))
        agents.append(agent)
        agent.poll(lambda t: f'node_health_gpu_power_watts{{gpu="{GPUS - 1}"}}' in t
                   and f'node_health_gpu_up{{gpu="{GPUS - 1}"}}' in t, "every GPU's check and telemetry")
        return families(agent.text())

    yield start
    for a in agents:
        a.stop()


def test_an_idle_eight_gpu_node_stays_within_the_series_budget(run: Callable[[str], Counter[str]]) -> None:
    lean = run("")
    total = sum(lean.values())
    assert total <= BUDGET, f"{total} series: {lean.most_common(12)}"
    assert not set(NVLINK_PER_LINK) & set(lean)
    assert lean["node_health_gpu_nvlink_gpu_bytes_total"] == GPUS * 2  # per GPU and direction
    assert lean["node_health_gpu_nvlink_links_active"] == GPUS

    full = run('nvlink_per_link = true\nfindings_at_zero = "all"\n')
    assert full["node_health_gpu_nvlink_bytes_total"] == GPUS * 18 * 2
    assert full["node_health_finding"] > lean["node_health_finding"]
    assert sum(full.values()) - total >= GPUS * (126 - 7)  # the per-link series the defaults fold
    print(f"series on an idle 8-GPU node: {total} by default, {sum(full.values())} with everything on")


def test_exclude_drops_whole_families(run: Callable[[str], Counter[str]]) -> None:
    got = run('exclude = ["node_health_gpu_clock_event_*", "node_health_gpu_nvlink_*"]\n')
    assert got["node_health_gpu_power_watts"] == GPUS
    assert not [f for f in got if f.startswith(("node_health_gpu_clock_event_", "node_health_gpu_nvlink_"))]


def _render(store, options) -> str:  # type: ignore[no-untyped-def]
    from agent.metrics import build_registry
    from agent.registry import CATALOG

    return build_registry(store, CATALOG, options).text().decode()


def test_findings_at_zero_modes_and_the_active_ones_always() -> None:
    from agent.findings import Finding, Severity
    from agent.metrics import RenderOptions
    from agent.store import Store

    store = Store()
    store.set_checks(["disk"], {"disk": (("/", "DiskReadOnly"), ("/", "DiskSpaceLow"), ("/", "MountNotVisible"))})
    store.set_events("xid", [Finding("disk", "/data", "DiskSpaceLow", Severity.WARNING, "m")])
    zero = {mode: {line for line in _render(store, RenderOptions(findings_at_zero=mode)).splitlines()
                   if line.startswith("node_health_finding{") and line.endswith(" 0.0")}
            for mode in ("all", "critical", "none")}
    assert {line.split('reason="')[1].split('"')[0] for line in zero["all"]} == {"DiskReadOnly", "DiskSpaceLow", "MountNotVisible"}
    assert {line.split('reason="')[1].split('"')[0] for line in zero["critical"]} == {"DiskReadOnly"}
    assert zero["none"] == set()
    for mode in ("all", "critical", "none"):  # an active finding is there whatever the mode
        assert ('node_health_finding{check="disk",gpu="",reason="DiskSpaceLow",severity="warning",subject="/data"} 1.0'
                in _render(store, RenderOptions(findings_at_zero=mode)))


def test_nvlink_folds_per_gpu_and_exclude_patterns() -> None:
    from agent.findings import Sample
    from agent.metrics import RenderOptions
    from agent.store import Store

    store = Store()
    samples = [Sample("node_health_gpu_nvlink_bytes_total", float(link * 10 + d),
                      (("gpu", "0"), ("link", str(link)), ("direction", direction)))
               for link in range(3) for d, direction in enumerate(("rx", "tx"))]
    samples += [Sample("node_health_gpu_nvlink_up", 1.0 if link else 0.0, (("gpu", "0"), ("link", str(link)))) for link in range(3)]
    store.set_extra("t", samples)
    text = _render(store, RenderOptions(nvlink_per_link=False))
    assert 'node_health_gpu_nvlink_gpu_bytes_total{direction="rx",gpu="0"} 30.0' in text  # 0 + 10 + 20
    assert 'node_health_gpu_nvlink_gpu_bytes_total{direction="tx",gpu="0"} 33.0' in text
    assert 'node_health_gpu_nvlink_links_active{gpu="0"} 2.0' in text
    assert "node_health_gpu_nvlink_bytes_total{" not in text and "node_health_gpu_nvlink_up{" not in text
    per_link = _render(store, RenderOptions())
    assert per_link.count("node_health_gpu_nvlink_bytes_total{") == 6 and "nvlink_gpu_bytes" not in per_link
    trimmed = _render(store, RenderOptions(nvlink_per_link=False, exclude=("node_health_gpu_nvlink_*", "node_health_build_info")))
    assert "nvlink" not in trimmed and "node_health_build_info" not in trimmed and "node_health_start_time_seconds" in trimmed
