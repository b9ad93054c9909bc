"""Drift between nights: compare a run with an earlier JSON report, and follow cases across many reports.

A kernel change that moves a case's error ratio from 1.0 to 1.8 passes every night until the night it
crosses 2. This module reads JSON reports ("bsa-compare/1") back and compares them with pure functions:

* `compare_with_baseline(suite, baseline)`: per case, tensor and check with a limit, the value before and
  now (`MetricChange`); a change is a **regression** when the value grew beyond `Margin` (relative and
  absolute, the absolute part a fraction of the check's limit), even while it still passes; plus the cases
  whose verdict changed, vanished or appeared.
* `trend(nights)`: the nights ordered by date, and per case one series of its deciding ratio.

Why the margins are what they are (measured run-to-run noise of the reference device) is written in
docs/compare.md, "Drift between nights". Reading a report file back into a `Night` is the job of
`report.document` (`read_report`, `night_from_document`); nothing here touches a file.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.exit_codes import ExitCode, exit_code
from ..store.manifest import json_number
from .results import ERROR, FAIL, PASS, CaseResult, Check, SuiteResult, Verdict

#: A regression grows by more than this fraction of its old value (measured run-to-run noise: at most 4.5%).
RELATIVE_MARGIN = 0.10

#: ...and by more than this fraction of the check's limit (measured noise: at most 1.5% of the limit).
ABSOLUTE_MARGIN = 0.05

#: A kernel's median time regressed when it grew by more than this fraction of the baseline's median beyond
#: the larger spread (interquartile range) of the two runs (ascend-forge flags a regression over 10% too).
TIME_THRESHOLD = 0.10


@dataclass(frozen=True)
class Margin:
    """How far a check's value may grow between two runs before it is a regression.

    A value regressed when `new > old * (1 + relative)` and `new - old > absolute * limit`: the relative
    part ignores run-to-run noise of ratios near 1, the absolute part ignores large relative moves of tiny
    values (a ratio floored at err_thd, 0.05 -> 0.08, is far from any limit and means nothing).
    """

    relative: float = RELATIVE_MARGIN
    absolute: float = ABSOLUTE_MARGIN

    def regressed(self, old: float, new: float, limit: float) -> bool:
        """Whether `new` grew beyond the margin from `old` (a value turning Inf or NaN from finite did)."""
        if math.isnan(new) or math.isnan(old):
            return math.isnan(new) and not math.isnan(old)
        if not math.isfinite(new) or not math.isfinite(old):
            return new > old
        return new > old * (1 + self.relative) and new - old > self.absolute * limit

    def validate(self) -> None:
        """Raises ValueError unless both margins are finite and not negative."""
        for name, value in (("relative", self.relative), ("absolute", self.absolute)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"regression margin {name}={value!r}: must be a number >= 0")


def parse_margin(text: str) -> Margin:
    """Parse `--regression-margin REL,ABS` (e.g. "0.1,0.05").

    Raises:
        ValueError: not two numbers >= 0 separated by a comma.
    """
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        margin = Margin(float(parts[0]), float(parts[1]))
        margin.validate()
    except ValueError:
        raise ValueError(
            f"--regression-margin {text!r}: expected REL,ABS, two numbers >= 0 (the relative growth and the "
            f"growth as a fraction of the limit), for example {RELATIVE_MARGIN},{ABSOLUTE_MARGIN}"
        ) from None
    return margin


# ---- reading reports ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Night:
    """One JSON report read back: its results and the circumstances that order and label it."""

    source: str  # the file it was read from
    date: _dt.datetime | None  # UTC; None for a report written before reports carried their date
    host: str | None
    version: str | None  # the bsa that wrote it
    devices: tuple[str, ...]  # who produced the outputs, most cases first
    suite: SuiteResult

    @property
    def label(self) -> str:
        """Date (UTC, minutes) and device, e.g. "2026-11-30 02:00 reference (bsa emulate)"."""
        when = self.date.strftime("%Y-%m-%d %H:%M") if self.date else "undated"
        return f"{when} {', '.join(self.devices) or 'device not recorded'}"


def parse_date(text: Any) -> _dt.datetime | None:
    """Return an ISO 8601 date as an aware UTC datetime (a date without offset is taken as UTC); None if absent.

    Raises:
        ValueError: a date that is not ISO 8601.
    """
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"date {str(text)[:40]!r} is not an ISO 8601 string")
    try:
        moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"date {text[:40]!r} is not ISO 8601 (e.g. 2026-11-30T02:00:00+00:00)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.timezone.utc)
    try:
        return moment.astimezone(_dt.timezone.utc)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is a moment before year 1 in UTC
        raise ValueError(f"date {text[:40]!r} is beyond the years 1 to 9999 in UTC") from None


# ---- comparing with a baseline --------------------------------------------------------------------


#: Checks whose value is a statistical score (the bias check's standard errors), not the size of an error:
#: a margin on sizes means nothing for it, so only its verdict counts for drift.
SCORES = frozenset({"bias"})


def ratio_checks(case: CaseResult) -> list[Check]:
    """The checks of a case's tensors that compare a value with a limit (finite, > 0): the ratios and
    fractions a standard decides by, not the structural checks (whose limit is 0) nor `SCORES`."""
    return [
        check
        for tensor in case.tensors
        for check in tensor.checks
        if check.limit is not None and math.isfinite(check.limit) and check.limit > 0 and check.name not in SCORES
    ]


def deciding_ratio(case: CaseResult) -> Check | None:
    """The ratio check closest to (or furthest past) its limit: what a chart of the case follows."""
    checks = ratio_checks(case)
    return max(checks, key=_share_of_limit) if checks else None


def _share_of_limit(check: Check) -> float:
    """A ratio check's value as a fraction of its limit (NaN last)."""
    if check.limit is None or math.isnan(check.value):
        return -math.inf
    return check.value / check.limit


@dataclass(frozen=True)
class MetricChange:
    """One check of one tensor of one case, before (the baseline) and now."""

    case: str
    tensor: str
    check: str
    old: float
    new: float
    limit: float  # now
    regressed: bool
    passed: bool  # the check passes now

    @property
    def delta(self) -> float:
        return self.new - self.old


@dataclass(frozen=True)
class VerdictChange:
    """A case whose verdict differs from the baseline's."""

    case: str
    old: Verdict
    new: Verdict
    headline: str  # what happened now

    @property
    def worsened(self) -> bool:
        """Whether a passing case now fails or cannot be judged."""
        return self.old == PASS and self.new in (FAIL, ERROR)


@dataclass(frozen=True)
class TimeChange:
    """One operator call's median kernel time in the baseline and now (`bsa run --time` on both nights)."""

    case: str
    step: str  # forward | backward
    old_us: float
    new_us: float
    spread_us: float  # the larger interquartile range of the two runs
    regressed: bool

    @property
    def change(self) -> float:
        """The relative change of the median, +0.2 for 20% slower."""
        return self.new_us / self.old_us - 1 if self.old_us > 0 else math.inf


def time_changes(suite: SuiteResult, baseline: SuiteResult, threshold: float) -> tuple[TimeChange, ...]:
    """Return each timed call of a case in both runs, regressed when `new > old * (1 + threshold) + spread`."""
    before = {(c.name, t.step): t for c in baseline.cases for t in c.kernel_time}
    changes = []
    for case in suite.cases:
        for time in case.kernel_time:
            old = before.get((case.name, time.step))
            if old is not None:
                spread = max(old.spread_us, time.spread_us)
                regressed = time.median_us > old.median_us * (1 + threshold) + spread
                changes.append(TimeChange(case.name, time.step, old.median_us, time.median_us, spread, regressed))
    return tuple(changes)


@dataclass(frozen=True)
class Drift:
    """This run against a baseline report: every metric's change, regressions, verdict changes, vanished
    and appeared cases."""

    baseline: Night
    margin: Margin
    changes: tuple[MetricChange, ...]
    verdicts: tuple[VerdictChange, ...]
    vanished: tuple[str, ...]  # in the baseline, not in this run
    appeared: tuple[str, ...]  # in this run, not in the baseline
    compared: int = 0  # cases in both
    notes: tuple[str, ...] = field(default=())  # e.g. the device differs from the baseline's
    inputs_changed: tuple[str, ...] = ()  # in both, on other input bytes: their figures are not drift
    times: tuple[TimeChange, ...] = ()  # kernel times of the calls timed in both runs
    time_threshold: float = TIME_THRESHOLD

    @property
    def slower(self) -> tuple[TimeChange, ...]:
        """The kernel time regressions, the largest first: reported apart from precision (exit code 4)."""
        return tuple(sorted((t for t in self.times if t.regressed), key=lambda t: -t.change))

    @property
    def regressions(self) -> tuple[MetricChange, ...]:
        """The changes that grew beyond the margin, largest growth (in limits) first."""
        found = [c for c in self.changes if c.regressed]
        return tuple(sorted(found, key=lambda c: -_growth(c)))

    @property
    def worsened(self) -> tuple[VerdictChange, ...]:
        return tuple(v for v in self.verdicts if v.worsened)

    @property
    def problems(self) -> int:
        """Regressions, cases gone from PASS to FAIL or ERROR, and vanished cases: what
        `--fail-on-regression` turns into exit code 1."""
        return len(self.regressions) + len(self.worsened) + len(self.vanished)

    def return_code(self, suite_code: int, fail_on_regression: bool) -> int:
        """The exit code of `bsa compare --baseline`: the suite's, except that with `fail_on_regression`
        a run that would exit 0 exits 1 when there are problems (a higher code is kept)."""
        regressed = fail_on_regression and self.problems > 0
        failed = suite_code == ExitCode.FAILED or regressed
        return int(exit_code(unjudged=suite_code == ExitCode.UNJUDGED, failed=failed, slower=bool(self.slower)))

    def counts_line(self) -> str:
        """E.g. "35 cases compared, 1 regression, 0 passed before and not now, 0 vanished, 0 appeared"."""
        parts = [
            f"{self.compared} case{'s' if self.compared != 1 else ''} compared",
            _count(len(self.regressions), "regression"),
            f"{len(self.worsened)} passed before and not now",
            f"{len(self.vanished)} vanished",
            f"{len(self.appeared)} appeared",
        ]
        if self.times:  # only runs timed on both nights compare times
            parts.append(f"{len(self.slower)} of {_count(len(self.times), 'timed call')} slower")
        return ", ".join(parts)

    def summary_line(self) -> str:
        """E.g. "drift against 2026-11-29 02:00 reference (bsa emulate): 35 cases compared, 1 regression, ..."."""
        return f"drift against {self.baseline.label}: {self.counts_line()}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _growth(change: MetricChange) -> float:
    delta = change.delta
    return delta / change.limit if math.isfinite(delta) else math.inf


def compare_with_baseline(
    suite: SuiteResult,
    baseline: Night,
    margin: Margin | None = None,
    devices: Sequence[str] = (),
    time_threshold: float = TIME_THRESHOLD,
) -> Drift:
    """Compare this run's results with a baseline report's, case by case (by name), tensor by tensor and
    check by check (by name); checks without a positive limit (structural ones) are left to the verdict.

    Args:
        devices: who produced this run's outputs, in words (`report.suite_devices`): a note says when the
            baseline's came from another device.
    """
    margin = margin or Margin()
    before = {case.name: case for case in baseline.suite.cases}
    now = {case.name: case for case in suite.cases}
    changes: list[MetricChange] = []
    verdicts: list[VerdictChange] = []
    inputs_changed: list[str] = []
    for case in suite.cases:
        old_case = before.get(case.name)
        if old_case is None:
            continue
        if old_case.verdict != case.verdict:
            verdicts.append(VerdictChange(case.name, old_case.verdict, case.verdict, case.headline))
        if inputs_differ(old_case, case):
            inputs_changed.append(case.name)
            continue
        old_checks = {(c.tensor, c.name): c for c in ratio_checks(old_case)}
        for check in ratio_checks(case):
            old = old_checks.get((check.tensor, check.name))
            if old is None:
                continue
            assert check.limit is not None and check.tensor is not None
            regressed = margin.regressed(old.value, check.value, check.limit)
            figures = (old.value, check.value, check.limit, regressed, check.passed)
            changes.append(MetricChange(case.name, check.tensor, check.name, *figures))
    vanished = tuple(name for name in before if name not in now)
    appeared = tuple(name for name in now if name not in before)
    notes = []
    now_devices = tuple(devices)
    if baseline.devices and now_devices and set(baseline.devices) != set(now_devices):
        notes.append(
            f"the baseline's outputs came from {', '.join(baseline.devices)}; this run's from {', '.join(now_devices)}"
        )
    if inputs_changed:
        more = len(inputs_changed) - 8
        shown = ", ".join(inputs_changed[:8]) + (f" and {more} more" if more > 0 else "")
        notes.append(
            f"inputs changed since the baseline (another spec, seed or bsa version) for "
            f"{_count(len(inputs_changed), 'case')}: {shown}; their figures are not drift"
        )
    compared = sum(1 for name in now if name in before)
    cases = (tuple(changes), tuple(verdicts), vanished, appeared, compared)
    times = time_changes(suite, baseline.suite, time_threshold)
    return Drift(baseline, margin, *cases, tuple(notes), tuple(inputs_changed), times, time_threshold)


def inputs_differ(old: CaseResult, new: CaseResult) -> bool:
    """Whether two results of a case ran on other input bytes (unknown, as in older reports: no)."""
    return old.inputs_sha256 is not None and new.inputs_sha256 is not None and old.inputs_sha256 != new.inputs_sha256


#: The `Drift` lists the JSON report's drift summary counts, in its order.
DRIFT_COUNTS = ("regressions", "worsened", "vanished", "appeared", "inputs_changed")


def drift_document(drift: Drift) -> dict[str, Any]:
    """Return the `drift` object of the JSON report (the `regressions` list is `regressions_document`)."""
    night = drift.baseline
    return {
        "baseline": {
            "file": night.source,
            "date": _iso(night.date),
            "host": night.host,
            "version": night.version,
            "devices": list(night.devices),
        },
        "margin": {"relative": drift.margin.relative, "absolute": drift.margin.absolute},
        "summary": {"compared": drift.compared, **{key: len(getattr(drift, key)) for key in DRIFT_COUNTS}},
        "notes": list(drift.notes),
        "verdict_changes": [
            {"case": v.case, "old": v.old, "new": v.new, "worsened": v.worsened, "headline": v.headline}
            for v in drift.verdicts
        ],
        "vanished": list(drift.vanished),
        "appeared": list(drift.appeared),
        "inputs_changed": list(drift.inputs_changed),
        "changes": [_change_document(c) for c in drift.changes],
        **({"kernel_time": _times_document(drift)} if drift.times else {}),
    }


def _times_document(drift: Drift) -> dict[str, Any]:
    """Return the drift's kernel times: the threshold, and every call timed in both runs."""
    changes = [
        {
            "case": t.case,
            "step": t.step,
            "old_us": json_number(t.old_us),
            "new_us": json_number(t.new_us),
            "change": json_number(t.change),
            "spread_us": json_number(t.spread_us),
            "regressed": t.regressed,
        }
        for t in drift.times
    ]
    return {"threshold": drift.time_threshold, "slower": len(drift.slower), "changes": changes}


def regressions_document(drift: Drift) -> list[dict[str, Any]]:
    """Return the top-level `regressions` list of the JSON report."""
    return [_change_document(c) for c in drift.regressions]


def _change_document(change: MetricChange) -> dict[str, Any]:
    return {
        "case": change.case,
        "tensor": change.tensor,
        "check": change.check,
        "old": json_number(change.old),
        "new": json_number(change.new),
        "delta": json_number(change.delta),
        "limit": json_number(change.limit),
        "regressed": change.regressed,
        "passed": change.passed,
    }


def _iso(moment: _dt.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="seconds")


# ---- trends across nights -------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """A case in one night: its verdict and the followed check's value and limit (None: not measured)."""

    verdict: Verdict
    value: float | None
    limit: float | None
    detail: str  # the check's text, or the case's headline
    inputs_changed: bool = False  # the case ran on other input bytes than the night before it was in


@dataclass(frozen=True)
class Series:
    """One case across the nights: the check it follows (tensor and name) and one point per night
    (None where the case is missing that night)."""

    case: str
    tensor: str | None
    check: str | None
    points: tuple[Point | None, ...]
    rising: bool  # the last value grew beyond the margin from the first, and the fitted slope is positive

    @property
    def label(self) -> str:
        return f"{self.tensor} {self.check}" if self.check else "no ratio check"

    @property
    def values(self) -> list[float | None]:
        return [p.value if p is not None else None for p in self.points]


@dataclass(frozen=True)
class Trend:
    nights: tuple[Night, ...]  # ordered by date
    series: tuple[Series, ...]  # by case name
    #: Each timed call across the nights (`bsa run --time`): its first and last night compared as
    #: `time_changes` compares a run with its baseline.
    times: tuple[TimeSeries, ...] = ()

    @property
    def rising(self) -> tuple[Series, ...]:
        return tuple(s for s in self.series if s.rising)


@dataclass(frozen=True)
class TimeSeries:
    """One timed call of a case across the nights: its median per night (None: not timed that night), and the
    change from the first timed night to the last."""

    case: str
    step: str
    medians: tuple[float | None, ...]
    last: TimeChange  # first timed night against the last


def time_series(nights: Sequence[Night], threshold: float = TIME_THRESHOLD) -> tuple[TimeSeries, ...]:
    """Return every call timed in at least two of the (ordered) nights."""
    by_night = [{(c.name, t.step): t for c in night.suite.cases for t in c.kernel_time} for night in nights]
    found = []
    for case, step in sorted({key for night in by_night for key in night}):
        times = [night.get((case, step)) for night in by_night]
        measured = [t for t in times if t is not None]
        if len(measured) >= 2:
            first, last = measured[0], measured[-1]
            spread = max(first.spread_us, last.spread_us)
            regressed = last.median_us > first.median_us * (1 + threshold) + spread
            change = TimeChange(case, step, first.median_us, last.median_us, spread, regressed)
            found.append(TimeSeries(case, step, tuple(None if t is None else t.median_us for t in times), change))
    return tuple(found)


def order_nights(nights: Iterable[Night]) -> tuple[Night, ...]:
    """Return the nights by date, oldest first (equal dates in the order given).

    Raises:
        ValueError: a night has no date (a report from before reports carried one).
    """
    nights = list(nights)
    for night in nights:
        if night.date is None:
            raise ValueError(
                f"{night.source}: the report has no date (written by an older bsa); "
                "judge the outputs again with `bsa compare --json` to get one"
            )
    return tuple(sorted(nights, key=lambda n: n.date or _dt.datetime.min))


def trend(nights: Sequence[Night], margin: Margin | None = None) -> Trend:
    """Follow every case across the nights (ordered by date): per case the check that decides it in the
    latest night that has one (`deciding_ratio`), its value and limit in every night.

    Raises:
        ValueError: a night has no date.
    """
    margin = margin or Margin()
    ordered = order_nights(nights)
    by_night = [{case.name: case for case in night.suite.cases} for night in ordered]
    series = [_series(name, by_night, margin) for name in sorted({name for cases in by_night for name in cases})]
    return Trend(ordered, tuple(series), time_series(ordered))


def _series(name: str, by_night: Sequence[Mapping[str, CaseResult]], margin: Margin) -> Series:
    followed: Check | None = None
    for cases in reversed(by_night):
        case = cases.get(name)
        if case is not None and (followed := deciding_ratio(case)) is not None:
            break
    points: list[Point | None] = []
    previous: CaseResult | None = None
    for cases in by_night:
        case = cases.get(name)
        if case is None:
            points.append(None)
            continue
        changed = previous is not None and inputs_differ(previous, case)
        previous = case
        check = None
        if followed is not None:
            key = (followed.tensor, followed.name)
            check = next((c for c in ratio_checks(case) if (c.tensor, c.name) == key), None)
        note = "inputs changed since the night before; " if changed else ""
        if check is None:
            points.append(Point(case.verdict, None, None, note + case.headline, changed))
            continue
        detail = check.detail
        if case.verdict != PASS and case.headline and case.headline != check.detail:
            detail = f"{case.headline}; charted: {check.detail}"  # what failed that night (the bias check's score, say)
        points.append(Point(case.verdict, check.value, check.limit, note + detail, changed))
    if followed is None:
        return Series(name, None, None, tuple(points), False)
    return Series(name, followed.tensor, followed.name, tuple(points), _rising(points, margin))


def _rising(points: Sequence[Point | None], margin: Margin) -> bool:
    """Whether the last value grew beyond the margin from the first and a least-squares line rises, over the
    nights since the case's inputs last changed (a change of inputs is not a trend)."""
    changes = [i for i, p in enumerate(points) if p is not None and p.inputs_changed]
    if changes:
        points = points[changes[-1] :]
    measured = [
        (i, p.value, p.limit)
        for i, p in enumerate(points)
        if p is not None and p.value is not None and p.limit is not None and math.isfinite(p.value)
    ]
    if len(measured) < 2:
        return False
    (_, first, _), (_, last, limit) = measured[0], measured[-1]
    xs = [float(i) for i, _, _ in measured]
    ys = [v for _, v, _ in measured]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return slope > 0 and margin.regressed(first, last, limit)
