"""`bsa gen`, `bsa validate`, `bsa list`: case specs in, case directories and tables out."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import click
from rich.table import Table

from . import output
from .case import Case
from .cli import UserError, main
from .errors import BsaError
from .generate import PRECISIONS, case_summary, generate_case
from .spec import load_specs


def load_cases(specs: tuple[str, ...], name_filter: str | None = None) -> list[Case]:
    """Load and filter the cases of the given specs, turning spec errors into `Error:` messages."""
    if not specs:
        raise UserError("give at least one spec file or folder (for example cases/smoke.yaml)")
    try:
        cases = load_specs(specs)
    except BsaError as exc:
        raise UserError(str(exc)) from None
    if name_filter:
        cases = [c for c in cases if fnmatch.fnmatchcase(c.name, name_filter)]
        if not cases:
            raise UserError(f"--filter {name_filter!r} matches no case")
    return cases


def warn_constraints(cases: list[Case]) -> None:
    """Print each case's kernel-constraint warnings on stderr."""
    for case in cases:
        for note in case.warnings:
            output.warn(f"{case.name}: outside the A2/A3 kernel: {note}")


@main.command("validate")
@click.argument("specs", nargs=-1)
def validate_command(specs: tuple[str, ...]) -> None:
    """Check case specs and print how many cases they expand to."""
    cases = load_cases(specs)
    warn_constraints(cases)
    negative = sum(not c.expect.ok for c in cases)
    output.stdout.print(f"{len(cases)} cases OK ({negative} negative) in {len(specs)} spec path(s)")


@main.command("list")
@click.argument("specs", nargs=-1)
@click.option("--filter", "name_filter", help="Only cases whose name matches this glob.")
def list_command(specs: tuple[str, ...], name_filter: str | None) -> None:
    """Show the expanded cases: shapes, selected-block density, FLOPs and bytes."""
    cases = load_cases(specs, name_filter)
    table = Table(title=f"{len(cases)} cases", show_lines=False)
    for column in ("case", "layout", "dtype", "B", "N1/N2", "D", "Sq/Skv", "block", "pattern", "density",
                   "GFLOP fwd+bwd", "MiB in/out", "expect"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("case", "pattern", "expect") else "right")
    for case in cases:
        summary = case_summary(case)
        gflop = (summary["flops_forward"] + summary["flops_backward"]) / 1e9
        table.add_row(
            case.name, case.layout, case.dtype, str(case.batch), f"{case.num_heads}/{case.num_kv_heads}",
            str(case.head_dim), f"{case.q_seq_len}/{case.kv_seq_len}", "x".join(map(str, case.block_shape)),
            case.sparsity.pattern, f"{summary['density']:.3f}", f"{gflop:.3g}",
            f"{summary['input_bytes'] / 2**20:.1f}/{summary['output_bytes'] / 2**20:.1f}",
            "ok" if case.expect.ok else str(case.expect.status),
        )  # fmt: skip
    output.stdout.print(table)


@main.command("gen")
@click.argument("specs", nargs=-1)
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="float32", show_default=True,
              help="Precision of the golden dq/dk/dv.")  # fmt: skip
@click.option("--filter", "name_filter", help="Only cases whose name matches this glob.")
def gen_command(specs: tuple[str, ...], out_dir: str, precision: str, name_filter: str | None) -> None:
    """Write inputs, golden and benchmark gradients and a manifest for every case of SPECS."""
    cases = load_cases(specs, name_filter)
    warn_constraints(cases)
    for case in cases:
        try:
            path = generate_case(case, Path(out_dir), precision)
        except BsaError as exc:
            raise UserError(f"case '{case.name}': {exc}") from None
        output.info(f"wrote {path}")
    output.stdout.print(f"generated {len(cases)} cases in {out_dir}")
