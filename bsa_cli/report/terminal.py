"""The terminal report: a case table, the failures' checks, worst elements and hot blocks, a summary line."""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..compare import ERROR, FAIL, PASS, SKIP, ULP_BUCKETS, CaseResult, SuiteResult, TensorResult
from ..compare.results import CLOSEST
from . import formatting, timing
from .formatting import fmt, grouped, hot_rows, short_headline, shows_ops, worst_rows

VERDICT_STYLE = {PASS: "bold green", FAIL: "bold red", ERROR: "bold magenta", SKIP: "bold cyan"}


def table_box(console: Console) -> box.Box:
    """The border of a table: rounded on a terminal, ASCII in a file or a pipe."""
    return box.ROUNDED if console.is_terminal else box.ASCII


def titled_table(
    console: Console, title: str, columns: Sequence[str], right: Sequence[str], rows: Iterable[Any] = (), **options: Any
) -> Table:
    """Return a table titled on the left, its `columns` added (those in `right` right-aligned) with `options`,
    and its `rows`.

    Without an `overflow` option (prose that may fold) no cell is wrapped or cut: where the table is wider
    than the console, its last columns are left out, and its caption names them (as `bsa list` does).
    """
    rows = [tuple(row) for row in rows]
    kept = len(columns)
    while True:
        table = Table(box=table_box(console), title=title, title_justify="left", caption_justify="left")
        for column in columns[:kept]:
            table.add_column(
                column, justify="right" if column in right else "left", no_wrap="overflow" not in options, **options
            )
        for row in rows:
            table.add_row(*row[:kept])
        if "overflow" in options or kept <= 2 or _natural_width(table) <= console.width:
            break
        kept -= 1
    if kept < len(columns):
        left_out = ", ".join(columns[kept:])
        table.caption = (
            f"left out at {console.width} columns: {left_out} (all of them: a wider terminal, or the HTML report)"
        )
    return table


def _natural_width(table: Table) -> int:
    """The width `table` takes with room enough for every cell on one line."""
    return Console(width=10_000, file=io.StringIO(), color_system=None).measure(table).maximum


def _verdict_text(verdict: str) -> Text:
    return Text(verdict, style=VERDICT_STYLE.get(verdict, ""))


def _case_table(suite: SuiteResult, console: Console, verbose: bool = True) -> Table:
    """One row per case; the standard goes in the title when every judged case has the same one (a column
    repeating one value only narrows the deciding check). Where the rows do not fit the console's width, a
    passing case's line leaves out its numbers in parentheses (the JSON and HTML reports keep them)."""
    with_ops = shows_ops(suite.cases)
    shortened = [c for c in suite.cases if c.headline.startswith(f"{CLOSEST} ") or (with_ops and c.verdict == PASS)]
    passing = dataclasses.replace(suite, cases=tuple(shortened))
    measure = Console(width=10_000, file=io.StringIO(), color_system=None).measure
    short = bool(passing.cases) and measure(_verdict_table(passing, console, short=False)).maximum > console.width
    return _verdict_table(suite, console, short=short, verbose=verbose)


#: Longest case name a table with ops keeps on one line (its op rows leave the column's other lines empty).
CASE_WHOLE = 32
#: What the deciding-check column's heading adds where passing lines are short (they leave out that they name
#: the check closest to its limit).
SHORT_NOTE = " (of a PASS: the check closest to its limit)"
#: What a SKIP row says when an op above it in the same case (or this op of the case above) was skipped for the
#: same reason.
_SAME = "not judged: same reason as"
#: The numbers in parentheses at the end of a check's text: `(device 0.00073, benchmark ..., err_thd ...)`.
_DETAIL = re.compile(r" \([^()]*\)$")


def _verdict_table(suite: SuiteResult, console: Console, short: bool, verbose: bool = True) -> Table:
    """One row per result; with ops other than the backward, a case's ops side by side in `OPS` order under
    its name (an op column; the name on the first row of the case, a line between cases). Without `verbose`
    a failing row says what failed without its parenthesised numbers, and its likely cause by name and score
    (`formatting.likely_cause`); the evidence is in the verbose report and the HTML one.

    A column of its own per case (a measured value, a time) goes next to "verdict": the deciding check is the
    one column that folds."""
    standards = sorted({c.standard for c in suite.cases if c.standard not in ("-", "") and c.verdict != SKIP})
    one = len(standards) <= 1
    title = f"bsa compare: standard {standards[0]}" if len(standards) == 1 else "bsa compare"
    with_ops = shows_ops(suite.cases)
    table = Table(box=table_box(console), title=title, title_justify="left", expand=False)
    longest = max((len(c.case_name) for c in suite.cases), default=0)
    table.add_column("case", overflow="fold", no_wrap=with_ops and longest <= CASE_WHOLE)
    if with_ops:
        table.add_column("op", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    if not one:
        table.add_column("standard", overflow="fold")
    table.add_column(f"deciding check{SHORT_NOTE if short else ''}", overflow="fold")
    cases = grouped(suite.cases)
    reasons: dict[str, str] = {}
    before: dict[str, str] = {}
    for index, case in enumerate(cases):
        text = case.headline
        if short and with_ops and case.verdict == PASS:  # notes and the check, without their numbers
            text = short_headline(case)
        elif short and text.startswith(f"{CLOSEST} "):  # a PASS without notes
            text = _DETAIL.sub("", text.removeprefix(f"{CLOSEST} "))
        elif case.verdict == PASS and case.expected_failure:  # a pair failing as it must: by its cause
            text = short_headline(case, asides=not short)
        elif case.verdict == FAIL and not verbose:
            text = short_headline(case)
        if likely := (formatting.likely_line(case) if verbose else formatting.likely_cause(case)):
            text = f"{text}\n{likely}"
        agreed = case.verdict == PASS and not case.verdicts_differ  # a PASS every standard gives says nothing new
        if not verbose and not agreed and (mark := formatting.side_mark(case)):  # -v prints them with their checks
            text = f"{text}\n{mark}"
        standard = [] if one else [case.standard]
        if not with_ops:
            table.add_row(case.name, _verdict_text(case.verdict), *standard, text)
            continue
        headline: str | Text = text
        first = index == 0 or cases[index - 1].case_name != case.case_name
        last = index == len(cases) - 1 or cases[index + 1].case_name != case.case_name
        if first:
            before, reasons = reasons, {}  # a SKIP's reason -> the case's first op skipped for it
        if case.verdict == SKIP and case.headline in reasons:
            headline = Text(f"{_SAME} {reasons[case.headline]}", style="dim")  # one reason, said once per case
        elif case.verdict == SKIP:
            if before.get(case.headline) == case.op:  # the case above skipped this op for this reason too
                headline = Text(f"{_SAME} the case above", style="dim")
            reasons[case.headline] = case.op
        name = case.case_name if first else ""
        table.add_row(name, case.op, _verdict_text(case.verdict), *standard, headline, end_section=last)
    return table


def _diagnosis_table(case: CaseResult, console: Console) -> Table:
    title = f"{case.name}: diagnosis (likely causes, best first)"
    columns = ("#", "kind", "score", "tensors", "evidence")
    rows = [
        (str(n), c.kind, f"{c.score:.2f}", ",".join(c.tensors), c.evidence) for n, c in enumerate(case.diagnosis, 1)
    ]
    return titled_table(console, title, columns, ("#", "score"), rows, overflow="fold")


def render_explanation(case: CaseResult, console: Console) -> None:
    """Print the full reasoning of one case's diagnosis: its causes, then every hypothesis tried, best
    first, with what it explained or why it was ruled out (`bsa compare --explain CASE`)."""
    console.print(Text(f"{case.name}: {case.verdict}: {case.headline}"), soft_wrap=True)
    if case.verdict != FAIL:
        console.print("no diagnosis: only a failing case is diagnosed")
        return
    if not case.hypotheses:
        console.print("no diagnosis: no gradient was judged (the case failed on its status)")
        return
    if case.diagnosis:
        console.print(_diagnosis_table(case, console))
        for cause in case.diagnosis:
            if cause.where:
                console.print(Text(f"  {cause.kind} where: {'; '.join(cause.where)}"), soft_wrap=True)
    else:
        console.print("no cause scores 0.2 or more: the errors are unexplained")
    console.print(f"hypotheses tried ({len(case.hypotheses)}), best first:")
    for h in case.hypotheses:
        console.print(Text(f"  [{h.score:.2f}] {h.kind}: {h.supposes}: {h.outcome}"), soft_wrap=True)


def _checks_table(case: CaseResult, console: Console, only_failed: bool) -> Table:
    columns = ("tensor", "check", "value", "limit", "result")
    rows = [
        (
            check.tensor or "-",
            check.name,
            fmt(check.value),
            fmt(check.limit),
            Text("ok", style="green") if check.passed else Text("FAIL", style="bold red"),
        )
        for check in case.all_checks
        if not (only_failed and check.passed)
    ]
    return titled_table(console, f"{case.name}: checks", columns, ("value", "limit"), rows)


def _short(value: float, digits: int) -> str:
    """A compact signed number: -2.67e-4 rather than -2.67e-04."""
    text = f"{value:+.{digits}g}" if value else "0"
    return text.replace("e-0", "e-").replace("e+0", "e+")


def _bias_table(case: CaseResult, console: Console) -> Table:
    """Each tensor's estimated systematic error, relative and in ULPs, with standard errors (`compare.bias`);
    the checks table says which failed."""
    columns = ("tensor", "device", "in ULP", "benchmark", "z bench", "z 0")
    rows = [
        (
            tensor.name,
            f"{_short(e.device, 3)}±{_short(e.device_se, 2)[1:]}",
            f"{_short(e.in_ulp(e.device), 2)}±{_short(e.in_ulp(e.device_se), 2)[1:]}",
            f"{_short(e.benchmark, 3)}±{_short(e.benchmark_se, 2)[1:]}",
            fmt(e.z, 3),
            fmt(e.device_z, 3),
        )
        for tensor in case.tensors
        if (e := tensor.bias) is not None
    ]
    return titled_table(console, f"{case.name}: bias (signed, relative to the golden)", columns, columns[1:], rows)


def _worst_table(case: CaseResult, tensor: TensorResult, console: Console) -> Table:
    columns = ("where", "device", "golden", "benchmark", "abs err", "ulp")
    return titled_table(console, f"{case.name} {tensor.name}: worst elements", columns, columns[1:], worst_rows(tensor))


def _hot_table(case: CaseResult, tensor: TensorResult, console: Console) -> Table:
    kind = "query block i" if formatting.query_axis(tensor) else "kv block j"
    columns = ("b", "n", "block", "rows", "score", "rmse", "bench rmse", "max abs err", "worst tile")
    return titled_table(console, f"{case.name} {tensor.name}: hot blocks ({kind})", columns, columns, hot_rows(tensor))


def _metrics_table(case: CaseResult, console: Console) -> Table:
    names = tuple(t.name for t in case.tensors)
    histograms = [
        " ".join(f"{label}:{count}" for label, count in zip(ULP_BUCKETS, t.device.ulp_histogram or (), strict=False))
        for t in case.tensors
    ]
    rows = [*formatting.metric_rows(case.tensors), ["ULP histogram", *histograms]]
    title = f"{case.name}: metrics (device / benchmark)"  # the histograms fold at their spaces, never in a number
    return titled_table(console, title, ("metric", *names), names, rows, overflow="fold")


def render_terminal(suite: SuiteResult, console: Console, verbose: bool = False, device_named: bool = False) -> None:
    """Print the case table (a line per result: its verdict, what decided it, its likely cause, the other
    standards' verdicts) and a summary; with `verbose`, between them the details of failing and unjudged cases,
    their figures, the other standards' checks and every metric. `device_named`: the
    command already said who produced the outputs (`bsa check`, `bsa run`), so the report does not again."""
    console.print(_case_table(suite, console, verbose))
    reference = sum(1 for c in suite.cases if formatting.is_reference(c) and c.verdict != SKIP)  # a SKIP has no outputs
    if reference and not device_named:
        faults = sorted({f for c in suite.cases if (f := formatting.planted_fault(c))})
        names = ", ".join(repr(f) for f in faults)
        planted = f"; planted fault{'s' if len(faults) > 1 else ''} {names}" if faults else ""
        noun = "result" if shows_ops(suite.cases) else "case"
        console.print(
            f"Note: the outputs of {formatting.plural(reference, noun)} come from the reference device "
            f"(bsa emulate), not from hardware{planted}.",
            style="yellow",
        )
    for case in grouped(suite.cases):
        if case.not_run or case.verdict == SKIP:  # the table's line says it (what to type, why not judged)
            continue
        if case.verdict == ERROR:  # whole, unfolded: its paths (a log, a record) are copied from here
            console.print(Text(f"{case.name}: could not be judged", style=VERDICT_STYLE[ERROR]))
            for error in case.errors:
                console.print(Text(f"  {error}"), soft_wrap=True)
            continue
        if not verbose:  # a failure's detail and figures: -v, and the HTML and JSON reports
            continue
        figures = "; ".join(formatting.tensor_figures(t) for t in case.tensors)
        lines = [line for line in (figures, formatting.side_line(case)) if line]
        console.print(_checks_table(case, console, only_failed=False))
        for line in lines:
            console.print(Text(f"  {line}"))
        if case.diagnosis:
            console.print(_diagnosis_table(case, console))
        if any(t.bias is not None for t in case.tensors):
            console.print(_bias_table(case, console))
        for tensor in case.tensors:
            if tensor.worst:
                console.print(_worst_table(case, tensor, console))
            if tensor.hot_blocks:
                console.print(_hot_table(case, tensor, console))
        if case.tensors:
            console.print(_metrics_table(case, console))
    if timed := timing.timed(suite):
        title = "Kernel time (bsa run --time: device events, median of the timed calls; TFLOP/s on bsa's FLOPs)"
        rows = [*timing.rows(suite), *timing.total_rows(timed)]
        console.print(titled_table(console, title, timing.COLUMNS, timing.COLUMNS[2:], rows))
    for note in timing.untimed_notes(suite):
        console.print(Text(f"Kernel time: {note}."), style="yellow", soft_wrap=True)
    if differ := formatting.differ_line(suite):
        console.print(Text(differ))
    if releases := formatting.releases_line(suite):
        console.print(Text(releases), soft_wrap=True)
    console.print(Text(formatting.summary_line(suite), style=VERDICT_STYLE[suite.verdict]))  # nothing judged: no green
