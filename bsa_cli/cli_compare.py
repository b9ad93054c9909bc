"""`bsa compare`: judge device outputs against the golden, render the verdict, exit with its code."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import click

from . import output, report
from .cli import UserError, main
from .compare import STANDARDS, RunSettings, SuiteResult, compare_suite
from .errors import BsaError, DataError
from .options import jobs_option_for
from .store import read_regular, select_cases

REPORT_MAX_BYTES = 1 << 30
"""Largest JSON report `--merge` reads."""


def parse_thresholds(values: tuple[str, ...]) -> dict[str, float]:
    """Parse `--threshold KEY=VALUE` options into a mapping (VALUE a number, `inf` allowed)."""
    thresholds: dict[str, float] = {}
    for text in values:
        key, sep, raw = text.partition("=")
        key = key.strip()
        try:
            if not sep or not key:
                raise ValueError
            thresholds[key] = float(raw)
        except ValueError:
            raise UserError(
                f"--threshold {text!r}: expected KEY=NUMBER, for example --threshold rmse_ratio=1.5"
            ) from None
    return thresholds


def _write(kind: str, path: Path, writer: Callable[[SuiteResult, Path], None], suite: SuiteResult) -> None:
    try:
        writer(suite, path)
    except OSError as exc:
        raise UserError(f"cannot write {kind} {path}: {exc.strerror or exc}") from None


def _load_reports(paths: tuple[Path, ...]) -> SuiteResult:
    documents = []
    for path in paths:
        try:
            documents.append((str(path), json.loads(read_regular(Path(path), REPORT_MAX_BYTES))))
        except DataError as exc:
            raise UserError(f"{path}: cannot read JSON report: {exc.message}") from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise UserError(f"{path}: not valid JSON: {str(exc)[:200]}") from None
    try:
        return report.merge(documents)
    except ValueError as exc:
        raise UserError(str(exc)) from None


_STANDARD_HELP = (
    "Judge every case by this standard: "
    + ", ".join([*STANDARDS, *(f"{name}:{preset}" for name, s in STANDARDS.items() for preset in s.presets)])
    + " (default: each case's spec, else double-benchmark)."
)


@main.command("compare")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--outputs-root",
    type=click.Path(path_type=Path, file_okay=False),
    help="Device outputs are in OUTPUTS_ROOT/<case> instead of each case's outputs/.",
)
@click.option("--standard", metavar="NAME[:PRESET]", help=_STANDARD_HELP)
@click.option(
    "--threshold",
    "thresholds",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override one threshold of the standard (repeatable), e.g. rmse_ratio=1.5 or zero_atol=1e-6.",
)
@click.option(
    "--padding",
    type=click.Choice(["ignore", "zero"]),
    help="BNSD padding past honored actual lengths: ignore it (default) or require zeros.",
)
@click.option(
    "--filter", "filters", multiple=True, metavar="GLOB", help="Only cases whose directory name matches (repeatable)."
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write everything measured as JSON (schema bsa-compare/1).",
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write a JUnit XML report (one testcase per case).",
)
@click.option(
    "--html", "html_path", type=click.Path(path_type=Path, dir_okay=False), help="Write a self-contained HTML report."
)
@click.option("--merge", is_flag=True, help="PATHS are JSON reports of shards: merge them into one verdict and report.")
@click.option(
    "--no-verify-inputs",
    is_flag=True,
    help="Hash only the inputs the judge reads (the block mask), not query/key/value/dout/out.",
)
@jobs_option_for("Processes judging cases side by side; auto: one per CPU when the outputs reach 384 MiB, else one.")
@click.option("-v", "--verbose", is_flag=True, help="Show every check and metric of every case.")
def compare_command(
    paths: tuple[Path, ...],
    outputs_root: Path | None,
    standard: str | None,
    thresholds: tuple[str, ...],
    padding: str | None,
    filters: tuple[str, ...],
    json_path: Path | None,
    junit_path: Path | None,
    html_path: Path | None,
    merge: bool,
    no_verify_inputs: bool,
    jobs: int | None,
    verbose: bool,
) -> None:
    """Judge the device's dq, dk, dv of every case under OUT (or merge shard reports with --merge).

    Exit code: 0 all cases pass, 1 a case failed, 2 usage error, 3 a case could not be judged.
    """
    started = time.perf_counter()
    if merge:
        given = [flag for flag, value in (("--outputs-root", outputs_root), ("--standard", standard),
                                          ("--threshold", thresholds), ("--padding", padding),
                                          ("--filter", filters), ("--no-verify-inputs", no_verify_inputs),
                                          ("--jobs", jobs))
                 if value]  # fmt: skip
        if given:
            raise UserError(f"--merge cannot be used with {', '.join(given)}: shard reports are already judged")
        suite = _load_reports(paths)
    else:
        run = RunSettings(standard=standard, thresholds=parse_thresholds(thresholds), padding=padding)
        try:
            run.validate()
            case_dirs = select_cases(paths, filters)
            suite = compare_suite(case_dirs, outputs_root, run, verify_inputs=not no_verify_inputs, jobs=jobs)
        except (ValueError, BsaError) as exc:
            raise UserError(str(exc)) from None
    report.render_terminal(suite, output.stdout, verbose=verbose)
    if json_path is not None:
        _write("--json", json_path, report.write_json, suite)
    if junit_path is not None:
        _write("--junit", junit_path, report.write_junit, suite)
    if html_path is not None:
        _write("--html", html_path, report.write_html, suite)
    if not merge:
        seconds = time.perf_counter() - started
        megabytes = suite.output_bytes / 1e6
        rate = f" ({megabytes / seconds:.0f} MB/s)" if seconds > 0 and megabytes >= 1 else ""
        output.info(f"judged {megabytes:.1f} MB of device outputs in {seconds:.2f} s{rate}")
    click.get_current_context().exit(suite.return_code)
