"""`allclose`: at most a fraction `mismatch` of elements with |a - g| > atol + rtol |g| (torch's form);
or msOpST's form, `allclose:msopst` or any of diff_thd / pct_thd / max_diff given: at most a fraction
pct_thd of elements over diff_thd (absolute below it, relative above), and no error reaching max_diff.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Check, Measured, Resolved, Standard, fmt, upper

#: The preset of msOpST's form.
MSOPST = "msopst"


class Allclose(Standard):
    name = "allclose"
    summary = (
        "|a - g| <= atol + rtol |g| for all but a fraction `mismatch` of elements; or msOpST's [diff_thd, pct_thd] form"
    )
    keys = {
        "mismatch": "allowed fraction of mismatched elements (default 0)",
        "diff_thd": "msOpST: per-element error bound, absolute below it, relative above (default 0.01)",
        "pct_thd": "msOpST: allowed fraction of elements over diff_thd (default 0.05)",
        "max_diff": "msOpST: the largest element error must stay below this (default 0.1)",
    }
    presets = {MSOPST: {"diff_thd": 0.01, "pct_thd": 0.05, "max_diff": 0.1}}
    own_defaults = {"mismatch": 0.0}
    rank = 2
    ttk_compare = "close"

    def ttk_fields(self, thresholds: Mapping[str, float], outputs: int) -> dict[str, str]:
        """TTK's close: per output (rtol, ptol) and one atol. msOpST's form (diff_thd absolute below 1, relative
        above) reads as rtol = atol = diff_thd, which bounds it within a factor of 2; max_diff has no column."""
        if "diff_thd" in thresholds:
            rtol, ptol, atol = thresholds["diff_thd"], thresholds["pct_thd"], thresholds["diff_thd"]
        else:
            rtol, ptol, atol = thresholds["rtol"], thresholds["mismatch"], thresholds["atol"]
        pairs = ((float(rtol), float(ptol)),) * outputs
        return {"precision_tolerances": repr(pairs), "absolute_precision": repr(float(atol))}

    def defaults(self, dtype: str, preset: str | None = None) -> dict[str, float]:
        values = super().defaults(dtype, preset)
        if preset == MSOPST:
            del values["mismatch"]  # msOpST's form counts by diff_thd alone
        return values

    def check_rules(self, thresholds: Mapping[str, float], preset: str | None) -> None:
        msopst = [k for k in self.presets[MSOPST] if k in thresholds]
        if msopst and "mismatch" in thresholds:
            raise ValueError(
                "allclose takes either mismatch (with rtol/atol) or msOpST's diff_thd/pct_thd/max_diff, "
                f"not both (got mismatch and {', '.join(msopst)})"
            )
        if preset == MSOPST and "mismatch" in thresholds:
            raise ValueError("allclose:msopst does not take mismatch (it uses diff_thd and pct_thd)")

    def finish(self, thresholds: dict[str, float], origin: dict[str, str], preset: str | None) -> Resolved:
        """msOpST's form where its preset or any of its keys is given: without mismatch, its keys defaulted."""
        given = {k for k, o in origin.items() if o in ("case", "cli")}
        if preset != MSOPST and not given & set(self.presets[MSOPST]):
            return thresholds, origin
        if "mismatch" in given:
            raise ValueError("allclose takes either mismatch or msOpST's diff_thd/pct_thd/max_diff, not both")
        thresholds = {k: v for k, v in thresholds.items() if k != "mismatch"}
        origin = {k: o for k, o in origin.items() if k != "mismatch"}
        for key, value in self.presets[MSOPST].items():
            thresholds.setdefault(key, value)
            origin.setdefault(key, "preset")
        return thresholds, origin

    def checks(self, m: Measured, t: Mapping[str, float]) -> list[Check]:
        d = m.device
        if "diff_thd" not in t:
            assert d.mismatch_ratio is not None
            beyond = f" ({d.mismatch_count} of {d.count} beyond atol {fmt(t['atol'])} + rtol {fmt(t['rtol'])})"
            return [upper("mismatch", m.tensor, d.mismatch_ratio, t["mismatch"], "mismatch fraction", detail=beyond)]
        assert d.msopst_err_count is not None and d.msopst_max_err is not None
        over, count = f"fraction over diff_thd {fmt(t['diff_thd'])}", f" ({d.msopst_err_count} of {d.count})"
        return [
            upper("pct_thd", m.tensor, d.msopst_err_count / max(d.count, 1), t["pct_thd"], over, detail=count),
            upper("max_diff", m.tensor, d.msopst_max_err, t["max_diff"], "msOpST max error", strict=True),
        ]
