"""The [kubernetes] section: one-line errors for values that would hurt the cluster."""

from __future__ import annotations

from typing import Any

import pytest

from agent import config


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        pytest.param('[kubernetes]\ntaint_prefix = "node.kubernetes.io/"\n', "kubernetes.taint_prefix",
                     "reserved for Kubernetes", id="reserved taint domain"),
        pytest.param('[kubernetes]\ntaint_prefix = "Not A Domain/"\n', "kubernetes.taint_prefix",
                     'expected "<your-domain>/"', id="bad taint prefix"),
        pytest.param('[kubernetes]\ncondition_prefix = "lower"\n', "kubernetes.condition_prefix", "CamelCase",
                     id="bad condition prefix"),
        pytest.param('[kubernetes]\nresync_interval = "30s"\n', "kubernetes.resync_interval", 'at least "10m"',
                     id="resync too often"),
        pytest.param('[kubernetes]\ncondition_heartbeat = "1m"\n', "kubernetes.condition_heartbeat", 'at least "5m"',
                     id="heartbeat too often"),
        pytest.param('[kubernetes.policy]\ncritical = "Evict"\n', "kubernetes.policy.critical", '"NoExecute"',
                     id="unknown effect"),
        pytest.param('[kubernetes.policy.overrides]\n"dsk/X" = "NoSchedule"\n', "kubernetes.policy.overrides.dsk/X",
                     'unknown check "dsk"', id="override of an unknown check"),
        pytest.param('[kubernetes.policy.overrides]\n"disk/NoSuchReason" = "NoSchedule"\n',
                     "kubernetes.policy.overrides.disk/NoSuchReason", "unknown finding reason", id="unknown reason"),
        pytest.param('[kubernetes.kill_switch]\nname = "Bad_Name"\n', "kubernetes.kill_switch.name", "object name",
                     id="bad kill switch name"),
        pytest.param('[kubernetes.hysteresis]\nraise_cycles = 0\n', "kubernetes.hysteresis.raise_cycles", "at least 1",
                     id="zero cycles"),
    ],
)
def test_bad_kubernetes_config_is_one_line(tmp_path: Any, text: str, key: str, expected: str) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as info:
        config.load(str(path))
    line = str(info.value)
    assert "\n" not in line and key in line and expected in line, line


def test_good_overrides_load() -> None:
    cfg = config.parse('[kubernetes.policy.overrides]\n"disk" = "PreferNoSchedule"\n"*/CheckFailed" = "none"\n', "x")
    assert dict(cfg.kubernetes.policy.overrides) == {"disk": "PreferNoSchedule", "*/CheckFailed": "none"}
