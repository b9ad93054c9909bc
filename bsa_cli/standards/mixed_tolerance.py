"""`mixed-tolerance`: opbase's open Mixed Tolerance standard (生态算子开源精度标准), against the golden alone.

An element passes when |a - g| <= atol + rtol |g|; a tensor passes when its matched ratio (elements passing /
elements judged) is at least `required_ratio` and its largest absolute error is within
max(max_abs_floor, ulp_factor x ULP), the table's "X or 32 * ULP" read as the larger of the two.

Sources (hicann/opbase, docs/zh/ops_precision_standard/; docs/research/issue30.md section 1 quotes them):
`experimental_standard.md` at adbe441e9254676174937047457419b6e645e384 (2026-07-15, the first wording),
`mixed_tolerance_standard.md` at 233ee24cc3500d36bd4c2a51f8872d67857cec08 (new numbers and the 2-ULP note) and at
29df87a6f8add42e3aa42f20eb32edc5d8fa178a (2026-09-23, PR !924: ULP anchored at the golden of the largest error).
Each document version is one preset, a row of `PRESETS`; the newest is the default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from .base import Check, Measured, Standard, by_dtype, fmt, upper

#: Mantissa bits, smallest and largest normal exponent of each output dtype:
#: ULP(x) = 2^(max(floor(log2|x|), emin) - bits).
FLOAT_BITS = {"float16": (10, -14, 15), "bfloat16": (7, -126, 127), "float32": (23, -126, 127)}

#: 233ee24c's table (rtol, atol, X per dtype), which 29df87a6 keeps.
NEWEST = {
    "float16": (2.0**-10, 2.0**-10, 1e-1),
    "bfloat16": (2.0**-7, 2.0**-7, 1e-1),
    "float32": (2.0**-13, 2.0**-13, 1e-2),
}
#: One row per document version: per dtype (rtol, atol, X of "X or 32 * ULP"), and whether the ULP is taken at
#: the golden of the largest error (1, 29df87a6's reading) or at 1.0 (0, TTK's reading of the older texts:
#: hicann/ops-test-kit ttk/core_modules/comparison/resolve.py at 367509326971c56f08cf313a3a5f1ccc4508960c).
PRESETS: dict[str, tuple[Mapping[str, tuple[float, float, float]], int]] = {
    "adbe441": (
        {
            "float16": (2.0**-9, 2.0**-9, 1e-1),
            "bfloat16": (2.0**-6, 2.0**-6, 1.0),
            "float32": (2.0**-10, 2.0**-16, 1e-2),
        },
        0,
    ),
    "233ee24c": (NEWEST, 0),
    # The note under 233ee24c's table: "可酌情降低至2ULP" for long reductions, read as rtol/atol doubled (the
    # per-element thresholds are the ones "约为 1ULP"); the limit stays. fp32's 2^-12 is bsa's reading.
    "233ee24c-2ulp": (
        {
            "float16": (2.0**-9, 2.0**-9, 1e-1),
            "bfloat16": (2.0**-6, 2.0**-6, 1e-1),
            "float32": (2.0**-12, 2.0**-12, 1e-2),
        },
        0,
    ),
    # PR !924: the table rows untouched by its diff (so 233ee24c's), the limit max(X, 32 * ULP(g_low)).
    "29df87a6": (NEWEST, 1),
}
#: The newest document version, judged by when no preset is named.
DEFAULT_PRESET = "29df87a6"
#: required_matched_ratio of every version's table.
REQUIRED_RATIO = 0.99
#: The 32 of "X or 32 * ULP".
ULP_FACTOR = 32.0


def ulp(value: float, dtype: str) -> float:
    """Return the unit in the last place of `value` in `dtype` (subnormals share the smallest normal's; an
    infinite value, a golden that overflows the dtype, has the largest finite value's)."""
    bits, emin, emax = by_dtype(FLOAT_BITS, dtype)
    magnitude = abs(value)
    exponent = emax if not math.isfinite(magnitude) else math.frexp(magnitude)[1] - 1 if magnitude > 0 else emin
    return 2.0 ** (max(exponent, emin) - bits)


def round_to(value: float, dtype: str) -> float:
    """Return `value` rounded to `dtype` (nearest, ties to even): the golden "收窄" to the output dtype."""
    bits, _, emax = by_dtype(FLOAT_BITS, dtype)
    if value == 0 or not math.isfinite(value):
        return value
    step = ulp(value, dtype)
    rounded = round(value / step) * step  # Python's round is ties-to-even
    largest = (2 - 2.0**-bits) * 2.0**emax
    return rounded if abs(rounded) <= largest else math.copysign(math.inf, value)


class MixedTolerance(Standard):
    name = "mixed-tolerance"
    summary = (
        "opbase Mixed Tolerance: |a - g| <= atol + rtol |g| for at least required_ratio of the elements, "
        "and max abs error <= max(X, 32 ULP)"
    )
    keys = {
        "required_ratio": "least fraction of elements within atol + rtol |g| (default 0.99)",
        "max_abs_floor": "X of the limit 'X or 32 * ULP' (1e-1 fp16 and bf16, 1e-2 fp32 at 29df87a6)",
        "ulp_factor": "the 32 of '32 * ULP' (default 32)",
        "dynamic_ulp": "1: the ULP of the golden at the largest error, rounded to the dtype (29df87a6); "
        "0: the ULP of 1.0 (the older versions, as TTK reads them)",
    }
    presets = {name: {} for name in PRESETS}
    own_defaults = {"required_ratio": REQUIRED_RATIO, "ulp_factor": ULP_FACTOR}
    side_by_side = True
    # TTK's mixed is this standard, but with its own table (ttk/core_modules/comparison/resolve.py at 36750932)
    ttk_note = "TTK's mixed reads its own table (opbase adbe441's numbers, ULP at 1.0), not this case's preset"
    recheck_margin = 2.0  # the 2-ULP note: twice the tolerance is what the document itself allows
    rank = 0.5

    def defaults(self, dtype: str, preset: str | None = None) -> dict[str, float]:
        table, dynamic = PRESETS[preset or DEFAULT_PRESET]
        rtol, atol, floor = by_dtype(table, dtype)
        values = super().defaults(dtype, None)
        values.update(rtol=rtol, atol=atol, max_abs_floor=floor, dynamic_ulp=float(dynamic))
        return values

    def check_rules(self, thresholds: Mapping[str, float], preset: str | None) -> None:
        if thresholds.get("required_ratio", 0.0) > 1:
            raise ValueError(f"threshold 'required_ratio' must be at most 1, got {thresholds['required_ratio']!r}")
        if thresholds.get("dynamic_ulp", 0.0) not in (0.0, 1.0):
            raise ValueError(f"threshold 'dynamic_ulp' must be 0 or 1, got {thresholds['dynamic_ulp']!r}")

    def checks(self, m: Measured, t: Mapping[str, float]) -> list[Check]:
        d = m.device
        assert d.mismatch_count is not None
        return [self.ratio_check(m.tensor, d.count, d.mismatch_count, t), self.max_abs_check(m, t)]

    @staticmethod
    def ratio_check(tensor: str, count: int, mismatched: int, t: Mapping[str, float]) -> Check:
        """matched_ratio >= required_ratio, decided in exact fractions (0.99 of 1000 is 990, not 989.99...)."""
        required = Fraction(repr(t["required_ratio"]))
        matched = count - mismatched
        ratio = matched / count if count else 1.0
        passed = count == 0 or Fraction(matched, count) >= required
        allowed = 1 - float(required)
        severity = (1 - ratio) / allowed if allowed > 0 else (0.0 if ratio >= 1 else math.inf)
        if not passed and severity <= 1:
            severity = 1.0 + 1e-12
        op = ">=" if passed else "<"
        text = (
            f"{tensor} matched ratio {ratio:.6f} {op} {fmt(t['required_ratio'])} ({matched} of {count} within "
            f"atol {fmt(t['atol'])} + rtol {fmt(t['rtol'])} |g|)"
        )
        return Check("matched_ratio", tensor, ratio, t["required_ratio"], passed, text, severity)

    @staticmethod
    def max_abs_check(m: Measured, t: Mapping[str, float]) -> Check:
        """max_abs_error <= max(X, ulp_factor x ULP), the ULP at the golden of the largest error or at 1.0."""
        d = m.device
        dtype = m.dtype or "float32"
        anchor = 1.0
        if t["dynamic_ulp"] and d.max_abs_golden is not None:
            anchor = round_to(d.max_abs_golden, dtype)
        ulps = t["ulp_factor"] * ulp(anchor, dtype)
        limit = max(t["max_abs_floor"], ulps)
        where = f"golden {fmt(anchor)}" if t["dynamic_ulp"] else "1.0"
        detail = f" (max of X {fmt(t['max_abs_floor'])} and {fmt(t['ulp_factor'])} ULP of {where}: {fmt(ulps)})"
        return upper("max_abs_error", m.tensor, d.max_abs_err, limit, "max abs error", detail=detail)
