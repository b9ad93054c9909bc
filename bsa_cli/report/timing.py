"""The kernel's speed in reports (`bsa run --time`): per case and step its median time, spread and achieved
TFLOP/s on the FLOPs of bsa's cost model (docs/operator.md section 6, forward and backward apart) with its
share of the chip's peak (`core.chips`, where the run named a chip bsa has a figure for), and the suite's
totals. Every report format takes its rows from here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..compare import CaseResult, SuiteResult
from ..compare.results import StepTime
from .style import esc, html_table

#: The columns of a kernel-time table, in order (terminal, HTML, CSV).
COLUMNS = ("case", "step", "median us", "spread us", "runs", "TFLOP/s", "of peak")


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
        "-" if time.peak_share is None else f"{time.peak_share:.1%} of {time.chip}",
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
            "",
        ]
        for total in totals(cases)
    ]


#: Width in pixels of the longest bar of the HTML report's kernel-time chart.
BAR_WIDTH = 360
#: Height in pixels of one bar (one step of one case) and the gap after it.
BAR_HEIGHT, BAR_GAP = 14, 4


def chart(suite: SuiteResult) -> str:
    """Return an SVG bar chart of each timed step's median time (its spread as a whisker), longest first."""
    bars = sorted(((c.name, t) for c in timed(suite) for t in c.kernel_time), key=lambda bar: -bar[1].median_us)
    if not bars:
        return ""
    longest = max(t.median_us + t.spread_us / 2 for _, t in bars) or 1.0
    label_width, height = 260, len(bars) * (BAR_HEIGHT + BAR_GAP)
    parts = []
    for index, (name, time) in enumerate(bars):
        y = index * (BAR_HEIGHT + BAR_GAP)
        width = BAR_WIDTH * time.median_us / longest
        half = BAR_WIDTH * time.spread_us / 2 / longest
        tflops = "" if time.tflops is None else f", {time.tflops:.3g} TFLOP/s"
        tip = esc(f"{name} {time.step}: median {time.median_us:.1f} us, spread {time.spread_us:.1f} us{tflops}")
        parts.append(
            f'<text x="{label_width - 6}" y="{y + BAR_HEIGHT - 3}" text-anchor="end" font-size="11">'
            f"{esc(name)} {esc(time.step)}</text>"
            f'<rect x="{label_width}" y="{y}" width="{width:.1f}" height="{BAR_HEIGHT}" fill="#4a78b5">'
            f"<title>{tip}</title></rect>"
            f'<line x1="{label_width + width - half:.1f}" x2="{label_width + width + half:.1f}" '
            f'y1="{y + BAR_HEIGHT / 2}" y2="{y + BAR_HEIGHT / 2}" stroke="#222"/>'
            f'<text x="{label_width + width + half + 4:.1f}" y="{y + BAR_HEIGHT - 3}" font-size="11">'
            f"{time.median_us:.1f} us</text>"
        )
    total = label_width + BAR_WIDTH + 80
    label = "median kernel time per case and step"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height}" role="img" '
        f'aria-label="{label}">{"".join(parts)}</svg>'
    )


def timing_html(suite: SuiteResult) -> str:
    """Return the HTML report's kernel-time section (nothing when no case was timed): the chart, then the
    table of `COLUMNS` with the suite's totals."""
    cases = timed(suite)
    notes = "".join(f"<p>{esc(note)}.</p>" for note in untimed_notes(suite))
    if not cases:
        return f'<section class="kernel-time"><h2>Kernel time</h2>{notes}</section>' if notes else ""
    cells = [[esc(cell) for cell in row] for row in [*rows(suite), *total_rows(cases)]]
    table = html_table(COLUMNS, cells, numeric=(2, 3, 4, 5, 6))
    return (
        '<section class="kernel-time"><h2>Kernel time</h2><p>bsa run --time: device events around each call, '
        "median of the timed calls; TFLOP/s on the FLOPs of bsa's cost model, and its share of the chip's FP16/BF16 "
        "peak where bsa knows the chip's (bsa_cli/core/chips.py).</p>"
        f"{chart(suite)}{table}{notes}</section>"
    )
