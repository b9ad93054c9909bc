"""The page of `bsa trend`: every case's deciding ratio across nights, one inline SVG line chart per case.

Self-contained like the HTML report (`page.py`): inline CSS and SVG, no script, font or link. The page
lists the nights (date in UTC, device, host, bsa, counts, file), a table of the cases (the followed check,
first and last value, rising ones marked), then one chart per case (rising cases first, then those not
passing in their latest night, then the rest): nights along x in date order, the
check's value along y from 0, its limit as a dashed red line, points coloured by the night's verdict
(PASS green, FAIL red, ERROR purple, drawn on the x axis as a hollow mark), a gap where the case is
missing from a night, and a tooltip per point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from ..compare import ERROR, FAIL, PASS, SKIP
from ..compare.drift import Night, Point, Series, Trend
from ..ops import split_folder_name
from .files import write_text_atomic
from .formatting import fmt, plural, results_of, summary_line
from .style import BASE_CSS, SVG_FONT, esc, html_table

COLOURS = {PASS: "#16702a", FAIL: "#b3001b", ERROR: "#8a1a8a", SKIP: "#6a6f78"}
LIMIT_COLOUR = "#b3001b"
LINE_COLOUR = "#4a6fa5"

_CSS = (
    BASE_CSS
    + """
h2{font-size:1.1em;margin:1em 0 .4em}
tr.rising td{background:#fbe3e6}td.flag{color:var(--fail);font-weight:700}
table.nights td:nth-child(2){white-space:nowrap}
.sub{color:#555}
.charts{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}
figure.case{margin:0;border:1px solid #eee;padding:.3em .4em}
figure.case figcaption{font-size:.9em;margin-bottom:.2em}
figure.case svg{display:block;background:#fff}
"""
)


def _nice_step(span: float) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving 4 to 10 ticks over `span`."""
    raw = span / 5 if span > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * power >= raw:
            return factor * power
    return 10 * power


def chart(series: Series, nights: Sequence[Night]) -> str:
    """Return the SVG line chart of one case across the nights."""
    left, right, top, plot_h = 48.0, 56.0, 22.0, 130.0
    bottom = top + plot_h
    step = max(28.0, min(70.0, 520.0 / max(len(nights), 1)))
    plot_w = step * max(len(nights) - 1, 1)
    width, height = left + plot_w + right + 20, top + plot_h + 58
    values = [p.value for p in series.points if p is not None and p.value is not None and math.isfinite(p.value)]
    limits = [p.limit for p in series.points if p is not None and p.limit is not None and math.isfinite(p.limit)]
    y_top = max([*values, *limits, 1e-12]) * 1.15
    tick = _nice_step(y_top)
    y_top = math.ceil(y_top / tick) * tick

    def x_of(i: int) -> float:
        return left + 10 + (step * i if len(nights) > 1 else plot_w / 2)

    def y_of(v: float) -> float:
        return top + plot_h - plot_h * min(max(v, 0.0), y_top) / y_top

    out = []
    for k in range(int(round(y_top / tick)) + 1):
        v = k * tick
        y = y_of(v)
        out.append(f'<line x1="{left:.1f}" y1="{y:.1f}" x2="{width - right:.1f}" y2="{y:.1f}" stroke="#ececec"/>')
        out.append(f'<text x="{left - 4:.1f}" y="{y + 3.5:.1f}" text-anchor="end">{esc(fmt(v, 3))}</text>')
    for y1, x2 in ((bottom, width - right), (top, left)):  # the x axis, the y axis
        out.append(f'<line class="axis" x1="{left:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{bottom:.1f}" stroke="#555"/>')
    out.append(_limit_line(series.points, x_of, y_of, left, width - right))
    label_every = max(1, math.ceil(34.0 / step))
    for i, night in enumerate(nights):
        if i % label_every == 0 or i == len(nights) - 1:
            x, y = x_of(i), bottom + 10
            when = night.date.strftime("%m-%d %H:%M") if night.date else "undated"  # month-day and time in UTC
            out.append(f'<line x1="{x:.1f}" y1="{bottom:.1f}" x2="{x:.1f}" y2="{bottom + 3:.1f}" stroke="#555"/>')
            out.append(
                f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="end" transform="rotate(-35 {x:.1f} {y:.1f})">'
                f"{esc(when)}</text>"
            )
    out.append(f'<text x="4" y="{top - 10:.1f}">{esc(series.label)}</text>')
    out.extend(_line(series.points, x_of, y_of))
    for i, point in enumerate(series.points):
        if point is not None:
            out.append(_marker(point, nights[i], x_of(i), y_of, top, plot_h))
    return (
        f'<svg width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f'aria-label="{esc(series.case)}: {esc(series.label)} across {len(nights)} nights" style="{SVG_FONT}">'
        f"{''.join(out)}</svg>"
    )


def _limit_line(points: Sequence[Point | None], x_of, y_of, x0: float, x1: float) -> str:  # type: ignore[no-untyped-def]
    """The limit as a dashed red line: one line when every night has the same limit, else steps per night."""
    limits = [(i, p.limit) for i, p in enumerate(points) if p is not None and p.limit is not None]
    if not limits:
        return ""
    if len({limit for _, limit in limits}) == 1:
        limit = limits[0][1]
        y = y_of(limit)
        return _limit_segment(x0, x1, y, limit) + (
            f'<text x="{x1 + 3:.1f}" y="{y + 3.5:.1f}" fill="{LIMIT_COLOUR}">limit {esc(fmt(limit))}</text>'
        )
    return "".join(_limit_segment(x_of(i) - 10, x_of(i) + 10, y_of(limit), limit) for i, limit in limits)


def _limit_segment(x0: float, x1: float, y: float, limit: float) -> str:
    return (
        f'<line class="limit" x1="{x0:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" stroke="{LIMIT_COLOUR}" '
        f'stroke-dasharray="5 3" stroke-width="1.2"><title>limit {esc(fmt(limit))}</title></line>'
    )


def _line(points: Sequence[Point | None], x_of, y_of) -> list[str]:  # type: ignore[no-untyped-def]
    """Polylines through consecutive measured nights; a night without a value breaks the line."""
    runs: list[list[str]] = [[]]
    for i, point in enumerate(points):
        if point is None or point.value is None or math.isnan(point.value):
            runs.append([])
            continue
        runs[-1].append(f"{x_of(i):.1f},{y_of(point.value):.1f}")
    return [
        f'<polyline class="trend" points="{" ".join(run)}" fill="none" stroke="{LINE_COLOUR}" stroke-width="1.5"/>'
        for run in runs
        if len(run) > 1
    ]


def _marker(point: Point, night: Night, x: float, y_of, top: float, plot_h: float) -> str:  # type: ignore[no-untyped-def]
    colour = COLOURS.get(point.verdict, "#555")
    tip = f"<title>{esc(f'{night.label}: {point.verdict}; {point.detail}')}</title>"
    if point.value is None or math.isnan(point.value):  # not measured that night (ERROR, or the check absent)
        return (
            f'<circle class="point v-{esc(point.verdict)}" cx="{x:.1f}" cy="{top + plot_h:.1f}" r="4.5" fill="#fff" '
            f'stroke="{colour}" stroke-width="2">{tip}</circle>'
        )
    if math.isinf(point.value):  # off the chart: a triangle at the top
        return (
            f'<polygon class="point v-{esc(point.verdict)}" points="{x - 5:.1f},{top + 6:.1f} {x + 5:.1f},'
            f'{top + 6:.1f} {x:.1f},{top - 2:.1f}" fill="{colour}">{tip}</polygon>'
        )
    return (
        f'<circle class="point v-{esc(point.verdict)}" cx="{x:.1f}" cy="{y_of(point.value):.1f}" r="4" '
        f'fill="{colour}" stroke="#fff" stroke-width="1">{tip}</circle>'
    )


def _nights_table(nights: Sequence[Night]) -> str:
    rows = []
    for i, night in enumerate(nights, 1):
        when = night.date.isoformat(timespec="seconds") if night.date else "-"
        texts = (when, ", ".join(night.devices) or "-", night.host or "-", night.version or "-")
        rows.append([str(i), *(esc(t) for t in texts), esc(summary_line(night.suite)), esc(night.source)])
    headers = ("#", "date (UTC)", "device", "host", "bsa", "cases", "report")
    return html_table(headers, rows, "nights", numeric=(0,))


def shown_order(trend: Trend) -> list[Series]:
    """The cases as the page shows them: rising ones first, then those not passing in their latest night,
    then the others, each group by name."""

    def latest_verdict(series: Series) -> str:
        return next((p.verdict for p in reversed(series.points) if p is not None), PASS)

    return sorted(trend.series, key=lambda s: (not s.rising, latest_verdict(s) == PASS, s.case))


def _cases_table(trend: Trend) -> str:
    rows = []
    for series in shown_order(trend):
        measured = [v for v in series.values if v is not None]
        first, last = (fmt(measured[0]), fmt(measured[-1])) if measured else ("-", "-")
        limits = [p.limit for p in series.points if p is not None and p.limit is not None]
        cls = ' class="rising"' if series.rising else ""
        rows.append(
            f'<tr{cls}><td><a href="#trend-{esc(series.case)}">{esc(series.case)}</a></td>'
            f'<td>{esc(series.label)}</td><td class="num">{esc(first)}</td>'
            f'<td class="num">{esc(last)}</td><td class="num">{esc(fmt(limits[-1]) if limits else "-")}</td>'
            f'<td class="num">{sum(p is not None for p in series.points)} of {len(series.points)}</td>'
            f'<td class="flag">{"rising" if series.rising else ""}</td></tr>'
        )
    head = "".join(f"<th>{h}</th>" for h in ("case", "followed check", "first", "last", "limit", "nights", "trend"))
    return f'<table class="trend-cases"><tr>{head}</tr>{"".join(rows)}</table>'


def _followed(trend: Trend) -> str:
    """Return what the trend follows: "28 cases", or with op folders (`NAME@forward`) "52 results of 13 cases"."""
    return results_of([split_folder_name(s.case) for s in trend.series])


def trend_html(trend: Trend) -> str:
    """Return the self-contained trend page (no script, no external file, font or link)."""
    nights = trend.nights
    title = f"bsa trend: {_followed(trend)} over {len(nights)} nights"
    rising = len(trend.rising)
    figures = [
        f'<figure class="case" id="trend-{esc(s.case)}"><figcaption><b>{esc(s.case)}</b> '
        f'<span class="sub">{esc(s.label)}</span></figcaption>{chart(s, nights)}</figure>'
        for s in shown_order(trend)
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">',
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
            f'<header class="top"><h1>{esc(title)}</h1><p class="sub">{rising} rising (last value beyond the '
            "regression margin above the first, and a rising fitted line). Each chart follows the check that decides "
            "the case in its latest night; the dashed red line is its limit; points are coloured by verdict "
            "(PASS green, FAIL red, ERROR purple, hollow on the axis when not measured); a gap: the case was not "
            "in that night's report.</p></header>",
            "<main><h2>Nights</h2>",
            _nights_table(nights),
            "<h2>Cases</h2>",
            _cases_table(trend),
            _times_table(trend),
            '<div class="charts">',
            *figures,
            "</div></main></body></html>\n",
        ]
    )


def write_trend_html(trend: Trend, path: Path) -> None:
    """Write the trend page to `path` (atomically)."""
    write_text_atomic(Path(path), trend_html(trend))


def render_trend(trend: Trend, console: Console) -> None:
    """Print the nights, then the rising cases (first and last value of the followed check) and a summary."""
    for i, night in enumerate(trend.nights, 1):
        console.print(Text(f"night {i}: {night.label} ({summary_line(night.suite)}) {night.source}"), soft_wrap=True)
    for series in trend.rising:
        measured = [v for v in series.values if v is not None]
        limits = [p.limit for p in series.points if p is not None and p.limit is not None]
        text = f"{series.case} {series.label} {fmt(measured[0])} -> {fmt(measured[-1])} (limit {fmt(limits[-1])})"
        console.print(Text(f"rising: {text}", style="bold red"), soft_wrap=True)
    for times in trend.times:
        change, style = times.last, "bold red" if times.last.regressed else ""
        word = "slower" if change.regressed else "kernel time"
        moved = f"{change.old_us:.1f} us -> {change.new_us:.1f} us ({100 * change.change:+.1f}%)"
        text = f"{word}: {times.case} {times.step} {moved}"
        console.print(Text(text, style=style), soft_wrap=True)
    rising = len(trend.rising)
    text = f"{_followed(trend)} over {plural(len(trend.nights), 'night')}: {rising} rising"
    if trend.times:
        text += f", {sum(t.last.regressed for t in trend.times)} of {plural(len(trend.times), 'timed call')} slower"
    console.print(Text(text, style="bold red" if rising else "bold green"))


def _times_table(trend: Trend) -> str:
    """The kernel times across the nights (`bsa run --time`): each timed call's median per night."""
    if not trend.times:
        return ""
    headers = ("case", "step", *(f"night {i} us" for i in range(1, len(trend.nights) + 1)), "first -> last")
    rows = [
        [
            esc(t.case),
            esc(t.step),
            *("-" if m is None else f"{m:.1f}" for m in t.medians),
            f"{100 * t.last.change:+.1f}%" + (" slower" if t.last.regressed else ""),
        ]
        for t in trend.times
    ]
    numeric = tuple(range(2, len(headers)))
    return "<h2>Kernel time (median per night)</h2>" + html_table(headers, rows, numeric=numeric)
