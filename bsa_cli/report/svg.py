"""Pictures of a failing tensor as inline SVG: the error heat map, the worst block's tiles, the ULP chart.

Everything is drawn as plain SVG elements with a `<title>` per cell (the browser's tooltip): no script,
no font or file from elsewhere. Colours (`score_colour`) are shared by the pictures and their legend:

* not computed (a block the mask leaves out): white, hatched in grey;
* at or below the benchmark's error (ratio <= 1): pale green, outlined, so it stays visible on white;
* between the benchmark's error and the limit: pale yellow to orange; at the limit and above: red to
  dark red (log scale); NaN/Inf in the block: near black.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..compare import BlockMap, HotBlock, Selection, TensorResult, UlpChart
from ..standards.bias import Bias
from .formatting import fmt, query_axis
from .style import SVG_FONT, esc

NOT_COMPUTED = "url(#bsa-hatch)"
AT_BENCHMARK = "#cfe8cf"
NONFINITE = "#1b0a2a"
CELL_STROKE = "#8a8a8a"
_LOW = ((255, 243, 176), (253, 174, 97))  # just above the benchmark's error .. just below the limit
_HIGH = ((244, 109, 67), (120, 0, 30))  # the limit .. the top of the scale
#: Heat-map panels (batch entry, head) drawn per tensor: the hottest, in (b, n) order.
MAX_PANELS = 8
#: Cells drawn per tensor heat map; larger grids are pooled (each cell covers f x f blocks).
MAX_CELLS = 6000


def _mix(pair: tuple[tuple[int, int, int], tuple[int, int, int]], t: float) -> str:
    t = min(max(t, 0.0), 1.0)
    rgb = [round(a + (b - a) * t) for a, b in zip(pair[0], pair[1], strict=True)]
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"


@dataclass(frozen=True)
class Scale:
    """The colour scale of one picture: ratio 1 is the benchmark's error, `limit` the check's limit."""

    limit: float
    top: float  # the largest finite ratio shown (the scale's end, at least 2 x limit)

    @classmethod
    def for_scores(cls, scores: Sequence[float] | np.ndarray, limit: float) -> Scale:
        """Return the scale for these ratios (NaN and Inf left out)."""
        values = np.asarray(scores, dtype=np.float64)
        finite = values[np.isfinite(values)]
        limit = limit if math.isfinite(limit) and limit > 1 else 3.0
        return cls(limit, max(float(finite.max()) if finite.size else 0.0, 2 * limit))

    def colour(self, score: float) -> str:
        """Return the fill of a computed cell of ratio `score`."""
        if math.isnan(score) or score == math.inf:
            return NONFINITE
        if score <= 1.0:  # -inf too
            return AT_BENCHMARK
        if score < self.limit:
            return _mix(_LOW, math.log(score) / math.log(self.limit))
        return _mix(_HIGH, math.log(score / self.limit) / max(math.log(self.top / self.limit), 1e-12))


_DEFS = (
    '<defs><pattern id="bsa-hatch" width="5" height="5" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="5" height="5" fill="#fff"/>'
    '<line x1="0" y1="0" x2="0" y2="5" stroke="#c4c4c4" stroke-width="1.6"/></pattern></defs>'
)


def _svg(width: float, height: float, body: str, label: str) -> str:
    return (
        f'<svg width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{esc(label)}" style="{SVG_FONT}">'
        f"{_DEFS}{body}</svg>"
    )


def _text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{esc(text)}</text>'


def _cell(x: float, y: float, size: float, fill: str, tip: str) -> str:
    """A square cell of a map, outlined, its figures in its tooltip."""
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{size:.1f}" height="{size:.1f}" '
        f'fill="{fill}" stroke="{CELL_STROKE}" stroke-width="0.5"><title>{esc(tip)}</title></rect>'
    )


def _outline(box: tuple[float, float, float, float], tip: str | None = None) -> str:
    """A box outlined in black over a map (the hottest block, the worst tile), with a tooltip if given."""
    x, y, w, h = box
    rect = f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="none" stroke="#000" '
    return rect + 'stroke-width="2.5"' + ("/>" if tip is None else f"><title>{esc(tip)}</title></rect>")


def _tick_step(count: int, cell: float) -> int:
    """Every how many blocks an axis gets an index (labels at least 18 px apart)."""
    for step in (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 256, 512):
        if step * cell >= 18 or step >= count:
            return step
    return max(count, 1)


def _ticks(ox: float, oy: float, grid: tuple[int, int], cell: float, per: int, first_row: int = 0) -> list[str]:
    """The indices along the top (columns, `per` apart) and the left (rows, from `first_row`) of a grid."""
    rows, cols = grid
    out = [_text(ox + (c + 0.5) * cell, oy - 4, str(c * per), "middle") for c in range(0, cols, _tick_step(cols, cell))]
    for r in range(0, rows, _tick_step(rows, cell)):
        out.append(_text(ox - 4, oy + (r + 0.5) * cell + 3.5, str(first_row + r * per), "end"))
    return out


# ---- the heat map ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Panel:
    batch: int
    head: int  # query head (dq) or kv head (dk, dv)
    rows: list[str]  # selection rows of the panel: q blocks x kv blocks ("1", "0", "-")
    heads: tuple[int, int]  # query heads the panel stands for (a kv head: its GQA group)
    scores: np.ndarray  # the tensor's block scores of this (batch, head): [blocks along its axis]


def _panel_rows(
    selection: Selection, batch: int, head: int, kind: str, group: int
) -> tuple[list[str], tuple[int, int]]:
    """Return the selection grid of a panel: a query head's own, or the union over a kv head's group."""
    if kind == "q":
        return selection.grid(batch, head), (head, head)
    first = head * group
    grids = [selection.grid(batch, h) for h in range(first, first + group)]
    rows = [
        "".join("1" if "1" in column else ("-" if set(column) == {"-"} else "0") for column in zip(*cells, strict=True))
        for cells in zip(*grids, strict=True)
    ]
    return rows, (first, first + group - 1)


def _panels(block_map: BlockMap, selection: Selection) -> tuple[list[_Panel], int]:
    """Return the panels to draw (the hottest MAX_PANELS, in (b, n) order) and how many there are in all."""
    batches, heads, _ = block_map.score.shape
    query_heads = selection.shape[1]
    group = max(query_heads // max(heads, 1), 1) if block_map.axis == "kv" else 1
    ranked = []
    for b in range(batches):
        for n in range(heads):
            scores = block_map.score[b, n]
            finite = scores[~np.isnan(scores)]
            if finite.size == 0:
                continue
            ranked.append((-float(np.max(np.where(np.isinf(finite), 1e300, finite))), b, n))
    chosen = sorted(sorted(ranked)[:MAX_PANELS], key=lambda item: (item[1], item[2]))
    panels = [
        _Panel(b, n, *_panel_rows(selection, b, n, block_map.axis, group), block_map.score[b, n]) for _, b, n in chosen
    ]
    return panels, len(ranked)


def heat_map(tensor: TensorResult, selection: Selection | None, limit: float) -> str:
    """Return the heat map of a tensor's error ratio per (head, query block, kv block) as SVG.

    With the case's block mask (`selection`) each panel is one head's grid of query blocks (rows) by kv
    blocks (columns); a computed cell shows the score of the block it feeds in this tensor (dq: its query
    block's, dk/dv: its kv block's); a kv head's panel shows its GQA group's union. The hottest block is
    outlined. Without the mask (too large to keep) the map shows heads by blocks along the tensor's axis.
    """
    block_map = tensor.block_map
    if block_map is None or block_map.score.size == 0:
        return ""
    scale = Scale.for_scores(block_map.score.reshape(-1), limit)
    if selection is None:
        return _strip_map(tensor, block_map, scale)
    panels, total = _panels(block_map, selection)
    if not panels:
        return ""
    n_q = max(len(p.rows) for p in panels)
    n_kv = max((len(p.rows[0]) if p.rows else 0) for p in panels)
    pool = 1
    while math.ceil(n_q / pool) * math.ceil(n_kv / pool) * len(panels) > MAX_CELLS:
        pool += 1
    rows, cols = math.ceil(n_q / pool), math.ceil(n_kv / pool)
    cell = min(22.0, max(4.0, 260.0 / max(rows, cols, 1)))
    title_h, margin_left, margin_top, gap = 22.0, 34.0, 34.0, 20.0
    panel_h = rows * cell
    label_w = max(len(_panel_label(block_map.axis, p)) for p in panels) * 6.1 - margin_left + 6
    panel_w = max(cols * cell, label_w)  # the slot of a panel: its grid, or its label when that is longer
    per_line = max(1, min(len(panels), 4, int(640 // (panel_w + margin_left + gap)) or 1))
    width = max(per_line * (margin_left + panel_w + gap) + 8, 330)
    height = title_h + math.ceil(len(panels) / per_line) * (margin_top + panel_h + gap)
    parts = []
    axis_q = "query block i" if pool == 1 else f"query blocks (x{pool})"
    axis_kv = "kv block j" if pool == 1 else f"kv blocks (x{pool})"
    for index, panel in enumerate(panels):
        ox = (index % per_line) * (margin_left + panel_w + gap) + margin_left
        oy = title_h + (index // per_line) * (margin_top + panel_h + gap) + margin_top
        parts.append(_panel_svg(tensor, panel, scale, (ox, oy), cell, pool))
    kind = "query head" if block_map.axis == "q" else "kv head"
    title = f"{tensor.name}: error ratio per ({kind}, {axis_q}, {axis_kv})"
    if total > len(panels):
        title += f"; the {len(panels)} hottest of {total} heads"
    axes = f"rows: {axis_q}; columns: {axis_kv}"
    body = _text(4, 12, title, extra=' font-weight="bold"') + _text(4, 26, axes) + "".join(parts)
    return _svg(max(width, len(title) * 6.3 + 10), height + 4, body, title)


def _panel_svg(
    tensor: TensorResult, panel: _Panel, scale: Scale, origin: tuple[float, float], cell: float, pool: int
) -> str:
    block_map = tensor.block_map
    assert block_map is not None
    hot = tensor.hot_blocks[0] if tensor.hot_blocks else None
    ox, oy = origin
    n_q = len(panel.rows)
    n_kv = len(panel.rows[0]) if panel.rows else 0
    rows, cols = math.ceil(n_q / pool), math.ceil(n_kv / pool)
    out = [_text(ox - 30, oy - 18, _panel_label(block_map.axis, panel), extra=' font-weight="bold"')]
    out.append(
        f'<rect x="{ox}" y="{oy}" width="{cols * cell:.1f}" height="{rows * cell:.1f}" '
        f'fill="{NOT_COMPUTED}" stroke="#777" stroke-width="1"/>'
    )
    out += _ticks(ox, oy, (rows, cols), cell, pool)
    what = "tile ratio" if block_map.rmse_benchmark is not None else "block RMSE / tensor RMSE"
    for r in range(rows):
        for c in range(cols):
            flat = "".join(panel.rows[i][c * pool : (c + 1) * pool] for i in range(r * pool, min((r + 1) * pool, n_q)))
            x, y = ox + c * cell, oy + r * cell
            q_range = (r * pool, min((r + 1) * pool, n_q) - 1)
            kv_range = (c * pool, min((c + 1) * pool, n_kv) - 1)
            where = f"b={panel.batch} n={panel.head} q block {_range(q_range)} x kv block {_range(kv_range)}"
            if "1" not in flat:
                if flat and all(ch == "-" for ch in flat):
                    out.append(
                        f'<rect x="{x:.1f}" y="{y:.1f}" width="{cell:.1f}" height="{cell:.1f}" fill="#fff">'
                        f"<title>{esc(where)}: no block (past the actual length)</title></rect>"
                    )
                continue
            blocks = range(q_range[0], q_range[1] + 1) if block_map.axis == "q" else range(kv_range[0], kv_range[1] + 1)
            values = [float(panel.scores[k]) for k in blocks if k < len(panel.scores)]
            values = [v for v in values if not math.isnan(v)] or [math.nan]
            score = max(values, key=lambda v: (math.isinf(v) and v > 0, v if math.isfinite(v) else 0.0))
            detail = _cell_detail(tensor, block_map, panel, blocks)
            tip = f"{where}: selected; {tensor.name} {what} {fmt(score, 4)}{detail}"
            out.append(_cell(x, y, cell, scale.colour(score), tip))
    if hot is not None and hot.batch == panel.batch and hot.head == panel.head:
        k = hot.block // pool
        if block_map.axis == "q":  # the row outlined, a triangle pointing left at it
            box = (ox, oy + k * cell, cols * cell, cell)
            marker_x, marker_y = ox + cols * cell + 3, oy + (k + 0.5) * cell
            corners = ((marker_x, marker_y), (marker_x + 7, marker_y - 5), (marker_x + 7, marker_y + 5))
        else:  # the column outlined, a triangle pointing up at it
            box = (ox + k * cell, oy, cell, rows * cell)
            marker_x, marker_y = ox + (k + 0.5) * cell, oy + rows * cell + 3
            corners = ((marker_x, marker_y), (marker_x - 5, marker_y + 7), (marker_x + 5, marker_y + 7))
        out.append(_outline(box, _hot_text(tensor, hot)))
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in corners)
        out.append(f'<polygon points="{points}" fill="#000"><title>{esc(_hot_text(tensor, hot))}</title></polygon>')
    return "".join(out)


def _panel_label(axis: str, panel: _Panel) -> str:
    label = f"b={panel.batch} n={panel.head}"
    if axis == "kv" and panel.heads[1] > panel.heads[0]:
        label += f" (q heads {panel.heads[0]}-{panel.heads[1]})"
    return label


def _range(bounds: tuple[int, int]) -> str:
    return str(bounds[0]) if bounds[0] == bounds[1] else f"{bounds[0]}-{bounds[1]}"


def _cell_detail(tensor: TensorResult, block_map: BlockMap, panel: _Panel, blocks: range) -> str:
    """The figures of the block a single (unpooled) cell feeds: RMSE against the benchmark's, max abs error."""
    if len(blocks) != 1:
        return ""
    k, size = blocks[0], block_map.block_size
    b, n = panel.batch, panel.head
    text = f"; block {tensor.name} rows {k * size}-{(k + 1) * size - 1}: RMSE {fmt(float(block_map.rmse[b, n, k]), 3)}"
    if block_map.rmse_benchmark is not None:
        text += f" (benchmark {fmt(float(block_map.rmse_benchmark[b, n, k]), 3)})"
    return text + f", max abs err {fmt(float(block_map.max_abs_err[b, n, k]), 3)}"


def _hot_text(tensor: TensorResult, hot: HotBlock) -> str:
    kind = "q block" if query_axis(tensor) else "kv block"
    text = f"hottest block: b={hot.batch} n={hot.head} {kind} {hot.block} (rows {hot.rows[0]}-{hot.rows[1] - 1})"
    if hot.tile is not None:
        text += f"; worst 16x16 tile at s={hot.tile[0]}, d={hot.tile[1]}: ratio {fmt(hot.tile_ratio, 3)}"
    return text


def _strip_map(tensor: TensorResult, block_map: BlockMap, scale: Scale) -> str:
    """Heads by blocks along the tensor's axis: the map when the block mask was too large to keep."""
    batches, heads, blocks = block_map.score.shape
    rows = [(b, n) for b in range(batches) for n in range(heads)]
    pool = max(1, math.ceil(blocks / 160))
    rows_pool = max(1, math.ceil(len(rows) / 64))
    cols = math.ceil(blocks / pool)
    cell = min(16.0, max(4.0, 640.0 / max(cols, 1)))
    left, top = 70.0, 40.0
    shown = rows[::rows_pool]
    width, height = left + cols * cell + 10, top + len(shown) * cell + 10
    axis = "query block i" if block_map.axis == "q" else "kv block j"
    title = f"{tensor.name}: error ratio per (head, {axis}); the block mask was too large to keep"
    width = max(width, len(title) * 6.3 + 10)
    out = [_text(4, 12, title, extra=' font-weight="bold"')]
    out += _ticks(left, top, (0, cols), cell, pool)
    for r, (b, n) in enumerate(shown):
        y = top + r * cell
        out.append(_text(left - 4, y + cell / 2 + 3.5, f"b{b} n{n}", "end"))
        for c in range(cols):
            values = block_map.score[b, n, c * pool : (c + 1) * pool]
            if np.all(np.isnan(values)):
                continue
            score = float(np.nanmax(values))
            tip = f"b={b} n={n} {axis} {_range((c * pool, min((c + 1) * pool, blocks) - 1))}: ratio {fmt(score, 4)}"
            out.append(_cell(left + c * cell, y, cell, scale.colour(score), tip))
    return _svg(width, height, "".join(out), f"{tensor.name} error map")


# ---- the legend -----------------------------------------------------------------------------------


def legend(scale: Scale, what: str, past_length: bool = True) -> str:
    """Return the colour scale (a bar from the benchmark's error to the top, the limit marked) and the
    swatches of the special cells."""
    bar_x, bar_y, bar_w, bar_h = 8.0, 34.0, 240.0, 12.0
    steps = 60
    out = [_text(bar_x, 11, f"{what} (1 = the benchmark's error; log scale)", extra=' font-weight="bold"')]
    log_top = math.log(scale.top)
    for i in range(steps):
        value = math.exp(log_top * (i + 0.5) / steps)
        out.append(
            f'<rect x="{bar_x + i * bar_w / steps:.2f}" y="{bar_y}" width="{bar_w / steps + 0.3:.2f}" '
            f'height="{bar_h}" fill="{scale.colour(value)}"/>'
        )
    out.append(f'<rect x="{bar_x}" y="{bar_y}" width="{bar_w}" height="{bar_h}" fill="none" stroke="#777"/>')
    for value, label in ((1.0, "1"), (scale.limit, f"limit {fmt(scale.limit, 3)}"), (scale.top, fmt(scale.top, 3))):
        x = bar_x + bar_w * math.log(value) / log_top if value > 1 else bar_x
        out.append(f'<line x1="{x:.1f}" y1="{bar_y - 3}" x2="{x:.1f}" y2="{bar_y + bar_h + 3}" stroke="#000"/>')
        if value == scale.limit:  # above the bar: it may sit close to 1 when the top is far
            out.append(_text(x, bar_y - 5, label, "middle"))
        else:
            out.append(_text(x, bar_y + bar_h + 14, label, "start" if value <= 1 else "end"))
    swatches = [
        (NOT_COMPUTED, "#777", "not computed (block not selected)"),
        (AT_BENCHMARK, CELL_STROKE, "at the benchmark's error (ratio <= 1)"),
        (NONFINITE, CELL_STROKE, "NaN/Inf in the block"),
    ]
    if past_length:
        swatches.append(("#fff", "#bbb", "no block (past the actual length)"))
    x0, y0 = bar_x + bar_w + 20, 20.0
    for i, (fill, stroke, label) in enumerate(swatches):
        y = y0 + i * 15
        out.append(f'<rect x="{x0}" y="{y}" width="12" height="12" fill="{fill}" stroke="{stroke}"/>')
        out.append(_text(x0 + 17, y + 10, label))
    y = y0 + len(swatches) * 15
    out.append(f'<rect x="{x0}" y="{y}" width="12" height="12" fill="none" stroke="#000" stroke-width="2.5"/>')
    out.append(f'<polygon points="{x0 + 16},{y + 6} {x0 + 23},{y + 1} {x0 + 23},{y + 11}" fill="#000"/>')
    out.append(_text(x0 + 28, y + 10, "the hottest block, where the worst 16x16 tile is"))
    return _svg(x0 + 320, y + 20, "".join(out), "colour scale")


# ---- the worst block's tiles ----------------------------------------------------------------------


def tile_map(tensor: TensorResult, scale: Scale) -> str:
    """Return the hottest block's 16x16 tiles (rows: positions, columns: head dim) with the worst outlined."""
    if not tensor.hot_blocks or tensor.hot_blocks[0].tiles is None:
        return ""
    hot = tensor.hot_blocks[0]
    tiles = np.asarray(hot.tiles)
    if tiles.ndim != 2 or tiles.size == 0:
        return ""
    n_rows, n_cols = tiles.shape
    cell = min(22.0, max(6.0, 200.0 / max(n_rows, n_cols)))
    left, top = 44.0, 54.0
    kind = "q block" if query_axis(tensor) else "kv block"
    title = f"{tensor.name} b={hot.batch} n={hot.head} {kind} {hot.block}: 16x16 tiles"
    out = [_text(4, 12, title, extra=' font-weight="bold"'), _text(left, 30, "columns: head dim d; rows: position s")]
    first_row = hot.rows[0]
    worst = np.unravel_index(int(np.nanargmax(np.where(np.isnan(tiles), -np.inf, tiles))), tiles.shape)
    out += _ticks(left, top, (n_rows, n_cols), cell, 16, first_row)
    for r in range(n_rows):
        for c in range(n_cols):
            value = float(tiles[r, c])
            s0, d0 = first_row + r * 16, c * 16
            tip = f"rows s={s0}-{min(s0 + 15, hot.rows[1] - 1)}, d={d0}-{d0 + 15}: tile RMSE ratio {fmt(value, 4)}"
            out.append(_cell(left + c * cell, top + r * cell, cell, scale.colour(value), tip))
    wr, wc = int(worst[0]), int(worst[1])
    out.append(_outline((left + wc * cell, top + wr * cell, cell, cell)))
    caption = f"worst: s={first_row + wr * 16}, d={wc * 16}, ratio {fmt(float(tiles[wr, wc]), 3)}"
    height = top + n_rows * cell + 20
    out.append(_text(left, height - 4, caption))
    return _svg(max(left + n_cols * cell + 10, 300), height, "".join(out), title)


# ---- the ULP chart --------------------------------------------------------------------------------

DEVICE_FILL = "#3b6fb6"
BENCHMARK_FILL = "#c9c9c9"


def ulp_bins(edges: Sequence[float]) -> list[str]:
    """Return the labels of the chart's bins: "<=0.5", "0.5-1", ..., ">1024"."""
    pairs = [f"{fmt(a)}-{fmt(b)}" for a, b in zip(edges, edges[1:], strict=False)]
    return [f"<={fmt(edges[0])}", *pairs, f">{fmt(edges[-1])}"]


def ulp_chart(tensor: TensorResult, chart: UlpChart) -> str:
    """Return device and benchmark element counts by ULP error as grouped bars on a log count axis."""
    labels = ulp_bins(chart.edges)
    series = [("device", chart.device, DEVICE_FILL)]
    if chart.benchmark is not None:
        series.append(("benchmark", chart.benchmark, BENCHMARK_FILL))
    peak = max(max(values) for _, values, _ in series) or 1
    decades = max(1, math.ceil(math.log10(peak + 1)))
    left, top, plot_h, group_w = 46.0, 34.0, 150.0, 28.0
    width = left + group_w * len(labels) + 20
    height = top + plot_h + 74
    totals = {name: max(sum(values), 1) for name, values, _ in series}
    title = f"{tensor.name}: elements by ULP error against the golden"
    out = [_text(4, 12, title, extra=' font-weight="bold"')]
    for d in range(decades + 1):
        y = top + plot_h - plot_h * d / decades
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 14:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(_text(left - 4, y + 3.5, f"1e{d}" if d > 3 else str(10**d), "end"))
    bar_w = (group_w - 6) / len(series)
    for i, label in enumerate(labels):
        x0 = left + i * group_w + 3
        for k, (name, values, fill) in enumerate(series):
            count = values[i]
            h = plot_h * math.log10(count + 1) / decades
            x = x0 + k * bar_w
            tip = f"{name}: {count} elements with ULP error {label} ({100.0 * count / totals[name]:.3g}%)"
            out.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 1:.1f}" height="{max(h, 0):.1f}" '
                f'fill="{fill}" stroke="#555" stroke-width="0.4"><title>{esc(tip)}</title></rect>'
            )
        tx, ty = x0 + group_w / 2 - 3, top + plot_h + 10
        out.append(_text(tx, ty, label, "end", f' transform="rotate(-40 {tx:.1f} {ty:.1f})"'))
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 14:.1f}" y2="{top + plot_h}" stroke="#555"/>')
    lx = left + 8
    for name, _, fill in series:
        out.append(f'<rect x="{lx:.1f}" y="20" width="10" height="10" fill="{fill}" stroke="#555"/>')
        out.append(_text(lx + 14, 29, name))
        lx += 90
    out.append(_text(left + 8, height - 6, "log scale of count + 1; ULP of max(|golden|, err_thd)"))
    return _svg(max(width, 420), height, "".join(out), title)


def bias_chart(tensor: TensorResult, estimate: Bias, floor: float) -> str:
    """Return the device's and the benchmark's relative bias with bars of 2 standard errors, on one axis with
    the floor band (where the bias check never fails) around 0; the ULP scale along the top."""
    rows = [
        ("device", estimate.device, estimate.device_se, DEVICE_FILL),
        ("benchmark", estimate.benchmark, estimate.benchmark_se, BENCHMARK_FILL),
    ]
    finite = [abs(v) + 2 * se for _, v, se, _ in rows if math.isfinite(v) and math.isfinite(se)]
    reach = max([floor * 1.5, *finite])
    left, right, top, row_h = 80.0, 440.0, 44.0, 26.0
    width, height = right + 80, top + row_h * len(rows) + 44

    def x(value: float) -> float:
        return left + (right - left) * (value + reach) / (2 * reach)

    title = f"{tensor.name}: systematic relative error against the golden (± 2 standard errors)"
    out = [_text(4, 12, title, extra=' font-weight="bold"')]
    band = f"within the floor ±{floor:.3g}: never a failure"
    band_h = row_h * len(rows) + 8
    out.append(
        f'<rect x="{x(-floor):.1f}" y="{top - 8}" width="{x(floor) - x(-floor):.1f}" height="{band_h}" '
        f'fill="{AT_BENCHMARK}"><title>{esc(band)}</title></rect>'
    )
    out.append(f'<line x1="{x(0):.1f}" y1="{top - 12}" x2="{x(0):.1f}" y2="{top + row_h * len(rows)}" stroke="#555"/>')
    for i, (name, value, se, fill) in enumerate(rows):
        y = top + i * row_h + row_h / 2 - 4
        out.append(_text(left - 6, y + 3.5, name, "end"))
        if not (math.isfinite(value) and math.isfinite(se)):
            continue
        lo, hi = x(max(value - 2 * se, -reach)), x(min(value + 2 * se, reach))
        tip = (
            f"{name}: {value:+.3g} ± {se:.2g} relative ({estimate.in_ulp(value):+.3g} ± {estimate.in_ulp(se):.2g} ULP)"
        )
        out.append(f'<line x1="{lo:.1f}" y1="{y:.1f}" x2="{hi:.1f}" y2="{y:.1f}" stroke="#333" stroke-width="1.5"/>')
        out.append(
            f'<circle cx="{x(value):.1f}" cy="{y:.1f}" r="5" fill="{fill}" stroke="#333">'
            f"<title>{esc(tip)}</title></circle>"
        )
    axis_y = top + row_h * len(rows)
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{right}" y2="{axis_y}" stroke="#555"/>')
    for value in (-reach, -reach / 2, 0.0, reach / 2, reach):
        out.append(_text(x(value), axis_y + 13, f"{value:+.2g}" if value else "0", "middle"))
        if estimate.ulp > 0:
            out.append(_text(x(value), top - 14, f"{estimate.in_ulp(value):+.2g}" if value else "0", "middle"))
    out.append(_text(right + 34, top - 14, "ULP"))
    out.append(_text(right + 34, axis_y + 13, "relative"))
    verdict = f"difference {estimate.difference:+.3g} ± {estimate.difference_se:.2g}: {estimate.z:.3g} standard errors"
    out.append(_text(left, height - 8, verdict + (" (paired)" if estimate.paired else "")))
    return _svg(width, height, "".join(out), title)
