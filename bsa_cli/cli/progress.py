"""The progress of `bsa gen`, `bsa run` and `bsa check` on stderr: one display for all three.

`ProgressDisplay` draws a rich bar above a line per finished case on a terminal, and plain lines naming the
case in a log (at most one every `PLAIN_PROGRESS_S`). `GenProgress` shows `bsa gen`'s suite on it (a line per
case folder written or skipped), `PipelineProgress` what `pipeline.check_suite` and `pipeline.run_suite`
report (the phases of `bsa check`, and the device's runs of `bsa run` and `bsa check`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import rich.progress
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column
from rich.text import Text

from .. import pipeline
from ..compare import CaseResult
from ..core.case import Case
from ..devices import Device, RunEvent, RunResult
from ..gen.schedule import Estimate
from ..ops import split_folder_name
from . import output

#: Least seconds between two progress lines when stderr is not a terminal (a log, a pipe).
PLAIN_PROGRESS_S = 15.0

#: Columns the progress bar keeps for all but its description: spinner, a 12-column bar, "0.49/1.21 TFLOP",
#: elapsed, "ETA", remaining, and the spaces between them.
BAR_FIXED = 52

#: The colour of each outcome in a case's line; red for any other (error, crashed, timeout, nondeterministic, ERROR).
OUTCOME_STYLE = dict.fromkeys(("ok", "generated", "PASS"), "green") | {
    "skipped": "dim",
    "interrupted": "yellow",
    "FAIL": "red",
    "SKIP": "cyan",
}

_Display = TypeVar("_Display", bound="ProgressDisplay")


class ProgressDisplay:
    """Per-case progress on stderr: a rich progress bar above per-case lines on a terminal, plain lines
    otherwise (at most one every `interval_s` seconds within a phase counted in FLOPs)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or output.stderr
        self.interval_s = PLAIN_PROGRESS_S
        self._progress: Progress | None = None
        self._task: Any = None
        self._label = ""
        self._width = 0
        self._weights: Mapping[str, float] = {}
        self._reached: dict[str, float] = {}
        self._started = 0.0
        self._last_line = 0.0

    def __enter__(self: _Display) -> _Display:
        if self.console.is_terminal:
            # One line at any width: the figures never wrap; the description (what runs now) is what gets cut.
            description = Column(no_wrap=True, overflow="ellipsis", max_width=max(self.console.width - BAR_FIXED, 8))
            whole = Column(no_wrap=True)
            figures = (
                _Amount(table_column=whole),
                TimeElapsedColumn(table_column=whole),
                TextColumn("ETA", table_column=whole),
                TimeRemainingColumn(table_column=whole),
            )
            columns = (SpinnerColumn(), TextColumn("{task.description}", table_column=description), BarColumn(12))
            self._progress = Progress(*columns, *figures, console=self.console, transient=True)
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def phase(
        self, label: str, total: int, names: Sequence[str] = (), flops: Mapping[str, float] | None = None
    ) -> None:
        """Start a phase (gen, run, compare) of `total` cases; `names` align the case column.

        With `flops` (per case name) the bar and its ETA count FLOPs instead of cases, and `progress`
        moves it within a case.
        """
        self._label = label
        self._width = min(max((len(n) for n in names), default=0), 48)
        self._weights = {name: value / 1e9 for name, value in (flops or {}).items()}
        self._reached = {}
        self._started = self._last_line = time.monotonic()
        if self._progress is not None:
            if self._task is not None:
                self._progress.remove_task(self._task)
            unit = "GFLOP" if flops is not None else "cases"
            size = sum(self._weights.values()) if flops is not None else total
            self._task = self._progress.add_task(label, total=size or 1, unit=unit)

    def progress(self, name: str, fraction: float) -> None:
        """Move the bar to `fraction` of case `name` (phases counted in FLOPs).

        Without a terminal (a CI log) a line says how far a long phase is, every `interval_s` at most.
        """
        weight = self._weights.get(name, 0.0)
        step = (fraction - self._reached.get(name, 0.0)) * weight
        self._reached[name] = fraction
        if self._progress is not None and self._task is not None and step:
            self._progress.advance(self._task, step)
        elif self._progress is None and fraction < 1.0 and time.monotonic() - self._last_line >= self.interval_s:
            self._last_line = time.monotonic()
            self.console.print(self._progress_line(name, fraction), soft_wrap=True, highlight=False, markup=False)

    def _progress_line(self, name: str, fraction: float) -> str:
        """E.g. "run      nightly-causal-16k 40%; run 23% of 520 GFLOP, ETA 3m 10s"."""
        total = sum(self._weights.values())
        done = sum(self._weights.get(n, 0.0) * f for n, f in self._reached.items())
        line = f"{self._label:<8} {name} {100 * fraction:.0f}%"
        elapsed = time.monotonic() - self._started
        if total > 0 and done > 0:
            eta = elapsed * (total - done) / done
            line += f"; {self._label} {100 * done / total:.0f}% of {flop_text(total * 1e9)}, ETA {_duration(eta)}"
        return line

    def running(self, text: str) -> None:
        """Say what runs now (shown in the bar's description on a terminal only)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=f"{self._label}: {escape(text)}")

    def case(self, outcome: str, name: str, detail: str = "", problems: Sequence[str] = ()) -> None:
        """Print one finished case and advance the bar."""
        style = OUTCOME_STYLE.get(outcome, "red")
        line = f"{self._label:<8} [{style}]{outcome:<16}[/{style}] {escape(name)}"
        head = len(f"{self._label:<8} {outcome:<16} {name}")
        aligned = " " * max(self._width - len(name), 0) + "  "
        if detail and head + len(aligned) + len(detail) > self.console.width:
            aligned = "  "  # a name as long as the longest does not fit: the detail follows it unaligned
        if detail and head + len(aligned) + len(detail) > self.console.width:
            aligned = "\n" + " " * (8 + 1 + 16 + 1)  # whole on a line of its own under the name, never broken
        if detail:
            line += f"{aligned}[dim]{escape(detail)}[/dim]"
        self.console.print(line, soft_wrap=True, highlight=False)
        for problem in problems:
            self.console.print(f"         {escape(problem)}", soft_wrap=True, highlight=False, style="red")
        self.advance(name)

    def advance(self, name: str) -> None:
        """Count case `name` as done on the bar without printing a line."""
        if name in self._weights:
            self.progress(name, 1.0)
        elif self._progress is not None and self._task is not None:
            self._progress.advance(self._task)

    def on_run_event(self, event: RunEvent) -> None:
        """Show a runner event: the case that starts in the bar, the line of one that ended."""
        if event.kind == "start":
            self.running(f"{event.case} on device {event.device_id}")
            return
        result = event.result
        assert result is not None
        self.case(result.outcome, result.name, run_detail(result), [*result.problems, *log_lines(result)])


def log_lines(result: RunResult) -> list[str]:
    """Return where a failed run's logs are (full paths), nothing for a run that left a result or was skipped."""
    if result.ok or result.outcome == "skipped":
        return []
    logs = [result.record.get(key) for key in ("stderr_log", "stdout_log")]
    paths = [Path(result.output_dir) / name for name in logs if isinstance(name, str) and name]
    shown = [str(path) for path in paths if path.is_file() and path.stat().st_size] or [str(p) for p in paths[:1]]
    return [f"log: {', '.join(shown)}"] if shown else []


def run_detail(result: RunResult) -> str:
    """Return the short status text of one run: aclnn status (and the expected one), time, device; why a
    skipped case was not run."""
    if result.skipped is not None:
        return result.skipped
    parts = []
    if result.status is not None:
        status = f"status {result.status}"
        if result.expect_status is not None and result.expect_status != result.status:
            status += f" (expected {result.expect_status})"
        parts.append(status)
    parts += [f"{result.duration_s:.2f} s", f"device {result.device_id}"]
    return ", ".join(parts)


def _gen_phase(display: ProgressDisplay, cases: Sequence[Case], estimates: Mapping[str, Estimate]) -> None:
    """Start the gen phase of `cases`, its bar counting their FLOPs."""
    display.phase("gen", len(cases), [c.name for c in cases], {name: e.flops for name, e in estimates.items()})


class GenProgress:
    """What `bsa gen` shows while `generate.generate_suite` writes a suite: the bar moving within each case,
    and a line per case naming its folder (or why it was skipped: current)."""

    def __init__(self, display: ProgressDisplay, cases: Sequence[Case], estimates: Mapping[str, Estimate]) -> None:
        """Start the gen phase of `cases` on `display`."""
        self.display = display
        #: The names of the cases found current, in the order they were skipped.
        self.skipped: list[str] = []
        _gen_phase(display, cases, estimates)

    def progress(self, case: Case, fraction: float) -> None:
        """`on_progress`: `fraction` of `case` is done."""
        self.display.running(case.name)
        self.display.progress(case.name, fraction)

    def done(self, case: Case, outcome: str, path: Path) -> None:
        """`on_done`: `case` is written to `path` (or was current there)."""
        if outcome == "current":
            self.skipped.append(case.name)
            line = f"skipped {path} (current: same spec, precision and bsa version, inputs intact)"
        else:
            line = f"{outcome} {path}"
        self.display.console.print(line, markup=False, highlight=False)
        self.display.advance(case.name)


class PipelineProgress(pipeline.CheckProgress):
    """Shows what `pipeline.check_suite` and `pipeline.run_suite` report: a `ProgressDisplay`, and on stderr which
    device runs (saying up front when the reference device stands in for one) and which cases a planted
    fault cannot change."""

    def __init__(self, display: ProgressDisplay) -> None:
        self.display = display

    def generating(self, cases: Sequence[Case], estimates: Mapping[str, Estimate]) -> None:
        _gen_phase(self.display, cases, estimates)

    def generated(self, case: Case, outcome: str) -> None:
        if outcome == "current":
            self.display.case("skipped", case.name, "inputs current")
        else:
            self.display.case(outcome, case.name)

    def progress(self, name: str, fraction: float) -> None:
        self.display.progress(name, fraction)

    def running(self, case_dirs: Sequence[Path], device: Device, flops: Mapping[str, float] | None) -> None:
        output.info(device.announcement)
        if device.fault:
            for warning in pipeline.inapplicable_faults(case_dirs, device.fault):
                output.warn(warning)
        self.display.phase("run", len(case_dirs), [c.name for c in case_dirs], flops)

    def on_run_event(self, event: RunEvent) -> None:
        self.display.on_run_event(event)

    def judging(self, case_dirs: Sequence[Path]) -> None:
        self.display.phase("compare", len(case_dirs), [c.name for c in case_dirs])
        output.info(f"judging {judged_text(case_dirs)}: verdicts in the table below")

    def judged(self, result: CaseResult) -> None:
        self.display.advance(result.name)  # the verdict itself is printed once, in the report's table


def judged_text(case_dirs: Sequence[Path]) -> str:
    """Return e.g. "12 cases", or with op folders (`NAME@forward`) "9 results of 3 cases"."""
    names = {split_folder_name(d.name) for d in case_dirs}
    cases = len({name for name, _ in names})
    if all(op.is_default for _, op in names):
        return f"{len(case_dirs)} case{'s' if len(case_dirs) != 1 else ''}"
    return f"{len(case_dirs)} result{'s' if len(case_dirs) != 1 else ''} of {cases} case{'s' if cases != 1 else ''}"


def _duration(seconds: float) -> str:
    """Return e.g. "45s", "3m 10s", "1h 02m"."""
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


FLOP_UNITS = ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP"))


def flop_unit(flops: float) -> tuple[float, str]:
    """Return the scale and name of the unit that shows `flops` in at most 3 digits before the point."""
    for scale, unit in FLOP_UNITS:
        if flops >= scale:
            return scale, unit
    return 1.0, "FLOP"


def flop_text(flops: float) -> str:
    """Return e.g. "520 GFLOP", "1.21 TFLOP", "58.7 MFLOP"."""
    scale, unit = flop_unit(flops)
    return f"{flops / scale:.3g} {unit}"


class _Amount(rich.progress.ProgressColumn):
    """The bar's "done/total unit": cases, or FLOPs in the unit of the total (0.49/1.21 TFLOP)."""

    def render(self, task: rich.progress.Task) -> Text:
        unit = task.fields.get("unit", "cases")
        if unit != "GFLOP":
            return Text(f"{task.completed:.4g}/{task.total or 0:.4g} {unit}")
        scale, name = flop_unit((task.total or 0) * 1e9)
        return Text(f"{task.completed * 1e9 / scale:.3g}/{(task.total or 0) * 1e9 / scale:.3g} {name}")
