"""`bsa compare`: judge device outputs against the golden, render the verdict, exit with its code."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from . import drift as drift_
from . import output, report
from .cli import UserError, main
from .compare import STANDARDS, RunSettings, SuiteResult, compare_suite
from .errors import BsaError, DataError
from .options import jobs_option_for, report_options
from .store import MANIFEST, find_cases, read_regular, select_cases

SUITE_DEPTH = 3
"""How deep below a folder without cases `bsa compare` looks for folders of suites."""

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


def prepare_reports(paths: dict[str, Path | None]) -> None:
    """Create the report files' folders and check they can be written, before any case is judged."""
    try:
        report.prepare_report_paths(paths)
    except report.ReportPathError as exc:
        raise UserError(str(exc)) from None


def write_reports(
    suite: SuiteResult,
    paths: dict[str, Path | None],
    out: Sequence[Path] = (),
    header: report.ReportHeader | None = None,
    drift: drift_.Drift | None = None,
    exit_code: int | None = None,
) -> None:
    """Write the reports asked for by --json, --junit, --html and --csv (with a baseline's drift in JSON and
    HTML; `exit_code` replaces the suite's in JSON when --fail-on-regression changed it)."""
    header = header or report.report_header(suite, out)
    additions: dict[str, object] = {}
    if drift is not None:
        additions = {"drift": drift_.drift_document(drift), "regressions": drift_.regressions_document(drift)}
    if exit_code is not None:
        additions["exit_code"] = exit_code
    writers: dict[str, Callable[[SuiteResult, Path], None]] = {
        "--json": lambda s, p: report.write_json(s, p, header, additions),
        "--junit": report.write_junit,
        "--html": lambda s, p: report.write_html(s, p, header, drift),
        "--csv": report.write_csv,
    }
    for option, path in paths.items():
        if path is not None:
            _write(option, path, writers[option], suite)


def find_suites(root: Path, depth: int = SUITE_DEPTH) -> list[Path]:
    """Return the folders below `root` (down to `depth` levels) that hold case directories, sorted."""
    suites: list[Path] = []
    level = [root]
    for _ in range(depth):
        below = sorted(p for folder in level for p in folder.iterdir()
                       if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))  # fmt: skip
        suites.extend(p for p in below if not (p / MANIFEST).is_file() and find_cases(p))
        level = [p for p in below if not (p / MANIFEST).is_file() and p not in suites]
    return sorted(suites)


def select_cases_or_suites(paths: Sequence[Path], filters: Sequence[str]) -> list[Path]:
    """Return the case directories under `paths`; a folder that holds no case itself but folders of suites
    (OUT/smoke, OUT/edge, ...) stands for all of them, and says so on stderr.

    Raises:
        UserError: a path holds no case at any depth (naming where to look), or no case matches the filter.
    """
    roots: list[Path] = []
    for path in paths:
        try:
            if Path(path).is_dir() and not find_cases(Path(path)):
                suites = find_suites(Path(path))
                if not suites:
                    raise DataError(
                        str(path), f"no case directories (*/case.json) here or up to {SUITE_DEPTH} folders below; "
                        "write them with `bsa gen SPECS -o OUT` and compare OUT"
                    )  # fmt: skip
                counts = ", ".join(f"{s} ({len(find_cases(s))} cases)" for s in suites)
                output.info(f"{path} holds no case itself; comparing the {len(suites)} suites below it: {counts}")
                roots.extend(suites)
            else:
                roots.append(Path(path))
        except OSError as exc:
            raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except BsaError as exc:
            raise UserError(str(exc)) from None
    try:
        return select_cases(roots, filters)
    except BsaError as exc:
        raise UserError(str(exc)) from None


def _load_reports(paths: tuple[Path, ...]) -> tuple[SuiteResult, report.ReportHeader | None]:
    documents = []
    for path in paths:
        try:
            documents.append((str(path), json.loads(read_regular(Path(path), REPORT_MAX_BYTES))))
        except DataError as exc:
            raise UserError(f"{path}: cannot read JSON report: {exc.message}") from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise UserError(f"{path}: not valid JSON: {str(exc)[:200]}") from None
    try:
        return report.merge(documents), report.merged_header(documents)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def load_baseline(path: Path) -> drift_.Night:
    """Read `--baseline` (an earlier JSON report), or stop with a usage error naming the file."""
    try:
        return drift_.night_from_document(drift_.read_report(path), str(path))
    except ValueError as exc:
        raise UserError(f"--baseline {exc}") from None


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
@report_options
@click.option("--merge", is_flag=True, help="PATHS are JSON reports of shards: merge them into one verdict and report.")
@click.option(
    "--no-verify-inputs",
    is_flag=True,
    help="Hash only the inputs the judge reads (the block mask), not query/key/value/dout/out.",
)
@click.option("--baseline", type=click.Path(path_type=Path, dir_okay=False), metavar="OLD.json",
              help="Compare with an earlier JSON report: each ratio's change, regressions, verdict changes, "
                   "vanished and new cases (terminal, --json, --html).")
@click.option("--fail-on-regression", is_flag=True,
              help="With --baseline: exit 1 (instead of 0) on a regression, a case gone from PASS to FAIL or "
                   "ERROR, or a vanished case.")
@click.option("--regression-margin", metavar="REL,ABS",
              help=f"With --baseline: a regression grows by more than REL of its old value and ABS of its limit "
                   f"(default {drift_.RELATIVE_MARGIN},{drift_.ABSOLUTE_MARGIN}).")
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
    csv_path: Path | None,
    merge: bool,
    no_verify_inputs: bool,
    baseline: Path | None,
    fail_on_regression: bool,
    regression_margin: str | None,
    jobs: int | None,
    verbose: bool,
) -> None:
    """Judge the device's dq, dk, dv of every case under OUT (or merge shard reports with --merge).

    OUT is a folder written by `bsa gen` (or one case of it); a folder of such folders (OUT/smoke,
    OUT/edge, ...) is compared whole. Report files' folders are created; a report that cannot be written
    stops the command before any case is judged.

    Exit code: 0 all cases pass, 1 a case failed (or, with --fail-on-regression, drifted), 2 usage error,
    3 a case could not be judged.
    """
    started = time.perf_counter()
    reports = {"--json": json_path, "--junit": junit_path, "--html": html_path, "--csv": csv_path}
    margin, night = _baseline_options(baseline, fail_on_regression, regression_margin)
    header = None
    if merge:
        given = [flag for flag, value in (("--outputs-root", outputs_root), ("--standard", standard),
                                          ("--threshold", thresholds), ("--padding", padding),
                                          ("--filter", filters), ("--no-verify-inputs", no_verify_inputs),
                                          ("--jobs", jobs))
                 if value]  # fmt: skip
        if given:
            raise UserError(f"--merge cannot be used with {', '.join(given)}: shard reports are already judged")
        prepare_reports(reports)
        suite, header = _load_reports(paths)
    else:
        run = RunSettings(standard=standard, thresholds=parse_thresholds(thresholds), padding=padding)
        try:
            run.validate()
        except ValueError as exc:
            raise UserError(str(exc)) from None
        case_dirs = select_cases_or_suites(paths, filters)
        prepare_reports(reports)
        try:
            suite = compare_suite(case_dirs, outputs_root, run, verify_inputs=not no_verify_inputs, jobs=jobs)
        except (ValueError, BsaError) as exc:
            raise UserError(str(exc)) from None
    report.render_terminal(suite, output.stdout, verbose=verbose)
    drift = None if night is None else drift_.compare_with_baseline(suite, night, margin)
    code = suite.return_code if drift is None else drift.return_code(suite.return_code, fail_on_regression)
    if drift is not None:
        report.render_drift(drift, output.stdout)
    write_reports(suite, reports, () if merge else paths, header, drift, code)
    if not merge:
        seconds = time.perf_counter() - started
        megabytes = suite.output_bytes / 1e6
        rate = f" ({megabytes / seconds:.0f} MB/s)" if seconds > 0 and megabytes >= 1 else ""
        output.info(f"judged {megabytes:.1f} MB of device outputs in {seconds:.2f} s{rate}")
    click.get_current_context().exit(code)


def _baseline_options(
    baseline: Path | None, fail_on_regression: bool, regression_margin: str | None
) -> tuple[drift_.Margin, drift_.Night | None]:
    """Check --baseline, --fail-on-regression and --regression-margin, and read the baseline report."""
    if baseline is None:
        given = [flag for flag, value in (("--fail-on-regression", fail_on_regression),
                                          ("--regression-margin", regression_margin)) if value]  # fmt: skip
        if given:
            raise UserError(f"{', '.join(given)} needs --baseline OLD.json (an earlier `bsa compare --json` report)")
        return drift_.Margin(), None
    try:
        margin = drift_.parse_margin(regression_margin) if regression_margin is not None else drift_.Margin()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return margin, load_baseline(baseline)
