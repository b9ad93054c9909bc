"""`bsa run`, `bsa emulate`, `bsa check`: drive a device (a binary, torch_npu, or the reference device) over cases."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import click

from .. import pipeline, report, runner, store
from ..devices import (
    DEVICE_KINDS,
    REFERENCE_DEVICE,
    Device,
    RunOptions,
    _emulator,
    parse_device_ids,
    reference_faults,
)
from ..errors import plural
from ..schedule import estimate
from . import output
from .common import (
    EXIT_INTERRUPTED,
    load_cases,
    prepare_reports,
    refuse_oversized,
    run_settings,
    show_kernel_path_notes,
    user_errors,
    warn_constraints,
    write_reports,
)
from .options import (
    force_option,
    jobs_option,
    max_cases_option,
    precision_option,
    release_option,
    report_options,
    shard_option,
)
from .progress import PipelineProgress, ProgressDisplay

# ---- shared options --------------------------------------------------------------------------------


def device_options(func: Any) -> Any:
    """Add the options that choose and drive the device (shared by `run` and `check`)."""
    options = [
        click.option(
            "--device",
            "device_kind",
            type=click.Choice(list(DEVICE_KINDS)),
            help="Built-in device: reference (the default: the reference device, reference results) or "
            "torch_npu (torch_npu.npu_block_sparse_attention_backward on an Ascend host, one child process "
            "per case). Not with --binary or --cmd.",
        ),
        click.option(
            "--binary",
            metavar="PATH",
            help="Device binary, run as `BINARY <case_dir>/case.json <output_dir>`. "
            "Without it (and without --cmd or --device) the built-in reference device runs the cases.",
        ),
        click.option(
            "--cmd",
            metavar="TEMPLATE",
            help="Command template instead of the default invocation, split like a shell would but never "
            "run by one; placeholders {binary} {case_dir} {manifest} {output_dir} {device_id}.",
        ),
        click.option(
            "--fault",
            metavar="NAME",
            help="Plant a fault in the reference device (see `bsa emulate --list-faults`); not with --binary or --cmd.",
        ),
        click.option(
            "--devices",
            default="0",
            show_default=True,
            metavar="IDS",
            help="Device ids, e.g. 0,1,2,3: one worker per device, cases run in parallel. "
            "Each run gets ASCEND_DEVICE_ID.",
        ),
        click.option(
            "--repeat",
            type=click.IntRange(min=1),
            metavar="N",
            default=1,
            show_default=True,
            help="Run each case N times and judge every run: a status or dq that differs between runs, or a "
            "run outside the standard, marks the case nondeterministic; dk/dv may differ in their last bits "
            "(fp32 atomic adds), which is reported as repeat-noise, not failed.",
        ),
        click.option(
            "--deterministic",
            is_flag=True,
            help="Ask for the operator's deterministic mode (A2/A3, ops-transformer master): the C++ harness sets "
            "ACL_OPT_DETERMINISTIC, torch_npu torch.use_deterministic_algorithms(True), the reference device one "
            "fixed dK/dV order; with --repeat every output must then be bitwise identical.",
        ),
        click.option(
            "--timeout",
            type=click.FloatRange(min=0, min_open=True),
            default=600.0,
            show_default=True,
            metavar="SECONDS",
            help="Kill a binary's (or a torch_npu child's) whole process group after this long (not applied "
            "to the reference device, which runs in-process).",
        ),
        click.option(
            "--filter",
            "filters",
            multiple=True,
            metavar="GLOB",
            help="Only cases whose name matches this glob (repeatable).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def make_options(
    device_kind: str | None,
    binary: str | None,
    cmd: str | None,
    fault: str | None,
    devices: str,
    repeat: int,
    timeout: float,
    outputs_root: str | None = None,
    deterministic: bool = False,
) -> RunOptions:
    """Build run options from CLI values, turning configuration errors into `Error:` lines."""
    with user_errors():
        device = Device.create(binary=binary, cmd=cmd, fault=fault, kind=device_kind)
        return RunOptions(
            device=device,
            device_ids=parse_device_ids(devices),
            repeat=repeat,
            timeout=timeout,
            outputs_root=Path(outputs_root) if outputs_root else None,
            deterministic=deterministic,
        )


def print_run_summary(summary: runner.RunSummary) -> None:
    """Print the run's totals on stdout."""
    counts = {o: summary.count(o) for o in runner.OUTCOMES if summary.count(o)}
    text = ", ".join(f"{n} {o}" for o, n in counts.items()) or "nothing ran"
    line = f"ran {plural(len(summary.results), 'case')} on {summary.device.name}: {text}"
    if summary.not_run:
        line += f"; {len(summary.not_run)} not run (interrupted)"
    output.stdout.print(line, markup=False, soft_wrap=True)


# ---- bsa run -------------------------------------------------------------------------------------


@click.command("run")
@click.argument("cases", nargs=-1, required=True, type=click.Path(path_type=Path))
@device_options
@click.option(
    "--outputs-root",
    metavar="DIR",
    help="Write case <name>'s outputs to DIR/<name> instead of <case_dir>/outputs.",
)
def run_command(
    cases: tuple[Path, ...],
    device_kind: str | None,
    binary: str | None,
    cmd: str | None,
    fault: str | None,
    devices: str,
    repeat: int,
    deterministic: bool,
    timeout: float,
    filters: tuple[str, ...],
    outputs_root: str | None,
) -> None:
    """Run a device (default: the reference device) on every case under CASES.

    CASES are folders written by `bsa gen` (or single case folders). Each case's outputs, status.txt,
    logs and run.json go to <case_dir>/outputs; judge them with `bsa compare`.

    Exit code: 0 every case left a complete result, 1 outputs differed across --repeat runs, 2 usage
    error, 3 a case crashed, timed out or left missing or malformed outputs, 130 interrupted.
    """
    options = make_options(device_kind, binary, cmd, fault, devices, repeat, timeout, outputs_root, deterministic)
    with user_errors():
        case_dirs = store.select_cases(cases, filters)
    with ProgressDisplay() as display, user_errors():
        summary = pipeline.run_suite(case_dirs, options, PipelineProgress(display))
    print_run_summary(summary)
    if summary.interrupted:
        raise click.exceptions.Exit(EXIT_INTERRUPTED)
    raise click.exceptions.Exit(summary.return_code)


# ---- bsa emulate ---------------------------------------------------------------------------------


def _list_faults(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    with user_errors():
        faults = reference_faults()
    for name, description in faults.items():
        output.stdout.print(f"{name:<18} {description}", markup=False, soft_wrap=True)
    ctx.exit(0)


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
def emulate_command(
    manifest: Path, output_dir: Path, fault: str | None, seed: int | None, deterministic: bool
) -> None:
    """Act as a device binary on one case: the built-in reference device.

    Follows the binary contract: reads MANIFEST (a case's case.json, or its folder) and its inputs,
    writes dq.bin, dk.bin, dv.bin and status.txt into OUTPUT_DIR. Its results are a reference (the kernel's
    precision path on the CPU), never device results. Like a device, it adds dK/dV partials in another
    order on every run (dq stays bit for bit the same); --seed repeats an order. Exits 0 once the status
    is written, whatever it is.
    """
    case_dir = manifest if manifest.is_dir() else manifest.parent
    order_seed: int | None = seed if seed is not None else secrets.randbits(32)
    if (deterministic or os.environ.get(store.DETERMINISTIC_ENV) == "1") and fault != "deterministic-ignored":
        order_seed = None
    with user_errors():
        Device.create(fault=fault)  # checks the fault name
        status = _emulator().emulate_case_dir(case_dir, output_dir, fault=fault, order_seed=order_seed)
    suffix = f" (fault '{fault}' planted)" if fault else ""
    output.info(f"{REFERENCE_DEVICE}: status {status}{suffix}; outputs in {output_dir}")


# ---- bsa check -----------------------------------------------------------------------------------


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
@device_options
@precision_option
@jobs_option
@shard_option
@force_option
@max_cases_option
@release_option
@click.option("--standard", metavar="NAME[:PRESET]", help="Judge every case by this standard (as bsa compare).")
@click.option(
    "--threshold",
    "thresholds",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override one threshold of the standard (repeatable), as bsa compare.",
)
@click.option("--padding", type=click.Choice(["ignore", "zero"]), help="BNSD padding rule, as bsa compare.")
@report_options
@click.option("-v", "--verbose", is_flag=True, help="Show every check and metric of every case.")
def check_command(
    specs: tuple[str, ...],
    out: Path,
    device_kind: str | None,
    binary: str | None,
    cmd: str | None,
    fault: str | None,
    devices: str,
    repeat: int,
    deterministic: bool,
    timeout: float,
    filters: tuple[str, ...],
    precision: str,
    jobs: int | None,
    shard_text: str | None,
    force: bool,
    max_cases: int,
    release: str | None,
    standard: str | None,
    thresholds: tuple[str, ...],
    padding: str | None,
    json_path: Path | None,
    junit_path: Path | None,
    html_path: Path | None,
    csv_path: Path | None,
    verbose: bool,
) -> None:
    """Generate, run and compare in one command: the main job.

    SPECS are case spec files or folders. Cases already in OUT with current inputs are not generated
    again. Without --binary, --cmd or --device torch_npu the built-in reference device runs them
    (reference results, not device results). Exit code as `bsa compare`: 0 all pass, 1 a case failed,
    2 usage or spec error, 3 a case could not be judged; 130 interrupted.
    """
    options = make_options(device_kind, binary, cmd, fault, devices, repeat, timeout, deterministic=deterministic)
    settings = run_settings(standard, thresholds, padding)
    reports = {"--json": json_path, "--junit": junit_path, "--html": html_path, "--csv": csv_path}
    prepare_reports(reports)
    try:
        with ProgressDisplay() as display:
            cases = load_cases(specs, filters, shard_text, max_cases, release)
            warn_constraints(cases)
            estimates = {case.name: estimate(case) for case in cases}
            refuse_oversized(estimates, force)
            with user_errors():
                checked = pipeline.check_suite(
                    cases, out, options, settings, precision, jobs, PipelineProgress(display), estimates
                )
            if checked.suite is None:
                raise KeyboardInterrupt
            suite = checked.suite
            show_kernel_path_notes(checked.case_dirs)
    except KeyboardInterrupt:
        output.info("interrupted: finished cases keep their files and run records")
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    report.render_terminal(suite, output.stdout, verbose=verbose)
    write_reports(suite, reports, (out,))
    if options.device.is_reference:
        output.stdout.print(f"device: {options.device.name}: reference results, not device results", markup=False)
    raise click.exceptions.Exit(suite.return_code)


__all__ = ["check_command", "emulate_command", "run_command"]
