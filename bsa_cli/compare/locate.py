"""Where the errors are: block maps, the hottest blocks and their 16x16 tiles, worst elements, ULP chart."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .geometry import TILE, _Geometry
from .metrics import TOP_K, _items, _Params, _RowOut
from .results import ULP_CHART_EDGES, BlockMap, HotBlock, UlpChart, WorstElement
from .ulp import _MANTISSA_BITS, _ulp_power, ulp_error


@dataclass
class _SpanTiles:
    """One batch entry's tile grid: ratio per (head, tile row, tile column) and which block each row is in."""

    starts: np.ndarray  # first position of each tile row
    block_of: np.ndarray  # block index of each tile row
    ratio: np.ndarray | None  # [heads, tile rows, tile cols]


def _block_map(
    geom: _Geometry,
    device: _RowOut,
    bench: _RowOut | None,
    bench_rmse: float,
    device_rmse: float,
    tile_floor: float,
    noise_floor: float = 0.0,
) -> tuple[BlockMap, dict[int, _SpanTiles]]:
    """Aggregate per-row errors into blocks (and 16x16 tiles) of each batch entry.

    A tile's benchmark RMSE is floored at `tile_floor` x the tensor's and at `noise_floor`, the absolute error
    the standard never counts (`small_value_thd`): where the true gradient is exactly 0 (a row that sees one
    key: dP - Dsum cancels), every side's error is float32 rounding noise and their ratio means nothing."""
    batches = len(geom.lengths)
    max_blocks = max((-(-n // geom.block) for n in geom.lengths), default=0)
    shape = (batches, geom.heads, max_blocks)
    rmse = np.full(shape, np.nan)
    rmse_bench = np.full(shape, np.nan) if bench is not None else None
    max_abs = np.full(shape, np.nan)
    score = np.full(shape, np.nan)
    dim = geom.dim
    col_sizes = np.minimum(TILE, dim - np.arange(0, dim, TILE)).astype(np.float64)
    floor = max(tile_floor * bench_rmse, noise_floor, 1e-30)
    spans: dict[int, _SpanTiles] = {}
    assert device.max_abs is not None
    for b, length in enumerate(geom.lengths):
        if length == 0:
            continue
        starts = range(0, length, geom.block)
        block_starts = np.asarray(starts)
        n_blocks = len(starts)
        tiles_per_block = [range(s, min(s + geom.block, length), TILE) for s in starts]
        tile_starts = np.concatenate([np.asarray(tiles) for tiles in tiles_per_block])
        tile_stops = np.append(tile_starts[1:], length)
        block_of = np.repeat(np.arange(n_blocks), [len(tiles) for tiles in tiles_per_block])
        first_tile = np.searchsorted(tile_starts, block_starts)
        dev_tiles = np.add.reduceat(geom.seq_view(device.tile_sse, b).astype(np.float64), tile_starts, axis=1)
        counts = (tile_stops - tile_starts)[:, None] * col_sizes[None, :]  # [tile rows, tile cols]
        block_rows = np.minimum(block_starts + geom.block, length) - block_starts
        dev_block = np.add.reduceat(dev_tiles.sum(axis=2), first_tile, axis=1)
        rmse[b, :, :n_blocks] = np.sqrt(dev_block / (block_rows * dim))
        row_max = geom.seq_view(device.max_abs, b)
        max_abs[b, :, :n_blocks] = np.maximum.reduceat(row_max, block_starts, axis=1)
        ratio = None
        if bench is not None and rmse_bench is not None:
            bench_tiles = np.add.reduceat(geom.seq_view(bench.tile_sse, b).astype(np.float64), tile_starts, axis=1)
            bench_block = np.add.reduceat(bench_tiles.sum(axis=2), first_tile, axis=1)
            rmse_bench[b, :, :n_blocks] = np.sqrt(bench_block / (block_rows * dim))
            ratio = np.sqrt(dev_tiles / counts) / np.maximum(np.sqrt(bench_tiles / counts), floor)
            score[b, :, :n_blocks] = np.maximum.reduceat(ratio.max(axis=2), first_tile, axis=1)
        else:
            score[b, :, :n_blocks] = rmse[b, :, :n_blocks] / max(device_rmse, 1e-30)
        nonfinite = np.isinf(max_abs[b, :, :n_blocks])  # rows with NaN/Inf (see _measure_array)
        score[b, :, :n_blocks][nonfinite] = np.inf
        spans[b] = _SpanTiles(tile_starts, block_of, ratio)
    block_map = BlockMap(geom.kind, geom.block, rmse, rmse_bench, max_abs, score)
    return block_map, spans


def _hot_blocks(
    block_map: BlockMap, spans: dict[int, _SpanTiles], geom: _Geometry, count: int = TOP_K, keep_tiles: bool = False
) -> tuple[HotBlock, ...]:
    """Return the `count` blocks of highest score, worst first (with `keep_tiles`, the first with its tiles)."""
    score = np.where(np.isnan(block_map.score), -np.inf, block_map.score)
    if score.size == 0:
        return ()
    order = np.argsort(score, axis=None)[::-1][:count]
    hot: list[HotBlock] = []
    for flat in order:
        b, n, j = (int(v) for v in np.unravel_index(flat, score.shape))
        if score[b, n, j] == -np.inf:
            break
        length = geom.lengths[b]
        rows = (j * geom.block, min((j + 1) * geom.block, length))
        tile = tile_ratio = block_tiles = None
        tiles = spans.get(b)
        if tiles is not None and tiles.ratio is not None:
            members = np.flatnonzero(tiles.block_of == j)
            sub = tiles.ratio[n, members]
            r, c = np.unravel_index(int(np.argmax(sub)), sub.shape)
            tile = (int(tiles.starts[members[r]]), int(c) * TILE)
            tile_ratio = float(sub[r, c])
            if keep_tiles and not hot:
                block_tiles = np.array(sub, dtype=np.float64)
        bench_rmse = None if block_map.rmse_benchmark is None else float(block_map.rmse_benchmark[b, n, j])
        rmse, max_abs = float(block_map.rmse[b, n, j]), float(block_map.max_abs_err[b, n, j])
        figures = (float(score[b, n, j]), rmse, bench_rmse, max_abs)
        hot.append(HotBlock(b, n, j, rows, *figures, tile, tile_ratio, block_tiles))
    return tuple(hot)


def _worst_elements(
    geom: _Geometry, out: _RowOut, device: np.ndarray, golden: np.ndarray, bench: np.ndarray | None, params: _Params
) -> tuple[WorstElement, ...]:
    """Return the elements of largest absolute error (at most one per row), worst first."""
    assert out.max_abs is not None and out.argmax is not None
    row_max = out.max_abs
    if row_max.size == 0:
        return ()
    k = min(TOP_K, row_max.size)
    top = np.argpartition(row_max, row_max.size - k)[-k:]
    top = top[np.argsort(row_max[top])[::-1]]
    device2d = device.reshape(geom.rows, geom.dim)
    golden2d = golden.reshape(geom.rows, geom.dim)
    bench2d = None if bench is None else bench.reshape(geom.rows, geom.dim)
    worst = []
    for row in top:
        if row_max[row] < 0:
            break
        col = int(out.argmax[row])
        value = device2d[row, col : col + 1]
        gold = np.asarray(golden2d[row, col : col + 1], dtype=np.float32)
        index, coords = geom.index(int(row), col)
        device_value = float(value.astype(np.float32)[0])
        benchmark = None if bench2d is None else float(bench2d[row, col].astype(np.float32))
        ulp = ulp_error(device_value, float(gold[0]), params.io_dtype, params.err_thd)
        figures = (device_value, float(golden2d[row, col]), benchmark, float(row_max[row]), ulp)
        worst.append(WorstElement(index, coords, coords["s"] // geom.block, *figures))
    return tuple(worst)


def ulp_chart(
    device: np.ndarray, bench: np.ndarray | None, golden: np.ndarray, geom: _Geometry, params: _Params
) -> UlpChart:
    """Count the judged elements of device and benchmark by ULP error in the bins of `ULP_CHART_EDGES`.

    One more pass over the arrays, made for failing tensors only (their pictures). NaN/Inf elements are
    left out, as from the other metrics.
    """
    unit = 2.0 ** _MANTISSA_BITS.get(params.io_dtype, 23)
    edges = np.asarray(ULP_CHART_EDGES, dtype=np.float64) / unit
    golden2d = golden.reshape(geom.rows, geom.dim)

    def count(values: np.ndarray) -> tuple[int, ...]:
        total = np.zeros(len(edges) + 1, dtype=np.int64)
        values2d = values.reshape(geom.rows, geom.dim)
        for rows in _items(geom):
            g = np.asarray(golden2d[rows], dtype=np.float32)
            a = np.asarray(values2d[rows]).astype(np.float32)
            power = _ulp_power(np.abs(g), params.io_dtype, err_thd=params.err_thd)
            error = (np.abs(a - g) / power).astype(np.float64)
            error = error[np.isfinite(error)]
            total += np.bincount(np.searchsorted(edges, error, side="left"), minlength=len(edges) + 1)
        return tuple(int(c) for c in total)

    with np.errstate(over="ignore", invalid="ignore"):
        return UlpChart(ULP_CHART_EDGES, count(device), None if bench is None else count(bench))
