"""`bsa export`: write generated cases as msOpST or ATK test cases that point at their .bin files."""

from __future__ import annotations

from pathlib import Path

import click

from ..core.errors import plural
from ..report.export import EXPECT_MODULE, FORMATS, export_cases
from . import output
from .common import UserError, refuse_writing_inputs, select_cases_or_suites, user_errors
from .options import filter_option


@click.command("export")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    required=True,
    help="msopst: MindStudio msOpST test-case JSON; atk: ops-transformer ATK-style case JSON.",
)
@click.option(
    "-o",
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the case files (created).",
)
@filter_option("Only cases whose name matches (repeatable).")
def export_command(paths: tuple[Path, ...], fmt: str, out_dir: Path, filters: tuple[str, ...]) -> None:
    """Write each case under PATHS (folders written by `bsa gen`) as an msOpST or ATK test case.

    The cases point at the .bin files `bsa gen` wrote (absolute paths): move or delete those and the
    exported cases break. msOpST cases get their expected outputs from bsa's golden through
    bsa_msopst_expect.py, written beside them. docs/export.md lists every field and how it is filled.
    """
    refuse_writing_inputs({"-o": out_dir}, paths)
    case_dirs = select_cases_or_suites(paths, filters)

    def earlier(kept: list[str], lost: list[str]) -> None:
        if kept:
            output.info(
                f"kept {plural(len(kept), 'case')} of an earlier export in {out_dir} working "
                f"({', '.join(kept[:3])}{f' and {len(kept) - 3} more' if len(kept) > 3 else ''}): "
                f"{EXPECT_MODULE} holds their expected outputs too"
            )
        for problem in lost:
            output.warn(problem)

    try:
        with user_errors():
            written = export_cases(case_dirs, fmt, out_dir, on_earlier=earlier)
    except OSError as exc:
        raise UserError(f"cannot write in {out_dir}: {exc.strerror or exc}") from None
    output.stdout.print(
        f"exported {plural(len(case_dirs), 'case')} as {fmt} into {out_dir} ({len(written)} files)",
        markup=False,
        soft_wrap=True,
    )
