"""`single`: CANN's single-reference standard, MERE < T and MARE < 10 T.

Its relative error is |a - g| / (|g| + 1e-7) over all elements, against the golden alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Check, Measured, Resolved, Standard, upper

#: The single-reference standard's T per dtype.
SINGLE_T = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-13}


class Single(Standard):
    name = "single"
    summary = "CANN single reference: MERE < T and MARE < 10 T"
    keys = {
        "mere": "limit of mean relative error (T: 2^-10 fp16, 2^-7 bf16)",
        "mare": "limit of max relative error (default 10 x mere)",
    }
    own_defaults = {"mere": SINGLE_T, "mare": {dtype: 10 * t for dtype, t in SINGLE_T.items()}}
    rank = 1
    # TTK's stat_rel_err is this rule with these T (ops-test-kit docs/Precision_Comparison.md 36750932)
    ttk_compare = "stat_rel_err"

    def finish(self, thresholds: dict[str, float], origin: dict[str, str], preset: str | None) -> Resolved:
        if origin.get("mare") in ("case", "cli"):
            return thresholds, origin
        return {**thresholds, "mare": 10 * thresholds["mere"]}, origin  # 10 x a given mere

    def checks(self, m: Measured, t: Mapping[str, float]) -> list[Check]:
        assert m.device.mere is not None and m.device.mare is not None
        return [
            upper("mere", m.tensor, m.device.mere, t["mere"], "MERE", strict=True),
            upper("mare", m.tensor, m.device.mare, t["mare"], "MARE", strict=True),
        ]
