"""Words and numbers every report shares: number formatting, where an element is, the device in words."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from ..compare import ERROR, FAIL, PASS, SKIP, CaseResult, SuiteResult, TensorResult
from ..ops import OPS, Op, get
from ..ops.interface import release_counts

#: Rows of the metrics tables: ErrorStats field, label.
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
    ("error_balance", "error balance (EB)"),
)


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
    """Return e.g. "28 cases: 26 passed, 1 failed, 1 error"; with ops other than the backward, the results
    of how many cases ("12 results of 4 cases: ..."), and the skipped ones where there are any ("..., 1
    skipped")."""
    errors, skipped = suite.count(ERROR), suite.count(SKIP)
    counted = results_of([(case.case_name, case.op) for case in suite.cases])
    return f"{counted}: {suite.count(PASS)} passed, {suite.count(FAIL)} failed, {plural(errors, 'error')}" + (
        f", {skipped} skipped" if skipped else ""
    )


def plural(count: int, word: str) -> str:
    """Return e.g. "1 case", "2 cases"."""
    return f"{count} {word}{'s' if count != 1 else ''}"


def results_of(folders: Sequence[tuple[str, str]]) -> str:
    """Return how many results of how many cases (case name, op) there are: "28 cases", or with ops other than
    the backward "52 results of 13 cases" (a backward-only suite counts as it always did)."""
    if all(get(op).is_default for _, op in folders):
        return plural(len(folders), "case")
    return f"{plural(len(folders), 'result')} of {plural(len({name for name, _ in folders}), 'case')}"


def shows_ops(cases: Sequence[CaseResult]) -> bool:
    """Whether reports name each result's op: some result judges an op other than the backward (a backward-only
    suite renders as it always did)."""
    return any(not get(case.op).is_default for case in cases)


def is_op(name: object) -> bool:
    """Whether a report's `op` (its JSON may hold anything) names an op (`bsa_cli.ops`)."""
    try:
        return isinstance(name, str) and get(name) is not None
    except ValueError:
        return False


def op_test_name(case_name: str, op: str) -> str:
    """Return a test's name for one op of a case: the case's name, with the op in brackets for an op other
    than the backward (`NAME[forward]`)."""
    return case_name if get(op).is_default else f"{case_name}[{op}]"


def grouped(cases: Sequence[CaseResult]) -> list[CaseResult]:
    """Return the results with each case's ops side by side: cases in the order of their first result, a case's
    ops in `OPS` order (forward, backward, chain, autograd). A backward-only suite keeps its order."""
    if not shows_ops(cases):
        return list(cases)
    first: dict[str, int] = {}
    for index, case in enumerate(cases):
        first.setdefault(case.case_name, index)
    return sorted(cases, key=lambda c: (first[c.case_name], OPS.index(c.op) if is_op(c.op) else len(OPS)))


def ops_of(cases: Sequence[CaseResult]) -> tuple[Op, ...]:
    """Return the ops the results judge, in `OPS` order."""
    present = {case.op for case in cases}
    return tuple(op for op in OPS if op in present)


#: The aclnn operator each op calls (the pair calls both: `operator_of`).
OPERATORS: dict[str, str] = {"forward": "aclnnBlockSparseAttention", "backward": "aclnnBlockSparseAttentionGrad"}

#: The forward's outputs, as a result's tensors name them (the pair's out and lse too).
FORWARD_TENSORS = ("out", "lse")


def operator_of(op: str, tensor: str | None = None) -> str:
    """Return the aclnn operator that produced a tensor of an op's result (out and lse: the forward; dq, dk,
    dv: the backward); without a tensor, the operators the op calls ("A+B" for the pair)."""
    calls = get(op)
    if not calls.calls_backward or (tensor in FORWARD_TENSORS):
        return OPERATORS["forward"]
    if not calls.calls_forward or tensor is not None:
        return OPERATORS["backward"]
    return f"{OPERATORS['forward']}+{OPERATORS['backward']}"


#: A parenthesised aside in a check's or a note's text: `(device 0.00073, benchmark ..., err_thd ...)`.
_PARENTHESES = re.compile(r" \([^()]*\)")


def short_headline(case: CaseResult, asides: bool = False) -> str:
    """Return a result's headline for a table cell: its notes, then what decided it, without the numbers in
    parentheses (kept with `asides`): a PASS's check closest to its limit without "closest to its limit:",
    a pair that fails as it must by its cause alone (the failing checks that follow are in the full headline)."""
    from ..compare.results import CLOSEST

    headline = case.headline
    if case.verdict == PASS and case.expected_failure and headline.endswith(case.expected_failure):
        main = case.expected_failure.split("; ", 1)[0]
    elif case.verdict == PASS and case.deciding is not None and headline.endswith(case.deciding.detail):
        main = case.deciding.detail
    elif case.verdict in (PASS, FAIL) and not asides:
        return without_asides(headline)
    else:
        return headline  # why an op was skipped or not judged, whole (its status is in parentheses)
    text = "; ".join([*case.notes, main.removeprefix(f"{CLOSEST} ")])
    return text if asides else without_asides(text)


def without_asides(text: str) -> str:
    """Return `text` without its parenthesised asides, nested ones too."""
    for _ in range(4):  # a pass that removes nothing leaves the text as it is
        text = _PARENTHESES.sub("", text)
    return text


def query_axis(tensor: TensorResult) -> bool:
    """Whether a tensor's blocks are query blocks i (dq, and the forward's out and lse), not kv blocks j."""
    return tensor.block_map.axis == "q" if tensor.block_map is not None else tensor.name in ("dq", *FORWARD_TENSORS)


def hot_rows(tensor: TensorResult) -> list[list[str]]:
    """Return a tensor's hot blocks as table rows: b, n, block, rows, score, rmse, bench rmse, max abs err, tile."""
    rows = []
    for hot in tensor.hot_blocks:
        tile = "-" if hot.tile is None else f"s={hot.tile[0]} d={hot.tile[1]} x{fmt(hot.tile_ratio, 3)}"
        figures = (fmt(v, 3) for v in (hot.score, hot.rmse, hot.rmse_benchmark, hot.max_abs_err))
        rows.append([str(hot.batch), str(hot.head), str(hot.block), f"{hot.rows[0]}-{hot.rows[1]}", *figures, tile])
    return rows


def worst_rows(tensor: TensorResult) -> list[list[str]]:
    """Return a tensor's worst elements as table rows: where, device, golden, benchmark, abs err, ULP."""
    rows = []
    for e in tensor.worst:
        values = (fmt(e.device, 6), fmt(e.golden, 6), fmt(e.benchmark, 6), fmt(e.abs_err), fmt(e.ulp, 3))
        rows.append([where(tensor, e.coords, e.block), *values])
    return rows


def metric_rows(tensors: Sequence[TensorResult]) -> list[list[str]]:
    """Return the rows of a metrics table (`METRIC_ROWS`): a label, then each tensor's "device / benchmark"
    (the device alone without a benchmark); a metric no tensor has is left out."""
    rows = []
    for key, label in METRIC_ROWS:
        digits = 7 if key == "cosine" else 4
        pairs = [(getattr(t.device, key), None if t.benchmark is None else getattr(t.benchmark, key)) for t in tensors]
        cells = [fmt(d, digits) if b is None else f"{fmt(d, digits)} / {fmt(b, digits)}" for d, b in pairs]
        if any(c != "-" for c in cells):
            rows.append([label, *cells])
        if key == "max_abs_err" and any(t.matched_ratio is not None for t in tensors):
            rows.append(["matched ratio (mixed tolerance)", *(fmt(t.matched_ratio, 6) for t in tensors)])
    return rows


def side_line(case: CaseResult) -> str | None:
    """Return the verdicts the side-by-side standards that did not decide would give, with the first check each
    fails: "double-benchmark: FAIL (dq MARE ratio 12 > 10 ...)"; None for a case not judged."""
    verdicts = case.side_verdicts
    if not verdicts:
        return None
    parts = []
    for label, verdict in verdicts.items():
        failed = [c for t in case.tensors for c in t.sides.get(label, t.checks) if not c.passed]
        worst = max(failed, key=lambda c: c.severity).detail if failed else None
        parts.append(f"{label}: {verdict}" + (f" ({worst})" if worst else ""))
    return "other standards: " + "; ".join(parts)


def side_mark(case: CaseResult) -> str | None:
    """Return the verdicts of the side-by-side standards that did not decide, without their checks: "also
    mixed-tolerance: FAIL" (the terminal's default row; `side_line` has the checks); None for a case not judged."""
    verdicts = case.side_verdicts
    return "also " + ", ".join(f"{label}: {v}" for label, v in verdicts.items()) if verdicts else None


def tensor_figures(tensor: TensorResult) -> str:
    """Return a tensor's matched ratio (mixed tolerance) and largest absolute error in words."""
    ratio = "" if tensor.matched_ratio is None else f"matched ratio {fmt(tensor.matched_ratio, 6)}, "
    return f"{tensor.name} {ratio}max abs error {fmt(tensor.max_abs_error)}"


def differ_line(suite: SuiteResult) -> str | None:
    """Return the cases whose side-by-side verdicts differ from the deciding one, or None where none does."""
    differ = [c for c in suite.cases if c.verdicts_differ]
    if not differ:
        return None
    cases = ", ".join(
        f"{c.name} ({c.standard} {c.verdict}, " + ", ".join(f"{k} {v}" for k, v in c.side_verdicts.items()) + ")"
        for c in differ
    )
    return f"verdicts differ between standards in {plural(len(differ), 'result')}: {cases}"


def releases_line(suite: SuiteResult) -> str | None:
    """Return e.g. "expected statuses follow operator release master (28 cases)", or None without releases."""
    by_case = {case.case_name: case.release for case in suite.cases}  # a case's ops follow one release
    shown = release_counts(by_case.values())
    return f"expected statuses follow operator release {shown}" if shown else None


def where(tensor: TensorResult, coords: Mapping[str, int], block: int) -> str:
    """Return an element's place in its tensor's layout and its block, e.g. "b=0,n=1,s=70,d=33 i=2"."""
    axis = "i" if query_axis(tensor) else "j"
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
    warning (reference results or a planted fault), most cases first (SKIP results have no outputs)."""
    judged = [case for case in suite.cases if case.verdict != SKIP]  # a SKIP has no outputs
    counts = Counter(provenance(case) for case in judged)
    warned = {provenance(case): is_reference(case) for case in judged}
    return [(text, count, warned[text]) for text, count in counts.most_common()]


def standards_line(suite: SuiteResult) -> str:
    """Return the standards that judged the suite with their case counts, e.g. "double-benchmark (27), single (1)"."""
    counts = Counter(
        case.standard for case in suite.cases if case.standard and case.standard != "-" and case.verdict != SKIP
    )
    return ", ".join(f"{name} ({count})" for name, count in counts.most_common()) or "-"


def likely_cause(case: CaseResult) -> str | None:
    """The `likely:` line of a diagnosed failing case in short: its best cause and score (`likely_line` has
    the evidence too)."""
    if case.verdict != FAIL or not case.hypotheses:
        return None
    if not case.diagnosis:
        return f"likely: unexplained (bsa compare --explain {case.name})"
    return f"likely: {case.diagnosis[0].kind} ({case.diagnosis[0].score:.2f})"


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
