"""`bsa export`: write generated cases as msOpST, ATK or TTK test cases that point at their .bin files."""

from __future__ import annotations

from pathlib import Path

import click

from ..core.errors import plural
from ..ops import Op
from ..report.export import EXPECT_MODULE, EXPORT_FORMATS, export_cases
from . import output
from .common import UserError, ops_selected, refuse_writing_inputs, select_cases_or_suites, user_errors
from .options import SELECT_OPS_HELP, filter_option, ops_option_for


@click.command("export")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(EXPORT_FORMATS)),
    required=True,
    help="; ".join(f"{f.name}: {f.help}" for f in EXPORT_FORMATS.values()) + ".",
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
@ops_option_for(SELECT_OPS_HELP)
def export_command(
    paths: tuple[Path, ...], fmt: str, out_dir: Path, filters: tuple[str, ...], ops: tuple[Op, ...] | None
) -> None:
    """Write each case under PATHS (folders written by `bsa gen`) as an msOpST, ATK or TTK test case.

    Backward and forward folders export as one aclnn call each; a chain or autograd folder is refused
    before anything is written (--ops forward,backward leaves them out). The cases point at the .bin files
    `bsa gen` wrote (absolute paths; TTK's replay folder hard-links them): move or delete those and the
    exported cases break. msOpST cases get their expected outputs from bsa's golden through
    bsa_msopst_expect.py, written beside them. The export is written whole or not at all, and replaces
    links named like its files. docs/export.md lists every field and how it is filled.
    """
    refuse_writing_inputs({"-o": out_dir}, paths)
    case_dirs = ops_selected(select_cases_or_suites(paths, filters), ops)

    def earlier(kept: list[str], lost: list[str]) -> None:
        if kept:
            output.info(
                f"kept {plural(len(kept), 'case')} of an earlier export in {out_dir} working "
                f"({', '.join(kept[:3])}{f' and {len(kept) - 3} more' if len(kept) > 3 else ''}): "
                f"{EXPECT_MODULE} holds their expected outputs too"
            )
        for problem in lost:
            output.warn(problem)

    skipped: list[str] = []

    def skip(line: str) -> None:
        skipped.append(line)
        output.info(line)

    def run_lines(lines: list[str]) -> None:
        for line in lines:
            output.info(f"run: {line}")

    try:
        with user_errors():
            written = export_cases(case_dirs, fmt, out_dir, on_earlier=earlier, on_run=run_lines, on_skipped=skip)
    except OSError as exc:
        raise UserError(f"cannot write in {out_dir}: {exc.strerror or exc}") from None
    output.stdout.print(
        f"exported {plural(len(case_dirs) - len(skipped), 'case')} as {fmt} into {out_dir} ({len(written)} files)",
        markup=False,
        soft_wrap=True,
    )
