"""Errors in units in the last place (ULP) of the golden in the case dtype (msprobe's ULP error)."""

from __future__ import annotations

import math

import numpy as np

from .buffers import _floor_array

_MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23}
_MIN_EXPONENT = {"float16": -14, "bfloat16": -126, "float32": -126}
ULP_EDGES = (0.5, 1.0)
#: Labels of `ErrorStats.ulp_histogram`: element counts by ULP error (0.5 or less is correctly rounded).
ULP_BUCKETS = ("<=0.5", "0.5-1", ">1")


def _ulp_floor(io_dtype: str, err_thd: float | None) -> float:
    """Return the smallest power of two an ULP unit is measured from: 2^floor(log2 err_thd), at least the
    dtype's smallest normal number.

    Below err_thd a golden is one of ATK's small values: its size says nothing of the error its rounding
    may carry (it is usually a sum of larger terms that cancelled). Measured from the golden's own
    exponent, such an element would count in ULPs of an ever smaller number, without bound for bfloat16
    (which shares float32's exponent range): a golden that cancelled to 1e-30 would turn an ordinary
    rounding error into 10^33 ULP. From err_thd up, the ULP is the golden's own.
    """
    tiny = 2.0 ** max(_MIN_EXPONENT.get(io_dtype, -126), -126)
    if err_thd is None or not err_thd > 0 or not math.isfinite(err_thd):
        return tiny
    return max(tiny, 2.0 ** math.floor(math.log2(err_thd)))


def _ulp_power(
    abs_golden: np.ndarray, io_dtype: str, out: np.ndarray | None = None, err_thd: float | None = None
) -> np.ndarray:
    """Return 2^floor(log2 max(|g|, err_thd)) as float32 (see `_ulp_floor`).

    The ULP unit in the case dtype is this times 2^-mantissa_bits; callers divide by the power and apply
    2^mantissa_bits to the reduced figures.
    """
    bits = None if out is None else out.view(np.int32)
    power = np.bitwise_and(abs_golden.view(np.int32), np.int32(0x7F800000), out=bits).view(np.float32)
    return np.maximum(power, _floor_array(_ulp_floor(io_dtype, err_thd), power.shape), out=power)


def ulp_error(value: float, golden: float, io_dtype: str, err_thd: float | None = None) -> float:
    """Return |value - golden| in ULPs of the golden in the case dtype (msprobe's ULP error), the golden's
    magnitude floored at `err_thd` (see `_ulp_floor`; None: at the dtype's smallest normal number)."""
    power = _ulp_power(np.abs(np.asarray([golden], dtype=np.float32)), io_dtype, err_thd=err_thd)[0]
    with np.errstate(over="ignore"):  # a device value near float32's range: inf ULPs, without a warning
        return float(abs(np.float32(value) - np.float32(golden)) / power * 2.0 ** _MANTISSA_BITS.get(io_dtype, 23))
