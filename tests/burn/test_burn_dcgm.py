"""`dcgmi diag -j` parsed into per-GPU outcomes: real documents from DCGM 3
and 4 (tests/fixtures/dcgm, with their sources), near-misses inline, and the
backend end to end with a stand-in `dcgmi` on PATH."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from burnfakes import FakeWatch, gpus

from agent.burn.dcgm import DcgmBackend, parse_diag
from agent.burn.model import BurnPlan, Fault
from agent.burn.orchestrator import run_burn
from agent.burn.verdict import Thresholds

FIXTURES = Path(__file__).parent.parent / "fixtures" / "dcgm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_dcgm4_gb10_persistence_mode_is_configuration_not_a_sick_gpu() -> None:
    [(i, o)] = parse_diag(fixture("dcgm-4.2.3-gb10-r1.json")).items()
    assert i == 0 and o.ran and o.problems == ()
    assert "software: configuration: Persistence Mode" in o.notes[0]


def test_dcgm4_diagnostic_on_eight_gpus_passes() -> None:
    out = parse_diag(fixture("dcgm-4.x-r3-diagnostic-8gpu.json"))
    assert sorted(out) == list(range(8))
    assert all(o.ran and not o.problems for o in out.values())


def test_dcgm3_all_skipped_means_not_tested() -> None:
    [(i, o)] = parse_diag(fixture("dcgm-3.x-r3-t400-skips.json")).items()
    assert i == 0 and not o.ran and not o.problems
    assert o.notes == ("DCGM skipped: PCIe, GPU Memory, Diagnostic, EUD Test, Targeted Stress",)


def _doc(root: str, results: list[dict[str, object]], name: str = "memory") -> str:
    return json.dumps(
        {
            root: {
                "test_categories": [
                    {
                        "category": "Hardware",
                        "tests": [{"name": name, "results": results, "test_summary": {"status": "Fail"}}],
                    }
                ]
            }
        }
    )


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        pytest.param(
            _doc(
                "DCGM GPU Diagnostic",
                [
                    {"gpu_ids": "0", "status": "Fail", "warnings": "GPU 0 memory error count 3"},
                    {"gpu_ids": "1", "status": "Pass"},
                ],
                "GPU Memory",
            ),
            {0: [Fault.DIAG_FAILED], 1: []},
            id="dcgm3 fail with a warning string",
        ),
        pytest.param(
            _doc(
                "DCGM GPU Diagnostic",
                [{"gpu_ids": "0,1,2", "status": "Fail", "warnings": ["Persistence mode off"]}],
                "Deployment",
            ),
            {0: [Fault.DIAG_FAILED], 1: [Fault.DIAG_FAILED], 2: [Fault.DIAG_FAILED]},
            id="dcgm3 software result for a CSV of GPUs (no severity: counts as a failure)",
        ),
        pytest.param(
            _doc(
                "DCGM Diagnostic",
                [
                    {
                        "entity_group": "GPU",
                        "entity_id": 3,
                        "status": "Fail",
                        "warnings": [
                            {
                                "error_category": 2,
                                "error_id": 50,
                                "error_severity": 2,
                                "warning": "Found 4 uncorrectable memory errors on GPU 3",
                            }
                        ],
                    }
                ],
            ),
            {3: [Fault.DIAG_FAILED]},
            id="dcgm4 isolate-severity failure",
        ),
        pytest.param(
            _doc("DCGM Diagnostic", [{"entity_group": "GPU", "entity_id": 0, "status": "Fail"}]),
            {0: [Fault.DIAG_FAILED]},
            id="fail without any warning still fails",
        ),
        pytest.param(
            _doc(
                "DCGM Diagnostic",
                [
                    {
                        "entity_group": "GPU",
                        "entity_id": 0,
                        "status": "Warn",
                        "warnings": [{"error_id": 3, "error_severity": 1, "warning": "PCIe replay rate"}],
                    }
                ],
            ),
            {0: []},
            id="warn is a note",
        ),
        pytest.param(
            _doc("DCGM Diagnostic", [{"entity_group": "CPU", "entity_id": 0, "status": "Fail"}]),
            {},
            id="a CPU entity is not a GPU",
        ),
        pytest.param(
            "Successfully ran diagnostic for group.\n"
            + _doc("DCGM Diagnostic", [{"entity_group": "GPU", "entity_id": 1, "status": "pass"}]),
            {1: []},
            id="text before the JSON and lower-case status",
        ),
    ],
)
def test_near_misses(text: str, expect: dict[int, list[Fault]]) -> None:
    out = parse_diag(text)
    assert {i: [p.fault for p in o.problems] for i, o in out.items()} == expect


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Error: unable to establish a connection to the specified host: localhost", id="no hostengine"),
        pytest.param('{"DCGM Diagnostic": {"runtime_error": "The diagnostic could not run"}}', id="runtime error"),
        pytest.param('{"something": "else"}', id="not a diag document"),
        pytest.param('{"DCGM Diagnostic": ', id="truncated"),
    ],
)
def test_unusable_output_raises(text: str) -> None:
    with pytest.raises(ValueError):
        parse_diag(text)


@pytest.fixture
def fake_dcgmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def install(stdout: str, code: int) -> Path:
        out = tmp_path / "out.json"
        out.write_text(stdout)
        args = tmp_path / "args"
        exe = tmp_path / "bin" / "dcgmi"
        exe.parent.mkdir(exist_ok=True)
        exe.write_text(f'#!/bin/sh\necho "$@" > {args}\ncat {out}\necho "dcgmi: something" >&2\nexit {code}\n')
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
        return args

    return install


def test_backend_runs_dcgmi_for_all_gpus_at_once(fake_dcgmi) -> None:
    doc = _doc(
        "DCGM Diagnostic",
        [
            {
                "entity_group": "GPU",
                "entity_id": i,
                "status": "Fail" if i == 1 else "Pass",
                "warnings": [{"error_severity": 2, "error_id": 50, "warning": "memory errors"}] if i == 1 else [],
            }
            for i in range(2)
        ],
    )
    args = fake_dcgmi(doc, 226)
    backend = DcgmBackend(level=2, timeout=30)
    assert backend.unavailable() is None
    report = run_burn(backend, gpus(2), BurnPlan(), FakeWatch(), Thresholds())
    assert args.read_text().split() == ["diag", "-r", "2", "-j", "-i", "0,1"]
    assert [g.status for g in report.gpus] == ["pass", "fail"]
    assert report.gpus[1].problems[0].message == "DCGM memory: memory errors"


def test_backend_without_hostengine_leaves_gpus_unknown(fake_dcgmi) -> None:
    fake_dcgmi("Error: unable to establish a connection to the specified host: localhost\n", 255)
    report = run_burn(DcgmBackend(timeout=30), gpus(2), BurnPlan(), FakeWatch(), Thresholds())
    assert report.status == "unknown"
    note = report.gpus[0].notes[0]
    assert "exited with code 255" in note and "unable to establish a connection" in note and "dcgmi: something" in note


def test_backend_absent() -> None:
    assert "not installed" in (DcgmBackend(dcgmi="dcgmi-that-does-not-exist").unavailable() or "")
