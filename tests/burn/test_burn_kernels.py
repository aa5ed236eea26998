"""The CUDA side, without a GPU: every kernel compiles with the real NVRTC
for the architectures the agent meets, and the C helpers the kernels share
with the host (compiled here with the host C compiler) agree bit for bit with
the Python twins that check GEMM results on the host."""

from __future__ import annotations

import math
import random
import subprocess
from pathlib import Path

import pytest
from conftest import require_tool, skip_or_fail

from agent.burn import kernels, reference


def _nvrtc() -> None:
    try:
        from cuda.bindings import nvrtc  # noqa: F401
        from cuda.pathfinder import load_nvidia_dynamic_lib

        load_nvidia_dynamic_lib("nvrtc")
    except Exception as exc:  # noqa: BLE001 - ImportError or the library missing
        skip_or_fail(f"needs cuda-bindings and the NVRTC wheel (pip install -e '.[test]'): {exc}")


@pytest.mark.parametrize(
    "arch",
    [
        pytest.param((7, 0), id="V100 sm_70"),
        pytest.param((8, 0), id="A100 sm_80"),
        pytest.param((8, 6), id="A10/RTX 30 sm_86"),
        pytest.param((8, 9), id="L4/L40 sm_89"),
        pytest.param((9, 0), id="H100/H200 sm_90"),
        pytest.param((10, 0), id="B200 sm_100"),
    ],
)
def test_kernels_compile_to_a_cubin(arch: tuple[int, int]) -> None:
    _nvrtc()
    cubin = kernels.compile_cubin(*arch)
    assert cubin[:4] == b"\x7fELF"
    for name in kernels.NAMES:
        assert name.encode() in cubin, f"{name} missing from the cubin"


def test_a_compile_error_says_what_nvrtc_said(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvrtc()
    monkeypatch.setattr(kernels, "SOURCE", kernels.SOURCE + "\nthis is not C++;\n")
    with pytest.raises(kernels.CompileError, match=r"sm_90: .*error"):
        kernels.compile_cubin(9, 0)


HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    nha_u64 seed, idx;
    char what;
    while (scanf(" %c %llu %llu", &what, &seed, &idx) == 3) {
        if (what == 'i') printf("%u\n", (unsigned)nha_input_bf16(seed, idx));
        else if (what == 'p') printf("%llu\n", nha_pattern(seed, idx));
        else printf("%llu\n", nha_digest_term(seed, (nha_u32)idx));
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def host_helpers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = require_tool("gcc")
    d = tmp_path_factory.mktemp("helpers")
    (d / "h.c").write_text("#define NHA_HOST 1\n" + kernels.HELPERS + HARNESS)
    subprocess.run([cc, "-O2", "-std=c99", "-Wall", "-Werror", "-o", str(d / "h"), str(d / "h.c")], check=True)
    return d / "h"


def _cases() -> list[tuple[str, int, int]]:
    rng = random.Random(7)
    edge = [0, 1, 2**23, 2**28 - 1, 2**63, 2**64 - 1]
    cases = [(w, s, i if w != "d" else i & 0xFFFFFFFF) for w in "ipd" for s in (0, 1, 0xA11CE, 2**64 - 1) for i in edge]
    cases += [(w, rng.getrandbits(64), rng.getrandbits(64 if w != "d" else 32)) for w in "ipd" for _ in range(3000)]
    return cases


def test_c_helpers_equal_their_python_twins(host_helpers: Path) -> None:
    cases = _cases()
    stdin = "".join(f"{w} {a} {b}\n" for w, a, b in cases)
    got = subprocess.run([str(host_helpers)], input=stdin, capture_output=True, text=True, check=True).stdout.split()
    twin = {"i": reference.input_bf16, "p": reference.pattern, "d": reference.digest_term}
    want = [str(twin[w](a, b)) for w, a, b in cases]
    mismatches = [(c, g, w) for c, g, w in zip(cases, got, want) if g != w]
    assert len(got) == len(cases) and not mismatches, mismatches[:5]


def test_inputs_are_bf16_values_in_range_and_not_degenerate() -> None:
    values = [reference.bf16_value(reference.input_bf16(0xA11CE, i)) for i in range(20000)]
    assert all(-1.0 <= v < 1.0 for v in values)
    assert len(set(values)) > 1000, "too few distinct inputs to exercise the multipliers"
    assert abs(sum(values) / len(values)) < 0.02


def test_reference_gemm_element_matches_a_direct_product() -> None:
    n = 64
    a = [[reference.bf16_value(reference.input_bf16(5, r + k * n)) for k in range(n)] for r in range(n)]
    b = [[reference.bf16_value(reference.input_bf16(9, k + c * n)) for c in range(n)] for k in range(n)]
    value, scale = reference.gemm_element(n, 5, 9, 3, 17)
    assert value == pytest.approx(sum(a[3][k] * b[k][17] for k in range(n)), abs=1e-12)
    assert scale == pytest.approx(sum(abs(a[3][k] * b[k][17]) for k in range(n)))


@pytest.mark.parametrize(
    ("error", "flagged"),
    [
        pytest.param(0.0, False, id="exact"),
        pytest.param(1e-4, False, id="float32 rounding of a long sum"),
        pytest.param(0.5, True, id="a high mantissa bit"),
        pytest.param(float("nan"), True, id="NaN"),
    ],
)
def test_host_check_of_sampled_elements(error: float, flagged: bool) -> None:
    n = 256
    row, col = 10, 20
    want, scale = reference.gemm_element(n, 1, 2, row, col)
    got = error if math.isnan(error) else want + error * scale
    assert bool(reference.check_samples(n, 1, 2, [(row, col, got)])) is flagged
