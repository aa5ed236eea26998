"""The built-in burn's procedure (agent.burn.gpuburn) on a CPU stand-in for
the device (tests/support/fakecuda.py: the kernels run as their Python twins): the
counters, the digest comparison, the host check of sampled elements and the
memory passes add up, and injected faults are found and counted."""

from __future__ import annotations

import pytest
from conftest import skip_or_fail
from fakecuda import FakeCublas, FakeDevice, Fault, burn

from agent.burn.worker import _result_event

N = 32  # small matrices: the stand-in multiplies in Python


@pytest.fixture(autouse=True)
def _nvrtc() -> None:
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError as exc:
        skip_or_fail(f"needs cuda-bindings (pip install -e '.[test]'): {exc}")


def test_healthy_gpu() -> None:
    dev = FakeDevice()
    events: list[dict[str, object]] = []
    b = burn(dev, FakeCublas(dev), events)
    b.gemm(N, 0.3)
    b.memory(0.5, 0.2)
    r = b.result
    assert r.iterations >= 2 and r.compute_errors == 0 and r.nonfinite == 0 and r.reference_errors == []
    assert len(r.digest) == 16 and r.gemm_flops and r.gemm_flops > 0
    assert r.memory_errors == 0 and r.first_bad_word is None and r.memory_bandwidth and r.memory_bandwidth > 0
    assert dev.mem == {}, "every allocation was freed"
    phases = [e["phase"] for e in events if e["event"] == "phase"]
    assert phases == ["gemm", "memory"]
    ev = _result_event(r, "g", [], 0.5)
    assert ev["problems"] == [] and ev["compute_errors"] == 0


def test_same_inputs_give_the_same_digest_on_another_device() -> None:
    digests = []
    for _ in range(2):
        dev = FakeDevice()
        b = burn(dev, FakeCublas(dev))
        b.gemm(N, 0.05)
        digests.append(b.result.digest)
    assert digests[0] == digests[1]


def flip_on(call: int) -> Fault:
    def fault(n: int, c: list[float]) -> None:
        if n == call:
            c[5] = c[5] * 2 + 1

    return fault


def test_one_corrupted_iteration_is_counted() -> None:
    dev = FakeDevice()
    b = burn(dev, FakeCublas(dev, flip_on(2)))
    b.gemm(N, 0.5)
    r = b.result
    assert r.iterations >= 3 and r.compute_errors == 1
    ev = _result_event(r, "g", [], 1.0)
    assert [p["fault"] for p in ev["problems"]] == ["compute_mismatch"]
    assert f"1 of {r.iterations} GEMM iterations" in ev["problems"][0]["message"]


def test_consistently_wrong_results_are_caught_by_the_host_check() -> None:
    def stuck_bit(n: int, c: list[float]) -> None:  # the same wrong answer every time
        c[:] = [v + 0.5 for v in c]

    dev = FakeDevice()
    b = burn(dev, FakeCublas(dev, stuck_bit))
    b.gemm(N, 0.1)
    r = b.result
    assert r.compute_errors == 0, "every iteration is equally wrong, so the digests agree"
    assert len(r.reference_errors) == 8 and "the host computes" in r.reference_errors[0]


def test_nan_is_counted() -> None:
    def nan_once(n: int, c: list[float]) -> None:
        if n == 0:
            c[3] = float("nan")

    dev = FakeDevice()
    b = burn(dev, FakeCublas(dev, nan_once))
    b.gemm(N, 0.05)
    assert b.result.nonfinite >= 1


def test_a_bad_memory_word_is_found_every_pass() -> None:
    dev = FakeDevice(free=1 << 14, flip=77)
    b = burn(dev, FakeCublas(dev))
    b.memory(0.5, 0.1)
    r = b.result
    passes = int(r.notes[-1].split(", ")[1].split()[0])
    assert r.memory_errors == passes and r.first_bad_word == 77
    ev = _result_event(r, "g", [], 1.0)
    assert ev["problems"][0]["fault"] == "memory_errors" and "byte offset 0x268" in ev["problems"][0]["message"]
