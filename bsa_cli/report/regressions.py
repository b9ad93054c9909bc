"""The drift section of the terminal and HTML reports: this run against a baseline report.

Both render the same `drift.Drift`: a summary line, then the regressions (checks whose value grew beyond
the margin, passing or not), the cases whose verdict changed, and the cases that vanished or appeared.
The HTML table also shows, per case and tensor, the check closest to its limit, so a reader sees what
did not move as well; regressions come first and are highlighted.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.text import Text

from ..compare import ERROR, FAIL, PASS, SKIP
from ..compare.drift import Drift, MetricChange
from .formatting import fmt
from .style import esc, html_table
from .terminal import titled_table

CSS = """
section.drift{margin:1em 0 1.2em}
section.drift h2{font-size:1.1em;margin:.6em 0 .3em}
table.drift tr.regressed td{background:#fbe3e6}
table.drift tr.regressed td.flag{color:var(--fail);font-weight:700}
td.up{color:var(--fail)}td.down{color:var(--pass)}
"""

#: Rows of the HTML drift table (regressions first); the JSON report holds every change.
MAX_ROWS = 400


def _delta(change: MetricChange) -> str:
    delta = change.delta
    if not math.isfinite(delta):
        return fmt(delta)
    share = f" ({100 * delta / change.old:+.0f}%)" if change.old > 0 and math.isfinite(change.old) else ""
    return f"{delta:+.4g}{share}"


def render_drift(drift: Drift, console: Console) -> None:
    """Print the drift section: regressions, verdict changes, vanished and appeared cases, a summary line."""
    if drift.regressions:
        title = f"regressions since {drift.baseline.label}"
        wide = max(len(c.case) for c in drift.regressions) + len("tensor check before now change limit passes") + 40
        if console.width >= wide:
            columns = ("case", "tensor", "check", "before", "now", "change", "limit", "passes")
            table = titled_table(console, title, columns, columns[3:7], overflow="fold")
            for column in table.columns:
                column.no_wrap = column.header in ("case", "check")
            for c in drift.regressions:
                passes = "yes" if c.passed else Text("no", style="bold red")
                table.add_row(c.case, c.tensor, c.check, fmt(c.old), fmt(c.new), _delta(c), fmt(c.limit), passes)
            console.print(table)
        else:  # a narrow terminal: one line per regression keeps every name whole
            console.print(Text(title + ":", style="bold"), soft_wrap=True)
            for change in drift.regressions:
                passes = "still passes" if change.passed else "fails"
                line = (
                    f"  {change.case} {change.tensor} {change.check}: {fmt(change.old)} -> {fmt(change.new)}, "
                    f"{_delta(change)}, limit {fmt(change.limit)}, {passes}"
                )
                console.print(Text(line, style="" if change.passed else "bold red"), soft_wrap=True)
    for v in drift.verdicts:
        style = "bold red" if v.worsened else "green" if v.new == PASS else ""
        console.print(Text(f"{v.case}: {v.old} -> {v.new}: {v.headline}", style=style), soft_wrap=True)
    if vanished := ", ".join(drift.vanished):
        console.print(Text(f"vanished since the baseline: {vanished}", style="bold red"), soft_wrap=True)
    if drift.appeared:
        console.print(Text(f"new since the baseline: {', '.join(drift.appeared)}"), soft_wrap=True)
    for t in drift.slower:
        line = (
            f"{t.case} {t.step}: kernel {t.old_us:.1f} us -> {t.new_us:.1f} us ({100 * t.change:+.1f}%; threshold "
            f"+{100 * drift.time_threshold:g}% beyond the runs' spread of {t.spread_us:.1f} us): slower"
        )
        console.print(Text(line, style="bold red"), soft_wrap=True)
    for note in drift.notes:
        console.print(Text(f"Note: {note}", style="yellow"), soft_wrap=True)
    margin = f"margin: +{100 * drift.margin.relative:g}% and +{drift.margin.absolute:g} x limit"
    style = "bold red" if drift.problems or drift.slower else "bold green"
    console.print(Text(f"{drift.summary_line()} ({margin})", style=style), soft_wrap=True)


def _rows(drift: Drift) -> list[MetricChange]:
    """Regressions, then per case and tensor the check closest to its limit now (once each)."""
    chosen: list[MetricChange] = list(drift.regressions)
    seen = {(c.case, c.tensor, c.check) for c in chosen}
    closest: dict[tuple[str, str], MetricChange] = {}
    for change in drift.changes:
        key = (change.case, change.tensor)
        best = closest.get(key)
        if best is None or _share(change) > _share(best):
            closest[key] = change
    chosen += [c for c in closest.values() if (c.case, c.tensor, c.check) not in seen]
    return chosen[:MAX_ROWS]


def _share(change: MetricChange) -> float:
    return change.new / change.limit if not math.isnan(change.new) else -math.inf


def drift_html(drift: Drift) -> str:
    """Return the drift section of the HTML report (a `<section class="drift">`)."""
    night = drift.baseline
    margin = f"+{100 * drift.margin.relative:g}% and +{drift.margin.absolute:g} x the limit"
    parts = [
        f'<section class="drift" id="drift"><h2>Drift since the baseline</h2>'
        f"<p><b>{esc(drift.counts_line())}</b></p>"
        f'<p class="sub">baseline {esc(night.source)}: {esc(night.label)}; a regression grew by more than '
        f"{esc(margin)}</p>"
    ]
    parts.extend(f'<p class="note">{esc(note)}</p>' for note in drift.notes)
    if drift.verdicts:
        rows = [
            [f'<a href="#case-{esc(v.case)}">{esc(v.case)}</a>', _badge(v.old), _badge(v.new), esc(v.headline)]
            for v in drift.verdicts
        ]
        parts.append(html_table(("case", "before", "now", "what happened now"), rows, "drift verdicts", ()))
    for title, names in (("vanished since the baseline", drift.vanished), ("new since the baseline", drift.appeared)):
        if names:
            cls = "warn" if title.startswith("vanished") else "sub"
            parts.append(f'<p class="{cls}">{esc(title)}: {esc(", ".join(names))}</p>')
    rows_html = []
    for change in _rows(drift):
        direction = "up" if change.delta > 0 else "down" if change.delta < 0 else ""
        link = f'<a href="#case-{esc(change.case)}">{esc(change.case)}</a>'
        numbers = [fmt(change.old), fmt(change.new), _delta(change), fmt(change.limit)]
        classes = ["num", "num", f"num {direction}".strip(), "num"]
        tds = "".join(f"<td>{text}</td>" for text in (link, esc(change.tensor), esc(change.check)))
        tds += "".join(f'<td class="{cls}">{esc(text)}</td>' for cls, text in zip(classes, numbers, strict=True))
        tds += f'<td class="flag">{"REGRESSION" if change.regressed else ""}</td>'
        row_class = ' class="regressed"' if change.regressed else ""
        rows_html.append(f"<tr{row_class}>{tds}</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("case", "tensor", "check", "before", "now", "change", "limit", ""))
    if rows_html:
        parts.append(f'<table class="drift"><tr>{head}</tr>{"".join(rows_html)}</table>')
    parts.append("</section>")
    return "".join(parts)


def _badge(verdict: str) -> str:
    cls = verdict if verdict in (PASS, FAIL, ERROR, SKIP) else ""
    return f'<span class="badge {cls}">{esc(verdict)}</span>'
