"""`bsa gen`, `bsa validate`, `bsa list`: case specs in, case directories and tables out."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import click
from rich import box
from rich.console import Console
from rich.table import Table

from ..core.case import Case, Precision
from ..core.errors import BsaError, plural
from ..gen.generate import generate_suite
from ..gen.schedule import Estimate, auto_jobs, estimate
from ..gen.settings import GenSettings
from ..ops import DEFAULT_OPS, Op, folder_name, interface
from ..ops.forward_interface import HEAD_DIMS
from ..ops.interface import DEFAULT_RELEASE
from ..store import find_cases
from ..store.manifest import params as case_params
from . import options, output
from .common import (
    load_cases,
    refuse_oversized,
    refuse_writing_inputs,
    show_kernel_path_notes,
    user_errors,
    warn_constraints,
)
from .progress import GenProgress, ProgressDisplay


@click.command("validate")
@click.argument("specs", nargs=-1)
@options.max_cases_option
@options.release_option
def validate_command(specs: tuple[str, ...], max_cases: int, release: str | None) -> None:
    """Check case specs and print how many cases they expand to, and which operator release they expect."""
    cases = load_cases(specs, max_cases=max_cases, release=release)
    warn_constraints(cases)
    negative = sum(not c.expect.ok for c in cases)
    output.stdout.print(f"{plural(len(cases), 'case')} OK ({negative} negative) in {plural(len(specs), 'spec path')}")
    # which operator release the cases' expected statuses follow, and where that came from
    shown = interface.release_counts(case.release for case in cases) or "-"
    source = "--release" if release else f"the specs' release: (default {DEFAULT_RELEASE})"
    output.stdout.print(f"operator release: {shown}, from {source}", soft_wrap=True)
    callers = {c.name: interface.callers_refusals(case_params(c), HEAD_DIMS) for c in cases if c.expect.ok}
    callers = {name: reasons for name, reasons in callers.items() if reasons}
    if callers:
        first, reasons = next(iter(callers.items()))
        output.warn(
            f"{plural(len(callers), 'valid case')} beyond the D torch_npu and the forward take, for a --binary "
            f"alone (first: {first}: {'; '.join(reasons)})"
        )
    outside = {c.name: interface.arch35_refusals(case_params(c)) for c in cases if c.expect.ok}
    outside = {name: reasons for name, reasons in outside.items() if reasons}
    if outside:
        first, reasons = next(iter(outside.items()))
        output.stdout.print(
            f"Ascend 950 (arch35): {plural(len(outside), 'valid case')} outside its tiling rules, "
            f"A2/A3 only (first: {first}: {'; '.join(reasons)})",
            soft_wrap=True,
        )


#: The columns of `bsa list`, in order, each with its place in the order a narrow terminal leaves columns out
#: (1 first; None: never: case, gen s and ref s always stay). What a case is (layout, dtype, B, N1/N2, D, S)
#: stays longer than what it costs besides time and memory (density, FLOPs); gen's and the reference device's
#: peak memory stay longest (what a machine must have for the suite). `OPS_COLUMN` follows them where a case
#: lists other ops than the backward alone (a suite of the backward alone shows what it always showed).
LIST_COLUMNS: dict[str, int | None] = {
    "case": None,
    "layout": 10,
    "dtype": 13,
    "B": 8,
    "N1/N2": 11,
    "D": 9,
    "Sq/Skv": 12,
    "block": 2,
    "pattern": 4,
    "density": 5,
    "GFLOP": 6,
    "MiB in/out": 1,
    "gen s": None,
    "ref s": None,
    "GiB": 15,
    "ref GiB": 14,
    "expect": 3,
}
OPS_COLUMN = "ops"
LIST_DROP_ORDER = [column for _, column in sorted((place, column) for column, place in LIST_COLUMNS.items() if place)]
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16"}
#: Backward FLOPs in a case's counted FLOPs (10 of the 14 per X x Y x D block pair, docs/operator.md section 6):
#: what the reference device computes.
BACKWARD_SHARE = 10 / 14


def list_rows(cases: Sequence[Case]) -> list[dict[str, str]]:
    """Return the cells of `bsa list`, one mapping per case (column -> text)."""
    from ..devices.reference import estimate_peak_memory

    rows = []
    for case in cases:
        e = estimate(case)
        ref = _reference_seconds(case, e)
        rows.append(
            {
                "case": case.name,
                "layout": case.layout,
                "dtype": SHORT_DTYPE.get(case.dtype, case.dtype),
                "B": str(case.batch),
                "N1/N2": f"{case.num_heads}/{case.num_kv_heads}",
                "D": str(case.head_dim),
                "Sq/Skv": f"{case.q_seq_len}/{case.kv_seq_len}",
                "block": "x".join(map(str, case.block_shape)),
                "pattern": case.sparsity.pattern,
                "density": f"{e.density:.3f}",
                "GFLOP": f"{e.flops / 1e9:.3g}",
                "MiB in/out": f"{e.input_bytes / 2**20:.1f}/{e.output_bytes / 2**20:.1f}",
                "gen s": _seconds(e.seconds),
                "ref s": _seconds(ref) if case.expect.ok else "0",
                "GiB": f"{e.peak_memory / 2**30:.2g}",
                "ref GiB": f"{estimate_peak_memory(case, e.input_bytes) / 2**30:.2g}" if case.expect.ok else "0",
                "expect": "ok" if case.expect.ok else str(case.expect.status),
                OPS_COLUMN: ",".join(case.ops),
            }
        )
    return rows


def _reference_seconds(case: Case, e: Estimate) -> float:
    """The reference device's estimated seconds for `case` (0 for a case the op refuses)."""
    from ..devices.reference import estimate_seconds

    if not case.expect.ok:
        return 0.0
    return estimate_seconds(e.flops * BACKWARD_SHARE, e.selected_blocks, case.num_heads // max(case.num_kv_heads, 1))


def _seconds(value: float) -> str:
    """Seconds in at most 5 characters, never cut: 0.004, 3.2, 17, 1234."""
    return f"{value:.2g}" if value < 100 else f"{value:.0f}"


def list_table(rows: Sequence[dict[str, str]], width: int) -> tuple[Table, list[str]]:
    """Return the table of `bsa list` that fits `width` columns, and the columns it leaves out (the ops
    column, where shown, last of all but case, gen s and ref s).

    Columns go in LIST_DROP_ORDER until the table fits; no cell is ever wrapped or cut (a case name
    longer than the terminal still shows whole, on a line of its own width).
    """
    with_ops = any(row[OPS_COLUMN] != ",".join(DEFAULT_OPS) for row in rows)
    shown = [*LIST_COLUMNS, OPS_COLUMN] if with_ops else list(LIST_COLUMNS)
    hidden: list[str] = []
    for column in (None, *LIST_DROP_ORDER, *([OPS_COLUMN] if with_ops else [])):
        if column is not None:
            shown.remove(column)
            hidden.append(column)
        table = _list_table(rows, shown)
        if Console(width=10_000, file=io.StringIO(), color_system=None).measure(table).maximum <= width:
            break
    return table, hidden


def _list_table(rows: Sequence[dict[str, str]], columns: Sequence[str]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False, collapse_padding=True)
    for column in columns:
        left = column in ("case", "layout", "dtype", "pattern", "expect", "ops")
        widest = max([len(column), *(len(row[column]) for row in rows)])
        table.add_column(column, justify="left" if left else "right", no_wrap=True, min_width=widest)
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    return table


@click.command("list")
@click.argument("specs", nargs=-1)
@options.filter_option(metavar="TEXT")
@options.shard_option
@options.max_cases_option
def list_command(specs: tuple[str, ...], filters: tuple[str, ...], shard_text: str | None, max_cases: int) -> None:
    """Show the expanded cases: shapes, density, FLOPs, bytes, estimated time and memory.

    gen s and GiB are `bsa gen`'s estimated seconds and peak memory on the quiet 2-core development
    machine, ref s the reference device's (`bsa run` without a device; measured with
    benchmarks/reference_estimate.py). Another busy process on the same cores can make either several
    times longer. The table fits the terminal's width
    (or COLUMNS): a narrow one leaves out the columns named below the table, never part of a name or number.
    """
    cases = load_cases(specs, filters, shard_text, max_cases)
    width = output.width()
    table, hidden = list_table(list_rows(cases), width)
    output.stdout.print(plural(len(cases), "case"), soft_wrap=True)
    output.stdout.print(table, soft_wrap=True, crop=False)
    output.stdout.print(total_line(cases), width=width)
    if hidden:
        output.stdout.print(f"left out at {width} columns: {', '.join(hidden)}", width=width)


def total_line(cases: Sequence[Case]) -> str:
    """The suite's line under `bsa list`'s table: gen's and the reference device's seconds summed, and the
    largest peak memory of each (one case at a time: `-j N` runs N cases of gen at once)."""
    from ..devices.reference import estimate_peak_memory

    estimates = [(case, estimate(case)) for case in cases]  # the count is the table's first line
    gen_s = sum(e.seconds for _, e in estimates)
    ref_s = sum(_reference_seconds(c, e) for c, e in estimates)
    gen_peak = max((e.peak_memory for _, e in estimates), default=0)
    ref_peak = max((estimate_peak_memory(c, e.input_bytes) for c, e in estimates if c.expect.ok), default=0)
    return (
        f"total: gen {_seconds(gen_s)} s, ref {_seconds(ref_s)} s; "
        f"largest case: gen {gen_peak / 2**30:.2g} GiB, ref {ref_peak / 2**30:.2g} GiB"
    )


@click.command("gen")
@click.argument("specs", nargs=-1)
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@options.precision_option
@options.filter_option(metavar="TEXT")
@options.shard_option
@options.jobs_option
@options.force_option
@options.max_cases_option
@options.release_option
@options.ops_option_for(options.GEN_OPS_HELP)
def gen_command(
    specs: tuple[str, ...],
    out_dir: str,
    precision: Precision,
    filters: tuple[str, ...],
    shard_text: str | None,
    jobs: int | None,
    force: bool,
    max_cases: int,
    release: str | None,
    ops: tuple[Op, ...] | None,
) -> None:
    """Write inputs, golden and benchmark gradients and a manifest for every case of SPECS.

    Each op a case tests (`ops:` in the spec, or --ops) is a case folder of its own: OUT/NAME for the
    backward, OUT/NAME@forward, OUT/NAME@chain, OUT/NAME@autograd for the others.
    """
    refuse_writing_inputs({"-o": out_dir}, specs)
    cases = load_cases(specs, filters, shard_text, max_cases, release, ops)
    warn_constraints(cases)
    estimates = {case.name: estimate(case) for case in cases}
    refuse_oversized(estimates, force)
    jobs = auto_jobs(jobs, list(estimates.values()))
    spec_cases = load_cases(specs, max_cases=max_cases, release=release, ops=ops) if filters or shard_text else cases
    warn_other_cases(Path(out_dir), spec_cases)
    with ProgressDisplay() as display:
        shown = GenProgress(display, cases, estimates)

        def done(case: Case, outcome: str, path: Path) -> None:
            shown.done(case, outcome, path)  # names the case's first folder
            if len(case.ops) > 1:
                folders = ", ".join(folder_name(case.name, op) for op in case.ops)
                display.console.print(f"  one folder per op: {folders}", markup=False, highlight=False)

        with user_errors():
            settings = GenSettings(precision, jobs, on_progress=shown.progress)
            case_dirs = generate_suite(cases, Path(out_dir), settings, skip_current=True, on_done=done)
    made = len(cases) - len(shown.skipped)
    line = f"generated {plural(made, 'case')} in {out_dir}"
    if len(case_dirs) != len(cases):
        line = f"generated {plural(made, 'case')} ({plural(len(case_dirs), 'case folder')}: one per op) in {out_dir}"
    if shown.skipped:
        line += f"; skipped {len(shown.skipped)} already current ({_names(shown.skipped)})"
    output.stdout.print(line, markup=False, soft_wrap=True)
    show_kernel_path_notes(case_dirs)


def _names(names: Sequence[str], shown: int = 3) -> str:
    """Return e.g. "a, b, c and 4 more"."""
    text = ", ".join(names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")


def warn_other_cases(out: Path, cases: Sequence[Case]) -> None:
    """Say on stderr when `out` already holds cases the specs do not make (`cases`: all of theirs, before
    --filter and --shard): `bsa run` and `bsa compare` of the folder would take them too."""
    try:
        found = find_cases(out) if out.is_dir() else []
    except BsaError:
        return
    names = {folder_name(case.name, op) for case in cases for op in case.ops}
    others = sorted(path.name for path in found if path.name not in names)
    if others:
        output.warn(
            f"{out} already holds {plural(len(others), 'other case')} that these specs do not make "
            f"({_names(others)}); `bsa run {out}` and `bsa compare {out}` take them too: write into an empty "
            "folder (-o), or remove them"
        )
