"""`bsa gen`, `bsa validate`, `bsa list`: case specs in, case directories and tables out."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from . import output
from .case import Case
from .cli import UserError, main
from .errors import BsaError
from .generate import generate_suite
from .options import filter_option, force_option, jobs_option, max_cases_option, precision_option, shard_option
from .schedule import Estimate, auto_jobs, estimate, machine_memory, parse_shard, shard
from .spec import MAX_CASES, load_specs


def load_cases(
    specs: Sequence[str],
    name_filters: Sequence[str] = (),
    shard_text: str | None = None,
    max_cases: int = MAX_CASES,
) -> list[Case]:
    """Load, filter and shard the cases of the given specs, turning spec errors into `Error:` messages."""
    if not specs:
        raise UserError("give at least one spec file or folder (for example cases/smoke.yaml)")
    try:
        cases = load_specs(specs, max_cases)
    except BsaError as exc:
        raise UserError(str(exc)) from None
    if name_filters:
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) for p in name_filters)]
        if not cases:
            raise UserError(f"--filter {' '.join(map(repr, name_filters))} matches no case")
    if shard_text:
        try:
            index, count = parse_shard(shard_text)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        cases = shard(cases, index, count)
    return cases


def warn_constraints(cases: Sequence[Case]) -> None:
    """Print on stderr where each case's golden and the A2/A3 kernel part ways."""
    for case in cases:
        for note in case.warnings:
            output.warn(f"{case.name}: {note}")


def refuse_oversized(estimates: dict[str, Estimate], force: bool) -> None:
    """Refuse cases whose estimated peak memory exceeds this machine's, unless forced."""
    memory = machine_memory()
    too_big = [(name, e) for name, e in estimates.items() if memory and e.peak_memory > memory]
    if too_big and not force:
        name, e = too_big[0]
        raise UserError(
            f"case '{name}' needs about {e.peak_memory / 2**30:.1f} GiB, more than this machine's "
            f"{memory / 2**30:.1f} GiB ({len(too_big)} such case(s)); use --force to try anyway, "
            "or --filter/--shard to leave them out"
        )


@main.command("validate")
@click.argument("specs", nargs=-1)
@max_cases_option
def validate_command(specs: tuple[str, ...], max_cases: int) -> None:
    """Check case specs and print how many cases they expand to."""
    cases = load_cases(specs, max_cases=max_cases)
    warn_constraints(cases)
    negative = sum(not c.expect.ok for c in cases)
    output.stdout.print(f"{len(cases)} cases OK ({negative} negative) in {len(specs)} spec path(s)")


@main.command("list")
@click.argument("specs", nargs=-1)
@filter_option
@shard_option
@max_cases_option
def list_command(
    specs: tuple[str, ...], name_filters: tuple[str, ...], shard_text: str | None, max_cases: int
) -> None:
    """Show the expanded cases: shapes, density, FLOPs, bytes, estimated time and memory."""
    cases = load_cases(specs, name_filters, shard_text, max_cases)
    table = Table(title=f"{len(cases)} cases")
    columns = ("case", "layout", "dtype", "B", "N1/N2", "D", "Sq/Skv", "block", "pattern", "density",
               "GFLOP", "MiB in/out", "est. s", "est. GiB", "expect")  # fmt: skip
    for column in columns:
        left = column in ("case", "pattern", "expect")
        table.add_column(
            column, justify="left" if left else "right", overflow="fold" if column == "case" else "ellipsis"
        )
    for case in cases:
        e = estimate(case)
        table.add_row(
            case.name, case.layout, case.dtype, str(case.batch), f"{case.num_heads}/{case.num_kv_heads}",
            str(case.head_dim), f"{case.q_seq_len}/{case.kv_seq_len}", "x".join(map(str, case.block_shape)),
            case.sparsity.pattern, f"{e.density:.3f}", f"{e.flops / 1e9:.3g}",
            f"{e.input_bytes / 2**20:.1f}/{e.output_bytes / 2**20:.1f}", f"{e.seconds:.2g}",
            f"{e.peak_memory / 2**30:.2g}", "ok" if case.expect.ok else str(case.expect.status),
        )  # fmt: skip
    output.stdout.print(table)


@main.command("gen")
@click.argument("specs", nargs=-1)
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@precision_option
@filter_option
@shard_option
@jobs_option
@force_option
@max_cases_option
def gen_command(specs: tuple[str, ...], out_dir: str, precision: str, name_filters: tuple[str, ...],
                shard_text: str | None, jobs: int | None, force: bool, max_cases: int) -> None:  # fmt: skip
    """Write inputs, golden and benchmark gradients and a manifest for every case of SPECS."""
    cases = load_cases(specs, name_filters, shard_text, max_cases)
    warn_constraints(cases)
    estimates = {case.name: estimate(case) for case in cases}
    refuse_oversized(estimates, force)
    jobs = auto_jobs(jobs, list(estimates.values()))
    with gen_progress(sum(e.flops for e in estimates.values())) as progress:
        task = progress.add_task("gen", total=sum(e.flops for e in estimates.values()) or 1)
        reached: dict[str, float] = {}

        def advance(case: Case, fraction: float) -> None:
            progress.advance(task, (fraction - reached.get(case.name, 0.0)) * estimates[case.name].flops)
            reached[case.name] = fraction

        def done(case: Case, outcome: str, path: Path) -> None:
            advance(case, 1.0)
            progress.console.print(f"{outcome} {path}", markup=False, highlight=False)

        try:
            generate_suite(cases, Path(out_dir), precision, jobs, on_done=done, on_progress=advance)
        except BsaError as exc:
            raise UserError(str(exc)) from None
    output.stdout.print(f"generated {len(cases)} cases in {out_dir}")


def gen_progress(total_flops: int) -> Progress:
    """Return a progress display on stderr whose ETA comes from FLOP counts."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn(f"{{task.completed:.3g}}/{total_flops:.3g} FLOP"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=output.stderr,
        transient=False,
        disable=not output.stderr.is_terminal,
    )
