"""`bsa compare`: judge device outputs against the golden, render the verdict, exit with its code."""

from __future__ import annotations

import time
from pathlib import Path

import click

from .. import report
from ..compare import STANDARDS, SuiteResult, compare_suite, missing_cases
from ..core.errors import DataError
from ..core.untrusted import load_json, read_regular
from ..ops import Op, split_folder_name
from . import common, options, output

#: Largest JSON report `--merge` reads.
REPORT_MAX_BYTES = 1 << 30


def _load_reports(paths: tuple[Path, ...]) -> tuple[SuiteResult, report.ReportHeader | None]:
    documents = []
    for path in paths:
        try:
            documents.append((str(path), load_json(read_regular(Path(path), REPORT_MAX_BYTES))))
        except DataError as exc:
            raise common.UserError(f"{path}: cannot read JSON report: {exc.message}") from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise common.UserError(f"{path}: not valid JSON: {str(exc)[:200]}") from None
    with common.user_errors(ValueError):
        return report.merge(documents), report.merged_header(documents)


_STANDARD_HELP = (
    "Judge every case by this standard: "
    + ", ".join([*STANDARDS, *(f"{name}:{preset}" for name, s in STANDARDS.items() for preset in s.presets)])
    + " (default: each case's spec, else double-benchmark)."
)


@click.command("compare")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--outputs-root",
    type=click.Path(path_type=Path, file_okay=False),
    help="Device outputs are in OUTPUTS_ROOT/<case> instead of each case's outputs/.",
)
@options.settings_options(
    standard=_STANDARD_HELP,
    threshold="Override one threshold of the standard (repeatable), e.g. rmse_ratio=1.5 or zero_atol=1e-6.",
    padding="BNSD padding past honored actual lengths: ignore it (default) or require zeros.",
)
@options.filter_option("Only cases whose directory name matches (repeatable).")
@options.report_options
@click.option("--merge", is_flag=True, help="PATHS are JSON reports of shards: merge them into one verdict and report.")
@click.option(
    "--no-verify-inputs",
    is_flag=True,
    help="Hash only the inputs the judge reads (the block mask), not query/key/value/dout/out.",
)
@options.baseline_options
@options.jobs_option_for(
    "Processes judging cases side by side; auto: one per CPU when the outputs reach 384 MiB, else one."
)
@click.option(
    "--explain",
    metavar="CASE",
    help="Judge (or, with --merge, read) only case CASE and print its diagnosis's full reasoning: each "
    "hypothesis tried, what it explained, why the others were ruled out.",
)
@options.verbose_option
@options.ops_option_for(options.SELECT_OPS_HELP)
def compare_command(
    paths: tuple[Path, ...],
    outputs_root: Path | None,
    settings: options.SettingsOptions,
    filters: tuple[str, ...],
    reports: options.ReportPaths,
    merge: bool,
    no_verify_inputs: bool,
    baseline: options.BaselineOptions,
    jobs: int | None,
    explain: str | None,
    verbose: bool,
    ops: tuple[Op, ...] | None,
) -> None:
    """Judge the device's dq, dk, dv of every case under OUT (or merge shard reports with --merge).

    OUT is a folder written by `bsa gen` (or one case of it); a folder of such folders (OUT/smoke,
    OUT/edge, ...) is compared whole. Each op of a case is a folder of its own (NAME, NAME@forward, ...),
    judged on its own; --ops takes only those ops' folders. Report files' folders are created; a report
    that cannot be written stops the command before any case is judged.

    Exit code: 0 all cases pass, 1 a case failed (or, with --fail-on-regression, drifted), 2 usage error,
    3 a case could not be judged, 4 every case passed but a kernel is slower than in --baseline.
    """
    started = time.perf_counter()
    common.refuse_writing_inputs(reports, [*paths, baseline.baseline, outputs_root])
    margin, night = baseline.night()
    header = None
    if merge:
        flags = {
            "--outputs-root": outputs_root,
            "--standard": settings.standard,
            "--threshold": settings.thresholds,
            "--padding": settings.padding,
            "--filter": filters,
            "--no-verify-inputs": no_verify_inputs,
            "--jobs": jobs,
            "--ops": ops,
        }
        given = [flag for flag, value in flags.items() if value]
        if given:
            raise common.UserError(f"--merge cannot be used with {', '.join(given)}: shard reports are already judged")
        common.prepare_reports(reports)
        suite, header = _load_reports(paths)
    else:
        run = settings.run_settings()
        case_dirs = common.ops_selected(common.select_cases_or_suites(paths, filters), ops)
        if explain is not None:  # the case directory --explain names (its folder name)
            case_dirs = [d for d in case_dirs if Path(d).name == explain][:1]
            if not case_dirs:
                raise common.UserError(f"--explain {explain}: no such case under the given folders")
        missing = missing_cases(common.folders_of_cases(paths), case_dirs, filters if explain is None else (explain,))
        if ops is not None:  # a leftover of an op not asked for is not missing
            missing = [item for item in missing if split_folder_name(item[0])[1] in ops]
        common.prepare_reports(reports)
        with common.user_errors(ValueError):
            suite = compare_suite(
                case_dirs, outputs_root, run, verify_inputs=not no_verify_inputs, jobs=jobs, missing=missing
            )
    if explain is not None:  # the suite cut to the case --explain names (by case name or folder)
        found = [c for c in suite.cases if explain in (c.name, Path(c.case_dir).name)]
        if not found:
            raise common.UserError(f"--explain {explain}: no such case in the reports")
        suite = SuiteResult(tuple(found[:1]), suite.seconds)
    report.render_terminal(suite, output.stdout, verbose=verbose)
    if explain is not None:
        report.render_explanation(suite.cases[0], output.stdout)
    drift, code = baseline.judge(suite, margin, night)
    common.write_reports(suite, reports, () if merge else paths, header, drift, code)
    if not merge:
        seconds = time.perf_counter() - started
        megabytes = suite.output_bytes / 1e6
        rate = f" ({megabytes / seconds:.0f} MB/s)" if seconds > 0 and megabytes >= 1 else ""
        output.info(f"judged {megabytes:.1f} MB of device outputs in {seconds:.2f} s{rate}")
    click.get_current_context().exit(code)
