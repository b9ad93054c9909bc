"""`bsa trend`: follow each case's deciding ratio across JSON reports (nights), on the terminal and as HTML."""

from __future__ import annotations

from pathlib import Path

import click

from ..compare import drift
from ..report import night_from_document, prepare_report_paths, read_report
from ..report.trend import render_trend, write_trend_html
from . import output
from .common import refuse_writing_inputs, user_errors, write_report


@click.command("trend")
@click.argument("reports", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--html",
    "html_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write a self-contained HTML page with one SVG line chart per case.",
)
@click.option(
    "--regression-margin",
    metavar="REL,ABS",
    help=f"A case rises when its last value exceeds its first by more than REL of it and ABS of the "
    f"limit (default {drift.RELATIVE_MARGIN},{drift.ABSOLUTE_MARGIN}, as bsa compare --baseline).",
)
def trend_command(reports: tuple[Path, ...], html_path: Path | None, regression_margin: str | None) -> None:
    """Draw each case's deciding ratio across the JSON reports REPORTS (written by `bsa compare --json`).

    The reports are ordered by their date and labelled with date and device; each case follows the check
    that decides it in the latest report. The terminal gets the nights and the cases that rise.

    Exit code: 0 (also when cases rise: use `bsa compare --baseline --fail-on-regression` to gate), 2 a
    report cannot be read.
    """
    refuse_writing_inputs({"--html": html_path}, reports)
    with user_errors(ValueError):  # and report.ReportPathError, a BsaError
        margin = drift.parse_margin(regression_margin) if regression_margin is not None else drift.Margin()
        prepare_report_paths({"--html": html_path})
        nights = [night_from_document(read_report(path), str(path)) for path in reports]
        found = drift.trend(nights, margin)
    render_trend(found, output.stdout)
    if html_path is not None:
        write_report("--html", html_path, write_trend_html, found)
