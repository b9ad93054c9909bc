"""bsa's own rounding to float16 and bfloat16, against an independent definition in exact rational arithmetic.

The oracle knows nothing of magic constants or bit patterns: it writes |x| = n * q + r for the format's
quantum q at |x| (Fractions), and picks n or n + 1 by the remainder and the tie rule. Every tie class is
covered: every midpoint between neighbouring float16 / bfloat16 numbers (subnormal, normal, the one past
the largest finite number), both signs, the float32 neighbours of each midpoint, float64 values closer to a
midpoint than float32 can hold, zeros, infinities and NaNs.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from bsa_cli.core.rounding import BFLOAT16, FLOAT16, round_float32, to_dtype

FORMATS = {  # significant bits, smallest normal exponent, largest finite value
    "float16": (11, -14, 65504.0),
    "bfloat16": (8, -126, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
}
DTYPE = {"float16": FLOAT16, "bfloat16": BFLOAT16}


def oracle(x: float, fmt: str, ties: str) -> float:
    """Round the real number x to the format by `ties` ("even" or "away"), exactly; overflow gives inf.

    x = num / 2**d exactly (Python's `as_integer_ratio`); the format's quantum at x is 2**k; n and the
    remainder of x / 2**k are integer shifts, compared with half a quantum.
    """
    if math.isnan(x) or math.isinf(x) or x == 0.0:
        return x
    bits, emin, largest = FORMATS[fmt]
    num, den = abs(x).as_integer_ratio()
    d = den.bit_length() - 1  # den is a power of two
    exponent = max(num.bit_length() - 1 - d, emin)
    shift = d + exponent - (bits - 1)  # x / quantum = num / 2**shift
    if shift <= 0:
        n, up = num << -shift, False
    else:
        n = num >> shift
        remainder, half = num - (n << shift), 1 << (shift - 1)
        up = remainder > half or (remainder == half and (ties == "away" or n % 2 == 1))
    result = Fraction(n + up) * Fraction(2) ** (exponent - (bits - 1))
    if result > Fraction(largest):
        return math.copysign(math.inf, x)
    return math.copysign(float(result), x)


def neighbours(fmt: str) -> np.ndarray:
    """Every finite non-negative value of the format, ascending, as float64 (exact), and the next one past max."""
    dtype = DTYPE[fmt]
    codes = np.arange(0, 0x7C00 if fmt == "float16" else 0x7F80, dtype=np.uint16)
    values = codes.view(dtype).astype(np.float64)
    bits, _, largest = FORMATS[fmt]
    beyond = largest + 2.0 ** (math.floor(math.log2(largest)) - (bits - 1))
    return np.append(values, beyond)


def tie_classes(fmt: str) -> np.ndarray:
    """Midpoints of all neighbours (exact in float32), their float32 neighbours, and the neighbours themselves."""
    values = neighbours(fmt)
    midpoints = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    assert np.array_equal(midpoints.astype(np.float64), (values[:-1] + values[1:]) / 2)  # exact
    below = np.nextafter(midpoints[::5], np.float32(0))
    above = np.nextafter(midpoints[::5], np.float32(np.inf))
    points = np.concatenate([values[:-1].astype(np.float32), midpoints, below, above])
    return np.concatenate([points, -points])


@pytest.mark.parametrize("ties", ["even", "away"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_every_tie_class_rounds_as_the_exact_definition(fmt: str, ties: str) -> None:
    values = tie_classes(fmt)
    got = round_float32(values, DTYPE[fmt], ties).astype(np.float64)
    want = np.array([oracle(float(x), fmt, ties) for x in values])
    wrong = np.flatnonzero(got != want)
    first = wrong[:3]
    assert wrong.size == 0, f"{wrong.size} wrong, first {values[first]}: got {got[first]}, want {want[first]}"
    as_dtype = to_dtype(values, DTYPE[fmt], ties).astype(np.float64)
    assert np.array_equal(as_dtype, got)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_ties_even_and_away_differ_exactly_on_ties(fmt: str) -> None:
    values = tie_classes(fmt)
    even = round_float32(values, DTYPE[fmt], "even")
    away = round_float32(values, DTYPE[fmt], "away")
    differ = even != away
    midpoints = neighbours(fmt)
    midpoints = (midpoints[:-1] + midpoints[1:]) / 2
    even_below = midpoints[0::2]  # the lower neighbour's code is even: ties to even go down, away up
    assert np.array_equal(differ, np.isin(np.abs(values.astype(np.float64)), even_below)) and differ.any()
    assert (np.abs(away[differ]) > np.abs(even[differ])).all()


def test_float64_to_float16_rounds_once_and_to_bfloat16_through_float32() -> None:
    # Just above a midpoint, by less than float32 can hold: direct rounding goes up, through float32 it ties.
    fp16_mid, bf16_mid = 1 + 2.0**-11, 1 + 2.0**-8
    values = np.array([fp16_mid + 2.0**-40, fp16_mid - 2.0**-40, -(fp16_mid + 2.0**-40)])
    assert to_dtype(values, FLOAT16).astype(np.float64).tolist() == [1 + 2.0**-10, 1.0, -(1 + 2.0**-10)]
    values = np.array([bf16_mid + 2.0**-40, bf16_mid + 2.0**-20, 3 * bf16_mid / 3])
    assert to_dtype(values, BFLOAT16).astype(np.float64).tolist() == [1.0, 1 + 2.0**-7, 1.0]
    assert to_dtype(values, BFLOAT16, "away").astype(np.float64).tolist() == [1 + 2.0**-7, 1 + 2.0**-7, 1 + 2.0**-7]


@pytest.mark.parametrize("ties", ["even", "away"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_non_finite_values_and_zeros(fmt: str, ties: str) -> None:
    nan_payload = np.array([0x7FC00001, 0xFFC00000, 0x7F800001], dtype=np.uint32).view(np.float32)  # q, -q, sNaN
    values = np.concatenate([np.array([np.inf, -np.inf, 0.0, -0.0, 3.0e38, -3.4e38], np.float32), nan_payload])
    got = round_float32(values, DTYPE[fmt], ties)
    assert got[0] == np.inf and got[1] == -np.inf
    assert got[2] == 0 and not np.signbit(got[2]) and got[3] == 0 and np.signbit(got[3])
    if fmt == "float16":
        assert got[4] == np.inf and got[5] == -np.inf
    else:
        assert got[4] == float(np.float32(3.0e38).astype(ml_dtypes.bfloat16)) and got[5] == -np.inf
    assert np.isnan(got[6:]).all() and np.signbit(got[7]) and not np.signbit(got[6])
    assert np.isnan(to_dtype(values, DTYPE[fmt], ties).astype(np.float32)[6:]).all()


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_ties_to_even_is_what_numpy_and_ml_dtypes_cast_from_float32(fmt: str) -> None:
    values = np.random.default_rng(3).standard_normal(200_000).astype(np.float32)
    values *= np.float32(2.0) ** np.random.default_rng(4).integers(-30, 18, values.size).astype(np.float32)
    with np.errstate(over="ignore"):
        want = values.astype(DTYPE[fmt]).astype(np.float32)
    assert np.array_equal(round_float32(values, DTYPE[fmt]), want)


def test_in_place_and_other_dtypes() -> None:
    values = np.array([1 + 2.0**-11, 2.5], np.float32)
    assert round_float32(values, FLOAT16, out=values) is values and values.tolist() == [1.0, 2.5]
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        round_float32(values, np.dtype(np.float32))
    assert to_dtype(values, np.dtype(np.float32)) is values
    assert to_dtype(np.array([1.5], np.float16), BFLOAT16).astype(np.float32).tolist() == [1.5]


def test_the_benchmark_and_the_reference_device_round_the_backward_half_away_from_zero(monkeypatch) -> None:
    from bsa_cli import golden
    from bsa_cli.core.rounding import BACKWARD_TIES, FORWARD_TIES
    from bsa_cli.devices import reference
    from bsa_cli.gen.generate import compute_case
    from bsa_cli.inputs import make_mask
    from bsa_cli.specs import load_specs

    assert (BACKWARD_TIES, FORWARD_TIES) == ("away", "even")  # CAST_ROUND in the backward, CAST_RINT forward
    case = next(c for c in load_specs(["cases/smoke.yaml"]) if c.name == "smoke-bnsd-random.fp16")
    runs = {}
    for rule in ("even", "away"):
        monkeypatch.setattr(golden.paths, "BACKWARD_TIES", rule)
        monkeypatch.setattr(reference, "BACKWARD_TIES", rule)
        tensors, _, bench = compute_case(case)
        device = reference.emulate(case, {**tensors, "block_sparse_mask": make_mask(case)})
        runs[rule] = tensors["attention_out"], bench, device
    assert np.array_equal(runs["even"][0].view(np.uint16), runs["away"][0].view(np.uint16))  # the forward: even
    for grad in ("dq", "dk", "dv"):
        for part in (1, 2):  # benchmark, reference device
            even, away = runs["even"][part][grad].view(np.uint16), runs["away"][part][grad].view(np.uint16)
            moved = np.flatnonzero(even != away)
            assert 0 < moved.size < even.size // 100, (grad, part, moved.size)
            # last-bit changes (a tie upstream, in P16 or dS16, moves a sum by far less than the tensor's scale)
            values = [runs[r][part][grad].astype(np.float64).reshape(-1) for r in ("even", "away")]
            scale = np.abs(values[0]).max()
            assert np.abs(values[0][moved] - values[1][moved]).max() <= 2.0**-9 * scale


def edge_sample() -> np.ndarray:
    """float32 bit patterns where a rounding goes wrong if it does: every pattern within 4 of each float16 and
    bfloat16 tie and of each value (subnormals, the smallest normals, the overflow edge 65504..65536 whole),
    zeros, infinities, NaNs with payloads in both signs and both quiet bits, float32 subnormals, and 2**18
    random patterns."""
    rng = np.random.default_rng(34)
    centres = [tie_classes(fmt).view(np.uint32) for fmt in FORMATS]
    near = np.concatenate([c.astype(np.int64)[:, None] + np.arange(-4, 5) for c in centres]).reshape(-1)
    edge = np.arange(0x477FE000, 0x47800001)  # 65504 .. 65536, every float32 between
    nans = rng.integers(1, 1 << 23, 4096) | rng.integers(0, 2, 4096) << 22 | 0x7F800000
    small = np.arange(0, 1 << 16)  # float32 subnormals
    specials = np.array([0, 0x7F800000, 0x7F7FFFFF, 0x00800000, 0x33000000, 0x33000001, 0x32FFFFFF])
    positive = np.concatenate([near, edge, nans, small, specials, rng.integers(0, 1 << 31, 1 << 18)])
    positive = np.clip(positive, 0, 0x7FFFFFFF).astype(np.uint32)
    return np.concatenate([positive, positive | np.uint32(0x80000000)])


@pytest.mark.parametrize("ties", ["even", "away"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_the_same_bits_as_the_rounding_of_bc5c210_on_the_edges(fmt: str, ties: str) -> None:
    """Today's vectorized rounding gives the bits bc5c210's did (benchmarks/perf.py checks all 2**32 patterns)."""
    from tests import rounding_bc5c210 as before

    values = edge_sample().view(np.float32)
    with np.errstate(all="ignore"):
        want = before.round_float32(values, DTYPE[fmt], ties).view(np.uint32)
        got = round_float32(values, DTYPE[fmt], ties).view(np.uint32)
        assert np.array_equal(got, want), f"{(got != want).sum()} differ, first {values[got != want][:3]}"
        for source in (values, values.astype(np.float64)):
            want = before.to_dtype(source, DTYPE[fmt], ties).view(np.uint16)
            got = to_dtype(source, DTYPE[fmt], ties).view(np.uint16)
            assert np.array_equal(got, want), f"{source.dtype}: {(got != want).sum()} differ"
        in_place = values.copy()
        assert round_float32(in_place, DTYPE[fmt], ties, out=in_place) is in_place
        assert np.array_equal(in_place.view(np.uint32), round_float32(values, DTYPE[fmt], ties).view(np.uint32))


def test_a_rounding_that_misses_ties_or_the_overflow_edge_is_caught(monkeypatch) -> None:
    """The comparison above fails on a rounding a little wrong: ties to even where away is asked, or no inf."""
    from bsa_cli.core import rounding

    values = edge_sample().view(np.float32)
    with np.errstate(all="ignore"):
        right = rounding.round_float32(values, FLOAT16, "away").view(np.uint32)
        wrong_ties = rounding._MAGIC32.round(values, "even").view(np.uint32)
        monkeypatch.setattr(rounding, "_FLOAT16_INF_FROM", 1e9)
        wrong_edge = rounding.round_float32(values, FLOAT16, "away").view(np.uint32)
    assert not np.array_equal(right, wrong_ties) and not np.array_equal(right, wrong_edge)


def test_largest_finite_values_without_ml_dtypes() -> None:
    from bsa_cli.core.rounding import largest

    for fmt in FORMATS:
        assert largest(fmt) == largest(DTYPE[fmt]) == float(ml_dtypes.finfo(DTYPE[fmt]).max)
    assert largest("float32") == float(np.finfo(np.float32).max)
