"""Render comparison results: terminal (rich), JSON, JUnit XML, HTML; read JSON reports back and merge them.

Everything here works from the result dataclasses of `compare.py`; JSON is their faithful image
(`to_document` / `from_document`), so shards judged in separate CI jobs merge into one `SuiteResult`
that renders exactly like a local run.

JSON schema "bsa-compare/1" (docs/compare.md describes every key): a document is
`{schema, tool, exit_code, summary, cases: [case...]}`; each case carries its verdict, message, deciding
check, settings, checks and errors, and per tensor the device and benchmark metrics, checks, worst
elements, hot blocks and the per-block error map. Non-finite numbers are written as the strings
"inf", "-inf" and "nan" (JSON has no such numbers); NaN cells of block maps as null.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import re
import types
import typing
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import __version__
from .compare import (
    ERROR,
    FAIL,
    PASS,
    ULP_BUCKETS,
    CaseResult,
    SuiteResult,
    TensorResult,
)
from .manifest import json_number

SCHEMA = "bsa-compare/1"
"""The JSON report format; a reader refuses any other."""

VERDICT_STYLE = {PASS: "bold green", FAIL: "bold red", ERROR: "bold magenta"}


# ---- JSON ---------------------------------------------------------------------------------------


def _map_cells(array: np.ndarray) -> Any:
    """Return a block map as nested lists, 6 significant digits, NaN as null, Inf as "inf"."""
    if array.ndim == 0:
        value = float(array)
        return None if math.isnan(value) else json_number(float(f"{value:.6g}"))
    return [_map_cells(row) for row in array]


def _plain(value: Any) -> Any:
    """Return `value` (dataclasses, tuples, mappings, arrays, numbers) as JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, np.ndarray):
        return _map_cells(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return json_number(float(value))
    return value


def case_document(case: CaseResult) -> dict[str, Any]:
    """Return one case as a JSON-ready dict, with its derived `message` and `deciding` check."""
    document = _plain(case)
    document["message"] = case.message
    document["headline"] = case.headline
    deciding = case.deciding
    document["deciding"] = None if deciding is None else _plain(deciding)
    for tensor, data in zip(case.tensors, document["tensors"], strict=True):
        data["passed"] = tensor.passed
    return document


def to_document(suite: SuiteResult) -> dict[str, Any]:
    """Return the whole result as the "bsa-compare/1" JSON document."""
    return {
        "schema": SCHEMA,
        "tool": {"name": "bsa", "version": __version__},
        "exit_code": suite.return_code,
        "summary": {
            "cases": len(suite.cases),
            "passed": suite.count(PASS),
            "failed": suite.count(FAIL),
            "errors": suite.count(ERROR),
            "output_bytes": suite.output_bytes,
            "seconds": round(suite.seconds, 3),
        },
        "cases": [case_document(c) for c in suite.cases],
    }


def write_json(suite: SuiteResult, path: Path) -> None:
    """Write the JSON report to `path`."""
    Path(path).write_text(json.dumps(to_document(suite), indent=1, allow_nan=False) + "\n")


def _load(tp: Any, data: Any) -> Any:
    """Build a value of type `tp` from JSON data (the inverse of `_plain`)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if data is None:
            return None
        return _load(args[0], data)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, Mapping):
            raise ValueError(f"expected an object for {tp.__name__}, got {data!r}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in data:
                kwargs[f.name] = _load(hints[f.name], data[f.name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{tp.__name__}: missing key {f.name!r}")
        return tp(**kwargs)
    if origin is tuple:
        items = typing.get_args(tp)
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(_load(items[0], v) for v in data)
        return tuple(_load(a, v) for a, v in zip(items, data, strict=True))
    if origin in (Mapping, dict, typing.Mapping) or tp in (dict, Mapping):
        pair = typing.get_args(tp)
        value_type = pair[1] if len(pair) == 2 else Any
        return {k: _load(value_type, v) for k, v in data.items()}
    if tp is np.ndarray:
        return np.array(_cells_back(data), dtype=np.float64)
    if tp is float:
        return float(data)  # also "inf", "-inf", "nan"
    if tp is int:
        return int(data)
    return data


def _cells_back(data: Any) -> Any:
    if isinstance(data, list):
        return [_cells_back(v) for v in data]
    if data is None:
        return math.nan
    return float(data)


def from_document(document: Mapping[str, Any], origin: str = "report") -> SuiteResult:
    """Rebuild a `SuiteResult` from a JSON report.

    Raises:
        ValueError: not a "bsa-compare/1" document, or a malformed one.
    """
    if not isinstance(document, Mapping) or document.get("schema") != SCHEMA:
        found = document.get("schema") if isinstance(document, Mapping) else None
        raise ValueError(f"{origin}: schema {found!r} is not {SCHEMA!r} (write it with `bsa compare --json`)")
    try:
        cases = tuple(_load(CaseResult, c) for c in document["cases"])
        seconds = float(document.get("summary", {}).get("seconds", 0.0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{origin}: malformed report ({type(exc).__name__}: {exc})") from None
    return SuiteResult(cases, seconds)


def merge(documents: Sequence[tuple[str, Mapping[str, Any]]]) -> SuiteResult:
    """Merge the JSON reports of several shards into one result (cases in the order given).

    Raises:
        ValueError: a document is not a valid report, or a case appears in two of them.
    """
    cases: list[CaseResult] = []
    seen: dict[str, str] = {}
    seconds = 0.0
    for origin, document in documents:
        suite = from_document(document, origin)
        for case in suite.cases:
            if case.name in seen:
                raise ValueError(
                    f"case {case.name!r} is in both {seen[case.name]} and {origin}: shards must not overlap"
                )
            seen[case.name] = origin
            cases.append(case)
        seconds += suite.seconds
    return SuiteResult(tuple(cases), seconds)


# ---- terminal -----------------------------------------------------------------------------------


def _fmt(value: float | int | None, digits: int = 4) -> str:
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


def _box(console: Console) -> box.Box:
    return box.ROUNDED if console.is_terminal else box.ASCII


def _verdict_text(verdict: str) -> Text:
    return Text(verdict, style=VERDICT_STYLE.get(verdict, ""))


def _deciding_text(case: CaseResult) -> str:
    """The first error of an ERROR case, else the deciding check's text."""
    if case.verdict == ERROR:
        return case.errors[0] if case.errors else ""
    deciding = case.deciding
    return deciding.detail if deciding else ""


def _case_table(suite: SuiteResult, console: Console) -> Table:
    table = Table(box=_box(console), title="bsa compare", title_justify="left", expand=False)
    table.add_column("case", overflow="fold")
    table.add_column("verdict")
    table.add_column("standard", overflow="fold")
    table.add_column("deciding check", overflow="fold")
    for case in suite.cases:
        table.add_row(case.name, _verdict_text(case.verdict), case.standard, _deciding_text(case))
    return table


def _checks_table(case: CaseResult, console: Console, only_failed: bool) -> Table:
    table = Table(box=_box(console), title=f"{case.name}: checks", title_justify="left")
    for column in ("tensor", "check", "value", "limit", "result"):
        table.add_column(column, justify="right" if column in ("value", "limit") else "left")
    for check in case.all_checks:
        if only_failed and check.passed:
            continue
        result = Text("ok", style="green") if check.passed else Text("FAIL", style="bold red")
        table.add_row(check.tensor or "-", check.name, _fmt(check.value), _fmt(check.limit), result)
    return table


def _where(tensor: TensorResult, coords: Mapping[str, int], block: int) -> str:
    axis = "i" if tensor.name == "dq" else "j"
    index = ",".join(f"{axis_name}={coords[axis_name]}" for axis_name in tensor.axes)
    extra = f" (b={coords['b']} s={coords['s']})" if "t" in coords else ""
    return f"{index}{extra} {axis}={block}"


def _worst_table(case: CaseResult, tensor: TensorResult, console: Console) -> Table:
    table = Table(box=_box(console), title=f"{case.name} {tensor.name}: worst elements", title_justify="left")
    for column in ("where", "device", "golden", "benchmark", "abs err", "ulp"):
        table.add_column(column, justify="left" if column == "where" else "right")
    for element in tensor.worst:
        table.add_row(
            _where(tensor, element.coords, element.block),
            _fmt(element.device, 6),
            _fmt(element.golden, 6),
            _fmt(element.benchmark, 6),
            _fmt(element.abs_err),
            _fmt(element.ulp, 3),
        )
    return table


def _hot_table(case: CaseResult, tensor: TensorResult, console: Console) -> Table:
    kind = "query block i" if tensor.name == "dq" else "kv block j"
    table = Table(box=_box(console), title=f"{case.name} {tensor.name}: hot blocks ({kind})", title_justify="left")
    for column in ("b", "n", "block", "rows", "score", "rmse", "bench rmse", "max abs err", "worst tile"):
        table.add_column(column, justify="right")
    for hot in tensor.hot_blocks:
        tile = "-" if hot.tile is None else f"s={hot.tile[0]} d={hot.tile[1]} x{_fmt(hot.tile_ratio, 3)}"
        table.add_row(
            str(hot.batch),
            str(hot.head),
            str(hot.block),
            f"{hot.rows[0]}-{hot.rows[1]}",
            _fmt(hot.score, 3),
            _fmt(hot.rmse, 3),
            _fmt(hot.rmse_benchmark, 3),
            _fmt(hot.max_abs_err, 3),
            tile,
        )
    return table


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
)


def _metrics_table(case: CaseResult, console: Console) -> Table:
    table = Table(box=_box(console), title=f"{case.name}: metrics (device / benchmark)", title_justify="left")
    table.add_column("metric")
    for tensor in case.tensors:
        table.add_column(tensor.name, justify="right")
    for key, label in METRIC_ROWS:
        cells = []
        for tensor in case.tensors:
            device = getattr(tensor.device, key)
            bench = getattr(tensor.benchmark, key) if tensor.benchmark is not None else None
            digits = 7 if key == "cosine" else 4
            cells.append(_fmt(device, digits) if bench is None else f"{_fmt(device, digits)} / {_fmt(bench, digits)}")
        if all(c == "-" for c in cells):
            continue
        table.add_row(label, *cells)
    hist_cells = []
    for tensor in case.tensors:
        histogram = tensor.device.ulp_histogram or ()
        hist_cells.append(" ".join(f"{label}:{count}" for label, count in zip(ULP_BUCKETS, histogram, strict=False)))
    table.add_row("ULP histogram", *hist_cells)
    return table


def render_terminal(suite: SuiteResult, console: Console, verbose: bool = False) -> None:
    """Print the case table, details of failing and unjudged cases (every metric with `verbose`), a summary."""
    console.print(_case_table(suite, console))
    reference = sum(1 for c in suite.cases if c.device and c.device.startswith("reference"))
    if reference:
        console.print(
            f"Note: the outputs of {reference} case{'s' if reference != 1 else ''} come from the reference device "
            "(bsa emulate), not from hardware.",
            style="yellow",
        )
    for case in suite.cases:
        if case.verdict == ERROR:
            console.print(Text(f"{case.name}: could not be judged", style=VERDICT_STYLE[ERROR]))
            for error in case.errors:
                console.print(Text(f"  {error}"), soft_wrap=True)
            continue
        if case.verdict == PASS and not verbose:
            continue
        console.print(_checks_table(case, console, only_failed=not verbose))
        for tensor in case.tensors:
            if tensor.passed and not verbose:
                continue
            if tensor.worst:
                console.print(_worst_table(case, tensor, console))
            if tensor.hot_blocks:
                console.print(_hot_table(case, tensor, console))
        if verbose and case.tensors:
            console.print(_metrics_table(case, console))
    style = "bold red" if suite.count(FAIL) else VERDICT_STYLE[ERROR] if suite.count(ERROR) else "bold green"
    console.print(Text(summary_line(suite), style=style))


# ---- JUnit --------------------------------------------------------------------------------------

_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    return _XML_INVALID.sub("?", text)


def _case_report_text(case: CaseResult) -> str:
    """Return the plain-text details of one case: failed checks, worst elements, hot blocks."""
    lines: list[str] = []
    if case.verdict == ERROR:
        lines.extend(case.errors)
        return "\n".join(lines)
    for check in sorted(case.all_checks, key=lambda c: -c.severity):
        if not check.passed:
            lines.append(f"FAIL {check.detail}")
    for tensor in case.tensors:
        if tensor.passed:
            continue
        for element in tensor.worst[:3]:
            lines.append(
                f"{tensor.name} worst at {_where(tensor, element.coords, element.block)}: device "
                f"{_fmt(element.device, 6)}, golden {_fmt(element.golden, 6)}, abs err {_fmt(element.abs_err)}"
            )
        for hot in tensor.hot_blocks[:3]:
            kind = "q block" if tensor.name == "dq" else "kv block"
            lines.append(
                f"{tensor.name} hot {kind}: b={hot.batch} n={hot.head} {kind}={hot.block} "
                f"rows {hot.rows[0]}-{hot.rows[1]} score {_fmt(hot.score, 3)}"
            )
    return "\n".join(lines)


def _metrics_text(case: CaseResult) -> str:
    lines = [f"standard {case.standard}; status {case.status}"]
    for tensor in case.tensors:
        d, b = tensor.device, tensor.benchmark
        lines.append(
            f"{tensor.name}: max_abs_err {_fmt(d.max_abs_err)} rmse {_fmt(d.rmse)} "
            f"max_rel_err {_fmt(d.max_rel_err)} mean_rel_err {_fmt(d.mean_rel_err)} cosine {_fmt(d.cosine, 8)} "
            f"ulp_max {_fmt(d.ulp_max, 3)}"
            + (
                f"; benchmark rmse {_fmt(b.rmse)} max_rel_err {_fmt(b.max_rel_err)} mean_rel_err {_fmt(b.mean_rel_err)}"
                if b
                else ""
            )
        )
    return "\n".join(lines)


def junit_xml(suite: SuiteResult) -> str:
    """Return a JUnit XML report: one testcase per case, <failure> for FAIL, <error> for ERROR."""
    tests, failures, errors = len(suite.cases), suite.count(FAIL), suite.count(ERROR)
    seconds = f"{sum(c.seconds for c in suite.cases):.3f}"
    root = ET.Element("testsuites", name="bsa compare", tests=str(tests), failures=str(failures),
                      errors=str(errors), time=seconds)  # fmt: skip
    testsuite = ET.SubElement(root, "testsuite", name="bsa compare", tests=str(tests), failures=str(failures),
                              errors=str(errors), skipped="0", time=seconds)  # fmt: skip
    for case in suite.cases:
        spec = Path(case.spec).stem if case.spec else "cases"
        testcase = ET.SubElement(testsuite, "testcase", name=case.name, classname=f"bsa.{spec}",
                                 time=f"{case.seconds:.3f}")  # fmt: skip
        if case.verdict == FAIL:
            element = ET.SubElement(testcase, "failure", message=_xml_text(case.message[:1000]), type="FAIL")
            element.text = _xml_text(_case_report_text(case))
        elif case.verdict == ERROR:
            element = ET.SubElement(testcase, "error", message=_xml_text(case.message[:1000]), type="ERROR")
            element.text = _xml_text(_case_report_text(case))
        out = ET.SubElement(testcase, "system-out")
        out.text = _xml_text(_metrics_text(case) if case.tensors else case.message)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(suite: SuiteResult, path: Path) -> None:
    Path(path).write_text(junit_xml(suite))


# ---- HTML ---------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em}
td,th{border:1px solid #ccc;padding:.2em .5em;font-size:.9em;text-align:left}
th{background:#f3f3f3}
.PASS{color:#167516;font-weight:bold}.FAIL{color:#b00;font-weight:bold}.ERROR{color:#909;font-weight:bold}
.num{text-align:right;font-variant-numeric:tabular-nums}
.map td{width:1.1em;height:1.1em;padding:0;border:1px solid #fff}
details{margin:.3em 0 1em}summary{cursor:pointer;font-weight:bold}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _heat_color(score: float, limit: float) -> str:
    """White for a score of 1 or less (the benchmark's error), red at or above `limit`, grey for no block."""
    if math.isnan(score):
        return "#eee"
    if math.isinf(score) or limit <= 1:
        level = 1.0 if score > 1 else 0.0
    else:
        level = max(0.0, min((score - 1.0) / (limit - 1.0), 1.0))
    shade = int(255 * (1 - level))
    return f"rgb(255,{shade},{shade})"


def _heat_map(tensor: TensorResult, limit: float, max_cells: int = 4096) -> str:
    block_map = tensor.block_map
    if block_map is None or block_map.score.size == 0:
        return ""
    score = block_map.score
    if score.size > max_cells:
        shape = "x".join(str(n) for n in score.shape)
        return f"<p>{_esc(tensor.name)} block map: {shape} blocks, too many to draw (see --json)</p>"
    axis = "query block i" if block_map.axis == "q" else "kv block j"
    rows = []
    for b in range(score.shape[0]):
        for n in range(score.shape[1]):
            cells = "".join(
                f'<td style="background:{_heat_color(float(v), limit)}" title="b={b} n={n} {axis}={j}: '
                f'{_esc(_fmt(float(v), 3))}"></td>'
                for j, v in enumerate(score[b, n])
            )
            rows.append(f"<tr><th>b{b} n{n}</th>{cells}</tr>")
    title = f"<p>{_esc(tensor.name)} block map (score per {axis}; white = the benchmark's error, red = the limit)</p>"
    return f"{title}<table class=map>{''.join(rows)}</table>"


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def html_report(suite: SuiteResult) -> str:
    """Return a self-contained HTML report (no external files, scripts or fonts)."""
    parts = [
        "<!DOCTYPE html><html><head><meta charset=utf-8><title>bsa compare</title>",
        f"<style>{_CSS}</style></head><body><h1>bsa compare</h1>",
        f"<p>{_esc(summary_line(suite))}; exit code {suite.return_code}</p>",
    ]
    rows = []
    for case in suite.cases:
        rows.append([
            f'<a href="#{_esc(case.name)}">{_esc(case.name)}</a>',
            f'<span class="{case.verdict}">{case.verdict}</span>',
            _esc(case.standard),
            _esc(_deciding_text(case)),
        ])  # fmt: skip
    parts.append(_html_table(("case", "verdict", "standard", "deciding check"), rows))
    for case in suite.cases:
        parts.append(f'<details id="{_esc(case.name)}"{" open" if case.verdict != PASS else ""}>')
        parts.append(f'<summary><span class="{case.verdict}">{case.verdict}</span> {_esc(case.name)}</summary>')
        if case.verdict == ERROR:
            parts.append("<ul>" + "".join(f"<li>{_esc(e)}</li>" for e in case.errors) + "</ul></details>")
            continue
        check_rows = [
            [_esc(c.tensor or "-"), _esc(c.name), f"<span class=num>{_esc(_fmt(c.value))}</span>",
             f"<span class=num>{_esc(_fmt(c.limit))}</span>",
             '<span class="PASS">ok</span>' if c.passed else '<span class="FAIL">FAIL</span>', _esc(c.detail)]
            for c in case.all_checks
        ]  # fmt: skip
        parts.append(_html_table(("tensor", "check", "value", "limit", "result", "detail"), check_rows))
        limit = (case.settings.thresholds.get("tile_ratio", 3.0) if case.settings else 3.0) or 3.0
        if math.isinf(limit):
            limit = 3.0
        for tensor in case.tensors:
            metric_rows = []
            for key, label in METRIC_ROWS:
                device = getattr(tensor.device, key)
                bench = getattr(tensor.benchmark, key) if tensor.benchmark else None
                if device is None and bench is None:
                    continue
                metric_rows.append([_esc(label), _esc(_fmt(device)), _esc(_fmt(bench))])
            parts.append(f"<h3>{_esc(tensor.name)}</h3>")
            parts.append(_html_table(("metric", "device", "benchmark"), metric_rows))
            if tensor.worst:
                worst_rows = [
                    [_esc(_where(tensor, e.coords, e.block)), _esc(_fmt(e.device, 6)), _esc(_fmt(e.golden, 6)),
                     _esc(_fmt(e.benchmark, 6)), _esc(_fmt(e.abs_err)), _esc(_fmt(e.ulp, 3))]
                    for e in tensor.worst
                ]  # fmt: skip
                parts.append(
                    _html_table(("worst element", "device", "golden", "benchmark", "abs err", "ulp"), worst_rows)
                )
            if tensor.hot_blocks:
                hot_rows = [
                    [str(h.batch), str(h.head), str(h.block), f"{h.rows[0]}-{h.rows[1]}", _esc(_fmt(h.score, 3)),
                     _esc(_fmt(h.rmse, 3)), _esc(_fmt(h.rmse_benchmark, 3))]
                    for h in tensor.hot_blocks
                ]  # fmt: skip
                parts.append(_html_table(("b", "n", "block", "rows", "score", "rmse", "bench rmse"), hot_rows))
            parts.append(_heat_map(tensor, limit))
        parts.append("</details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_html(suite: SuiteResult, path: Path) -> None:
    Path(path).write_text(html_report(suite))


__all__ = [
    "SCHEMA",
    "case_document",
    "from_document",
    "html_report",
    "junit_xml",
    "merge",
    "render_terminal",
    "summary_line",
    "to_document",
    "write_html",
    "write_json",
    "write_junit",
]
