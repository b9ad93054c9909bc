"""`bsa run`, `bsa emulate`, `bsa check`: drive a device (a binary, torch_npu, or the reference device) over cases."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import click

from .. import pipeline, report, store
from ..core.case import Precision
from ..core.errors import plural
from ..core.exit_codes import ExitCode
from ..devices import OUTCOMES, create, reference_faults
from ..devices.reference import REFERENCE_DEVICE, emulate_case_dir
from ..gen.schedule import estimate
from ..ops import Op
from . import common, options, output
from .progress import PipelineProgress, ProgressDisplay

# ---- bsa run -------------------------------------------------------------------------------------


@click.command("run")
@click.argument("cases", nargs=-1, required=True, type=click.Path(path_type=Path))
@options.device_options
@options.filter_option()
@click.option(
    "--outputs-root", metavar="DIR", help="Write case <name>'s outputs to DIR/<name> instead of <case_dir>/outputs."
)
@options.ops_option_for(options.SELECT_OPS_HELP)
@click.option(
    "--resume",
    is_flag=True,
    help="Run only the cases without a complete result of this run (the default; kept for scripts that say it).",
)
@click.option("--all", "run_all", is_flag=True, help="Run every case, those with a complete result of this run too.")
@click.option(
    "--failed",
    "failed_report",
    metavar="REPORT.json",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Run only the cases a JSON report (--json; `bsa check` writes OUT/report.json) says FAIL or ERROR.",
)
def run_command(
    cases: tuple[Path, ...],
    device: options.DeviceOptions,
    filters: tuple[str, ...],
    outputs_root: str | None,
    ops: tuple[Op, ...] | None,
    resume: bool,
    run_all: bool,
    failed_report: Path | None,
) -> None:
    """Run a device (default: the reference device) on every case under CASES.

    CASES are folders written by `bsa gen` (or single case folders). Each case's outputs, status.txt,
    logs and run.json go to <case_dir>/outputs; judge them with `bsa compare`.

    A case that tests several ops is a folder per op (NAME, NAME@forward, ...); --ops takes only those
    ops' folders. Op folders gen skipped (their operator refuses what another op accepts) are never run.

    A case that already holds a complete result of this run (its record of outcome ok, of the inputs as they
    are now, of the same device, binary, --repeat and --deterministic, its outputs as recorded) is left as it
    is, so a run cut short by Ctrl-C goes on where it stopped; --all runs every case again.

    Exit code: 0 every case left a complete result, 1 outputs differed across --repeat runs, 2 usage
    error, 3 a case crashed, timed out or left missing or malformed outputs, 130 interrupted.
    """
    run_options = device.run_options(outputs_root)
    with common.user_errors():
        case_dirs = store.select_cases(cases, filters)
    case_dirs = common.ops_selected(case_dirs, ops)
    if outputs_root is not None:  # each case's outputs go to OUTPUTS_ROOT/<name>: never inside a case folder
        for case_dir in case_dirs:  # (OUTPUTS_ROOT/<name> being the case folder itself: run_suite says so)
            where = Path(outputs_root) / case_dir.name
            if where.resolve() != case_dir.resolve():
                common.refuse_writing_inputs({"--outputs-root": where}, [], device_outputs=True)
    if failed_report is not None:
        with common.user_errors(ValueError):
            failed = pipeline.failed_in_report(report.read_report(failed_report), str(failed_report))
        case_dirs = [case_dir for case_dir in case_dirs if case_dir.name in failed]
        output.info(f"--failed: {plural(len(case_dirs), 'case')} of those {failed_report} says FAIL or ERROR")
    if resume and run_all:
        raise click.UsageError("--resume and --all: choose one (--resume is the default)")
    done = set() if run_all else set(pipeline.completed(case_dirs, run_options))
    if done:  # a first run says nothing of it
        case_dirs = [case_dir for case_dir in case_dirs if case_dir not in done]
        output.info(f"{plural(len(done), 'case')} already complete, {len(case_dirs)} to run (--all runs every case)")
    for case_dir, reason in pipeline.skipped_folders(case_dirs):
        output.info(f"skipped {case_dir.name}: {reason}")
    with ProgressDisplay() as display, common.user_errors():
        summary = pipeline.run_suite(case_dirs, run_options, PipelineProgress(display))
    counts = {o: summary.count(o) for o in OUTCOMES if summary.count(o)}  # the run's totals, on stdout
    text = ", ".join(f"{n} {o}" for o, n in counts.items()) or "nothing ran"
    line = f"ran {plural(len(summary.results), 'case')} on {summary.device.name}: {text}"
    if summary.not_run:
        line += f"; {len(summary.not_run)} not run (interrupted)"
    output.stdout.print(line, markup=False, soft_wrap=True)
    if summary.interrupted:
        raise click.exceptions.Exit(ExitCode.INTERRUPTED)
    raise click.exceptions.Exit(summary.return_code)


# ---- bsa emulate ---------------------------------------------------------------------------------


def _list_faults(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    with common.user_errors():
        faults = reference_faults()
    for name, description in faults.items():
        output.stdout.print(f"{name:<18} {description}", markup=False, soft_wrap=True)
    ctx.exit(ExitCode.PASSED)


@click.command("emulate")
@click.argument("manifest", type=click.Path(path_type=Path))
@click.argument("output_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--fault", metavar="NAME", help="Plant one of the reference device's faults (see --list-faults).")
@click.option(
    "--list-faults",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_list_faults,
    help="List the faults the reference device can plant, and exit.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=None,
    help="Seed of the order in which dK/dV partials are added (a device's atomic adds); default: a fresh one.",
)
@click.option(
    "--deterministic",
    is_flag=True,
    help="Deterministic mode: dK/dV partials in one fixed order (--seed is ignored), as the operator's "
    f"deterministic mode; also on when {store.DETERMINISTIC_ENV}=1 (what `bsa run --deterministic` sets).",
)
def emulate_command(manifest: Path, output_dir: Path, fault: str | None, seed: int | None, deterministic: bool) -> None:
    """Act as a device binary on one case: the built-in reference device.

    Follows the binary contract: reads MANIFEST (a case's case.json, or its folder) and its inputs,
    writes dq.bin, dk.bin, dv.bin and status.txt into OUTPUT_DIR. Its results are a reference (the kernel's
    precision path on the CPU), never device results. Like a device, it adds dK/dV partials in another
    order on every run (dq stays bit for bit the same); --seed repeats an order. Exits 0 once the status
    is written, whatever it is.
    """
    case_dir = manifest if manifest.is_dir() else manifest.parent
    common.refuse_writing_inputs({"OUTPUT_DIR": output_dir}, [manifest, case_dir / "case.json"], device_outputs=True)
    order_seed: int | None = seed if seed is not None else secrets.randbits(32)
    if (deterministic or os.environ.get(store.DETERMINISTIC_ENV) == "1") and fault != "deterministic-ignored":
        order_seed = None
    with common.user_errors():
        create(fault=fault)  # checks the fault name
        status = emulate_case_dir(case_dir, output_dir, fault=fault, order_seed=order_seed)
    suffix = f" (fault '{fault}' planted)" if fault else ""
    output.info(f"{REFERENCE_DEVICE}: status {status}{suffix}; outputs in {output_dir}")


# ---- bsa check -----------------------------------------------------------------------------------

#: The reports `bsa check` writes into OUT unless --json or --html names another file: the terminal shows a line
#: per case, these everything (the HTML report's pictures, the JSON for `bsa run --failed` and `bsa trend`).
CHECK_REPORTS = {"--json": "report.json", "--html": "report.html"}


@click.command("check")
@click.argument("specs", nargs=-1, required=True)
@click.option(
    "-o",
    "--out",
    default="out",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the generated cases (cases already there and current are reused).",
)
@options.device_options
@options.filter_option()
@options.precision_option
@options.jobs_option
@options.shard_option
@options.force_option
@options.max_cases_option
@options.release_option
@options.ops_option_for(options.GEN_OPS_HELP)
@options.settings_options(
    standard="Judge every case by this standard (as bsa compare).",
    threshold="Override one threshold of the standard (repeatable), as bsa compare.",
    padding="BNSD padding rule, as bsa compare.",
)
@options.report_options
@options.baseline_options
@options.verbose_option
@click.option(
    "--recheck",
    "recheck",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="Judge a case that fails narrowly again over N reseeded runs, by the bootstrap interval of their median "
    "ratio (the commercial standard's recheck; fewer than 200 runs fail). 0: no recheck.",
)
def check_command(
    specs: tuple[str, ...],
    out: Path,
    device: options.DeviceOptions,
    filters: tuple[str, ...],
    precision: Precision,
    jobs: int | None,
    shard_text: str | None,
    force: bool,
    max_cases: int,
    release: str | None,
    settings: options.SettingsOptions,
    reports: options.ReportPaths,
    baseline: options.BaselineOptions,
    verbose: bool,
    ops: tuple[Op, ...] | None,
    recheck: int,
) -> None:
    """Generate, run and compare in one command: the main job.

    SPECS are case spec files or folders. Cases already in OUT with current inputs are not generated
    again. Without --binary, --cmd or --device torch_npu the built-in reference device runs them
    (reference results, not device results). The terminal shows a line per case (every check and metric
    with -v); the full reports go to OUT/report.html and OUT/report.json unless --html or --json names
    another file. --baseline compares the verdict with an earlier report as `bsa compare --baseline` does.
    Exit code as `bsa compare`: 0 all pass, 1 a case failed, 2 usage or spec error, 3 a case could not be
    judged, 4 every case passed but a kernel is slower than in --baseline; 130 interrupted.
    """
    run_options = device.run_options()
    run_settings = settings.run_settings()
    common.refuse_writing_inputs({**reports, "-o": out}, [*specs, baseline.baseline])
    margin, night = baseline.night()
    reports = {
        flag: path or (out / CHECK_REPORTS[flag] if flag in CHECK_REPORTS else None) for flag, path in reports.items()
    }
    common.prepare_reports(reports)
    try:
        with ProgressDisplay() as display:
            cases = common.load_cases(specs, filters, shard_text, max_cases, release, ops)
            common.warn_constraints(cases)
            estimates = {case.name: estimate(case) for case in cases}
            common.refuse_oversized(estimates, force)
            with common.user_errors():
                checked = pipeline.check_suite(
                    cases, out, run_options, run_settings, precision, jobs, PipelineProgress(display), estimates
                )
            if checked.suite is None:
                raise KeyboardInterrupt
            suite = checked.suite
            if recheck:
                with common.user_errors():
                    shown = PipelineProgress(display)
                    suite = pipeline.recheck_suite(
                        suite, cases, out, recheck, run_options, run_settings, precision, jobs, shown
                    )
            common.show_kernel_path_notes(checked.case_dirs)
    except KeyboardInterrupt:
        output.info("interrupted: finished cases keep their files and run records")
        raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None
    report.render_terminal(suite, output.stdout, verbose=verbose, device_named=True)  # the run's first line named it
    drift, code = baseline.judge(suite, margin, night)
    # without --baseline the reports are as before (compare's JSON records its exit code; check's did not)
    exit_code = None if drift is None else code
    common.write_reports(suite, reports, (out,), drift=drift, exit_code=exit_code)  # "wrote ... report PATH" last
    raise click.exceptions.Exit(code)


__all__ = ["check_command", "emulate_command", "run_command"]
