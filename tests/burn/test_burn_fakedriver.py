"""The real burn worker, end to end, through the real cuda-bindings, the real
NVRTC and our ctypes cuBLAS layer, against a CPU stand-in for the driver and
cuBLAS (tests/support/fakelibcuda): every CUDA call the worker makes is checked the
way the driver checks it (live allocations, a CUDA ELF that holds the
kernels, launch shapes, GEMM types and leading dimensions), and faults are
injected where a sick GPU has them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import fakelibcuda
import pytest
from burnfakes import NODE, gpus, sysfs

from agent import cli
from agent.burn.backend import NoWatch
from agent.burn.builtin import BuiltinBackend
from agent.burn.model import BurnPlan, Fault
from agent.burn.orchestrator import run_burn
from agent.burn.verdict import Thresholds

N = 1024  # the smallest matrix the config allows: about 0.1 s per GEMM on one core


def worker(
    libs: str, *args: str, faults: Mapping[str, str] | None = None, visible: str | None = None, **settings: object
) -> list[dict]:
    env = dict(os.environ, **fakelibcuda.env(libs, faults, **settings))
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    res = subprocess.run(
        [sys.executable, "-m", "agent.burn.worker", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert not res.stderr.strip(), res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def burn_one(libs: str, fault: str | None = None, seconds: float = 0.6, **settings: object) -> dict:
    args = ["run", "--seconds", str(seconds), "--matrix-size", str(N), "--memory-fraction", "0.5"]
    events = worker(libs, *args, "--memory-time-share", "0.3", faults={"*": fault} if fault else None, **settings)
    assert events[-1]["event"] == "result", events[-1]
    return events[-1]


def test_a_healthy_gpu_passes_with_measurements(fake_gpu_libs: str) -> None:
    r = burn_one(fake_gpu_libs, require_flags=4)  # CU_CTX_SCHED_BLOCKING_SYNC: waits block instead of spinning
    assert r["problems"] == [] and r["compute_errors"] == 0 and r["memory_errors"] == 0
    assert r["iterations"] >= 2 and r["gemm_flops"] > 0 and r["memory_bandwidth"] > 0
    assert r["group"] == f"NVIDIA H100 80GB HBM3|132|{N}"
    assert len(r["digest"]) == 16 and r["digest"] != "0" * 16
    assert any(n.startswith("memory test: 32.0 MiB,") for n in r["notes"]), r["notes"]


def test_the_digest_is_a_function_of_the_inputs_alone(fake_gpu_libs: str) -> None:
    """Two GPUs (two runs) of one model agree bit for bit; a GPU that computes
    something else does not, which is how the verdict finds the odd one out."""
    assert burn_one(fake_gpu_libs)["digest"] == burn_one(fake_gpu_libs, seconds=0.3)["digest"]
    assert burn_one(fake_gpu_libs, "wrong")["digest"] != burn_one(fake_gpu_libs)["digest"]


def test_one_flipped_bit_in_one_gemm_is_a_compute_mismatch(fake_gpu_libs: str) -> None:
    r = burn_one(fake_gpu_libs, "flip:2")
    assert [p["fault"] for p in r["problems"]] == [Fault.COMPUTE_MISMATCH]
    assert r["problems"][0]["message"].startswith("1 of ") and r["compute_errors"] == 1


def test_a_gpu_that_is_consistently_wrong_is_caught_by_the_host_reference(fake_gpu_libs: str) -> None:
    r = burn_one(fake_gpu_libs, "wrong")
    assert r["compute_errors"] == 8 and [p["fault"] for p in r["problems"]] == [Fault.COMPUTE_MISMATCH]
    message = r["problems"][0]["message"]
    assert message.startswith("8 of 8 sampled GEMM results differ from the host's reference: C[")
    assert message.endswith("(and 7 more)") and "the host computes" in message


def test_a_stuck_memory_bit_is_found_and_located(fake_gpu_libs: str) -> None:
    r = burn_one(fake_gpu_libs, "stuck:1000")
    assert [p["fault"] for p in r["problems"]] == [Fault.MEMORY_ERRORS]
    assert r["memory_errors"] > 0 and "first at byte offset 0x1f40" in r["problems"][0]["message"]


def test_a_kernel_fault_is_reported_as_the_first_error_with_its_phase(fake_gpu_libs: str) -> None:
    r = burn_one(fake_gpu_libs, "fail:5:719")
    assert r["problems"] == [
        {
            "fault": Fault.CUDA_ERROR,
            "message": "cuStreamSynchronize: CUDA_ERROR_LAUNCH_FAILED (in the gemm phase)",
        }
    ]


def test_too_little_device_memory_for_the_matrices_is_a_cuda_error(fake_gpu_libs: str) -> None:
    r = burn_one(fake_gpu_libs, memory=4 << 20)
    assert r["problems"][0]["message"] == f"cuMemAlloc({4 * N * N}): CUDA_ERROR_OUT_OF_MEMORY (in the gemm phase)"


def test_a_gpu_cuda_cannot_see_fails_at_cuinit(fake_gpu_libs: str) -> None:
    events = worker(fake_gpu_libs, "run", "--seconds", "1", "--matrix-size", str(N), "--memory-fraction", "0.5",
                    "--memory-time-share", "0.3", visible="MIG-bogus")  # fmt: skip
    assert events[-1]["problems"][0]["message"] == "cuInit: CUDA_ERROR_NO_DEVICE (in the setup phase)"


def test_list_reports_cuda_devices_in_order(fake_gpu_libs: str) -> None:
    events = worker(fake_gpu_libs, "list", devices=3)
    assert [(d["index"], d["pci_bus_id"]) for d in events[0]["devices"]] == [
        (0, "0000:18:00.0"),
        (1, "0000:28:00.0"),
        (2, "0000:38:00.0"),
    ]


# ------------------------------------------------------------ the whole backend


@pytest.fixture
def driver(fake_gpu_libs: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    def set_(faults: Mapping[int, str] | None = None, **settings: object) -> None:
        by_uuid = {g.uuid: faults[g.index] for g in gpus(8) if faults and g.index in faults}
        for key, value in fakelibcuda.env(fake_gpu_libs, by_uuid, **settings).items():
            monkeypatch.setenv(key, value)

    yield set_


def backend_burn(n: int, hang_timeout: float = 30.0) -> object:
    """Stragglers are off: CPU "GPUs" sharing two cores run at whatever speed
    the scheduler gives them (tests/burn/test_burn_verdict.py holds that math)."""
    plan = BurnPlan(seconds=1.0, matrix_size=N, memory_fraction=0.25, hang_timeout=hang_timeout)
    return run_burn(BuiltinBackend(), gpus(n), plan, NoWatch("test"), Thresholds(straggler_fraction=0))


def test_backend_three_gpus_pass(driver) -> None:
    driver()
    report = backend_burn(3)
    assert report.status == "pass", report
    assert all(g.gemm_flops and g.memory_bandwidth and not g.problems for g in report.gpus)


def test_backend_the_odd_gpu_out_fails_the_others_pass(driver) -> None:
    driver({1: "wrong"})
    report = backend_burn(3)
    assert [g.status for g in report.gpus] == ["pass", "fail", "pass"], report
    assert {p.fault for p in report.gpus[1].problems} == {Fault.COMPUTE_MISMATCH}


def test_backend_a_hung_gpu_is_killed_at_its_deadline(driver) -> None:
    driver({0: "hang:1"})
    report = backend_burn(2, hang_timeout=5.0)
    assert [g.status for g in report.gpus] == ["fail", "pass"], report
    assert [p.fault for p in report.gpus[0].problems] == [Fault.TIMEOUT]


def test_agent_burn_json_on_the_fake_driver(
    driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`agent burn` as an SRE runs it: GPUs from the PCI bus (no NVML here),
    listed by CUDA, burned by the real workers."""
    driver(devices=2)
    root = sysfs(tmp_path, {k: v for k, v in NODE.items() if k in ("0000:18:00.0", "0000:2a:00.0")})
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f"[checks.burn]\nmatrix_size = {N}\nmemory_fraction = 0.25\nstraggler_fraction = 0.0\n")
    code = cli.main(["burn", "--path.sysfs", str(root), "--config", str(cfg), "--seconds", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    assert doc["status"] == "pass" and [g["status"] for g in doc["gpus"]] == ["pass", "pass"]
    assert all(g["gemm_flops"] > 0 and g["memory_bandwidth"] > 0 for g in doc["gpus"])


@pytest.mark.parametrize(
    ("cc", "what"),
    [
        pytest.param("8.0", "cubin", id="A100: a cubin for sm_80"),
        pytest.param("13.0", "ptx", id="a GPU newer than the NVRTC: PTX the driver compiles"),
    ],
)
def test_the_kernels_load_on_the_gpus_architecture(fake_gpu_libs: str, cc: str, what: str) -> None:
    """The fake driver refuses a cubin built for another major architecture
    and PTX for a newer one, as the real driver does."""
    r = burn_one(fake_gpu_libs, cc=cc, seconds=0.3)
    assert r["problems"] == [] and r["iterations"] >= 1, r


def test_a_gpu_older_than_every_architecture_nvrtc_knows_is_not_tested(fake_gpu_libs: str) -> None:
    events = worker(fake_gpu_libs, "run", "--seconds", "1", "--matrix-size", str(N), "--memory-fraction", "0.5",
                    "--memory-time-share", "0.3", cc="3.5")  # fmt: skip
    assert events[-1]["event"] == "error" and "this NVRTC cannot compile for sm_35" in events[-1]["message"]


def test_the_fake_driver_refuses_a_cubin_the_gpu_cannot_run(fake_gpu_libs: str) -> None:
    code = (
        "from cuda.bindings import driver as cu; from agent.burn import kernels; cu.cuInit(0);"
        "_, d = cu.cuDeviceGet(0); _, c = cu.cuDevicePrimaryCtxRetain(d); cu.cuCtxSetCurrent(c);"
        "print(*(cu.cuModuleLoadData(kernels.compile_cubin(*a))[0].name for a in ((9, 0), (8, 9), (8, 0))))"
    )
    env = dict(os.environ, **fakelibcuda.env(fake_gpu_libs), FAKECUDA_CC="8.6")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.split() == ["CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_INVALID_IMAGE", "CUDA_SUCCESS"]
