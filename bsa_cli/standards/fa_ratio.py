"""`fa-ratio`: FlashAttention 3's test, max abs error <= k x the benchmark's max abs error + an ULP-sized floor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .base import Check, Measured, Standard, fmt, upper

if TYPE_CHECKING:
    import numpy as np

#: Golden elements rounded at a time for the ULP floor (8 x compare's CHUNK_ELEMENTS).
CHUNK = 1 << 20


class FaRatio(Standard):
    name = "fa-ratio"
    summary = "FlashAttention: max abs error <= k x benchmark max abs error + ULP floor"
    keys = {
        "k": "factor on the benchmark's max abs error (default 3, FlashAttention's for gradients)",
        "floor_factor": "ULP floor: this times max |(g + 0.3) - 0.3 - g| in the case dtype (default 2)",
    }
    needs_benchmark = True
    own_defaults = {"k": 3.0, "floor_factor": 2.0}
    rank = 3
    ttk_note = "TTK has no rule against a benchmark's max error: judged by TTK's mixed tolerance instead"

    def measure(self, golden: np.ndarray, dtype: str, thresholds: Mapping[str, float]) -> dict[str, float]:
        """The ULP floor: floor_factor x max |(g + 0.3) - 0.3 - g|, all in the case dtype."""
        import numpy as np

        from ..core.case import numpy_dtype
        from ..core.rounding import round_float32

        io_dtype = numpy_dtype(dtype)
        flat = golden.reshape(-1)
        worst = 0.0
        for start in range(0, flat.size, CHUNK):
            g = round_float32(flat[start : start + CHUNK].astype(np.float32), io_dtype)
            shifted = round_float32(g + np.float32(0.3), io_dtype)
            back = round_float32(shifted - round_float32(np.asarray(0.3, np.float32), io_dtype), io_dtype)
            worst = max(worst, float(np.abs(back - g).max(initial=0.0)))
        return {"ulp_floor": thresholds["floor_factor"] * worst}

    def checks(self, m: Measured, t: Mapping[str, float]) -> list[Check]:
        assert m.bench is not None
        floor = m.extra["ulp_floor"]
        detail = f" (k {fmt(t['k'])} x benchmark {fmt(m.bench.max_abs_err)} + floor {fmt(floor)})"
        limit = t["k"] * m.bench.max_abs_err + floor
        return [upper("max_abs_err", m.tensor, m.device.max_abs_err, limit, "max abs error", detail=detail)]
