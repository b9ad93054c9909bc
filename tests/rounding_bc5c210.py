"""bsa_cli/core/rounding.py as of commit bc5c210, kept verbatim: the reference that tests/gen/test_rounding.py and
benchmarks/perf.py (on all 2**32 float32 bit patterns) hold today's rounding to, bit for bit. Not used by bsa.

Its own docstring:

bsa's own rounding to float16 and bfloat16: which intermediate precision, which tie rule, written once.

Every value bsa writes in a 16-bit dtype, and every 16-bit rounding its golden, benchmark and reference
device make, goes through `to_dtype` or `round_float32`, so the bytes depend on the spec and seed only,
never on how a NumPy or ml_dtypes version happens to cast (ml_dtypes 0.7 rounds float64 to bfloat16
directly where 0.3-0.6 rounded through float32: the same spec gave other bf16 inputs).

The rules:
- float64 -> float16: one rounding, straight from float64 (as NumPy's cast has always done).
- float64 -> bfloat16: first to float32 (IEEE round to nearest, ties to even: the C cast), then to bfloat16.
  Two roundings on purpose: it is what every ml_dtypes release before 0.7, and PyTorch's float-based
  bfloat16 constructor, give, so suites generated before keep their bytes.
- float32 -> float16 / bfloat16: one rounding.
- Ties: `even` (IEEE round half to even: NumPy, torch, the forward kernel's CAST_RINT) or `away` (round
  half away from zero: AscendC CAST_ROUND, which the backward kernel uses for P16, dS16 and dq/dk/dv).
- Overflow: a value past the largest finite number by half an ULP or more (ties as the rule says) becomes
  inf of its sign; inf stays inf; NaN stays NaN (float16: payload and sign kept where the format can hold
  them; bfloat16: the top 16 bits, made quiet). Subnormals are rounded like normal numbers (no flush).

The arithmetic uses only IEEE additions, subtractions, comparisons and bit operations, which give the same
result on every machine and NumPy version.
"""

from __future__ import annotations

import functools
from typing import Literal

import ml_dtypes
import numpy as np

#: How a value halfway between two neighbours is rounded: to the even one, or away from zero.
Ties = Literal["even", "away"]


#: The A2/A3 backward kernel's casts (P16, dS16, and dq/dk/dv at the end) use AscendC RoundMode::CAST_ROUND,
#: round half away from zero: ops-transformer master 5778144, attention/block_sparse_attention_grad/op_kernel/
#: attn_infra/epilogue/block/block_epilogue_simply_softmax.hpp (P, dS) and block_epilogue_post.hpp (the final
#: `Cast(dstLocal, srcLocal, RoundMode::CAST_ROUND, ...)` after the scale). The benchmark and the reference
#: device round as the kernel does.
BACKWARD_TIES: Ties = "away"

#: The forward kernel casts with CAST_RINT (ties to even): the attention_out bsa writes is rounded so.
FORWARD_TIES: Ties = "even"

FLOAT16 = np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

_FLOAT16_MAX = 65504.0


class _Magic:
    """Rounding a float's magnitude to float16 spacing by one addition: |x| + m - m, m = 2**(e + shift).

    With e the exponent of |x| (at least -14, float16's smallest normal exponent, so subnormals get the
    spacing 2**-24), m has the float's spacing 2**(e - 10) there, so the hardware's addition rounds |x|
    to float16 spacing, ties to even, and the subtraction is exact.
    """

    def __init__(self, dtype: np.dtype, uint: type, mantissa_bits: int) -> None:
        self.dtype, self.uint = np.dtype(dtype), uint
        exponent_field = np.iinfo(uint).max >> 1 & ~((1 << mantissa_bits) - 1)
        bias = (exponent_field >> mantissa_bits) >> 1
        self.exponent = uint(exponent_field)
        self.lowest = uint((bias - 14) << mantissa_bits)  # 2**-14
        self.beyond = uint((bias + 16) << mantissa_bits)  # 2**16, past 65504
        self.shift = uint((mantissa_bits - 10) << mantissa_bits)  # 2**(mantissa_bits - 10)
        self.half_ulp = self.dtype.type(2.0 ** -(mantissa_bits + 1))  # m * this = half the float16 spacing at |x|

    def round(self, values: np.ndarray, ties: Ties) -> np.ndarray:
        """Return float16-representable magnitudes-with-signs of `values` (this float type), by `ties`."""
        magic = np.bitwise_and(values.view(self.uint), self.exponent)
        np.clip(magic, self.lowest, self.beyond, out=magic)
        magic += self.shift
        magic_float = magic.view(self.dtype)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN, inf
            magnitude = np.abs(values)
            result = magnitude + magic_float
            result -= magic_float
            if ties == "away":
                half = magic_float * self.half_ulp
                rounded_down = (magnitude - result) == half  # an exact tie went to the even neighbour below
                if rounded_down.any():
                    result[rounded_down] += half[rounded_down] + half[rounded_down]
            if not result.max(initial=0) <= _FLOAT16_MAX:  # overflow or NaN: rare
                np.copyto(result, self.dtype.type(np.inf), where=result > _FLOAT16_MAX)
                np.copyto(result, values, where=np.isnan(values))
        return np.copysign(result, values, out=result)


_MAGIC32 = _Magic(np.dtype(np.float32), np.uint32, 23)
_MAGIC64 = _Magic(np.dtype(np.float64), np.uint64, 52)


def _bfloat16_bits(values: np.ndarray, ties: Ties) -> np.ndarray:
    """Return the bfloat16 bit patterns (uint16) of float32 `values`, rounded by `ties`.

    bfloat16 is float32's top 16 bits: adding half of the dropped part's range (0x8000, less one for ties
    to even unless the kept part is odd) and truncating rounds to nearest; a carry into the exponent gives
    the next binade, or inf past the largest finite number.
    """
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    if ties == "even":
        rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    else:
        rounded = bits + np.uint32(0x8000)
    upper = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        upper[nan] = (bits[nan] >> np.uint32(16)).astype(np.uint16) | np.uint16(0x0040)
    return upper


def round_float32(
    values: np.ndarray, dtype: np.dtype, ties: Ties = "even", out: np.ndarray | None = None
) -> np.ndarray:
    """Return float32 `values` rounded to `dtype` (float16 or bfloat16) by `ties`, still as float32 (exact).

    `out` (float32, of `values`' shape) receives the result if given; it may be `values`.
    """
    values = np.ascontiguousarray(values, dtype=np.float32)
    dtype = np.dtype(dtype)
    if dtype == FLOAT16:
        result = _MAGIC32.round(values, ties)
    elif dtype == BFLOAT16:
        result = (_bfloat16_bits(values, ties).astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        raise ValueError(f"round_float32 rounds to float16 or bfloat16, not {dtype}")
    if out is None:
        return result
    out[...] = result
    return out


@functools.cache
def _numpy_half_cast_is_bsa_s() -> bool:
    """Whether NumPy's float64 -> float16 cast gives bsa's rule's bits on every float16 tie class (its
    midpoints, their float64 neighbours, subnormals, overflow, inf, NaN): checked once, else bsa's own
    (slower) rounding is used."""
    codes = np.arange(0, 0x7C00, dtype=np.uint16).view(FLOAT16).astype(np.float64)
    mid = (codes[:-1] + codes[1:]) / 2
    points = np.concatenate([codes, mid, np.nextafter(mid, 0), np.nextafter(mid, np.inf), [65520.0, 65519.99, 1e6]])
    points = np.concatenate([points, -points, [np.inf, -np.inf, np.nan]])
    with np.errstate(over="ignore"):
        theirs = points.astype(FLOAT16).view(np.uint16)
    ours = _MAGIC64.round(points, "even").astype(FLOAT16).view(np.uint16)
    return bool(np.array_equal(theirs, ours))


def to_dtype(values: np.ndarray, dtype: np.dtype, ties: Ties = "even") -> np.ndarray:
    """Return `values` (float64, float32 or a 16-bit float) as an array of `dtype`, rounded by bsa's rules.

    float16 and bfloat16 follow the module's rules; float32 from float64 is the IEEE cast; a value already
    of `dtype` is returned as it is (no copy).
    """
    values = np.asarray(values)
    dtype = np.dtype(dtype)
    if values.dtype == dtype:
        return values
    if dtype not in (FLOAT16, BFLOAT16):
        return values.astype(dtype)
    if values.dtype in (FLOAT16, BFLOAT16):  # one 16-bit type to the other: exactly through float32
        values = values.astype(np.float32)
    if dtype == FLOAT16:
        if values.dtype == np.float64 and ties == "even" and _numpy_half_cast_is_bsa_s():
            with np.errstate(over="ignore"):  # overflow is inf, silently, as in bsa's own rounding
                return values.astype(FLOAT16)  # the same bits, about 10x faster (checked once per process)
        if values.dtype == np.float64:
            rounded = _MAGIC64.round(np.ascontiguousarray(values), ties)
        else:
            rounded = _MAGIC32.round(np.ascontiguousarray(values, dtype=np.float32), ties)
        return rounded.astype(FLOAT16)  # exact: every value is a float16 already
    if values.dtype == np.float64:
        values = values.astype(np.float32)  # bfloat16's rule: through float32, ties to even
    return _bfloat16_bits(values, ties).view(BFLOAT16)
