"""Standalone sketch of opbase's Mixed Tolerance standard (生态算子开源精度标准), pure NumPy, not wired into bsa.

An independent reading of the document, written from its text (docs/research/issue30.md cites every line),
to check bsa's future `--standard mixed-tolerance` against. Run it to see the boundary examples:

    python docs/research/mixed_tolerance_sketch.py

The rule (identical in every version):
    element passes      |actual - golden| <= atol + rtol * |golden|
    matched_ratio       elements passing / all elements                      ("通过元素数 / 总元素数")
    tensor passes       matched_ratio >= required_matched_ratio  and  max_abs_error <= max_abs_error_limit
Only the numbers and the reading of "max_abs_error_limit = X or 32 * ULP" differ between versions.

Readings of "X or 32 * ULP" (the document's own words are quoted in the memo):
    "at-one"   max(X, 32 * ULP(1.0)) = max(X, 32 * 2^-mantissa_bits): TTK's reading
               (hicann/ops-test-kit ttk/core_modules/comparison/resolve.py at 36750932: "满足任一即不超限，等价取 max；
               ULP 取 1.0 处（即 eps）"). Used for adbe441 and 233ee24c, which do not define ULP.
    "dynamic"  max(X, 32 * ULP(g_low)), g_low = the golden value at the element of largest absolute error, rounded
               to the output dtype (opbase PR !924, commit 29df87a6, 2026-09-23: "max_abs_error_limit =
               max(兜底值, 32 * ULP(g_low))"). max_abs_error there is taken over finite pairs only.

Non-finite values, as TTK's mix_tolerance.py (36750932) judges them and the document (29df87a6) restates for
max_abs_error: NaN against NaN and +-inf against the same-signed inf count as matched elements (they stay in the
denominator); any other NaN/inf disagreement makes the element fail and the tensor fail (TTK sets
max_abs_error = inf). max_abs_error is the largest |a - g| over elements where both are finite. The ±inf
"narrowing rule" of 29df87a6 §2.3 was not readable (see the memo): this sketch does not implement it.

Arithmetic: float64 throughout (fp16, bf16 and fp32 values are exact in float64; rtol and atol are powers of two,
so atol + rtol * |g| is exact for all but extreme exponent gaps). The ratio test is exact rational arithmetic
(passing * 100 >= 99 * total for 0.99), so "just above / just below" never depends on how 0.99 rounds.
bfloat16: NumPy has no bfloat16; pass float32 arrays that already hold bf16 values, with dtype="bfloat16".
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23}
MIN_NORMAL_EXP = {"float16": -14, "bfloat16": -126, "float32": -126}

# One row per document version. rtol, atol, required ratio, fixed part X of "X or 32 * ULP", ULP reading.
# Commit ids and dates: docs/research/issue30.md, section 1.
PRESETS: dict[str, dict[str, object]] = {
    # experimental_standard.md, first Mixed Tolerance wording (adbe441e, 2026-07-15). TTK's "mixed" table
    # (resolve.py at 36750932) has exactly these numbers.
    "opbase-adbe441": {
        "table": {
            "float16": (2.0**-9, 2.0**-9, 1e-1),
            "bfloat16": (2.0**-6, 2.0**-6, 1e-0),
            "float32": (2.0**-10, 2.0**-16, 1e-2),
        },
        "ratio": "0.99",
        "ulp": "at-one",
    },
    # mixed_tolerance_standard.md at 233ee24c (date not found; after 2026-07-22, before 2026-09-23):
    # rtol = atol = 2^-10 / 2^-7 / 2^-13, bf16's X lowered from 1e-0 to 1e-1, the 2-ULP note added.
    "opbase-233ee24c": {
        "table": {
            "float16": (2.0**-10, 2.0**-10, 1e-1),
            "bfloat16": (2.0**-7, 2.0**-7, 1e-1),
            "float32": (2.0**-13, 2.0**-13, 1e-2),
        },
        "ratio": "0.99",
        "ulp": "at-one",
    },
    # The note of 233ee24c: "当前的阈值拦截在各数值精度下约为 1ULP左右，涉及到大数规约可能会引入更大精度误差导致误报，
    # 可酌情降低至2ULP": rtol/atol doubled (read as a relaxation of rtol/atol, not of the limit; see the memo).
    "opbase-233ee24c-2ulp": {
        "table": {
            "float16": (2.0**-9, 2.0**-9, 1e-1),
            "bfloat16": (2.0**-6, 2.0**-6, 1e-1),
            "float32": (2.0**-12, 2.0**-12, 1e-2),
        },
        "ratio": "0.99",
        "ulp": "at-one",
    },
    # PR !924, commit 29df87a6 (2026-09-23): same table (its diff does not touch the table rows, so they are
    # 233ee24c's: inferred, not read), limit = max(X, 32 * ULP(g_low)), max_abs_error over finite pairs.
    "opbase-29df87a6": {
        "table": {
            "float16": (2.0**-10, 2.0**-10, 1e-1),
            "bfloat16": (2.0**-7, 2.0**-7, 1e-1),
            "float32": (2.0**-13, 2.0**-13, 1e-2),
        },
        "ratio": "0.99",
        "ulp": "dynamic",
    },
}
DEFAULT_PRESET = "opbase-29df87a6"
ULP_FACTOR = 32


def ulp(value: float, dtype: str) -> float:
    """Unit in the last place of `value` (already a value of `dtype`) in `dtype`; subnormals share the smallest."""
    p, emin = MANTISSA_BITS[dtype], MIN_NORMAL_EXP[dtype]
    a = abs(float(value))
    if not np.isfinite(a):
        raise ValueError("ULP of a non-finite value")
    e = max(int(np.floor(np.log2(a))), emin) if a > 0 else emin
    return 2.0 ** (e - p)


def to_dtype(value: float, dtype: str) -> float:
    """Round a float64 to `dtype` (nearest, ties to even); bfloat16 by bit manipulation of float32."""
    if dtype == "float16":
        return float(np.float16(value))
    if dtype == "float32":
        return float(np.float32(value))
    bits = np.array([value], dtype=np.float32).view(np.uint32)[0]
    rounded = (int(bits) + 0x7FFF + ((int(bits) >> 16) & 1)) & 0xFFFF0000
    return float(np.array([rounded], dtype=np.uint32).view(np.float32)[0])


def judge_mixed_tolerance(
    actual: np.ndarray, golden: np.ndarray, dtype: str, preset: str = DEFAULT_PRESET
) -> tuple[bool, float, float, float]:
    """Judge one tensor by a Mixed Tolerance preset: (passed, matched_ratio, max_abs_error, limit).

    `dtype` is the output dtype (float16, bfloat16, float32). An empty tensor passes with ratio 1.
    """
    row = PRESETS[preset]
    rtol, atol, fixed = row["table"][dtype]  # type: ignore[index]
    required = Fraction(str(row["ratio"]))
    a = np.asarray(actual, dtype=np.float64).ravel()
    g = np.asarray(golden, dtype=np.float64).ravel()
    if a.shape != g.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {g.shape}")
    total = a.size
    if total == 0:
        return True, 1.0, 0.0, float(fixed)
    finite = np.isfinite(a) & np.isfinite(g)
    same_nan = np.isnan(a) & np.isnan(g)
    same_inf = np.isinf(a) & np.isinf(g) & (np.sign(a) == np.sign(g))
    mismatch = ~finite & ~same_nan & ~same_inf
    err = np.zeros(total)
    err[finite] = np.abs(a[finite] - g[finite])
    ok = same_nan | same_inf | (finite & (err <= atol + rtol * np.abs(g)))
    passing = int(np.count_nonzero(ok))
    matched_ratio = passing / total
    if finite.any():
        where = int(np.flatnonzero(finite)[np.argmax(err[finite])])
        max_abs_error = float(err[where])
        g_at_max = g[where]
    else:
        max_abs_error, g_at_max = 0.0, 1.0
    if row["ulp"] == "dynamic":
        g_low = to_dtype(g_at_max, dtype)
        if not np.isfinite(g_low):  # the golden overflows the output dtype: the largest finite value's ULP
            g_low = float(np.finfo(np.float16).max) if dtype == "float16" else 3.3895313892515355e38
        limit = max(float(fixed), ULP_FACTOR * ulp(g_low, dtype))
    else:
        limit = max(float(fixed), ULP_FACTOR * 2.0 ** -MANTISSA_BITS[dtype])
    if mismatch.any():
        max_abs_error = float("inf")  # TTK: a NaN/inf disagreement is an unbounded error
    ratio_ok = Fraction(passing, total) >= required
    return bool(ratio_ok and max_abs_error <= limit), matched_ratio, max_abs_error, limit


def _examples() -> list[tuple[str, bool, tuple[bool, float, float, float]]]:
    """The memo's boundary examples: (what, expected verdict, judge's answer)."""
    out = []

    def case(what: str, expect: bool, a, g, dtype: str, preset: str) -> None:
        out.append((what, expect, judge_mixed_tolerance(np.array(a), np.array(g), dtype, preset)))

    p = "opbase-233ee24c"
    # Element at the edge: fp16, g = 1, tolerance 2^-10 + 2^-10 * 1 = 2^-9 (two fp16 ULPs at 1).
    case("fp16 233ee24c: a = 1 + 2^-9 (err == tol, inside)", True, [1 + 2.0**-9], [1.0], "float16", p)
    case("fp16 233ee24c: a = 1 + 3*2^-10 (err > tol, outside; 1 of 1 fails)", False, [1 + 3 * 2.0**-10], [1.0],
         "float16", p)
    case("bf16 233ee24c: a = 1 + 2^-6 (err == tol 2^-6, inside)", True, [1 + 2.0**-6], [1.0], "bfloat16", p)
    case("bf16 233ee24c: a = 1 + 3*2^-7 (outside)", False, [1 + 3 * 2.0**-7], [1.0], "bfloat16", p)
    case("fp16 adbe441: a = 1 + 2^-8 (tol 2^-9 + 2^-9 = 2^-8, inside)", True, [1 + 2.0**-8], [1.0], "float16",
         "opbase-adbe441")
    # Matched ratio at 0.99 over 1000 elements, errors that are outside tolerance but below the limit.
    g = np.ones(1000)
    for bad, expect in ((10, True), (11, False)):
        a = g.copy()
        a[:bad] = 1 + 2.0**-5  # err 0.03125: outside tol 2^-9, below the limit 0.1
        case(f"fp16 233ee24c: {bad}/1000 outside tolerance, ratio {1 - bad / 1000}", expect, a, g, "float16", p)
    # 128 x 128 = 16384 elements: floor(0.01 * 16384) = 163 failures allowed.
    g = np.ones(16384)
    for bad, expect in ((163, True), (164, False)):
        a = g.copy()
        a[:bad] = 1 + 2.0**-5
        case(f"bf16 233ee24c: {bad}/16384 outside", expect, a, g, "bfloat16", p)
    # The limit: one element far off, the ratio fine (1 of 1000). fp16 limit max(0.1, 32 * 2^-10) = 0.1.
    g = np.ones(1000)
    for value, expect in ((1.099609375, True), (1.1005859375, False)):
        a = g.copy()
        a[0] = value
        case(f"fp16 233ee24c: one element err {value - 1} vs limit 0.1", expect, a, g, "float16", p)
    # Dynamic ULP (29df87a6): at g = 8, ULP(8) = 2^-7 in fp16, 32 ULP = 0.25 > 0.1, so err 0.125 passes there
    # but fails under the at-one reading (limit 0.1).
    g = np.full(1000, 8.0)
    a = g.copy()
    a[0] = 8.125
    case("fp16 29df87a6 (dynamic): g = 8, err 0.125, limit 0.25", True, a, g, "float16", "opbase-29df87a6")
    case("fp16 233ee24c (at-one): g = 8, err 0.125, limit 0.1", False, a, g, "float16", p)
    # bf16 at 233ee24c: X = 0.1 but 32 * 2^-7 = 0.25, so the limit is 0.25 (at-one), not 0.1.
    g = np.ones(1000)
    a = g.copy()
    a[0] = 1.1875  # a bf16 value, err 0.1875 (0.1 < err < 0.25)
    case("bf16 233ee24c: err 0.1875, limit max(0.1, 0.25) = 0.25", True, a, g, "bfloat16", p)
    # Non-finite: NaN/NaN matched; NaN against a number fails the tensor.
    case("fp16: NaN vs NaN counts as matched", True, [np.nan, 1.0], [np.nan, 1.0], "float16", p)
    case("fp16: NaN vs 1.0 fails (max_abs_error inf)", False, [np.nan] + [1.0] * 999, [1.0] * 1000, "float16", p)
    return out


if __name__ == "__main__":
    failures = 0
    for what, expect, (passed, ratio, max_err, limit) in _examples():
        flag = "ok " if passed == expect else "BAD"
        failures += passed != expect
        print(f"{flag} {'pass' if passed else 'fail'}  ratio {ratio:.6f}  max_abs {max_err:.6g}  limit {limit:.6g}  {what}")
    raise SystemExit(1 if failures else 0)
