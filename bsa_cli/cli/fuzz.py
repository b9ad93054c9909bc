"""`bsa fuzz`: draw cases the operator accepts, check them on a device, shrink each failure to a repro."""

from __future__ import annotations

import re
import time
from pathlib import Path

import click

from .. import fuzz as fuzzing
from ..core.errors import plural
from ..core.exit_codes import ExitCode
from ..ops import Op
from . import common, options, output

#: A duration: a number with an optional unit (s, m, h), like 90, 90s, 10m, 1.5h.
DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
#: Least seconds between two progress lines in a log (a terminal gets one line rewritten in place).
PROGRESS_EVERY_S = 5.0


class Duration(click.ParamType):
    """A duration in seconds from `90`, `90s`, `10m` or `1.5h`."""

    name = "duration"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        match = DURATION_RE.match(str(value))
        if not match or float(match.group(1)) <= 0:
            self.fail(f"{value!r} is not a duration > 0 such as 90s, 10m or 1h", param, ctx)
        return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class _Progress(fuzzing.FuzzProgress):
    """Cases tried, failures found, shrinking steps: a line now and then, and one per failure."""

    def __init__(self, budget: float) -> None:
        self.started, self.budget, self.last = time.monotonic(), budget, 0.0

    def line(self, result: fuzzing.FuzzResult) -> str:
        steps = sum(1 for t in result.tried if t.shrinking is not None)
        left = max(0.0, self.budget - (time.monotonic() - self.started))
        return (
            f"fuzz: {plural(result.drawn, 'case')} tried, {plural(len(result.failures), 'failure')} "
            f"({result.failed} failing cases), {plural(steps, 'shrink step')}, {left:.0f} s left"
        )

    def tried(self, result: fuzzing.FuzzResult, tried: fuzzing.Tried) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            output.info(self.line(result))

    def found(self, result: fuzzing.FuzzResult, failure: fuzzing.Failure, repeat: bool) -> None:
        if repeat:  # counted; the progress line and the summary show them
            return
        output.info(
            f"fuzz: FAIL {failure.repro} ({failure.diagnosis}): {failure.headline}; first {failure.first_case} "
            f"({failure.first_flops} FLOPs) shrunk in {failure.shrink_steps} steps to {failure.repro_flops} FLOPs"
        )


@click.command("fuzz")
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the run: cases/ (failing cases kept), repro/NAME.yaml (one per distinct failure), fuzz.json.",
)
@click.option(
    "--budget", type=Duration(), default="10m", show_default=True, help="How long to draw cases: 90s, 10m, 1h."
)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the case sequence.")
@click.option(
    "--max-cases",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Stop after N drawn cases (and their shrinking) even if budget is left.",
)
@click.option(
    "--within",
    "within",
    metavar="SPEC",
    default=None,
    help="Draw within the ranges of this spec's cases: their largest batch, heads, lengths and D, their layouts "
    "and dtypes.",
)
@options.device_options
@options.release_option
@options.ops_option_for(options.GEN_OPS_HELP)
def fuzz_command(
    out: Path,
    budget: float,
    seed: int,
    max_cases: int | None,
    within: str | None,
    device: options.DeviceOptions,
    release: str | None,
    ops: tuple[Op, ...] | None,
) -> None:
    """Draw cases the operator accepts and check each on a device; shrink each failure to a repro.

    Cases are a pure function of --seed (the budget only decides where the sequence stops): every layout,
    dtype, GQA ratio, head dim and block shape, lengths at the block boundaries (1, X - 1, X + 1, 0 between
    others), every sparsity pattern and value distribution, most small and some large by the cost model.
    Each failure is shrunk while it fails with the same diagnosis and written as OUT/repro/NAME.yaml, a spec
    `bsa check` reproduces; OUT/fuzz.json records every case. Exit code: 0 nothing failed, 1 a failure,
    2 usage error, 130 interrupted.
    """
    run_options = device.run_options()
    bounds = fuzzing.Bounds()
    if within is not None:
        bounds = fuzzing.Bounds.within(common.load_cases((within,), (), None, 10_000, release, ops))
    settings = fuzzing.FuzzSettings(
        out=out,
        seed=seed,
        budget=budget,
        options=run_options,
        release=release,
        ops=ops,
        bounds=bounds,
        max_cases=max_cases,
        device_words=run_options.device.name,
    )
    progress = _Progress(budget)
    with common.user_errors():
        result = fuzzing.fuzz(settings, progress)
    output.info(progress.line(result))
    for failure in result.failures:
        output.stdout.print(
            f"FAIL {failure.repro}: {failure.diagnosis}: {failure.headline} (repro {failure.repro_flops} FLOPs, "
            f"{failure.ratio:.3g} of the first failing case; {failure.repeats} repeats) -> "
            f"{out / 'repro' / (failure.repro + '.yaml')}",
            markup=False,
            soft_wrap=True,
        )
    output.stdout.print(
        f"fuzz: {plural(result.drawn, 'case')} in {result.seconds:.0f} s, {plural(len(result.failures), 'failure')}"
        f"; record in {out / 'fuzz.json'}",
        markup=False,
    )
    if result.interrupted:
        raise click.exceptions.Exit(ExitCode.INTERRUPTED)
    raise click.exceptions.Exit(result.return_code)


__all__ = ["fuzz_command"]
