"""Render comparison results for people and tools: terminal, JSON, JUnit, HTML (with SVG pictures), CSV.

Every report works from the result dataclasses of `compare/results.py`; JSON is their faithful image, so shards
judged in separate CI jobs merge into one `SuiteResult` that renders exactly like a local run.

Modules: `document` (JSON, merging), `terminal`, `junit`, `page` (HTML) with `svg` (its pictures),
`regressions` (the drift section against a baseline report), `trend` (the page of `bsa trend`),
`msprobe_csv` (msprobe's compare CSV), `header` (date, version, host, folders), `formatting` (shared words
and numbers), `files` (report paths checked up front, atomic writes).
"""

from __future__ import annotations

# The package's names, re-exported for its callers.
from .document import (  # noqa: F401
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
from .files import ReportPathError, prepare_report_paths  # noqa: F401
from .formatting import summary_line  # noqa: F401
from .header import ReportHeader, report_header  # noqa: F401
from .junit import case_report_text, junit_xml, write_junit  # noqa: F401
from .msprobe_csv import MSPROBE_COLUMNS, csv_rows, write_csv  # noqa: F401
from .page import html_report, write_html  # noqa: F401
from .regressions import render_drift  # noqa: F401
from .terminal import render_explanation, render_terminal  # noqa: F401
