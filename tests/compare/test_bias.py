"""The bias statistic on synthetic tensors: it catches small systematic errors and stays quiet on noise.

The golden is drawn heavy-tailed (a product of normals, like gradients); the benchmark carries a
kernel-path-like relative noise of a few ULPs per element; devices are built from either.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from bsa_cli.standards import bias

DTYPES = {"float16": (np.float16, 10, 2.0**-11), "bfloat16": (ml_dtypes.bfloat16, 7, 2.0**-8)}


def _golden(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.standard_normal(n) * rng.standard_normal(n) * 0.3).astype(np.float32)


def _round(values: np.ndarray, dtype) -> np.ndarray:
    return values.astype(dtype).astype(np.float32)


def _sums(values: np.ndarray, golden: np.ndarray, err_thd: float) -> bias.RelativeSums:
    sums = bias.RelativeSums()
    relative, count = bias.relative_errors(values.astype(np.float64) - golden, golden, err_thd)
    sums.add(relative, count)
    return sums


def _estimate(device, bench, golden, dtype_name: str, paired: bool = True) -> bias.Bias:
    _, mantissa, err_thd = DTYPES[dtype_name]
    pairs = None
    if paired:
        pairs = bias.RelativeSums()
        pairs.add(*bias.relative_errors(device.astype(np.float64) - bench, golden, err_thd))
    return bias.estimate(
        _sums(device, golden, err_thd), _sums(bench, golden, err_thd), bias.ulp_relative(mantissa), pairs
    )


def _kernel_like(golden: np.ndarray, rng: np.random.Generator, dtype, mantissa: int, ulps: float = 3.0):
    """Pre-rounding values of a kernel path: the golden with an unbiased relative noise of a few ULPs."""
    return golden.astype(np.float64) * (1 + rng.standard_normal(golden.size) * ulps * 2.0**-mantissa)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("sign", [1, -1])
def test_a_device_that_rounds_a_biased_golden_is_caught(dtype_name, sign):
    dtype, mantissa, _ = DTYPES[dtype_name]
    rng = np.random.default_rng(7)
    golden = _golden(rng, 32768)
    bench = _round(_kernel_like(golden, rng, dtype, mantissa), dtype)
    device = _round(golden.astype(np.float64) * (1 + sign * 1e-4), dtype)
    estimate = _estimate(device, bench, golden, dtype_name)
    assert estimate.beyond(bias.BIAS_Z, bias.BIAS_FLOOR), estimate.describe()
    assert math.copysign(1, estimate.device) == sign
    assert abs(estimate.device - sign * 1e-4) < 5 * estimate.device_se


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_a_kernel_like_device_with_a_bias_before_rounding_is_caught(dtype_name):
    dtype, mantissa, _ = DTYPES[dtype_name]
    rng = np.random.default_rng(8)
    golden = _golden(rng, 32768)
    path = _kernel_like(golden, rng, dtype, mantissa)
    bench = _round(path, dtype)
    device = _round(path * (1 + 1e-4), dtype)
    estimate = _estimate(device, bench, golden, dtype_name)
    assert estimate.paired and estimate.against_benchmark(bias.BIAS_Z, bias.BIAS_FLOOR), estimate.describe()
    assert estimate.beyond(bias.BIAS_Z, bias.BIAS_FLOOR)


def test_a_bf16_bias_of_one_256th_is_caught_even_unpaired():
    dtype, mantissa, _ = DTYPES["bfloat16"]
    rng = np.random.default_rng(9)
    golden = _golden(rng, 32768)
    path = _kernel_like(golden, rng, dtype, mantissa)
    estimate = _estimate(_round(path * (1 + 2.0**-8), dtype), _round(path, dtype), golden, "bfloat16", paired=False)
    assert not estimate.paired and estimate.beyond(bias.BIAS_Z, bias.BIAS_FLOOR)
    assert estimate.in_ulp(estimate.device) == pytest.approx(0.7, abs=0.3)  # 2^-8 is about 0.7 bf16 ULPs


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_clean_devices_pass_over_many_seeds(dtype_name):
    """The device equals the benchmark, carries its own unbiased noise, or is the rounded golden (more
    accurate than the benchmark): no false alarm over 200 tensors, and z scores look like |N(0, 1)|."""
    dtype, mantissa, _ = DTYPES[dtype_name]
    scores = []
    for seed in range(200):
        rng = np.random.default_rng(1000 + seed)
        golden = _golden(rng, 8192)
        path = _kernel_like(golden, rng, dtype, mantissa)
        bench = _round(path, dtype)
        for device in (
            bench,
            _round(_kernel_like(golden, rng, dtype, mantissa), dtype),
            _round(golden, dtype),
            _round(path + path * rng.standard_normal(path.size) * 2.0**-20, dtype),  # another accumulation order
        ):
            estimate = _estimate(device, bench, golden, dtype_name)
            assert not estimate.beyond(bias.BIAS_Z, bias.BIAS_FLOOR), (seed, estimate.describe())
            scores.append(estimate.device_z)
    assert np.mean(np.array(scores) > 3) < 0.01


def test_a_bias_of_the_precision_path_itself_does_not_fail_a_device_that_shares_it():
    """Structured data can bias the kernel path (every P rounded the same way): the benchmark shows it,
    and a device with the same bias passes."""
    dtype, mantissa, _ = DTYPES["float16"]
    rng = np.random.default_rng(11)
    golden = _golden(rng, 32768)
    path = golden.astype(np.float64) * (1 + 3e-4)
    bench = _round(path, dtype)
    device = _round(path * (1 + rng.standard_normal(path.size) * 2.0**-22), dtype)
    estimate = _estimate(device, bench, golden, "float16")
    assert estimate.benchmark == pytest.approx(3e-4, rel=0.1)
    assert not estimate.beyond(bias.BIAS_Z, bias.BIAS_FLOOR), estimate.describe()


def test_floor_and_size_limits():
    rng = np.random.default_rng(12)
    golden = _golden(rng, 32768)
    bench = _round(golden, np.float16)
    device = _round(golden.astype(np.float64) * (1 + 1e-5), np.float16)  # below the 2^-16 floor
    assert not _estimate(device, bench, golden, "float16").beyond(bias.BIAS_Z, bias.BIAS_FLOOR)
    small = golden[:200]
    estimate = _estimate(_round(small * 1.01, np.float16), _round(small, np.float16), small, "float16")
    assert not estimate.judgeable() and not estimate.beyond(bias.BIAS_Z, bias.BIAS_FLOOR)


def test_paired_sums_give_the_same_difference_as_the_sides():
    rng = np.random.default_rng(13)
    golden = _golden(rng, 4096)
    bench = _round(_kernel_like(golden, rng, np.float16, 10), np.float16)
    device = _round(golden.astype(np.float64) * (1 + 3e-4), np.float16)
    paired, unpaired = _estimate(device, bench, golden, "float16"), _estimate(device, bench, golden, "float16", False)
    assert paired.difference == pytest.approx(unpaired.difference, rel=1e-9)
    assert paired.difference == pytest.approx(paired.device - paired.benchmark, rel=1e-9)
