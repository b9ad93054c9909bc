"""Render comparison results for people and tools: terminal, JSON, JUnit, HTML (with SVG pictures), CSV.

Every report works from the result dataclasses of `compare/results.py`; JSON is their faithful image, so shards
judged in separate CI jobs merge into one `SuiteResult` that renders exactly like a local run.

Modules: `document` (JSON, merging), `terminal`, `junit`, `page` (HTML) with `svg` (its pictures),
`regressions` (the drift section against a baseline report), `trend` (the page of `bsa trend`),
`msprobe_csv` (msprobe's compare CSV), `header` (date, version, host, folders), `formatting` (shared words
and numbers), `files` (report paths checked up front, atomic writes).
"""

from __future__ import annotations

from .document import (
    SCHEMA_MINOR,
    case_document,
    from_document,
    merge,
    merged_header,
    night_from_document,
    read_report,
    suite_devices,
    to_document,
    write_json,
)
from .files import ReportPathError, prepare_report_paths
from .formatting import summary_line
from .header import ReportHeader, report_header
from .junit import case_report_text, junit_xml, write_junit
from .msprobe_csv import MSPROBE_COLUMNS, csv_rows, write_csv
from .page import html_report, write_html
from .regressions import render_drift
from .terminal import render_explanation, render_terminal

__all__ = [
    "MSPROBE_COLUMNS",
    "SCHEMA_MINOR",
    "ReportHeader",
    "ReportPathError",
    "case_document",
    "case_report_text",
    "csv_rows",
    "from_document",
    "html_report",
    "junit_xml",
    "merge",
    "merged_header",
    "night_from_document",
    "read_report",
    "prepare_report_paths",
    "render_drift",
    "render_explanation",
    "render_terminal",
    "report_header",
    "suite_devices",
    "summary_line",
    "to_document",
    "write_csv",
    "write_html",
    "write_json",
    "write_junit",
]
