"""The kernel's speed in reports (`bsa run --time`): per case and step its median time, spread and achieved
TFLOP/s on the FLOPs of bsa's cost model (docs/operator.md section 6, forward and backward apart), and the
suite's totals. Every report format takes its rows from here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..compare import CaseResult, SuiteResult
from ..compare.results import StepTime

#: The columns of a kernel-time table, in order (terminal, HTML, CSV).
COLUMNS = ("case", "step", "median us", "spread us", "runs", "TFLOP/s")


@dataclass(frozen=True)
class StepTotal:
    """One step summed over the suite's timed cases: the sum of the median times and of the FLOPs."""

    step: str
    cases: int
    median_us: float
    flops: float | None  # None when a timed case's FLOPs are unknown

    @property
    def tflops(self) -> float | None:
        """The suite's achieved TFLOP/s on this step: all FLOPs over all median times."""
        return self.flops / self.median_us / 1e6 if self.flops is not None and self.median_us > 0 else None


def timed(suite: SuiteResult) -> list[CaseResult]:
    """Return the cases with kernel times, in the suite's order."""
    return [case for case in suite.cases if case.kernel_time]


def untimed_notes(suite: SuiteResult) -> list[str]:
    """Return each distinct reason a timed run recorded no time (the reference device's sentence)."""
    return sorted({case.untimed for case in suite.cases if case.untimed and not case.kernel_time})


def step_row(case: CaseResult, time: StepTime) -> list[str]:
    """Return one step of one case as the cells of `COLUMNS`."""
    tflops = time.tflops
    runs = f"{time.runs}" + (f" ({time.outliers_dropped} outliers dropped)" if time.outliers_dropped else "")
    return [
        case.name,
        time.step,
        f"{time.median_us:.1f}",
        f"{time.spread_us:.1f}",
        runs,
        "-" if tflops is None else f"{tflops:.3g}",
    ]


def rows(suite: SuiteResult) -> list[list[str]]:
    """Return every timed step of every case as cells of `COLUMNS`."""
    return [step_row(case, time) for case in timed(suite) for time in case.kernel_time]


def totals(cases: Sequence[CaseResult]) -> list[StepTotal]:
    """Return each step summed over the timed cases (forward first)."""
    found = []
    for step in ("forward", "backward"):
        times = [t for case in cases for t in case.kernel_time if t.step == step]
        if times:
            flops = None if any(t.flops is None for t in times) else sum(t.flops or 0.0 for t in times)
            found.append(StepTotal(step, len(times), sum(t.median_us for t in times), flops))
    return found


def total_rows(cases: Sequence[CaseResult]) -> list[list[str]]:
    """Return the totals as cells of `COLUMNS` (case column: "all N cases")."""
    return [
        [
            f"all {total.cases} case(s)",
            total.step,
            f"{total.median_us:.1f}",
            "",
            "",
            "-" if total.tflops is None else f"{total.tflops:.3g}",
        ]
        for total in totals(cases)
    ]
