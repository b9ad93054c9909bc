"""Click options that several commands share, each defined once, and the values some of them gather into.

Options that travel together reach their command as one argument: `device_options` as a `DeviceOptions`
(`run`, `check`), `settings_options` as a `SettingsOptions` (`compare`, `check`), `report_options` as the
report paths by option (`compare`, `check`), `baseline_options` as a `BaselineOptions` (`compare`, `check`).
Their order in `--help` is the order they are listed in here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ..compare import RunSettings, SuiteResult
from ..compare import drift as drift_
from ..devices import DEVICE_KINDS, DeviceKind, RunOptions, create, parse_device_ids
from ..devices.timing import MAX_RUNS, Timing
from ..gen.generate import PRECISIONS
from ..ops import OPS, Op, parse_ops
from ..ops.interface import DEFAULT_RELEASE, RELEASES
from . import output
from .common import UserError, user_errors

#: What a click option is to the command function it decorates.
Decorator = Callable[[Any], Any]


def gathered(into: str, gather: Callable[..., object], options: Sequence[Decorator]) -> Decorator:
    """Return a decorator that adds `options` to a command (in this order in its --help) and hands the command
    their values as one argument named `into`: `gather(**values)`, the values named by `gather`'s parameters."""
    names = tuple(inspect.signature(gather).parameters)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def gathering(*args: Any, **values: Any) -> Any:
            group = gather(**{name: values.pop(name) for name in names})
            return command(*args, **values, **{into: group})

        for option in reversed(options):
            gathering = option(gathering)
        return gathering

    return decorate


FILTER_HELP = "Only cases whose name matches this glob (repeatable)."


def filter_option(help_text: str = FILTER_HELP, metavar: str = "GLOB") -> Decorator:
    """Return `--filter GLOB` (repeatable; the command gets the globs as `filters`) with a command's own help."""
    return click.option("--filter", "filters", multiple=True, metavar=metavar, help=help_text)


shard_option = click.option(
    "--shard", "shard_text", metavar="I/N", help="Only shard I of N, balanced by FLOPs (CI matrices)."
)
precision_option = click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default="float32",
    show_default=True,
    help="Precision of the golden dq/dk/dv.",
)
max_cases_option = click.option(
    "--max-cases",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    metavar="N",
    help="Refuse specs that expand to more than N cases (a matrix of many keys grows fast).",
)
release_option = click.option(
    "--release",
    type=click.Choice(RELEASES),
    default=None,
    help=f"Judge every case by this operator release's rules (statuses and their order), overriding the specs' "
    f"`release:`; default: each case's own, else {DEFAULT_RELEASE}.",
)
force_option = click.option(
    "--force", is_flag=True, help="Generate cases even when their estimated memory exceeds the machine's."
)


class OpsList(click.ParamType):
    """A comma list of ops (`forward,backward`), parsed by `ops.parse_ops` into `OPS` order; a word that is no
    op is a usage error naming the ops."""

    name = "LIST"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> tuple[Op, ...]:
        if isinstance(value, tuple):
            return value
        try:
            return parse_ops(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def ops_option_for(help_text: str) -> Decorator:
    """Return `--ops LIST` (the command gets a tuple of ops in `OPS` order, or None) with a command's own help."""
    return click.option("--ops", "ops", type=OpsList(), metavar="LIST", default=None, help=help_text)


OPS_WORDS = ", ".join(OPS)
GEN_OPS_HELP = (
    f"Comma list of the operator calls to test ({OPS_WORDS}), overriding the specs' `ops:` "
    "(default: each case's own, else backward): one case folder per op."
)
SELECT_OPS_HELP = (
    f"Only these ops' case folders (comma list of {OPS_WORDS}); a case without a folder of a requested op "
    "is named on stderr and that op of it is not taken."
)


class Jobs(click.ParamType):
    """A process count: a positive integer, or `auto` (kept as None; `schedule.auto_jobs` decides)."""

    name = "N|auto"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or value == "auto":
            return None
        try:
            jobs = int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            jobs = 0
        if jobs < 1:
            self.fail(f"{value!r} is not a positive whole number or 'auto'", param, ctx)
        return jobs


def jobs_option_for(help_text: str) -> Callable[[Any], Any]:
    """Return the `-j/--jobs N|auto` option (default auto) with a command's own help text."""
    return click.option(
        "-j", "--jobs", type=Jobs(), metavar="N|auto", default="auto", show_default=True, help=help_text
    )


jobs_option = jobs_option_for(
    "Processes across cases, or threads within a single case; auto: one per CPU when the estimated work "
    "is a few seconds or more (a single case: a fraction of a second), else one."
)


verbose_option = click.option("-v", "--verbose", is_flag=True, help="Show every check and metric of every case.")


# ---- the device (run, check) ---------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceOptions:
    """The device options as given (`device_options`): which device runs the cases, and how."""

    device_kind: DeviceKind | None
    binary: str | None
    cmd: str | None
    fault: str | None
    devices: str
    repeat: int
    deterministic: bool
    timeout: float
    time: bool = False
    time_runs: int = 20
    warmup: int = 3

    def run_options(self, outputs_root: str | None = None) -> RunOptions:
        """Build the runner's options (`outputs_root`: `bsa run --outputs-root`), turning configuration
        errors into `Error:` lines."""
        with user_errors():
            device = create(binary=self.binary, cmd=self.cmd, fault=self.fault, kind=self.device_kind)
            return RunOptions(
                device=device,
                device_ids=parse_device_ids(self.devices),
                repeat=self.repeat,
                timeout=self.timeout,
                outputs_root=Path(outputs_root) if outputs_root else None,
                deterministic=self.deterministic,
                timing=Timing(self.time_runs, self.warmup) if self.time else None,
            )


#: The options that choose and drive the device, as `device: DeviceOptions`.
device_options = gathered(
    "device",
    DeviceOptions,
    [
        click.option(
            "--device",
            "device_kind",
            type=click.Choice(list(DEVICE_KINDS)),
            help="Built-in device: reference (the default: the reference device, reference results) or "
            "torch_npu (its npu_block_sparse_attention_backward on an Ascend host, one child process "
            "per case) or cann_ops_transformer (ops-transformer's own forward entry, forward folders only). "
            "Not with --binary or --cmd.",
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
            "--time",
            is_flag=True,
            help="Time the operator on the device: after the judged call, --warmup untimed calls and --time-runs "
            "calls timed with device events (the C++ harness, torch_npu); run.json and the reports give the "
            "median. The reference device records no time. See docs/run.md, 'Timed runs'.",
        ),
        click.option(
            "--time-runs",
            type=click.IntRange(min=1, max=MAX_RUNS),
            default=20,
            show_default=True,
            metavar="N",
            help="Timed calls per case with --time.",
        ),
        click.option(
            "--warmup",
            type=click.IntRange(min=0, max=MAX_RUNS),
            default=3,
            show_default=True,
            metavar="N",
            help="Untimed calls before the timed ones with --time.",
        ),
    ],
)


# ---- comparison settings and report files (compare, check) ---------------------------------------


@dataclass(frozen=True)
class SettingsOptions:
    """The comparison settings as given for the whole run (`settings_options`)."""

    standard: str | None
    thresholds: tuple[str, ...]
    padding: str | None

    def run_settings(self) -> RunSettings:
        """Build and check the comparison settings, before any case is touched."""
        settings = RunSettings(self.standard, parse_thresholds(self.thresholds), self.padding)
        with user_errors(ValueError):
            settings.validate()
        return settings


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


def settings_options(standard: str, threshold: str, padding: str) -> Decorator:
    """Return --standard, --threshold and --padding with a command's own help texts, as
    `settings: SettingsOptions`."""
    return gathered(
        "settings",
        SettingsOptions,
        [
            click.option("--standard", metavar="NAME[:PRESET]", help=standard),
            click.option("--threshold", "thresholds", multiple=True, metavar="KEY=VALUE", help=threshold),
            click.option("--padding", type=click.Choice(["ignore", "zero"]), help=padding),
        ],
    )


#: The report files asked for, by option (`--json`, `--junit`, `--html`, `--csv`); None: not asked for.
ReportPaths = dict[str, Path | None]


def _report_paths(
    json_path: Path | None, junit_path: Path | None, html_path: Path | None, csv_path: Path | None
) -> ReportPaths:
    return {"--json": json_path, "--junit": junit_path, "--html": html_path, "--csv": csv_path}


#: Each report option's help, in --help order.
REPORT_HELP = {
    "--json": "Write everything measured as JSON (schema bsa-compare/1).",
    "--junit": "Write a JUnit XML report (one testcase per case; says when results are reference ones).",
    "--html": "Write a self-contained HTML report with pictures of every failing tensor.",
    "--csv": "Write msprobe's compare CSV (one row per tensor) with bsa's verdict columns.",
}

#: --json, --junit, --html and --csv (report files; their folders are created), as `reports: ReportPaths`.
report_options = gathered(
    "reports",
    _report_paths,
    [
        click.option(flag, f"{flag[2:]}_path", type=click.Path(path_type=Path, dir_okay=False), help=text)
        for flag, text in REPORT_HELP.items()
    ],
)


# ---- an earlier report to compare with (compare, check) ------------------------------------------


@dataclass(frozen=True)
class BaselineOptions:
    """--baseline and the options that only go with it, as given (`baseline_options`)."""

    baseline: Path | None
    fail_on_regression: bool
    regression_margin: str | None
    time_threshold: float

    def night(self) -> tuple[drift_.Margin, drift_.Night | None]:
        """Check the options and read the baseline report (None without --baseline), before any case is touched."""
        if self.baseline is None:
            flags = {"--fail-on-regression": self.fail_on_regression, "--regression-margin": self.regression_margin}
            given = [flag for flag, value in flags.items() if value]
            if given:
                raise UserError(
                    f"{', '.join(given)} needs --baseline OLD.json (an earlier `bsa compare --json` report)"
                )
            return drift_.Margin(), None
        with user_errors(ValueError):
            margin = drift_.parse_margin(self.regression_margin) if self.regression_margin else drift_.Margin()
        from .. import report  # here: the commands without --baseline (gen, list, validate) load no report module

        try:  # the earlier JSON report, or a usage error naming the file
            return margin, report.night_from_document(report.read_report(self.baseline), str(self.baseline))
        except ValueError as exc:
            raise UserError(f"--baseline {exc}") from None

    def judge(
        self, suite: SuiteResult, margin: drift_.Margin, night: drift_.Night | None
    ) -> tuple[drift_.Drift | None, int]:
        """Print the suite's drift from the baseline night and return it with the exit code it makes (the
        suite's own without a baseline)."""
        if night is None:
            return None, suite.return_code
        from .. import report

        devices = tuple(d["device"] for d in report.suite_devices(suite))
        drift = drift_.compare_with_baseline(suite, night, margin, devices, self.time_threshold)
        report.render_drift(drift, output.stdout)
        return drift, drift.return_code(suite.return_code, self.fail_on_regression)


#: --baseline, --fail-on-regression, --regression-margin, --time-threshold, as `baseline: BaselineOptions`.
baseline_options = gathered(
    "baseline",
    BaselineOptions,
    [
        click.option(
            "--baseline",
            type=click.Path(path_type=Path, dir_okay=False),
            metavar="OLD.json",
            help="Compare with an earlier JSON report: each ratio's change, regressions, verdict changes, "
            "vanished and new cases, slower kernels (terminal, --json, --html).",
        ),
        click.option(
            "--fail-on-regression",
            is_flag=True,
            help="With --baseline: exit 1 (instead of 0) on a regression, a case gone from PASS to FAIL or "
            "ERROR, or a vanished case.",
        ),
        click.option(
            "--regression-margin",
            metavar="REL,ABS",
            help=f"With --baseline: a regression grows by more than REL of its old value and ABS of its limit "
            f"(default {drift_.RELATIVE_MARGIN},{drift_.ABSOLUTE_MARGIN}).",
        ),
        click.option(
            "--time-threshold",
            type=click.FloatRange(min=0),
            default=drift_.TIME_THRESHOLD,
            show_default=True,
            metavar="FRACTION",
            help="With --baseline and timed runs (bsa run --time) on both sides: a call whose median kernel time "
            "grew by more than FRACTION beyond the runs' spread is slower; exit code 4 when nothing else failed.",
        ),
    ],
)
