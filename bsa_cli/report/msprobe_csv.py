"""msprobe's compare CSV: one row per tensor, msprobe's columns first, then bsa's verdict and deciding check.

msprobe (MindStudio Probe) writes its accuracy comparison as a table with the columns of
`MSPROBE_COLUMNS` ("real data" mode); dashboards built on it read those names. bsa fills them from its own
measurements: "NPU" is the device's output, "Bench" the golden (the float32/float64 reference).

* Cosine, MaxAbsErr: as msprobe computes them. MaxRelativeErr: max |a - g| / (|g| + 1e-7) (bsa's MARE;
  msprobe adds a machine epsilon to a zero golden instead).
* One / Five Thousandths Err Ratio: the fraction of elements whose relative error is below 0.001 / 0.005
  (the higher, the better, as in msprobe).
* NPU/Bench max, min, mean, l2norm: of the finite elements bsa judged (BNSD padding left out).
* Accuracy Reached or Not: "Yes" when the tensor passes every check of its case's standard, "No"
  otherwise; not msprobe's own cosine / max-abs rule, which a precision bug confined to one 16x16 tile
  passes. Err_message: the tensor's failed checks, or why the case could not be judged.
* bsa's columns: the case, its verdict, the tensor's verdict, the standard, and the check that decided
  the case.

A case without tensor results (a negative case judged on its status, one that could not be judged, or a
skipped op) has one row named after the case, with "N/A" in the numeric columns ("Accuracy Reached or Not"
too for a SKIP).

Ops: a result's names carry its op (the case folder `NAME@forward`) and the operator that produced each
tensor (`aclnnBlockSparseAttention/NAME@chain/out`, `aclnnBlockSparseAttentionGrad/NAME@chain/dq`), so
msprobe's columns keep their meaning; a suite with ops other than the backward gets one more bsa column at
the end, `bsa Op` (a backward-only suite's CSV is as it always was).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from ..compare import ERROR, PASS, SKIP, CaseResult, SuiteResult, TensorResult
from ..compare.results import MSPROBE_FIELDS
from .files import write_text_atomic
from .formatting import grouped, operator_of, shows_ops

#: msprobe's compare result header (real data mode).
MSPROBE_COLUMNS = (
    *(f"{side} {what}" for what in ("Name", "Dtype", "Tensor Shape") for side in ("NPU", "Bench")),
    *("Cosine", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio", "Five Thousandths Err Ratio"),
    *(f"{side} {stat}" for side in ("NPU", "Bench") for stat in ("max", "min", "mean", "l2norm")),
    "Accuracy Reached or Not",
    "Err_message",
)

#: The columns bsa adds after msprobe's.
BSA_COLUMNS = (
    *("bsa Case", "bsa Verdict", "bsa Tensor Verdict", "bsa Standard", "bsa Deciding Check"),
    *("bsa Matched Ratio", "bsa Max Abs Error", "bsa Other Verdicts"),
)

#: The last column where a suite has ops other than the backward: forward, backward, chain, autograd.
OP_COLUMN = "bsa Op"
#: The columns after those where a case was timed (`bsa run --time`): the median time and achieved TFLOP/s of
#: the call that wrote the row's tensor (out, lse: the forward; dq, dk, dv and a status row: the last call).
TIME_COLUMNS = ("bsa Kernel Median us", "bsa Kernel TFLOP/s")

NA = "N/A"
#: The backward's operator, in the names of a backward result's rows (`formatting.operator_of` for the others).
OP = "aclnnBlockSparseAttentionGrad"


def _number(value: float | int | None) -> str:
    if value is None:
        return NA
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(float(value))  # nan, inf, -inf
    return f"{value:.6g}"


def _tensor_row(case: CaseResult, tensor: TensorResult) -> list[str]:
    d = tensor.device
    failed = [c.detail for c in sorted(tensor.checks, key=lambda c: -c.severity) if not c.passed]
    shape = str(list(tensor.shape))
    row = [
        f"{operator_of(case.op, tensor.name)}/{case.name}/{tensor.name}",
        f"golden/{case.name}/{tensor.name}",
        tensor.dtype,
        tensor.golden_dtype or "float32",
        shape,
        shape,
        *(_number(getattr(d, name)) for name in ("cosine", "max_abs_err", "mare", *MSPROBE_FIELDS)),
        "Yes" if tensor.passed else "No",
        "; ".join([*case.notes, *failed]),
    ]
    verdict = PASS if tensor.passed else "FAIL"
    ratio, largest = _number(tensor.matched_ratio), _number(tensor.max_abs_error)
    return row + [case.name, case.verdict, verdict, case.standard, case.headline, ratio, largest, _sides(case)]


def _sides(case: CaseResult) -> str:
    """The side-by-side standards' verdicts: "double-benchmark PASS"."""
    return "; ".join(f"{label} {verdict}" for label, verdict in case.side_verdicts.items()) or NA


def _case_row(case: CaseResult) -> list[str]:
    """The one row of a case without tensor results."""
    why = case.errors if case.verdict in (ERROR, SKIP) else (case.message,)
    message = "; ".join([*case.notes, *why])
    dtype = case.dtype or NA
    reached = NA if case.verdict == SKIP else "Yes" if case.verdict == PASS else "No"
    status = f"{operator_of(case.op)}/{case.name}/status"
    row = [status, f"expected/{case.name}/status", dtype, dtype, NA, NA, *([NA] * 13), reached, message]
    return row + [case.name, case.verdict, case.verdict, case.standard, case.headline, NA, NA, _sides(case)]


def csv_rows(suite: SuiteResult) -> list[list[str]]:
    """Return the CSV's rows, header first: one per tensor of each result (one per result without tensors),
    a case's ops side by side."""
    with_ops = shows_ops(suite.cases)
    timed = any(case.kernel_time for case in suite.cases)
    header = [*MSPROBE_COLUMNS, *BSA_COLUMNS, *([OP_COLUMN] if with_ops else []), *(TIME_COLUMNS if timed else ())]
    rows: list[list[str]] = [header]
    for case in grouped(suite.cases):
        shown: list[tuple[list[str], str | None]] = [(_tensor_row(case, t), t.name) for t in case.tensors]
        shown = shown or [(_case_row(case), None)]
        for row, tensor in shown:
            rows.append([*row, *([case.op] if with_ops else []), *(_time_cells(case, tensor) if timed else [])])
    return rows


def _time_cells(case: CaseResult, tensor: str | None) -> list[str]:
    """The time columns of a row: the step that wrote `tensor` (None: a status row, the last step)."""
    step = "forward" if tensor in ("out", "lse") else "backward"
    times = [t for t in case.kernel_time if t.step == step] or list(case.kernel_time[-1:])
    if not times:
        return [NA, NA]
    return [_number(times[0].median_us), _number(times[0].tflops)]


def csv_text(suite: SuiteResult) -> str:
    """Return the CSV (RFC 4180 quoting, CRLF line ends as Python's csv module writes them)."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(csv_rows(suite))
    return buffer.getvalue()


def write_csv(suite: SuiteResult, path: Path) -> None:
    """Write msprobe's compare CSV with bsa's columns to `path` (atomically)."""
    write_text_atomic(Path(path), csv_text(suite))
