"""Commands an SRE runs on a node judge the deployed agent, not the defaults:
the config comes from the flag, else $NODE_HEALTH_AGENT_CONFIG (the DaemonSet
sets it), else /etc/node-health-agent/agent.toml where it exists; selftest
reads the agent's state dir (`--state-dir`) and reports what the daemon would
for the same state, the boot burn included; node_exporter's flag spellings
work; a reader that leaves the pipe early gets no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import cli
from agent.burn.model import BurnReport, GpuVerdict
from agent.burn.preflight import BurnState, Options, PreflightSource
from agent.cli import shared
from agent.findings import Finding, Severity
from agent.statedir import StateDir

BOOT = "6c1c3c47-5d0b-4a53-9a3e-1f2b0ad4c0de"


def test_config_path_flag_then_env_then_deployed_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deployed = tmp_path / "etc.toml"
    monkeypatch.setattr(shared, "DEFAULT_CONFIG", str(deployed))
    monkeypatch.delenv(shared.CONFIG_ENV, raising=False)
    assert shared.config_path(None) is None, "nothing deployed: the embedded defaults"
    deployed.write_text("")
    assert shared.config_path(None) == str(deployed)
    monkeypatch.setenv(shared.CONFIG_ENV, "/from/env.toml")
    assert shared.config_path(None) == "/from/env.toml"
    assert shared.config_path("/flag.toml") == "/flag.toml"


def test_config_show_reads_the_environment_variable(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[agent]\nstate_dir = "/srv/nha-state"\n')
    env = {**os.environ, shared.CONFIG_ENV: str(cfg)}
    res = subprocess.run([sys.executable, "-m", "agent", "config", "show"], capture_output=True, text=True,
                         env=env, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert f"from {cfg}" in res.stdout.splitlines()[0] and '"/srv/nha-state"' in res.stdout


def test_a_bad_config_named_by_the_variable_is_one_line_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text("[agent]\nlog_level = 7\n")
    res = subprocess.run([sys.executable, "-m", "agent", "config", "show"], capture_output=True, text=True,
                         env={**os.environ, shared.CONFIG_ENV: str(cfg)}, timeout=60, check=False)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and str(cfg) in res.stderr, res.stderr


def test_node_exporter_flag_spellings() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["run", "--web.listen-address", "127.0.0.1:9904", "--log.level", "debug",
                              "--log.format", "json"])
    assert (args.listen, args.log_level, args.log_format) == ("127.0.0.1:9904", "debug", "json")
    args = parser.parse_args(["selftest", "--state-dir", "/s"])
    assert args.state_dir == "/s"


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """`agent docs metrics | head -1`: the pipe closes before the agent writes."""
    p = subprocess.Popen([sys.executable, "-m", "agent", "docs", "metrics"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the child is still importing: its first write meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def _procfs(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT + "\n")
    return proc


REPORTS = {
    "failed": BurnReport("builtin", time.time() - 60, time.time() - 30, gpus=(
        GpuVerdict(0, "pass"), GpuVerdict(1, "fail", name="NVIDIA H100"),
    )),
    "unknown": BurnReport("builtin", time.time() - 60, time.time() - 30, unavailable="no CUDA in this image"),
    "passed": BurnReport("builtin", time.time() - 60, time.time() - 30, gpus=(GpuVerdict(0, "pass"),)),
}


def _daemon_findings(state: StateDir) -> list[Finding]:
    """What the daemon's preflight source publishes for the recorded burn of this boot."""
    published: list[list[Finding]] = []
    from types import SimpleNamespace

    from agent.burn.idle import Idleness

    runner = SimpleNamespace(inventory=None)  # never asked: only the recorded result is published
    src = PreflightSource(runner, state, lambda: BOOT, Options(), lambda: (), Idleness(None))  # type: ignore[arg-type]
    src._publish(lambda findings, samples: published.append(list(findings)), BurnState.load(state, BOOT))
    return published[-1]


@pytest.mark.parametrize("case", sorted(REPORTS))
def test_selftest_judges_the_burn_as_the_daemon_does(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = StateDir(str(tmp_path / "state"))
    state.ensure()
    BurnState(BOOT, preflight=REPORTS[case]).save(state)
    before = sorted((p.name, p.read_bytes()) for p in Path(state.path).iterdir())
    daemon = _daemon_findings(state)
    code = cli.main(["selftest", "--only", "burn", "--json", "--state-dir", state.path,
                     "--path.procfs", str(_procfs(tmp_path))])
    doc = json.loads(capsys.readouterr().out)
    got = sorted((f["subject"], f["reason"], f["severity"]) for f in doc["findings"])
    assert got == sorted((f.subject, f.reason, f.severity.value) for f in daemon), case
    daemon_healthy = all(f.severity.rank < Severity.WARNING.rank for f in daemon)
    assert doc["healthy"] is daemon_healthy and code == (0 if daemon_healthy else 1), (case, doc)
    if case != "passed":
        assert not doc["healthy"] and doc["problems"] + doc["unknown"] >= 1
    assert sorted((p.name, p.read_bytes()) for p in Path(state.path).iterdir()) == before, "selftest wrote"


def test_the_table_counts_unknown_rows_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = StateDir(str(tmp_path / "state"))
    state.ensure()
    BurnState(BOOT, preflight=REPORTS["unknown"]).save(state)
    code = cli.main(["selftest", "--only", "burn", "--state-dir", state.path, "--path.procfs", str(_procfs(tmp_path))])
    out = capsys.readouterr().out
    assert code == 1 and "UNKNOWN" in out and out.rstrip().endswith("problem(s), 1 unknown"), out
