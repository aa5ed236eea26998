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
