"""Click options shared by several commands (gen, list, check, compare), defined once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..generate import PRECISIONS
from ..interface import DEFAULT_RELEASE, RELEASES

filter_option = click.option(
    "--filter", "name_filters", multiple=True, help="Only cases whose name matches this glob (repeatable)."
)
shard_option = click.option(
    "--shard", "shard_text", metavar="I/N", help="Only shard I of N, balanced by FLOPs (CI matrices)."
)
precision_option = click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default="float32",
    show_default=True,
    help="Precision of the golden dq/dk/dv.",
)
max_cases_option = click.option(
    "--max-cases",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    metavar="N",
    help="Refuse specs that expand to more than N cases (a matrix of many keys grows fast).",
)
release_option = click.option(
    "--release",
    type=click.Choice(RELEASES),
    default=None,
    help=f"Judge every case by this operator release's rules (statuses and their order), overriding the specs' "
    f"`release:`; default: each case's own, else {DEFAULT_RELEASE}.",
)
force_option = click.option(
    "--force", is_flag=True, help="Generate cases even when their estimated memory exceeds the machine's."
)


class Jobs(click.ParamType):
    """A process count: a positive integer, or `auto` (kept as None; `schedule.auto_jobs` decides)."""

    name = "N|auto"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or value == "auto":
            return None
        try:
            jobs = int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            jobs = 0
        if jobs < 1:
            self.fail(f"{value!r} is not a positive whole number or 'auto'", param, ctx)
        return jobs


def jobs_option_for(help_text: str) -> Callable[[Any], Any]:
    """Return the `-j/--jobs N|auto` option (default auto) with a command's own help text."""
    return click.option(
        "-j", "--jobs", type=Jobs(), metavar="N|auto", default="auto", show_default=True, help=help_text
    )


jobs_option = jobs_option_for(
    "Processes across cases, or threads within a single case; auto: one per CPU when the estimated work "
    "is a few seconds or more (a single case: a fraction of a second), else one."
)


def report_options(func: Any) -> Any:
    """Add --json, --junit, --html and --csv (report files; their folders are created) to a command."""
    options = [
        click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False),
                     help="Write everything measured as JSON (schema bsa-compare/1)."),
        click.option("--junit", "junit_path", type=click.Path(path_type=Path, dir_okay=False),
                     help="Write a JUnit XML report (one testcase per case; says when results are reference ones)."),
        click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False),
                     help="Write a self-contained HTML report with pictures of every failing tensor."),
        click.option("--csv", "csv_path", type=click.Path(path_type=Path, dir_okay=False),
                     help="Write msprobe's compare CSV (one row per tensor) with bsa's verdict columns."),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func
