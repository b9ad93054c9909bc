"""Click options shared by several commands (gen, list, check, compare), defined once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .generate import PRECISIONS

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
