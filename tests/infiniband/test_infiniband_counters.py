"""Error counters over windows that survive restarts, resets, saturation, flap vs drop,
and counter files that fail with EINVAL (firmware-restricted functions)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from ibtree import ACTIVE, DOWN, LINK_UP, POLLING, Clock, IbTree, make_check, reasons, value

from agent.findings import Severity
from agent.infiniband import sysfs
from agent.infiniband.catalog import CATALOG


@pytest.fixture
def tree(tmp_path: Path) -> IbTree:
    t = IbTree(tmp_path / "host")
    t.node(2)
    return t


class Runs:
    """Runs of the check, each one made anew (as after a restart) when `restart` is set."""

    def __init__(self, tree: IbTree, state: Path, **cfg: object) -> None:
        self.tree, self.state, self.cfg, self.clock = tree, state, cfg, Clock()
        self.check = make_check(tree, state, self.clock, **cfg)

    def run(self, after: float = 30, restart: bool = False):  # type: ignore[no-untyped-def]
        self.clock.advance(after)
        if restart:
            self.check = make_check(self.tree, self.state, self.clock, **self.cfg)
        return self.check.run()


@pytest.mark.parametrize(
    ("counter", "reason"),
    [
        pytest.param("link_downed", "IbLinkDowned", id="link_downed"),
        pytest.param("local_link_integrity_errors", "IbLinkIntegrityErrors", id="local_link_integrity_errors"),
        pytest.param("excessive_buffer_overrun_errors", "IbBufferOverrunErrors", id="excessive_buffer_overrun_errors"),
    ],
)
def test_any_increase_of_a_fatal_counter_is_critical_for_fatal_window(tree: IbTree, tmp_path: Path, counter: str, reason: str) -> None:
    runs = Runs(tree, tmp_path / "state")
    assert runs.run().findings == ()
    tree.bump("mlx5_1", 1, **{counter: 1})
    obs = runs.run()
    (f,) = [f for f in obs.findings if f.reason == reason]
    entry = CATALOG.reason(reason)
    assert (f.subject, f.severity, f.action) == ("mlx5_1/1", entry.severity, entry.action)
    assert (f.severity, f.action) == (Severity.CRITICAL, "drain_and_diagnose")
    assert f"{counter} rose by 1 within the last 1h" in f.message
    assert reason in {r for _, r in reasons(runs.run(after=3000, restart=True))}  # still within the hour, after a restart
    assert reason not in {r for _, r in reasons(runs.run(after=1200))}  # the hour has passed without another increase


def test_symbol_errors_count_over_the_hour_across_a_restart(tree: IbTree, tmp_path: Path) -> None:
    runs = Runs(tree, tmp_path / "state")
    runs.run()
    tree.bump("mlx5_0", 1, symbol_error=70)
    assert runs.run(after=600).findings == ()  # 70 in 10 minutes: under 120 per hour
    tree.bump("mlx5_0", 1, symbol_error=70)
    obs = runs.run(after=1800, restart=True)  # the agent restarted in the middle of the window
    (f,) = obs.findings
    assert (f.subject, f.reason, f.severity, f.action) == ("mlx5_0/1", "IbSymbolErrors", Severity.WARNING, "none")
    assert "rose by 140 in 40m" in f.message and "limit 120 per 1h" in f.message
    assert runs.run(after=3600).findings == ()  # no new errors in the hour since


def test_a_counter_that_goes_back_is_a_reset_not_a_negative_rate(tree: IbTree, tmp_path: Path) -> None:
    tree.counters("mlx5_0", 1, symbol_error=5000, link_downed=7)
    runs = Runs(tree, tmp_path / "state")
    runs.run()
    tree.counters("mlx5_0", 1, symbol_error=3, link_downed=0)  # perfquery -x, or a driver reload
    assert runs.run().findings == ()
    tree.counters("mlx5_0", 1, symbol_error=100)
    assert runs.run().findings == ()  # 97 since the reset, not 100 - 5000 nor 100 - 3 + 5000
    tree.counters("mlx5_0", 1, symbol_error=150)
    (f,) = runs.run().findings
    assert "rose by 147" in f.message


def test_receive_errors_and_link_error_recovery_have_their_own_limits(tree: IbTree, tmp_path: Path) -> None:
    runs = Runs(tree, tmp_path / "state", rcv_error_limit=100, link_error_recovery_limit=2)
    runs.run()
    tree.bump("mlx5_0", 1, port_rcv_errors=101, link_error_recovery=3)
    assert reasons(runs.run()) == {("mlx5_0/1", "IbReceiveErrors"), ("mlx5_0/1", "IbLinkErrorRecovery")}


def test_a_new_boot_starts_every_window_again(tree: IbTree, tmp_path: Path) -> None:
    runs = Runs(tree, tmp_path / "state")
    runs.run()
    tree.counters("mlx5_0", 1, link_downed=3)  # went up across a reboot: a new boot, new baselines
    tree.boot("another-boot")
    assert runs.run(restart=True).findings == ()


def test_a_saturated_counter_is_unknown(tree: IbTree, tmp_path: Path) -> None:
    tree.counters("mlx5_0", 1, link_downed=255, symbol_error=65535)
    (f,) = Runs(tree, tmp_path / "state").run().findings
    assert (f.reason, f.unknown, f.severity) == ("IbCounterSaturated", True, Severity.INFO)
    assert "link_downed = 255" in f.message and "symbol_error = 65535" in f.message


def test_a_saturated_counter_on_a_healthy_port_is_information(tree: IbTree, tmp_path: Path) -> None:
    """A real healthy H100 node: excessive_buffer_overrun_errors reads 15 (4 bits, full) from the first
    look on. No warning, ever; the rise to 15 while watched is the critical IbBufferOverrunErrors."""
    tree.counters("mlx5_0", 1, excessive_buffer_overrun_errors=15)
    runs = Runs(tree, tmp_path / "state")
    for _ in range(3):
        (f,) = runs.run().findings
        assert (f.reason, f.severity) == ("IbCounterSaturated", Severity.INFO)
    tree.counters("mlx5_1", 1, excessive_buffer_overrun_errors=14)
    runs.run()
    tree.counters("mlx5_1", 1, excessive_buffer_overrun_errors=15)
    found = {(f.subject, f.reason): f.severity for f in runs.run().findings}
    assert found[("mlx5_1/1", "IbBufferOverrunErrors")] == Severity.CRITICAL
    assert found[("mlx5_1/1", "IbCounterSaturated")] == Severity.INFO
    assert Severity.WARNING not in {found[k] for k in found if k[1] == "IbCounterSaturated"}


def test_no_pma_is_not_a_number_and_not_a_crash(tree: IbTree, tmp_path: Path) -> None:
    tree.counters("mlx5_0", 1, symbol_error="N/A (no PMA)")
    obs = Runs(tree, tmp_path / "state").run()
    assert obs.findings == ()
    assert value(obs, "node_health_infiniband_port_errors_total", device="mlx5_0", counter="symbol_error") is None
    assert value(obs, "node_health_infiniband_port_errors_total", device="mlx5_1", counter="symbol_error") == 0


# ---------------------------------------------------------------- flap vs drop


def _down(tree: IbTree) -> None:
    tree.set("mlx5_1", 1, state=DOWN, phys_state=POLLING)
    tree.bump("mlx5_1", 1, link_downed=1)


def _up(tree: IbTree) -> None:
    tree.set("mlx5_1", 1, state=ACTIVE, phys_state=LINK_UP)


def test_down_and_back_three_times_is_flapping_not_dropped(tree: IbTree, tmp_path: Path) -> None:
    runs = Runs(tree, tmp_path / "state")
    runs.run()
    for i in range(3):
        _down(tree)
        obs = runs.run(restart=i == 1)
        assert ("mlx5_1/1", "IbPortDown") in reasons(obs)
        _up(tree)
        obs = runs.run()
    assert ("mlx5_1/1", "IbPortFlapping") in reasons(obs)
    assert ("mlx5_1/1", "IbPortDropped") not in reasons(obs)
    assert value(obs, "node_health_infiniband_port_down_events", device="mlx5_1") == 3
    assert "now ACTIVE" in next(f.message for f in obs.findings if f.reason == "IbPortFlapping")


def test_flaps_between_two_runs_are_counted_from_link_downed(tree: IbTree, tmp_path: Path) -> None:
    """Down and back up within one interval: no run sees the port down, link_downed does."""
    runs = Runs(tree, tmp_path / "state")
    runs.run()
    tree.bump("mlx5_1", 1, link_downed=2)
    assert ("mlx5_1/1", "IbPortFlapping") not in reasons(runs.run())
    tree.bump("mlx5_1", 1, link_downed=1)
    assert ("mlx5_1/1", "IbPortFlapping") in reasons(runs.run())


def test_down_and_staying_down_is_dropped_not_flapping(tree: IbTree, tmp_path: Path) -> None:
    runs = Runs(tree, tmp_path / "state")
    runs.run()
    _down(tree)
    for _ in range(9):
        obs = runs.run()
    assert ("mlx5_1/1", "IbPortDropped") in reasons(obs)
    assert ("mlx5_1/1", "IbPortFlapping") not in reasons(obs)
    assert value(obs, "node_health_infiniband_port_down_events", device="mlx5_1") == 1


def test_flapping_clears_when_the_downs_leave_the_window(tree: IbTree, tmp_path: Path) -> None:
    runs = Runs(tree, tmp_path / "state", flap_window=3600.0, fatal_window=600.0)
    runs.run()
    tree.bump("mlx5_1", 1, link_downed=3)
    assert ("mlx5_1/1", "IbPortFlapping") in reasons(runs.run())
    assert runs.run(after=3600).findings == ()


# ---------------------------------------------------------------- EINVAL: firmware-restricted functions


def test_a_counter_read_that_fails_with_einval_is_not_repeated_this_boot(
    tree: IbTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real, tried = sysfs._read, []

    def restricted(path: str) -> bytes:
        if "mlx5_0/ports/1/counters/" in path:
            tried.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path)

    monkeypatch.setattr(sysfs, "_read", restricted)
    runs = Runs(tree, tmp_path / "state")
    obs = runs.run()
    first = len(tried)
    assert first == len(sysfs.COUNTERS)
    assert value(obs, "node_health_infiniband_skipped_files", device="mlx5_0") == first
    assert value(obs, "node_health_infiniband_skipped_files", device="mlx5_1") == 0
    assert value(obs, "node_health_infiniband_port_active", device="mlx5_0") == 1  # state and rate still read
    assert sum("failed with EINVAL" in r.message for r in caplog.records) == first
    runs.run()
    runs.run(restart=True)
    assert len(tried) == first  # never again this boot, restarts included
    assert "mlx5_0/ports/1/counters/symbol_error" in json.loads((tmp_path / "state/infiniband.json").read_text())["skipped"]
    tree.boot("next-boot")
    runs.run()
    assert len(tried) == 2 * first  # a new boot (new firmware?) tries once more


def test_counters_exclude_never_reads_the_counters(tree: IbTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real, read = sysfs._read, []
    monkeypatch.setattr(sysfs, "_read", lambda p: read.append(p) or real(p))
    obs = Runs(tree, tmp_path / "state", counters_exclude=("mlx5_0",)).run()
    assert not any("mlx5_0/ports/1/counters" in p or "mlx5_0/ports/1/hw_counters" in p for p in read)
    assert any("mlx5_1/ports/1/hw_counters/rnr_nak_retry_err" in p for p in read)
    assert value(obs, "node_health_infiniband_port_active", device="mlx5_0") == 1


def test_a_damaged_state_file_is_set_aside_and_the_check_starts_afresh(tree: IbTree, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state/infiniband.json").write_text('{"boot": 1, "devices": []}')
    obs = Runs(tree, tmp_path / "state").run()
    assert obs.findings == ()
    assert any(p.name.startswith("infiniband.json.bad-") for p in (tmp_path / "state").iterdir())


def test_a_steady_node_writes_no_state_and_a_change_is_written_at_once(tree: IbTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.statedir import StateDir

    writes: list[str] = []
    real = StateDir.write_json
    monkeypatch.setattr(StateDir, "write_json", lambda self, name, data: writes.append(name) or real(self, name, data))
    runs = Runs(tree, tmp_path / "state")
    for _ in range(20):
        runs.run()
    assert writes == ["infiniband.json"]  # the first run: devices, ports and baselines
    tree.bump("mlx5_0", 1, symbol_error=1)
    runs.run()
    assert len(writes) == 2
    saved = json.loads((tmp_path / "state/infiniband.json").read_text())
    assert saved["ports"]["mlx5_0/1"]["counters"]["symbol_error"][-1][1] == 1
