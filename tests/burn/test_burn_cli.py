"""`agent burn` and `agent selftest --burn`: exit codes (0 pass, 1 fail or
not tested, 2 bad input), the table, --json. GPUs come from a sysfs fixture
(NVIDIA display devices on the PCI bus, no driver here, so no NVML) and the
stand-in worker (tests/support/fakeburn/worker.py) plays the GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from burnfakes import NODE, sysfs

from agent import cli
from agent.burn import builtin
from agent.burn.runner import pci_gpu_count
from agent.hostpaths import HostPaths

FAKE = str(Path(__file__).parent.parent / "support" / "fakeburn" / "worker.py")


def test_pci_gpu_count(tmp_path: Path) -> None:
    assert pci_gpu_count(HostPaths(sysfs=str(sysfs(tmp_path, NODE)))) == 3
    assert pci_gpu_count(HostPaths(sysfs=str(tmp_path / "nothing"))) == 0


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    root = sysfs(tmp_path, {k: v for k, v in NODE.items() if k in ("0000:18:00.0", "0000:2a:00.0")})
    monkeypatch.setattr(builtin, "worker_command", lambda: [sys.executable, FAKE])
    cfg = tmp_path / "agent.toml"
    # No NVML here, whatever an earlier test loaded into this process (by soname, dlopen would find it again).
    nvml = tmp_path / "no-driver" / "libnvidia-ml.so.1"
    cfg.write_text(f'[checks.burn]\nhang_timeout = "10s"\n[checks.gpu]\nnvml_library = "{nvml}"\n')

    def agent(*args: str, scenario: dict[str, str] | None = None) -> tuple[int, str, str]:
        monkeypatch.setenv("FAKE_BURN", json.dumps({"count": 2} | (scenario or {})))
        code = cli.main([args[0], "--path.sysfs", str(root), "--config", str(cfg), *args[1:]])
        out, err = capsys.readouterr()
        return code, out, err

    return agent


def test_all_pass_exit_0_and_a_table(node) -> None:
    code, out, _ = node("burn", "--seconds", "0.2")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["GPU", "MODEL", "RESULT", "TFLOP/S", "MEM", "GB/S"]
    assert lines[1].split()[0] == "0" and "PASS" in lines[1] and "700.0" in lines[1] and "2900.0" in lines[1]
    assert lines[-1].startswith("burn: pass (builtin,") and "GPUs listed by CUDA" in lines[-1]


def test_a_failing_gpu_exit_1_json(node) -> None:
    code, out, _ = node("burn", "--seconds", "0.2", "--json", scenario={"1": "memory"})
    assert code == 1
    doc = json.loads(out)
    assert doc["status"] == "fail" and [g["status"] for g in doc["gpus"]] == ["pass", "fail"]
    assert doc["gpus"][1]["problems"] == [{"fault": "memory_errors", "message": "17 words read back wrong"}]
    assert doc["gpus"][1]["memory_errors"] == 17 and doc["gpus"][0]["gemm_flops"] == 700e12


def test_only_the_gpus_asked_for(node) -> None:
    code, out, _ = node("burn", "--seconds", "0.2", "--gpus", "1", "--json", scenario={"0": "memory"})
    assert code == 0 and [g["index"] for g in json.loads(out)["gpus"]] == [1]


def test_not_tested_is_exit_1(node) -> None:
    code, out, _ = node("burn", "--seconds", "0.2", scenario={"0": "unavailable", "1": "unavailable"})
    assert code == 1 and "UNKNOWN" in out and "libcuda.so.1" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("--gpus", "9"), "--gpus: there is no GPU 9 here (GPUs: 0, 1)", id="no such GPU"),
        pytest.param(("--gpus", "0,x"), '--gpus: expected GPU indices such as "0,1,3", got "0,x"', id="not an index"),
        pytest.param(("--seconds", "0"), "--seconds: expected a number of seconds above 0, got 0", id="zero seconds"),
        pytest.param(("--seconds", "-5"), "above 0, got -5", id="negative seconds"),
    ],
)
def test_bad_input_exit_2_one_line(node, args: tuple[str, ...], message: str) -> None:
    code, out, err = node("burn", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_selftest_includes_the_burn(node) -> None:
    code, out, _ = node("selftest", "--only", "burn", "--burn", "0.2", scenario={"1": "mismatch"})
    assert code == 1
    rows = [line for line in out.splitlines() if line.startswith("burn ")]
    assert any("gpu1" in r and "CRITICAL" in r and "3 of 100 GEMM" in r for r in rows), out
    assert not any("gpu0" in r for r in rows), "a GPU that passed is not a problem row"


def test_selftest_burn_bad_seconds(node) -> None:
    code, _, err = node("selftest", "--burn", "0")
    assert code == 2 and "--burn: expected a number of seconds above 0" in err


def test_no_gpu_host_passes_as_a_real_process(tmp_path: Path) -> None:
    root = sysfs(tmp_path, {"0000:00:1f.0": ("0x8086", "0x060100")})
    res = subprocess.run(
        [sys.executable, "-m", "agent", "burn", "--json", "--path.sysfs", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "pass" and doc["no_gpu"] and doc["gpus"] == []


def test_the_table_shows_power_clock_and_temperature_from_nvml() -> None:
    import io

    from agent.cli.burn import render
    from agent.burn.model import BurnReport, Fault, GpuVerdict, Problem, Telemetry

    seen = Telemetry(power_watts_mean=688.4, sm_clock_hz_mean=1.98e9, temperature_max_c=71.0, samples=60)
    report = BurnReport(
        "builtin",
        0.0,
        61.0,
        (
            GpuVerdict(0, "pass", "NVIDIA H100 80GB HBM3", gemm_flops=756e12, memory_bandwidth=2.9e12, telemetry=seen),
            GpuVerdict(1, "fail", "NVIDIA H100 80GB HBM3", problems=(Problem(Fault.TIMEOUT, "hung"),)),
        ),
    )
    out = io.StringIO()
    render(report, out)
    head, gpu0, gpu1, _, last = out.getvalue().splitlines()
    assert head.split() == [
        "GPU", "MODEL", "RESULT", "TFLOP/S", "MEM", "GB/S", "POWER", "W", "SM", "MHZ", "MAX", "C", "ERRORS", "DETAIL",
    ]  # fmt: skip
    assert gpu0.split()[5:12] == ["PASS", "756.0", "2900.0", "688.4", "1980", "71.0", "0"]
    assert gpu1.split()[5:12] == ["FAIL", "-", "-", "-", "-", "-", "0"] and gpu1.endswith("timeout: hung")
    assert last == "burn: fail (builtin, 61s)"
