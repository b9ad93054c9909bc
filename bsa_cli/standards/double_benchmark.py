"""`double-benchmark` (the default): CANN/ATK's standard, the device's errors against the benchmark's.

Each error metric of the device against the golden is divided by the same metric of the benchmark (the
kernel-faithful result in the case dtype written by `bsa gen`), floored at `err_thd`: MARE, MERE and RMSE
ratios, and a small-value error count ratio. bsa adds a localized check, `tile_ratio`: the RMSE ratio of
every 16x16 tile of every block (the cube unit's fractal), so a precision bug confined to one tile cannot
hide in the tensor-wide means. Preset `double-benchmark:fa` has the stricter flash-attention limits
2 / 1.2 / 1.2. It is the one standard whose bias check is on by default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .base import BIAS_Z, Check, Measured, Standard, fmt, upper

#: ATK's err_thd: the floor of benchmark errors, and the |golden| above which relative errors count.
ERR_THD = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-14}
#: ATK's small-value rule: an element with |golden| <= err_thd is an error when |a - g| exceeds this.
SMALL_VALUE_THD = {"float16": 2.0**-16, "bfloat16": 2.0**-16, "float32": 2.0**-30}


class DoubleBenchmark(Standard):
    name = "double-benchmark"
    summary = (
        "CANN/ATK: device error / max(benchmark error, err_thd) for MARE, MERE, RMSE, small-value "
        "errors; and per 16x16 tile RMSE ratio"
    )
    keys = {
        "mare_ratio": "limit of max relative error ratio (default 10)",
        "mere_ratio": "limit of mean relative error ratio (default 2)",
        "rmse_ratio": "limit of RMSE ratio (default 2)",
        "small_value_ratio": "limit of small-value error count ratio, device / max(benchmark, 1) (default 2)",
        "err_thd": "error floor and large-value bound (2^-11 fp16, 2^-8 bf16)",
        "small_value_thd": "error bound of small values (2^-16)",
        "tile_ratio": "limit of any 16x16 tile's RMSE ratio (default 3; inf turns it off)",
        "tile_floor": "a tile's benchmark RMSE is floored at this fraction of the tensor's (default 0.1)",
    }
    presets = {"fa": {"mare_ratio": 2.0, "mere_ratio": 1.2, "rmse_ratio": 1.2}}
    needs_benchmark = True
    bias_z = BIAS_Z
    atk_name = "cv_fused_double_benchmark"
    atk_keys = {"mare_ratio": "max_re_ratio", "mere_ratio": "avg_re_ratio", "rmse_ratio": "root_mean_squared_ratio"}
    # TTK's cross_check has these ratios but against a third-party chip's output (XPU), which bsa lacks
    ttk_note = (
        "TTK's cross_check takes the same ratios against a third-party chip's output, not a CPU benchmark: "
        "judged by TTK's mixed tolerance instead"
    )
    own_defaults = {
        "mare_ratio": 10.0,
        "mere_ratio": 2.0,
        "rmse_ratio": 2.0,
        "small_value_ratio": 2.0,
        "err_thd": ERR_THD,
        "small_value_thd": SMALL_VALUE_THD,
        "tile_ratio": 3.0,
        "tile_floor": 0.1,
    }
    rank = 0
    side_by_side = True
    # The commercial standard's narrowest step between adjacent levels' limits (L1 1.5 -> L2 1.2: x1.25; opbase
    # commercial_standard.md at 56922c3e667df071af471d78d938b6158a012343, section 1.2).
    recheck_margin = 1.25

    def checks(self, m: Measured, t: Mapping[str, float]) -> list[Check]:
        device, bench = m.device, m.bench
        assert bench is not None
        thd = t["err_thd"]
        checks = []
        for key, label, dev, ref in (
            ("mare_ratio", "MARE ratio", device.max_rel_err, bench.max_rel_err),
            ("mere_ratio", "MERE ratio", device.mean_rel_err, bench.mean_rel_err),
            ("rmse_ratio", "RMSE ratio", device.rmse, bench.rmse),
        ):
            if ref < thd:  # the ratio's denominator is err_thd, not the benchmark's error: say so
                detail = f" (device {fmt(dev)} / err_thd {fmt(thd)}: benchmark {fmt(ref)} floored at err_thd)"
            else:
                detail = f" (device {fmt(dev)}, benchmark {fmt(ref)}, err_thd {fmt(thd)})"
            checks.append(upper(key, m.tensor, dev / max(ref, thd), t[key], label, detail=detail))
        dev_n, ref_n = device.small_value_err_count, bench.small_value_err_count
        floored = ", floored at 1" if ref_n < 1 else ""
        detail = f" (small values off by more than small_value_thd: device {dev_n}, benchmark {ref_n}{floored})"
        ratio, label = dev_n / max(ref_n, 1), "small-value error ratio"
        checks.append(upper("small_value_ratio", m.tensor, ratio, t["small_value_ratio"], label, detail=detail))
        if m.tile_max is not None and math.isfinite(t["tile_ratio"]):
            checks.append(upper("tile_ratio", m.tensor, m.tile_max, t["tile_ratio"], "worst 16x16 tile RMSE ratio"))
        return checks
