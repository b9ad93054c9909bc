"""The bias check: a systematic, signed error of the device that the size-based metrics cannot see.

A constant rounded to a 16-bit type inside the kernel (the scale, say) multiplies every output by about
1 + 1e-4: well inside one ULP of float16/bfloat16, so every error ratio of the CANN standards stays near
1, yet over a tensor of many elements the shift is many standard errors away from zero. docs/compare.md
("The bias check") explains the statistic for users; this is its arithmetic.

The estimate. Over the tensor's large elements (|g| > err_thd, where ATK's relative error is defined),
the signed relative error r = (a - g) / g of an array a has mean

    beta(a) = mean(r),     se(a) = sqrt(sum((r - beta)^2)) / n,

the relative (multiplicative) bias of a with its standard error: a = (1 + beta) g + noise. Each element
weighs the same, so the estimate is the weighted least-squares fit of a against g with weights 1 / g^2,
the weights that make float16/bfloat16 rounding noise (a fixed fraction of |g|) equally loud everywhere.
The device's bias is compared with the benchmark's: the difference delta = beta(d) - beta(b) has the
paired standard error of the per-element differences (d - b) / g when both arrays are at hand, else
sqrt(se(d)^2 + se(b)^2) (larger: the two sides' rounding errors are correlated).

The verdict. Round-to-nearest accumulation in float32 is unbiased, so a bias under `bias_floor`
(default 2^-16: 1/6 of the 1e-4 the check is built to catch, 256 float32 ULPs) never fails. The check
fails when a bias over the floor is statistically certain, z = `bias_z` (default 5), in one of two ways:
- against the benchmark: |delta| > bias_floor and |delta| > z se(delta). A device computes the same
  rounded products as the benchmark, so the two share their rounding noise and the paired difference is
  precise. One exception: where the benchmark's own bias is certain (beyond `PATH_Z` of its standard
  error: the precision path itself is biased on this data), a device closer to the golden passes;
- against zero, where the benchmark shows no bias of its own (within `PATH_Z`): |beta(d)| > bias_floor
  and |beta(d)| > z se(d). A device that rounds more accurately than the kernel path has far less noise
  than the benchmark; its bias is certain on its own sums long before the benchmark's noise would let
  the difference be.
For normally distributed estimates, z = 5 means a false-alarm rate of 5.7e-7 per tensor and branch.
A tensor with fewer than `MIN_COUNT` large elements is not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .base import BIAS_FLOOR as BIAS_FLOOR
from .base import BIAS_Z as BIAS_Z
from .base import Check, fmt

#: The benchmark's bias within this many of its standard errors: the precision path shows no bias.
PATH_Z = 4.0

#: Fewest large elements for which the check judges a tensor.
MIN_COUNT = 256


@dataclass
class RelativeSums:
    """Count, sum and sum of squares of signed relative errors over large elements; `add` folds chunks."""

    count: int = 0
    total: float = 0.0
    squares: float = 0.0

    @classmethod
    def of(cls, mean: float, se: float, count: int) -> RelativeSums:
        """The sums that give `mean` and standard error `se` over `count` values (as `ErrorStats` keeps them)."""
        total = mean * count
        return cls(count=count, total=total, squares=(se * count) ** 2 + total * mean)

    def add(self, relative: np.ndarray, count: int) -> None:
        """Add a chunk's signed relative errors (0 where the golden is not large) and its large count."""
        flat = relative.reshape(-1)
        self.count += count
        self.total += float(flat.sum(dtype=np.float64))
        self.squares += float(np.dot(flat, flat))

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    @property
    def se(self) -> float:
        """The standard error of `mean`: sqrt(sum((r - mean)^2)) / n."""
        if not self.count:
            return 0.0
        return math.sqrt(max(self.squares - self.total * self.mean, 0.0)) / self.count


def relative_errors(difference: np.ndarray, golden: np.ndarray, err_thd: float) -> tuple[np.ndarray, int]:
    """Return difference / g (float64, flat) where |g| > err_thd and the quotient is finite, else 0, and
    how many elements were kept: a device's signed relative errors (difference a - g), or the paired ones
    of device and benchmark (d - b)."""
    g = golden.astype(np.float64).reshape(-1)
    large = np.abs(g) > err_thd
    with np.errstate(over="ignore", invalid="ignore"):
        relative = difference.astype(np.float64).reshape(-1) / np.where(large, g, np.inf)
    keep = large & np.isfinite(relative)
    return np.where(keep, relative, 0.0), int(np.count_nonzero(keep))


@dataclass(frozen=True)
class Bias:
    """The estimated systematic error of one tensor, relative to its values (signed: + means too large).

    `device` and `benchmark` are each side's mean signed relative error over large elements, with
    standard errors; `difference` is device - benchmark with `difference_se` (`paired`: from the
    per-element differences). `ulp` is the mean relative size of one ULP of the case dtype (values spread
    evenly in log scale: 2^-m / (2 ln 2)), so `device / ulp` is the bias in ULPs.
    """

    device: float
    device_se: float
    benchmark: float
    benchmark_se: float
    difference: float
    difference_se: float
    paired: bool
    count: int
    ulp: float

    def judgeable(self) -> bool:
        return self.count >= MIN_COUNT

    @property
    def z(self) -> float:
        """Standard errors the device's bias lies from the benchmark's."""
        return _z(self.difference, self.difference_se)

    @property
    def device_z(self) -> float:
        """Standard errors the device's bias lies from zero."""
        return _z(self.device, self.device_se)

    @property
    def benchmark_z(self) -> float:
        """Standard errors the benchmark's bias lies from zero."""
        return _z(self.benchmark, self.benchmark_se)

    def against_benchmark(self, z_limit: float, floor: float) -> bool:
        """Certainly biased against the benchmark, by more than `floor`; where the precision path has a
        certain bias of its own, only a device further from the golden than the benchmark."""
        if not (abs(self.difference) > floor and self.z > z_limit):
            return False
        return self.benchmark_z <= PATH_Z or abs(self.device) > abs(self.benchmark)

    def against_zero(self, z_limit: float, floor: float) -> bool:
        """Certainly biased by more than `floor`, where the benchmark (the precision path) shows no bias."""
        return abs(self.device) > floor and self.device_z > z_limit and self.benchmark_z <= PATH_Z

    def beyond(self, z_limit: float, floor: float) -> bool:
        """The verdict: a bias over `floor` that is certain against the benchmark or against zero."""
        if not self.judgeable():
            return False
        return self.against_benchmark(z_limit, floor) or self.against_zero(z_limit, floor)

    def in_ulp(self, value: float) -> float:
        return value / self.ulp if self.ulp > 0 else 0.0

    def check(self, tensor: str, z_limit: float, floor: float) -> Check:
        """The bias check of a tensor: its value is the standard errors of the deciding comparison."""
        failed = self.beyond(z_limit, floor)
        against_benchmark = self.against_benchmark(z_limit, floor)
        z = self.z if against_benchmark or not failed else self.device_z
        if not self.judgeable():
            why = f"not judged: {self.count} values above err_thd, fewer than {MIN_COUNT}"
        elif failed and against_benchmark:
            how = "paired" if self.paired else "unpaired"
            why = f"{self.z:.3g} standard errors ({how}) from the benchmark's, over the floor {fmt(floor)}"
        elif failed:
            why = (
                f"{self.device_z:.3g} standard errors from 0 where the benchmark shows none "
                f"({self.benchmark_z:.2g}), over the floor {fmt(floor)}"
            )
        elif abs(self.device) <= floor and abs(self.difference) <= floor:
            why = f"within the floor {fmt(floor)}"
        else:
            why = f"{self.z:.3g} standard errors from the benchmark's, not certain (limit {fmt(z_limit)})"
        # a pass is at most 1: certain but within the floor, or a precision path biased like the device
        severity = max(z / z_limit, 1.0 + 1e-12) if failed else min(z / z_limit, 1.0)
        return Check(
            "bias", tensor, float(z), float(z_limit), not failed, f"{tensor} {self.describe()}: {why}", severity
        )

    def describe(self) -> str:
        """The estimate in words: relative and in ULPs, each side with its standard error."""
        return (
            f"bias {self.device:+.3g} ± {self.device_se:.2g} relative ({self.in_ulp(self.device):+.3g} ± "
            f"{self.in_ulp(self.device_se):.2g} ULP), benchmark {self.benchmark:+.3g} ± {self.benchmark_se:.2g}"
        )


def _z(value: float, se: float) -> float:
    if se > 0:
        return abs(value) / se
    return math.inf if value != 0 else 0.0


def ulp_relative(mantissa_bits: int) -> float:
    """The mean of ulp(x) / |x| over values spread evenly in log scale: 2^-m / (2 ln 2)."""
    return 2.0**-mantissa_bits / (2 * math.log(2))


def estimate(device: RelativeSums, bench: RelativeSums, ulp: float, pairs: RelativeSums | None = None) -> Bias:
    """The bias of a tensor from each side's sums, with the paired difference's sums when measured."""
    if pairs is not None and pairs.count:
        difference, difference_se, paired = pairs.mean, pairs.se, True
    else:
        difference = device.mean - bench.mean
        difference_se, paired = math.hypot(device.se, bench.se), False
    return Bias(device.mean, device.se, bench.mean, bench.se, difference, difference_se, paired, device.count, ulp)
