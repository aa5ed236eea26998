"""The chart's `config:` value is checked at render time against the agent's own
schema: values.schema.json's `config` property is generated from the config
definitions (`agent.config.json_schema`), a test holds it in sync, and a typo
or a wrong type under `config:` fails `helm template` / `helm install` with the
key's path, before any pod starts with it.

To rewrite the config part of values.schema.json after changing a setting
(refused under CI=true, see conftest.pytest_configure):
    NHA_UPDATE_CHART_SCHEMA=1 python -m pytest tests/kube/test_chart_config_schema.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import update_requested
from kube_render import CHART, agent_toml, helm

from agent.config import ConfigError, defaults, json_schema, parse, plain

SCHEMA = CHART / "values.schema.json"
NODES = {"taintBudget": {"nodes": 10}}


def _config_span(text: str) -> tuple[int, int]:
    """Where the value of the top-level "config" property is in values.schema.json's text."""
    start = text.index('\n    "config": ') + len('\n    "config": ')
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return start, i + 1
    raise AssertionError("unbalanced values.schema.json")


def generated() -> dict[str, Any]:
    out = json_schema()
    out["description"] = ("agent.toml as YAML: generated from the agent's config definitions "
                          "(tests/kube/test_chart_config_schema.py); `agent config check` checks the rest")
    return out


def test_values_schema_config_is_generated_from_the_config_definitions() -> None:
    text = SCHEMA.read_text()
    if update_requested("NHA_UPDATE_CHART_SCHEMA"):
        start, end = _config_span(text)
        body = json.dumps(generated(), indent=2).replace("\n", "\n    ")
        SCHEMA.write_text(text[:start] + body + text[end:])
        text = SCHEMA.read_text()
    assert json.loads(text)["properties"]["config"] == generated(), (
        "values.schema.json's config differs from the agent's: "
        "NHA_UPDATE_CHART_SCHEMA=1 python -m pytest tests/kube/test_chart_config_schema.py")


def test_every_default_of_the_agent_passes_the_charts_schema() -> None:
    """The full default config, every key written out, renders, and the agent takes what it renders."""
    config = plain(defaults())
    docs = helm({**NODES, "config": config})
    parse(agent_toml(docs), "agent.toml")


BAD = [
    pytest.param({"checks": {"gpu": {"intervall": "30s"}}}, "intervall", id="misspelt key"),
    pytest.param({"chekcs": {}}, "chekcs", id="misspelt section"),
    pytest.param({"checks": {"gpuu": {}}}, "gpuu", id="unknown check"),
    pytest.param({"remediation": {"mode": "enforcing"}}, "mode", id="not a choice"),
    pytest.param({"checks": {"disk": {"interval": "30 seconds"}}}, "interval", id="not a duration"),
    pytest.param({"checks": {"gpu": {"expected_count": "8"}}}, "expected_count", id="a string for an integer"),
    pytest.param({"agent": {"jitter": 0.9}}, "jitter", id="out of range"),
    pytest.param({"checks": {"network": {"interfaces": "eth0"}}}, "interfaces", id="a string for a list"),
]


@pytest.mark.parametrize(("config", "key"), BAD)
def test_a_bad_config_fails_the_render_naming_the_key(config: dict[str, Any], key: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=key):
        helm({**NODES, "config": config})


@pytest.mark.parametrize(("config", "key"), BAD)
def test_the_agent_refuses_the_same_configs(config: dict[str, Any], key: str) -> None:
    """The schema refuses nothing the agent would take (same cases, the agent's own loader)."""
    import tomli_w

    with pytest.raises(ConfigError, match=key):
        parse(tomli_w.dumps(config), "agent.toml")


def test_good_values_of_every_kind_render() -> None:
    config = {"agent": {"jitter": 0.2, "log_level": "debug"},
              "checks": {"gpu": {"expected_count": 8, "interval": "1m30s"}, "network": {"interfaces": ["eth0"]},
                         "disk": {"paths": ["/", "/data"]}},
              "remediation": {"mode": "observe"}}
    cfg = parse(agent_toml(helm({**NODES, "config": config})), "agent.toml")
    assert cfg.checks["gpu"].expected_count == 8 and cfg.checks["gpu"].interval == 90.0


def test_the_schema_file_is_valid_json_with_the_chart_values() -> None:
    full = json.loads(Path(SCHEMA).read_text())
    assert full["properties"]["config"]["additionalProperties"] is False
