"""Damaged state files: every file the agent keeps in its state dir, with every
kind of damage (empty, cut short, binary, JSON of another shape), is set aside
as <name>.bad-<time>, named in one log line, counted, and starts fresh; the
consumers that crashed on a file of the wrong shape now start."""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from agent import statedir as state
from agent.statedir import StateDir, StateFile

# Every module that declares a state file (importing them registers the files).
DECLARING = (
    "agent.network.links",
    "agent.burn.preflight",
    "agent.gpu.poller",
    "agent.gpu.xid_source",
    "agent.traffic.tally",
    "agent.kube.reconciler",
)

GPU = "GPU-8e0f0a1c"
REPORT = {"backend": "builtin", "started": 1.0, "finished": 61.0, "gpus": [{"index": 0, "status": "pass"}], "status": "pass"}
ACTIVE = {"check": "disk", "subject": "/", "reason": "DiskFull", "severity": "critical", "message": "m", "since": 1.0, "origin": "disk"}
TALLY = {"gen": "a1", "packets": 1, "bytes": 2, "base_packets": 0, "base_bytes": 0}
STREAM = {
    "cursor": 5, "active": [["gpu0", "Xid79", "critical", "fell off the bus", "reset_gpu", None, 1]],
    "counts": [["0", "79", 1]], "lost": 0, "gaps": 0, "coverage": [0.0, ""],
}

# file: (what the agent writes, the same with one field of the wrong type)
SHAPES: dict[str, tuple[Any, Any]] = {
    "network-interfaces.json": (
        {"boot_id": "b1", "interfaces": ["eth0"]},
        {"boot_id": "b1", "interfaces": "eth0"},
    ),
    "burn.json": (
        {"boot_id": "b1", "preflight": REPORT, "retest": None},
        {"boot_id": "b1", "preflight": {**REPORT, "started": "yesterday"}, "retest": None},
    ),
    "gpu-poll.json": (
        {"boot": "b1", "gpus": {GPU: {"t": 1.0, "cor": 0, "unc_agg_base": 0, "links_up": [0], "nvlink": {"0": {"replay": 1}}}},
         "seen": ["0000:18:00.0"]},
        {"boot": "b1", "gpus": {GPU: {"t": 1.0, "nvlink": {"0": {"replay": "many"}}}}, "seen": ["0000:18:00.0"]},
    ),
    "gpu-inventory.json": (
        {"boot": "b1", "index": {"0000:18:00.0": 0}},
        {"boot": "b1", "index": {"0000:18:00.0": "zero"}},
    ),
    "xid-stream.json": (
        {"boot": "b1", "stream": STREAM},
        {"boot": "b1", "stream": {**STREAM, "active": {"gpu0": "Xid79"}}},
    ),
    "traffic.json": (
        {"version": 1, "tallies": {"internet-in/ipv4": TALLY}, "repairs": {"ipv4": 1}},
        {"version": 1, "tallies": {"internet-in/ipv4": {**TALLY, "bytes": "2"}}, "repairs": {}},
    ),
    "kubernetes.json": (
        {"version": 1, "active": [ACTIVE], "outbox": [{"type": "Warning", "reason": "DiskFull", "action": "", "note": "n", "name": "e1"}],
         "slot": True},
        {"version": 1, "active": [{**ACTIVE, "severity": ["critical"]}], "outbox": [], "slot": False},
    ),
}


def specs() -> dict[str, StateFile[Any]]:
    found: dict[str, StateFile[Any]] = {}
    for name in DECLARING:
        mod = importlib.import_module(name)
        for value in vars(mod).values():
            if isinstance(value, StateFile):
                found[value.name] = value
    return found


def damaged(name: str) -> dict[str, bytes]:
    good, wrong = (json.dumps(v).encode() for v in SHAPES[name])
    return {
        "empty": b"",
        "whitespace": b"\n",
        "cut short": good[: len(good) // 2],
        "binary": b"\x00\xff\xfe\x80\x81 not json at all \x00",
        "list, not an object": json.dumps([SHAPES[name][0]]).encode(),
        "a string": b'"hello"',
        "null": b"null",
        "field of the wrong type": wrong,
        "object missing every field": b"{}",
    }


CASES = [pytest.param(name, kind, id=f"{name}: {kind}") for name in SHAPES for kind in damaged(name)]


def test_the_table_covers_every_state_file() -> None:
    assert set(specs()) == set(SHAPES)
    assert set(SHAPES) <= set(state.rejected())


@pytest.mark.parametrize("name", SHAPES)
def test_what_the_agent_writes_loads(tmp_path: Path, name: str) -> None:
    sd = StateDir(str(tmp_path))
    sd.write_json(name, SHAPES[name][0])
    before = state.rejected()[name]
    assert sd.load(specs()[name]) is not None
    assert os.listdir(tmp_path) == [name] and state.rejected()[name] == before


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_damaged_file_is_set_aside_logged_counted_and_starts_fresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, kind: str
) -> None:
    content = damaged(name)[kind]
    (tmp_path / name).write_bytes(content)
    sd = StateDir(str(tmp_path))
    before = state.rejected()[name]
    with caplog.at_level(logging.INFO, logger="agent.statedir"):
        assert sd.load(specs()[name]) is None
    [aside] = os.listdir(tmp_path)
    assert aside.startswith(f"{name}.bad-")
    assert (tmp_path / aside).read_bytes() == content, "set aside as it was, not deleted"
    assert state.rejected()[name] == before + 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(tmp_path / name) in lines[0] and aside in lines[0], lines
    sd.write_json(name, SHAPES[name][0])  # the fresh state is written over it as usual
    assert sd.load(specs()[name]) is not None


def test_set_aside_copies_are_bounded(tmp_path: Path) -> None:
    sd = StateDir(str(tmp_path))
    spec = specs()["traffic.json"]
    for i in range(state.KEEP_BAD + 3):
        (tmp_path / "traffic.json").write_text(f"[{i}]")
        assert sd.load(spec) is None
    aside = sorted(os.listdir(tmp_path))
    assert len(aside) == state.KEEP_BAD
    assert (tmp_path / aside[-1]).read_text() == f"[{state.KEEP_BAD + 2}]", "the newest are kept"


def test_unreadable_file_is_left_in_place(tmp_path: Path) -> None:
    (tmp_path / "traffic.json").mkdir()  # EISDIR: not damage of ours to set aside
    before = state.rejected()["traffic.json"]
    assert StateDir(str(tmp_path)).load(specs()["traffic.json"]) is None
    assert os.listdir(tmp_path) == ["traffic.json"] and state.rejected()["traffic.json"] == before


def test_rejections_are_exported(tmp_path: Path) -> None:
    from agent.metrics import collect_series
    from agent.registry import CATALOG
    from agent.store import Store

    (tmp_path / "burn.json").write_text("[]")
    StateDir(str(tmp_path)).load(specs()["burn.json"])
    series = dict(collect_series(Store().snapshot(), CATALOG)["node_health_state_file_rejected_total"])
    assert series[(("file", "burn.json"),)] == state.rejected()["burn.json"] >= 1
    assert (("file", "kubernetes.json"),) in series, "every declared file is exported, 0 until one is rejected"


def test_a_read_only_state_dir_never_creates_renames_or_writes(tmp_path):
    from agent.remediation.record import RECORD_FILE
    from agent.statedir import StateDirError

    name = RECORD_FILE.name
    (tmp_path / name).write_bytes(b"[damaged")
    before = state.rejected().get(name, 0)
    ro = StateDir(str(tmp_path), read_only=True)
    assert ro.load(RECORD_FILE) is None and ro.problems[name].startswith("damaged")
    ro.write_json("other.json", {"a": 1})
    ro.remove(name)
    StateDir(str(tmp_path / "absent"), read_only=True).ensure()
    with pytest.raises(StateDirError):
        ro.lock()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert (tmp_path / name).read_bytes() == b"[damaged" and state.rejected().get(name, 0) == before
