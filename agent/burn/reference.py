"""Python twins of the C helpers in `agent.burn.kernels.HELPERS`, and the host
reference for sampled GEMM results.

The digests tell whether a GPU computes the same thing every time and the same
as its peers; a GPU alone on its node that is consistently wrong passes both.
So the worker also recomputes a few elements of C = A·B here, from the same
generator, in float64, and compares within a tolerance (the GPU accumulates
16,384 products in float32 in an order of its choosing).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
# |GPU - reference| must stay within this share of Σ|a·b| of the element. The
# worst case of float32 accumulation is n·2⁻²⁴ ≈ 1e-3 for n = 16,384 terms; a
# real fault (a flipped exponent or high mantissa bit, a wrong operand) is far
# larger, so the bound catches faults without flagging rounding.
RELATIVE_TOLERANCE = 2e-3


def mix(z: int) -> int:
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def input_bf16(seed: int, idx: int) -> int:
    h = mix(idx + seed * GOLDEN)
    k = (h >> 40) - (1 << 23)
    bits = int(struct.unpack("<I", struct.pack("<f", k / 8388608.0))[0])
    return bits >> 16


def bf16_value(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits << 16))[0])


def pattern(seed: int, word: int) -> int:
    return mix(word ^ (seed * GOLDEN))


def digest_term(idx: int, bits: int) -> int:
    return mix(idx * GOLDEN + bits)


def gemm_element(n: int, seed_a: int, seed_b: int, row: int, col: int) -> tuple[float, float]:
    """C[row, col] of C = A·B for column-major n×n A and B from the generator,
    and Σ|a·b| (the scale for the tolerance)."""
    total = scale = 0.0
    for k in range(n):
        p = bf16_value(input_bf16(seed_a, row + k * n)) * bf16_value(input_bf16(seed_b, k + col * n))
        total += p
        scale += abs(p)
    return total, scale


def sample_positions(n: int, count: int, seed: int) -> list[tuple[int, int]]:
    return [(mix(seed + 2 * i) % n, mix(seed + 2 * i + 1) % n) for i in range(count)]


def check_samples(n: int, seed_a: int, seed_b: int, samples: Iterable[tuple[int, int, float]]) -> list[str]:
    """Messages for sampled (row, col, GPU value) that disagree with the reference."""
    bad = []
    for row, col, got in samples:
        want, scale = gemm_element(n, seed_a, seed_b, row, col)
        if not abs(got - want) <= RELATIVE_TOLERANCE * scale:  # also catches NaN
            bad.append(f"C[{row},{col}] = {got!r}, the host computes {want!r}")
    return bad
