"""bsa's own rounding to float16 and bfloat16: which intermediate precision, which tie rule, written once.

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
result on every machine and NumPy version: a few passes of integer and float ufuncs over the data, none
of NumPy's (scalar, slow) float16 casts but the exact one of a value already a float16. ml_dtypes is
imported the first time a bfloat16 is needed (`bfloat16()`): ml_dtypes 0.7 takes most of a second to load.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

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

#: float16, NumPy's own (bfloat16 is ml_dtypes', loaded when needed: `bfloat16()`).
FLOAT16 = np.dtype(np.float16)

#: float16's largest finite value.
_FLOAT16_MAX = 65504.0
#: Least magnitude that rounds to inf: halfway from 65504 to 2**16 (a tie, and 2**16 is the even neighbour).
_FLOAT16_INF_FROM = 65520.0


@functools.cache
def bfloat16() -> np.dtype:
    """Return ml_dtypes' bfloat16 dtype, importing ml_dtypes the first time (0.7 takes most of a second)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def __getattr__(name: str) -> Any:
    """`BFLOAT16`: the bfloat16 dtype, loaded on first use (`bfloat16()`)."""
    if name == "BFLOAT16":
        return bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The largest finite value of each 16-bit dtype (bfloat16: 0x7F7F), known without loading ml_dtypes.
_LARGEST = {"float16": _FLOAT16_MAX, "bfloat16": float(np.uint32(0x7F7F0000).view(np.float32))}


def largest(dtype: np.dtype | str) -> float:
    """Return the largest finite value of a float dtype (float16, bfloat16, float32, float64), or of its name."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return _LARGEST[name] if name in _LARGEST else float(np.finfo(np.dtype(dtype)).max)


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether `dtype` is bfloat16 (without loading ml_dtypes to ask)."""
    return np.dtype(dtype).name == "bfloat16"


class _Magic:
    """Rounding a float's magnitude to float16 spacing by one addition: |x| + m - m, m = 2**(e + shift).

    With e the exponent of |x| (at least -14, float16's smallest normal exponent, so subnormals get the
    spacing 2**-24), m has the float's spacing 2**(e - 10) there, so the hardware's addition rounds |x|
    to float16 spacing, ties to even, and the subtraction is exact. Ties away from zero: the same addition
    on |x| with its last bit set (a sticky bit, far below float16's last bit), so an exact tie becomes a
    value just past it and rounds up, while every other value rounds as before (its bits below float16's
    keep the same side of the half). Every step is an integer or float ufunc that NumPy vectorizes (not
    clip or copysign: several times slower); |x| of 65520 and more, inf and NaN (m is garbage there) are
    set apart after, where the result's maximum shows any.
    """

    def __init__(self, dtype: np.dtype, uint: type, mantissa_bits: int) -> None:
        self.dtype, self.uint = np.dtype(dtype), uint
        self.sign = uint(1 << (np.iinfo(uint).bits - 1))
        exponent_field = np.iinfo(uint).max >> 1 & ~((1 << mantissa_bits) - 1)
        bias = (exponent_field >> mantissa_bits) >> 1
        self.exponent = uint(exponent_field)
        self.lowest = uint((bias - 14) << mantissa_bits)  # 2**-14
        self.shift = uint((mantissa_bits - 10) << mantissa_bits)  # 2**(mantissa_bits - 10)

    def round(self, values: np.ndarray, ties: Ties, out: np.ndarray | None = None) -> np.ndarray:
        """Return float16-representable magnitudes-with-signs of `values` (this float type), by `ties`.

        `out` (of `values`' type and shape) receives the result if given; it may be `values`.
        """
        bits: np.ndarray = values.view(self.uint)
        sign = bits & self.sign
        magnitude = bits ^ sign
        magic = magnitude & self.exponent
        np.maximum(magic, self.lowest, out=magic)
        magic += self.shift
        magic_float = magic.view(self.dtype)
        if ties == "away":
            magnitude |= self.uint(1)  # the sticky bit (an inf becomes a NaN: put back below)
        result = magnitude.view(self.dtype)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN, inf, and the garbage m past 2**115
            result += magic_float
            result -= magic_float
            if not result.max(initial=0) <= _FLOAT16_MAX:  # overflow, inf or NaN: rare
                absolute = np.abs(values)
                np.copyto(result, self.dtype.type(np.inf), where=absolute >= _FLOAT16_INF_FROM)
                np.copyto(result, absolute, where=~np.isfinite(values))
        if out is None:
            out = np.empty_like(values)
        np.bitwise_or(magnitude, sign, out=out.view(self.uint))
        return out


_MAGIC32 = _Magic(np.dtype(np.float32), np.uint32, 23)
_MAGIC64 = _Magic(np.dtype(np.float64), np.uint64, 52)


def _bfloat16_bits(values: np.ndarray, ties: Ties) -> np.ndarray:
    """Return float32 `values` rounded to bfloat16, as float32 bit patterns (uint32, the low 16 bits zero).

    bfloat16 is float32's top 16 bits: adding half of the dropped part's range (0x8000, less one for ties
    to even unless the kept part is odd) and truncating rounds to nearest; a carry into the exponent gives
    the next binade, or inf past the largest finite number. A NaN keeps its top bits, made quiet.
    """
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    if ties == "even":
        rounded = bits >> np.uint32(16)
        rounded &= np.uint32(1)
        rounded += bits
        rounded += np.uint32(0x7FFF)
    else:
        rounded = bits + np.uint32(0x8000)
    rounded &= np.uint32(0xFFFF0000)
    if not np.isfinite(values.max(initial=0)):  # inf or NaN: rare
        nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        np.copyto(rounded, (bits & np.uint32(0xFFFF0000)) | np.uint32(0x00400000), where=nan)
    return rounded


#: 2**-112: float16's exponent bias (15) less float32's (127). A float16 value times it is a float32 whose bits
#: 13 and up are the float16's bits (subnormals too: exactly, down to 2**-136).
_REBIAS = np.float32(2.0**-112)


def _float16_of(values: np.ndarray) -> np.ndarray:
    """Return float32 `values` that float16 holds exactly as float16, by bit operations (NumPy's float16 cast
    is a scalar loop, several times slower); an inf or a NaN is cast by NumPy, as it always was."""
    magnitude = np.abs(values)
    with np.errstate(invalid="ignore"):  # a signalling NaN
        magnitude *= _REBIAS
    half = (magnitude.view(np.uint32) >> np.uint32(13)).astype(np.uint16)
    half |= (values.view(np.uint32) >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000)
    result = half.view(FLOAT16)
    if not np.isfinite(magnitude.max(initial=0)):  # inf or NaN: rare
        special = ~np.isfinite(values)
        result[special] = values[special].astype(FLOAT16)
    return result


def round_float32(
    values: np.ndarray, dtype: np.dtype, ties: Ties = "even", out: np.ndarray | None = None
) -> np.ndarray:
    """Return float32 `values` rounded to `dtype` (float16 or bfloat16) by `ties`, still as float32 (exact).

    `out` (float32, of `values`' shape) receives the result if given; it may be `values`.
    """
    values = np.ascontiguousarray(values, dtype=np.float32)
    dtype = np.dtype(dtype)
    if dtype == FLOAT16:
        return _MAGIC32.round(values, ties, out)
    if not is_bfloat16(dtype):
        raise ValueError(f"round_float32 rounds to float16 or bfloat16, not {dtype}")
    result = _bfloat16_bits(values, ties).view(np.float32)
    if out is None:
        return result
    out[...] = result
    return out


def to_dtype(values: np.ndarray, dtype: np.dtype, ties: Ties = "even") -> np.ndarray:
    """Return `values` (float64, float32 or a 16-bit float) as an array of `dtype`, rounded by bsa's rules.

    float16 and bfloat16 follow the module's rules; float32 from float64 is the IEEE cast; a value already
    of `dtype` is returned as it is (no copy).
    """
    values = np.asarray(values)
    dtype = np.dtype(dtype)
    if values.dtype == dtype:
        return values
    if dtype != FLOAT16 and not is_bfloat16(dtype):
        return values.astype(dtype)
    if values.dtype == FLOAT16 or is_bfloat16(values.dtype):  # one 16-bit type to the other: exactly through float32
        values = values.astype(np.float32)
    if dtype == FLOAT16:
        if values.dtype == np.float64:
            rounded = _MAGIC64.round(np.ascontiguousarray(values), ties).astype(np.float32)  # exact: float16 values
        else:
            rounded = _MAGIC32.round(np.ascontiguousarray(values, dtype=np.float32), ties)
        return _float16_of(rounded)
    if values.dtype == np.float64:
        values = values.astype(np.float32)  # bfloat16's rule: through float32, ties to even
    return (_bfloat16_bits(values, ties) >> np.uint32(16)).astype(np.uint16).view(dtype)
