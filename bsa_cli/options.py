"""Click options shared by several commands (gen, list, check), defined once."""

from __future__ import annotations

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
jobs_option = click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
                           help="Processes: across cases, or across kv-head groups of one large case.")  # fmt: skip
