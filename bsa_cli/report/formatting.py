"""Words and numbers every report shares: number formatting, where an element is, the device in words."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

import numpy as np

from ..compare import ERROR, FAIL, PASS, CaseResult, SuiteResult, TensorResult
from ..interface import release_counts

METRIC_ROWS: tuple[tuple[str, str], ...] = (
    ("max_abs_err", "max abs error"),
    ("mean_abs_err", "mean abs error"),
    ("rmse", "RMSE"),
    ("max_rel_err", "max rel error (ATK)"),
    ("mean_rel_err", "mean rel error (ATK)"),
    ("mare", "MARE (single)"),
    ("mere", "MERE (single)"),
    ("cosine", "cosine similarity"),
    ("mismatch_count", "mismatches (rtol/atol)"),
    ("mismatch_ratio", "mismatch ratio"),
    ("small_value_err_count", "small-value errors"),
    ("nan_count", "NaN"),
    ("inf_count", "Inf"),
    ("ulp_max", "max ULP error"),
    ("ulp_mean", "mean ULP error"),
    ("msopst_err_count", "msOpST errors"),
    ("msopst_max_err", "msOpST max error"),
    ("bias", "relative bias (signed)"),
    ("bias_se", "relative bias, standard error"),
)
"""Rows of the metrics tables: ErrorStats field, label."""


def fmt(value: float | int | None, digits: int = 4) -> str:
    """Format a number for a report: integers plainly, others with `digits` significant digits."""
    if value is None:
        return "-"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.{digits}g}"


def summary_line(suite: SuiteResult) -> str:
    """Return e.g. "28 cases: 26 passed, 1 failed, 1 error"."""
    errors = suite.count(ERROR)
    return (
        f"{len(suite.cases)} case{'s' if len(suite.cases) != 1 else ''}: {suite.count(PASS)} passed, "
        f"{suite.count(FAIL)} failed, {errors} error{'s' if errors != 1 else ''}"
    )


def releases_line(suite: SuiteResult) -> str | None:
    """Return e.g. "expected statuses follow operator release master (28 cases)", or None without releases."""
    shown = release_counts(case.release for case in suite.cases)
    return f"expected statuses follow operator release {shown}" if shown else None


def where(tensor: TensorResult, coords: Mapping[str, int], block: int) -> str:
    """Return an element's place in its tensor's layout and its block, e.g. "b=0,n=1,s=70,d=33 i=2"."""
    axis = "i" if tensor.name == "dq" else "j"
    index = ",".join(f"{axis_name}={coords[axis_name]}" for axis_name in tensor.axes)
    extra = f" (b={coords['b']} s={coords['s']})" if "t" in coords else ""
    return f"{index}{extra} {axis}={block}"


def is_reference(case: CaseResult) -> bool:
    """Whether a case's outputs come from the reference device (bsa emulate), not from hardware."""
    return case.device_kind == "reference" or bool(case.device and case.device.startswith("reference"))


def planted_fault(case: CaseResult) -> str | None:
    """Return the fault planted in the reference device for this case (from the record, or its name)."""
    if case.fault:
        return case.fault
    if case.device and " with fault '" in case.device:
        return case.device.split(" with fault '", 1)[1].rstrip("'")
    return None


def provenance(case: CaseResult) -> str:
    """Return who produced a case's outputs in words, with the fault or binary digest when recorded."""
    if case.device is None:
        return "not recorded (no run.json)"
    if is_reference(case):
        fault = planted_fault(case)
        text = "the reference device (bsa emulate): reference results, not device results"
        return text + (f"; planted fault '{fault}'" if fault else "")
    if case.binary_sha256:
        return f"{case.device} (sha256 {case.binary_sha256})"
    return case.device


def device_lines(suite: SuiteResult) -> list[tuple[str, int, bool]]:
    """Return each distinct provenance of the suite's outputs with its case count, and whether it is a
    warning (reference results or a planted fault), most cases first."""
    counts = Counter(provenance(case) for case in suite.cases)
    warned = {provenance(case): is_reference(case) for case in suite.cases}
    return [(text, count, warned[text]) for text, count in counts.most_common()]


def standards_line(suite: SuiteResult) -> str:
    """Return the standards that judged the suite with their case counts, e.g. "double-benchmark (27), single (1)"."""
    counts = Counter(case.standard for case in suite.cases if case.standard and case.standard != "-")
    return ", ".join(f"{name} ({count})" for name, count in counts.most_common()) or "-"


__all__ = [
    "METRIC_ROWS",
    "ERROR",
    "FAIL",
    "PASS",
    "device_lines",
    "fmt",
    "is_reference",
    "planted_fault",
    "provenance",
    "standards_line",
    "summary_line",
    "where",
    "likely_line",
]


def likely_line(case: CaseResult) -> str | None:
    """The `likely:` line of a diagnosed failing case: its best cause with score and evidence (None for a case
    the diagnosis did not run on)."""
    if case.verdict != FAIL or not case.hypotheses:
        return None
    if not case.diagnosis:
        return (
            f"likely: unexplained: none of {len(case.hypotheses)} hypotheses fits (bsa compare --explain {case.name})"
        )
    best = case.diagnosis[0]
    return f"likely: {best.kind} ({best.score:.2f}): {best.evidence}"
