"""The HTML report: a header, one summary table with filters by verdict, then each case; pictures first.

The page is one self-contained file: inline CSS and SVG, no script, font, image or link to anything else,
so it opens from a CI artifact or a mail attachment as it is. The verdict filters are radio buttons
styled by CSS alone. Passing cases fold away; failing ones open with their pictures (`svg.py`): the heat
map of each failing tensor, its hottest block's 16x16 tiles, and its ULP chart against the benchmark's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..compare import ERROR, FAIL, PASS, SKIP, CaseResult, SuiteResult, TensorResult, Verdict
from . import formatting, svg, timing
from .files import write_text_atomic
from .formatting import fmt, grouped, shows_ops, summary_line, worst_rows
from .header import ReportHeader, report_header
from .regressions import CSS as _DRIFT_CSS
from .regressions import drift_html
from .style import BASE_CSS, esc, html_table

if TYPE_CHECKING:
    from ..compare.drift import Drift

VERDICTS: tuple[Verdict, ...] = (FAIL, ERROR, PASS)

_CSS = (
    BASE_CSS
    + """
h3{font-size:1.02em;margin:1.2em 0 .4em}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:.15em 1em;margin:0;font-size:.92em}
dl.meta dt{color:#555}dl.meta dd{margin:0}
.warn{color:var(--fail);font-weight:600}
.PASS{color:var(--pass);font-weight:700}.FAIL{color:var(--fail);font-weight:700}.ERROR{color:var(--error);font-weight:700}
.badge{display:inline-block;min-width:3.6em;text-align:center;border-radius:3px;color:#fff;font-size:.8em;
 font-weight:700;padding:.05em .3em}
.badge.PASS{background:var(--pass)}.badge.FAIL{background:var(--fail)}.badge.ERROR{background:var(--error)}
input.filter{position:absolute;opacity:0;pointer-events:none}
nav.filters{margin:1em 0 .3em;font-size:.9em}
nav.filters label{display:inline-block;border:1px solid #aaa;border-radius:3px;padding:.1em .6em;margin-right:.3em;
 cursor:pointer;background:#fff}
#show-all:checked~nav label[for=show-all],#show-problems:checked~nav label[for=show-problems],
#show-FAIL:checked~nav label[for=show-FAIL],#show-ERROR:checked~nav label[for=show-ERROR],
#show-PASS:checked~nav label[for=show-PASS]{background:#333;color:#fff;border-color:#333}
#show-problems:checked~table.cases tr.v-PASS,#show-problems:checked~section.v-PASS,
#show-FAIL:checked~table.cases tr.v-PASS,#show-FAIL:checked~table.cases tr.v-ERROR,
#show-FAIL:checked~section.v-PASS,#show-FAIL:checked~section.v-ERROR,
#show-ERROR:checked~table.cases tr.v-PASS,#show-ERROR:checked~table.cases tr.v-FAIL,
#show-ERROR:checked~section.v-PASS,#show-ERROR:checked~section.v-FAIL,
#show-PASS:checked~table.cases tr.v-FAIL,#show-PASS:checked~table.cases tr.v-ERROR,
#show-PASS:checked~section.v-FAIL,#show-PASS:checked~section.v-ERROR{display:none}
table.cases td.headline{max-width:60em}
section.case{border-top:1px solid var(--line);padding:.2em 0}
section.case>details>summary{cursor:pointer;padding:.35em 0;font-size:.95em}
section.case>details>summary b{font-size:1.05em}
.sub{color:#555}.note{color:#9a4a00;font-weight:600}
.figs{display:flex;flex-wrap:wrap;gap:1.2em;align-items:flex-start;margin:.3em 0}
.figs svg{background:#fff;border:1px solid #eee;display:block;margin-bottom:.6em}
details.more>summary{cursor:pointer;color:#333;font-size:.9em}
ul.errors li{color:var(--error)}
"""
)

#: The rules a page needs only when it shows ops other than the backward or a SKIP (a backward-only suite's page
#: is as it always was).
_OPS_CSS = """
:root{--skip:#6a6f78}
.SKIP{color:var(--skip);font-weight:700}.badge.SKIP{background:var(--skip);color:#fff}
#show-SKIP:checked~nav label[for=show-SKIP]{background:#333;color:#fff;border-color:#333}
#show-problems:checked~section.v-SKIP,#show-FAIL:checked~section.v-SKIP,#show-ERROR:checked~section.v-SKIP,
#show-PASS:checked~section.v-SKIP,#show-SKIP:checked~section.v-PASS,#show-SKIP:checked~section.v-FAIL,
#show-SKIP:checked~section.v-ERROR,#show-SKIP:checked~table.cases tr.v-PASS,#show-SKIP:checked~table.cases tr.v-FAIL,
#show-SKIP:checked~table.cases tr.v-ERROR,#show-problems:checked~table.cases tr.v-SKIP,
#show-FAIL:checked~table.cases tr.v-SKIP,#show-ERROR:checked~table.cases tr.v-SKIP,
#show-PASS:checked~table.cases tr.v-SKIP,
#show-problems:checked~table.ops tr.case:not(.has-FAIL):not(.has-ERROR),
#show-FAIL:checked~table.ops tr.case:not(.has-FAIL),#show-ERROR:checked~table.ops tr.case:not(.has-ERROR),
#show-PASS:checked~table.ops tr.case:not(.has-PASS),#show-SKIP:checked~table.ops tr.case:not(.has-SKIP){display:none}
table.ops td.op{min-width:11em;max-width:22em}table.ops td:first-child{white-space:nowrap}
table.ops td.op a{text-decoration:none}
table.ops td.op .what{display:block;font-size:.86em;color:#333;margin-top:.15em}
table.ops td.op .cellnote{display:block;font-size:.78em;color:#9a4a00;margin-top:.1em}
table.ops td.none{color:#999;text-align:center}
.opname{display:inline-block;border:1px solid #999;border-radius:3px;padding:0 .35em;font-size:.85em;color:#333;
 background:#f4f4f4;margin-left:.3em}
p.siblings{font-size:.88em;margin:.2em 0 .5em}p.siblings a,p.siblings b{margin-right:.9em;text-decoration:none}
ul.skips li{color:var(--skip)}
"""


def _header(suite: SuiteResult, head: ReportHeader) -> str:
    verdict = suite.verdict  # nothing judged: SKIP, not a PASS
    rows = [("date", esc(head.date)), ("bsa", esc(head.version)), ("host", esc(head.host))]
    rows.append(("output folder", "<br>".join(esc(p) for p in head.out) or "-"))
    devices = []
    noun = ("judged " if suite.count(SKIP) else "") + ("results" if shows_ops(suite.cases) else "cases")
    judged = len(suite.cases) - suite.count(SKIP)  # a SKIP has no outputs
    for text, count, warned in formatting.device_lines(suite):
        share = f" ({count} of {judged} {noun})" if judged > 1 else ""
        devices.append(f'<span class="warn">{esc(text)}</span>{share}' if warned else f"{esc(text)}{share}")
    rows.append(("device", "<br>".join(devices) or "-"))
    rows.append(("standard", esc(formatting.standards_line(suite))))
    if releases := formatting.releases_line(suite):
        rows.append(("release", esc(releases)))
    rows.append(("cases", f"{esc(summary_line(suite))}; exit code {suite.return_code}"))
    meta = "".join(f"<dt>{label}</dt><dd>{value}</dd>" for label, value in rows)
    return (
        f'<header class="top"><h1>bsa compare: <span class="{verdict}">{verdict}</span></h1>'
        f'<dl class="meta">{meta}</dl></header>'
    )


def _filters(suite: SuiteResult) -> str:
    problems = suite.count(FAIL) + suite.count(ERROR)
    problem_label = "FAIL or ERROR" if suite.count(SKIP) else "failed or not judged"  # a SKIP is not judged either
    choices = [("all", f"all ({len(suite.cases)})"), ("problems", f"{problem_label} ({problems})")]
    choices += [(v, f"{v} ({suite.count(v)})") for v in (*VERDICTS, *((SKIP,) if suite.count(SKIP) else ()))]
    inputs = "".join(
        f'<input type="radio" name="show" id="show-{key}" class="filter"{" checked" if key == "all" else ""}>'
        for key, _ in choices
    )
    labels = "".join(f'<label for="show-{key}">{esc(text)}</label>' for key, text in choices)
    return f'{inputs}<nav class="filters">show: {labels}</nav>'


def _summary_table(suite: SuiteResult) -> str:
    if shows_ops(suite.cases):
        return _ops_table(suite)
    rows = [
        f'<tr class="v-{case.verdict}"><td><a href="#case-{esc(case.name)}">{esc(case.name)}</a></td>'
        f'<td><span class="badge {case.verdict}">{case.verdict}</span></td><td>{esc(case.dtype or "-")}</td>'
        f"<td>{esc(case.layout or '-')}</td><td>{esc(case.standard)}</td>"
        f'<td class="headline">{esc(case.headline)}</td></tr>'
        for case in suite.cases
    ]
    head = "".join(f"<th>{h}</th>" for h in ("case", "verdict", "dtype", "layout", "standard", "what happened"))
    return f'<table class="cases"><tr class="head">{head}</tr>{"".join(rows)}</table>'


def _ops_table(suite: SuiteResult) -> str:
    """The summary of a suite with ops: one row per case, one cell per op (the verdict linking to the op's
    section, and what happened), the ops in `OPS` order; a case without an op shows a dash there."""
    ops = formatting.ops_of(suite.cases)
    by_case: dict[str, dict[str, CaseResult]] = {}
    for case in grouped(suite.cases):
        by_case.setdefault(case.case_name, {})[case.op] = case
    rows = []
    above: dict[str, str | None] = {}  # per op: the SKIP reason of the row above, said once down a column
    for name, results in by_case.items():
        first = next(iter(results.values()))
        verdicts = " ".join(f"has-{v}" for v in dict.fromkeys(r.verdict for r in results.values()))
        cells = []
        for op in ops:
            if (result := results.get(op)) is None:
                above[op] = None
                cells.append('<td class="none" title="the case does not test this op">-</td>')
                continue
            what = formatting.short_headline(dataclasses.replace(result, notes=()))  # the notes follow in smaller print
            what = what if len(what) <= 160 else what[:157] + "..."
            reason = result.headline if result.verdict == SKIP else None
            if reason is not None and above.get(op) == reason:
                what = "same reason as above"
            above[op] = reason
            notes = "".join(f'<span class="cellnote">{esc(formatting.without_asides(n))}</span>' for n in result.notes)
            cells.append(
                f'<td class="op v-{result.verdict}"><a href="#case-{esc(result.name)}" title="{esc(result.headline)}">'
                f'<span class="badge {result.verdict}">{result.verdict}</span></a>'
                f'<span class="what">{esc(what)}</span>{notes}</td>'
            )
        rows.append(
            f'<tr class="case {verdicts}"><td><a href="#case-{esc(first.name)}">{esc(name)}</a></td>'
            f"<td>{esc(first.dtype or '-')}</td><td>{esc(first.layout or '-')}</td>{''.join(cells)}</tr>"
        )
    head = "".join(f"<th>{esc(h)}</th>" for h in ("case", "dtype", "layout", *ops))
    return f'<table class="cases ops"><tr class="head">{head}</tr>{"".join(rows)}</table>'


def _siblings(case: CaseResult, suite: SuiteResult) -> str:
    """Links to the other ops of a result's case, each with its verdict (empty for a case of one op)."""
    others = [c for c in grouped(suite.cases) if c.case_name == case.case_name]
    if len(others) < 2:
        return ""
    links = [
        f'<a href="#case-{esc(c.name)}"><span class="badge {c.verdict}">{c.verdict}</span> {esc(c.op)}</a>'
        if c is not case
        else f'<b><span class="badge {c.verdict}">{c.verdict}</span> {esc(c.op)}</b>'
        for c in others
    ]
    return f'<p class="siblings">ops of {esc(case.case_name)}: {" ".join(links)}</p>'


_RESULT = {True: '<span class="PASS">ok</span>', False: '<span class="FAIL">FAIL</span>'}


def _checks_table(case: CaseResult, only_failed: bool) -> str:
    checks = sorted(case.all_checks, key=lambda c: (c.passed, -c.severity)) if only_failed else case.all_checks
    rows = [
        [*(esc(x) for x in (c.tensor or "-", c.name, fmt(c.value), fmt(c.limit))), _RESULT[c.passed], esc(c.detail)]
        for c in checks
        if not (only_failed and c.passed)
    ]
    return html_table(("tensor", "check", "value", "limit", "result", "detail"), rows, numeric=(2, 3))


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int]) -> str:
    """An HTML table of plain-text cells (`formatting`'s rows)."""
    return html_table(headers, [[esc(cell) for cell in row] for row in rows], numeric=numeric)


def _failing_tensor(case: CaseResult, tensor: TensorResult) -> str:
    failed = sorted((c for c in tensor.checks if not c.passed), key=lambda c: -c.severity)
    first = failed[0].detail if failed else ""
    parts = [f'<h3>{esc(tensor.name)} <span class="badge FAIL">FAIL</span> <span class="sub">{esc(first)}</span></h3>']
    bias_figure = ""
    if tensor.bias is not None and any(c.name == "bias" for c in failed):
        floor = case.settings.thresholds.get("bias_floor", 2.0**-16) if case.settings else 2.0**-16
        bias_figure = f'<div class="figs">{svg.bias_chart(tensor, tensor.bias, floor)}</div>'
    if failed and failed[0].name == "bias":  # the picture of what decided first
        parts.append(bias_figure)
        bias_figure = ""
    if cause := next((c for c in case.diagnosis if tensor.name in c.tensors), None):  # next to its heat map
        parts.append(f'<p class="note">likely: {esc(cause.kind)} ({cause.score:.2f}): {esc(cause.evidence)}</p>')
    block_map = tensor.block_map
    if block_map is not None and block_map.score.size:
        limit = case.settings.thresholds.get("tile_ratio", 3.0) if case.settings else 3.0
        scale = svg.Scale.for_scores(block_map.score.reshape(-1), limit)
        what = "worst 16x16 tile RMSE ratio" if block_map.rmse_benchmark is not None else "block RMSE / tensor RMSE"
        left = svg.heat_map(tensor, case.selection, limit) + svg.legend(scale, what)
        right = svg.tile_map(tensor, scale)
        if tensor.ulp_chart is not None:
            right += svg.ulp_chart(tensor, tensor.ulp_chart)
        parts.append(f'<div class="figs"><div class="col">{left}</div><div class="col">{right}</div></div>')
    elif tensor.ulp_chart is not None:
        parts.append(f'<div class="figs">{svg.ulp_chart(tensor, tensor.ulp_chart)}</div>')
    parts.append(bias_figure)
    if tensor.hot_blocks:
        kind = "query block i" if formatting.query_axis(tensor) else "kv block j"
        columns = ("b", "n", kind, "rows", "score", "rmse", "bench rmse", "max abs err", "worst 16x16 tile")
        parts.append(f"<p class=sub>hot blocks</p>{_text_table(columns, formatting.hot_rows(tensor), range(8))}")
    if tensor.worst:
        headers = ("worst element", "device", "golden", "benchmark", "abs err", "ULP")
        parts.append(f"<p class=sub>worst elements</p>{_text_table(headers, worst_rows(tensor), range(1, 6))}")
    return "".join(parts)


def _case_section(case: CaseResult, suite: SuiteResult | None = None, with_ops: bool = False) -> str:
    """One result: open with pictures when it failed, folded when it passed or was skipped; with ops, its op
    after the case's name and links to the case's other ops."""
    is_open = " open" if case.verdict not in (PASS, SKIP) else ""
    standard = case.standard if case.verdict != SKIP else None  # no standard judged a SKIP
    facts = " · ".join(esc(x) for x in (case.dtype, case.layout, standard) if x and x != "-")
    opname = f'<span class="opname">{esc(case.op)}</span>' if with_ops else ""
    title = f"<b>{esc(case.case_name if with_ops else case.name)}</b>{opname}"
    summary = (
        f'<summary><span class="badge {case.verdict}">{case.verdict}</span> {title} '
        f'<span class="sub">{facts}</span> — {esc(case.headline)}</summary>'
    )
    parts = [f'<section class="case v-{case.verdict}" id="case-{esc(case.name)}"><details{is_open}>{summary}']
    folders = f"case {esc(case.case_dir)}, outputs {esc(case.output_dir)}"
    if with_ops and suite is not None:
        parts.append(_siblings(case, suite))
    parts.extend(f'<p class="note">{esc(note)}</p>' for note in case.notes)
    parts.extend(f'<p class="sub">precision path: {esc(note)}</p>' for note in case.kernel_notes)
    if case.verdict in (SKIP, ERROR):  # why it is not judged, or could not be
        items = "".join(f"<li>{esc(e)}</li>" for e in case.errors)
        listed = '<p class="sub">not judged:</p><ul class="skips">' if case.verdict == SKIP else '<ul class="errors">'
        parts.append(f'{listed}{items}</ul><p class="sub">{folders}</p>')
        return "".join(parts) + "</details></section>"
    figures = "; ".join(formatting.tensor_figures(t) for t in case.tensors)
    parts.extend(f'<p class="sub">{esc(line)}</p>' for line in (figures, formatting.side_line(case)) if line)
    if case.verdict == FAIL:
        parts.append(_checks_table(case, only_failed=True))
        if case.diagnosis:
            rows = [
                (str(n), c.kind, f"{c.score:.2f}", ", ".join(c.tensors), c.evidence)
                for n, c in enumerate(case.diagnosis, 1)
            ]
            table = _text_table(("#", "kind", "score", "tensors", "evidence"), rows, (0, 2))
            parts.append(f"<h3>diagnosis: likely causes, best first</h3>{table}")
        parts.extend(_failing_tensor(case, tensor) for tensor in case.tensors if not tensor.passed)
        if passing := ", ".join(t.name for t in case.tensors if t.passed):
            parts.append(f'<p class="sub">{esc(passing)} pass.</p>')
    more = [_checks_table(case, only_failed=False)]
    if case.tensors:  # device / benchmark metrics, a column per tensor
        headers = ["metric (device / benchmark)", *(t.name for t in case.tensors)]
        more.append(_text_table(headers, formatting.metric_rows(case.tensors), range(1, len(case.tensors) + 1)))
    more.append(f'<p class="sub">{folders}; judged in {case.seconds:.2f} s</p>')
    if case.verdict == PASS:
        parts.extend(more)
    else:
        parts.append('<details class="more"><summary>every check and metric</summary>' + "".join(more) + "</details>")
    parts.append("</details></section>")
    return "".join(parts)


def html_report(suite: SuiteResult, header: ReportHeader | None = None, drift: Drift | None = None) -> str:
    """Return a self-contained HTML report (no script, no external file, font or link); with `drift`, a
    section comparing the run with a baseline report comes first."""
    with_ops = shows_ops(suite.cases)
    skip_in_drift = drift is not None and any(SKIP in (v.old, v.new) for v in drift.verdicts)
    extra = _OPS_CSS if with_ops or suite.count(SKIP) or skip_in_drift else ""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">',
        f"<title>bsa compare: {esc(summary_line(suite))}</title>",
        f"<style>{_CSS}{extra}{_DRIFT_CSS if drift else ''}</style></head><body>",
        _header(suite, header or report_header(suite)),
        "<main>",
        drift_html(drift) if drift is not None else "",
        _filters(suite),
        _summary_table(suite),
        timing.timing_html(suite),
    ]
    if differ := formatting.differ_line(suite):
        parts.append(f'<p class="note">{esc(differ)}</p>')
    parts.extend(_case_section(case, suite, with_ops) for case in grouped(suite.cases))
    parts.append("</main></body></html>\n")
    return "\n".join(parts)


def write_html(suite: SuiteResult, path: Path, header: ReportHeader | None = None, drift: Drift | None = None) -> None:
    """Write the HTML report to `path` (atomically)."""
    write_text_atomic(Path(path), html_report(suite, header, drift))
