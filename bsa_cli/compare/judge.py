"""The pure core: `judge_tensors` judges dq, dk, dv arrays of a case (arrays in, `TensorResult`s out).

It measures (`metrics.py`), runs the structural checks (`structural.py`), the checks of the case's
standard (its `Standard.checks`, bsa_cli/standards) and the bias check, and locates the errors
(`locate.py`). No files, no printing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from ..core.case import Case
from ..standards import Settings, bias, side_settings
from ..standards.base import Measured
from ..store.manifest import GRAD_NAMES
from .geometry import TILE, _Geometry, _geometry, structural_rows
from .locate import _block_map, _hot_blocks, _worst_elements, ulp_chart
from .metrics import _measure, _params, _RowOut, noise_params, paired_relative_sums
from .results import Check, TensorResult
from .structural import _structural_checks, batch_consistency_check
from .summary import BenchmarkSummary, summary_key
from .ulp import _MANTISSA_BITS


def judge_tensors(
    case: Case,
    settings: Settings,
    device: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    benchmark: Mapping[str, np.ndarray] | None,
    block_mask: np.ndarray,
    summary: BenchmarkSummary | None = None,
    deterministic: bool = False,
) -> tuple[TensorResult, ...]:
    """Judge dq, dk, dv of a valid case: metrics, the standard's checks, structural checks, block maps.

    Args:
        case: the case geometry (`manifest.case_from_manifest`).
        settings: resolved settings (`resolve_settings`).
        device, golden, benchmark: {"dq", "dk", "dv"} arrays of the case's shapes; device and benchmark in
            the case dtype, golden float32 or float64. `benchmark` may be None when the standard needs none
            or `summary` stands for it (then it only adds the benchmark's values to the worst elements).
        block_mask: the case's blockSparseMask input.
        summary: the benchmark measured against this golden beforehand (`summarize_benchmark`); used
            instead of measuring `benchmark` again when its key matches these settings.
        deterministic: the run asked for deterministic mode (`batch_consistency_check` then judges dk, dv too).

    Raises:
        ValueError: the standard needs a benchmark and none is given, or shapes do not match the case.
    """
    usable = summary if summary is not None and summary.key == summary_key(case, settings) else None
    if settings.standard.needs_benchmark and not benchmark and usable is None:
        raise ValueError(f"standard {settings.label!r} needs the benchmark (kernel-faithful) outputs")
    rows = structural_rows(case, block_mask)
    return tuple(
        judge_tensor(
            case,
            settings,
            _geometry(case, name),
            device[name],
            golden[name],
            benchmark,
            usable,
            rows[name],
            deterministic,
        )
        for name in GRAD_NAMES
    )


def judge_tensor(
    case: Case,
    settings: Settings,
    geom: _Geometry,
    dev: np.ndarray,
    gold: np.ndarray,
    benchmark: Mapping[str, np.ndarray] | None,
    usable: BenchmarkSummary | None,
    rows: tuple[np.ndarray, np.ndarray],
    deterministic: bool = False,
) -> TensorResult:
    """Judge one tensor by the case's standard (`judge_tensors` for dq, dk, dv; the forward's out too).

    Args:
        geom: the tensor's geometry; its `judged` rows, when set, are the only ones measured.
        benchmark: the benchmark arrays by name (this tensor's may be absent when `usable` stands for it).
        usable: a benchmark summary whose key matches these settings, or None.
        rows: (rows that must be 0, padding rows) of the tensor (`structural_rows`).
        deterministic: the run asked for deterministic mode (`batch_consistency_check`).
    """
    t = settings.thresholds
    sides = side_settings(case.dtype, case.compare or None, settings)
    name = geom.name
    params = noise_params(_params(case, settings, sides), case, name, gold)
    bench = benchmark.get(name) if benchmark else None
    for label, array in (("device", dev), ("golden", gold), ("benchmark", bench)):
        if array is not None and tuple(array.shape) != geom.shape:
            raise ValueError(f"{name}: {label} shape {list(array.shape)} is not {list(geom.shape)}")
    summarized = usable is not None and name in usable.stats
    measured = _measure(dev, None if summarized else bench, gold, geom, params)
    dev_stats, dev_rows, nonfinite_rows, bench_stats, bench_rows = measured
    if usable is not None and summarized:
        tiles = usable.tiles[name]
        expected = (geom.rows, -(-geom.dim // TILE))
        if tiles.dtype != np.float32 or tuple(tiles.shape) != expected:
            raise ValueError(
                f"{name}: benchmark summary tiles are {tiles.dtype} {list(tiles.shape)}, "
                f"expected float32 {list(expected)}"
            )
        bench_stats, bench_rows = usable.stats[name], _RowOut(tiles)
    if settings.standard.needs_benchmark and bench_stats is None:
        raise ValueError(f"standard {settings.label!r} needs the benchmark (kernel-faithful) outputs of {name}")
    assert dev_stats is not None and dev_rows is not None
    block_map, spans = _block_map(
        geom,
        dev_rows,
        bench_rows,
        bench_stats.rmse if bench_stats else 0.0,
        dev_stats.rmse,
        t.get("tile_floor", 0.1),
        params.small_thd,
    )
    ratios = [float(s.ratio.max()) for s in spans.values() if s.ratio is not None and s.ratio.size]
    tile_max = None if bench_rows is None else max(ratios, default=0.0)
    extra = settings.standard.measure(gold, case.dtype, t)
    structural = _structural_checks(name, geom, dev, dev_stats, nonfinite_rows, rows, settings)
    consistency = batch_consistency_check(name, case, dev, deterministic)
    if consistency is not None:
        structural.append(consistency)
    judged = Measured(name, dev_stats, bench_stats, tile_max, extra, case.dtype)
    checks = structural + settings.standard.checks(judged, t)
    estimate = None
    bias_wanted = any(math.isfinite(s.thresholds["bias_z"]) for s in (settings, *sides))
    if bias_wanted and bench_stats is not None and bench_stats.bias is not None:
        # The bias (`bias.py`) from each side's sums, with the paired difference measured when the two biases differ
        # by more than the floor and the benchmark's arrays are at hand.
        both = []
        for stats in (dev_stats, bench_stats):
            assert stats.bias is not None and stats.bias_se is not None
            both.append(bias.RelativeSums.of(stats.bias, stats.bias_se, stats.large_count))
        pairs = None
        if bench is not None and abs(both[0].mean - both[1].mean) > t["bias_floor"]:
            pairs = paired_relative_sums(dev, bench, gold, geom, params)
        ulp = bias.ulp_relative(_MANTISSA_BITS.get(params.io_dtype, 23))
        estimate = bias.estimate(both[0], both[1], ulp, pairs)
        if math.isfinite(t["bias_z"]):
            checks.append(estimate.check(name, t["bias_z"], t["bias_floor"]))
    others = {s.label: _side_checks(case, s, i, structural, judged, gold, estimate) for i, s in enumerate(sides)}
    failed = not all(c.passed for c in checks)
    chart = ulp_chart(dev, bench, gold, geom, params) if failed else None
    return TensorResult(
        name=name,
        shape=geom.shape,
        dtype=case.dtype,
        axes=geom.axes,
        device=dev_stats,
        benchmark=bench_stats,
        checks=tuple(checks),
        worst=_worst_elements(geom, dev_rows, dev, gold, bench, params),
        hot_blocks=_hot_blocks(block_map, spans, geom, keep_tiles=failed),
        block_map=block_map,
        extra=extra,
        ulp_chart=chart,
        golden_dtype=str(gold.dtype),
        bias=estimate if math.isfinite(t["bias_z"]) else None,
        sides=others,
    )


def _side_checks(
    case: Case,
    side: Settings,
    index: int,
    structural: list[Check],
    measured: Measured,
    gold: np.ndarray,
    estimate: bias.Bias | None,
) -> tuple[Check, ...]:
    """The checks a side-by-side standard makes of a tensor: the same structural checks, its own on the same
    measurement (mismatches counted at its tolerances), and its bias check; none of its own without the
    benchmark it needs (the side verdict is then the structural checks' alone)."""
    stats = measured.device
    counts = stats.side_mismatch_counts
    assert counts is not None
    mismatched = counts[index]
    stats = dataclasses.replace(stats, mismatch_count=mismatched, mismatch_ratio=mismatched / max(stats.count, 1))
    t = side.thresholds
    if side.standard.needs_benchmark and measured.bench is None:
        return tuple(structural)
    extra = side.standard.measure(gold, case.dtype, t)
    own = side.standard.checks(dataclasses.replace(measured, device=stats, extra=extra, dtype=case.dtype), t)
    if estimate is not None and math.isfinite(t["bias_z"]):
        own.append(estimate.check(measured.tensor, t["bias_z"], t["bias_floor"]))
    return (*structural, *own)
