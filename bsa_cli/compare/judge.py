"""The pure core: `judge_tensors` judges dq, dk, dv arrays of a case (arrays in, `TensorResult`s out).

It measures (`metrics.py`), runs the structural checks (`structural.py`) and the checks of the case's
standard (here), and locates the errors (`locate.py`). No files, no printing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..core.case import Case, numpy_dtype
from ..core.rounding import round_float32
from ..standards import STANDARDS, Settings, bias
from ..store.manifest import GRAD_NAMES
from .buffers import CHUNK_ELEMENTS
from .geometry import TILE, _Geometry, _geometry, structural_rows
from .locate import _block_map, _hot_blocks, _worst_elements, ulp_chart
from .metrics import _measure, _Params, _params, _RowOut, paired_relative_sums
from .results import Check, ErrorStats, TensorResult, _fmt
from .structural import _structural_checks
from .summary import BenchmarkSummary, summary_key
from .ulp import _MANTISSA_BITS


def _ratio(value: float, reference: float, floor: float) -> float:
    return value / max(reference, floor)


def _upper(name: str, tensor: str, value: float, limit: float, text: str, strict: bool = False) -> Check:
    """A check `value <= limit` (or `<` with `strict`)."""
    passed = value < limit if strict else value <= limit
    if limit > 0:
        severity = value / limit
    else:
        severity = 0.0 if value <= 0 else math.inf
    if not passed and severity <= 1:
        severity = 1.0 + 1e-12  # a strict limit reached exactly still fails
    op = ("<" if strict else "<=") if passed else (">=" if strict else ">")
    return Check(
        name, tensor, float(value), float(limit), passed, f"{tensor} {text} {_fmt(value)} {op} {_fmt(limit)}", severity
    )


def _standard_checks(
    name: str,
    settings: Settings,
    device: ErrorStats,
    bench: ErrorStats | None,
    tile_max: float | None,
    extra: dict[str, float],
) -> list[Check]:
    """Return the checks of the case's standard for one tensor."""
    t = settings.thresholds
    checks: list[Check] = []
    if settings.standard == "double-benchmark":
        assert bench is not None
        thd = t["err_thd"]
        for key, label, dev, ref in (
            ("mare_ratio", "MARE ratio", device.max_rel_err, bench.max_rel_err),
            ("mere_ratio", "MERE ratio", device.mean_rel_err, bench.mean_rel_err),
            ("rmse_ratio", "RMSE ratio", device.rmse, bench.rmse),
        ):
            ratio = _ratio(dev, ref, thd)
            check = _upper(key, name, ratio, t[key], label)
            if ref < thd:  # the ratio's denominator is err_thd, not the benchmark's error: say so
                detail = f" (device {_fmt(dev)} / err_thd {_fmt(thd)}: benchmark {_fmt(ref)} floored at err_thd)"
            else:
                detail = f" (device {_fmt(dev)}, benchmark {_fmt(ref)}, err_thd {_fmt(thd)})"
            checks.append(_with_detail(check, detail))
        ratio = _ratio(device.small_value_err_count, bench.small_value_err_count, 1)
        check = _upper("small_value_ratio", name, ratio, t["small_value_ratio"], "small-value error ratio")
        detail = (
            f" (small values off by more than small_value_thd: device {device.small_value_err_count}, "
            f"benchmark {bench.small_value_err_count}"
        )
        detail += ", floored at 1)" if bench.small_value_err_count < 1 else ")"
        checks.append(_with_detail(check, detail))
        if tile_max is not None and math.isfinite(t["tile_ratio"]):
            checks.append(_upper("tile_ratio", name, tile_max, t["tile_ratio"], "worst 16x16 tile RMSE ratio"))
    elif settings.standard == "single":
        assert device.mere is not None and device.mare is not None
        checks.append(_upper("mere", name, device.mere, t["mere"], "MERE", strict=True))
        checks.append(_upper("mare", name, device.mare, t["mare"], "MARE", strict=True))
    elif settings.standard == "allclose":
        if settings.msopst:
            assert device.msopst_err_count is not None and device.msopst_max_err is not None
            fraction = device.msopst_err_count / max(device.count, 1)
            check = _upper("pct_thd", name, fraction, t["pct_thd"], f"fraction over diff_thd {_fmt(t['diff_thd'])}")
            checks.append(_with_detail(check, f" ({device.msopst_err_count} of {device.count})"))
            checks.append(
                _upper("max_diff", name, device.msopst_max_err, t["max_diff"], "msOpST max error", strict=True)
            )
        else:
            assert device.mismatch_ratio is not None
            check = _upper("mismatch", name, device.mismatch_ratio, t["mismatch"], "mismatch fraction")
            detail = (
                f" ({device.mismatch_count} of {device.count} beyond atol {_fmt(t['atol'])} + rtol {_fmt(t['rtol'])})"
            )
            checks.append(_with_detail(check, detail))
    elif settings.standard == "fa-ratio":
        assert bench is not None
        limit = t["k"] * bench.max_abs_err + extra["ulp_floor"]
        check = _upper("max_abs_err", name, device.max_abs_err, limit, "max abs error")
        detail = f" (k {_fmt(t['k'])} x benchmark {_fmt(bench.max_abs_err)} + floor {_fmt(extra['ulp_floor'])})"
        checks.append(_with_detail(check, detail))
    return checks


def _bias(
    dev_stats: ErrorStats,
    bench_stats: ErrorStats,
    arrays: tuple[np.ndarray, np.ndarray | None, np.ndarray],
    geom: _Geometry,
    params: _Params,
    floor: float,
) -> bias.Bias:
    """The bias of one tensor (`bias.py`): from each side's sums, with the paired difference measured
    when the two biases differ by more than `floor` and the benchmark's arrays are at hand."""
    sides = []
    for stats in (dev_stats, bench_stats):
        mean, se = stats.bias, stats.bias_se
        assert mean is not None and se is not None
        sides.append(bias.RelativeSums.of(mean, se, stats.large_count))
    device, bench, golden = arrays
    pairs = None
    if bench is not None and abs(sides[0].mean - sides[1].mean) > floor:
        pairs = paired_relative_sums(device, bench, golden, geom, params)
    ulp = bias.ulp_relative(_MANTISSA_BITS.get(params.io_dtype, 23))
    return bias.estimate(sides[0], sides[1], ulp, pairs)


def _bias_check(name: str, estimate: bias.Bias, z_limit: float, floor: float) -> Check:
    """The bias check of one tensor: its value is the standard errors of the deciding comparison."""
    failed = estimate.beyond(z_limit, floor)
    against_benchmark = estimate.against_benchmark(z_limit, floor)
    z = estimate.z if against_benchmark or not failed else estimate.device_z
    if not estimate.judgeable():
        why = f"not judged: {estimate.count} values above err_thd, fewer than {bias.MIN_COUNT}"
    elif failed and against_benchmark:
        how = "paired" if estimate.paired else "unpaired"
        why = f"{estimate.z:.3g} standard errors ({how}) from the benchmark's, over the floor {_fmt(floor)}"
    elif failed:
        why = (
            f"{estimate.device_z:.3g} standard errors from 0 where the benchmark shows none "
            f"({estimate.benchmark_z:.2g}), over the floor {_fmt(floor)}"
        )
    elif abs(estimate.device) <= floor and abs(estimate.difference) <= floor:
        why = f"within the floor {_fmt(floor)}"
    else:
        why = f"{estimate.z:.3g} standard errors from the benchmark's, not certain (limit {_fmt(z_limit)})"
    severity = max(z / z_limit, 1.0 + 1e-12) if failed else min(z / z_limit, 1.0)
    if not failed and severity >= 1:
        severity = 1.0  # certain but within the floor, or a precision path biased like the device
    return Check("bias", name, float(z), float(z_limit), not failed, f"{name} {estimate.describe()}: {why}", severity)


def _with_detail(check: Check, suffix: str) -> Check:
    return Check(
        check.name, check.tensor, check.value, check.limit, check.passed, check.detail + suffix, check.severity
    )


def _fa_floor(golden: np.ndarray, io_dtype: str, factor: float) -> float:
    """FlashAttention 3's ULP floor: factor x max |(g + 0.3) - 0.3 - g|, all in the case dtype."""
    dtype = numpy_dtype(io_dtype)
    flat = golden.reshape(-1)
    worst = 0.0
    step = CHUNK_ELEMENTS * 8
    for start in range(0, flat.size, step):
        g = round_float32(flat[start : start + step].astype(np.float32), dtype)
        shifted = round_float32(g + np.float32(0.3), dtype)
        back = round_float32(shifted - round_float32(np.asarray(0.3, np.float32), dtype), dtype)
        worst = max(worst, float(np.abs(back - g).max(initial=0.0)))
    return factor * worst


def judge_tensors(
    case: Case,
    settings: Settings,
    device: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    benchmark: Mapping[str, np.ndarray] | None,
    block_mask: np.ndarray,
    summary: BenchmarkSummary | None = None,
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

    Raises:
        ValueError: the standard needs a benchmark and none is given, or shapes do not match the case.
    """
    standard = STANDARDS[settings.standard]
    usable = summary if summary is not None and summary.key == summary_key(case, settings) else None
    if standard.needs_benchmark and not benchmark and usable is None:
        raise ValueError(f"standard {settings.label!r} needs the benchmark (kernel-faithful) outputs")
    rows = structural_rows(case, block_mask)
    return tuple(
        judge_tensor(case, settings, _geometry(case, name), device[name], golden[name], benchmark, usable, rows[name])
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
) -> TensorResult:
    """Judge one tensor by the case's standard (`judge_tensors` for dq, dk, dv; the forward's out too).

    Args:
        geom: the tensor's geometry; its `judged` rows, when set, are the only ones measured.
        benchmark: the benchmark arrays by name (this tensor's may be absent when `usable` stands for it).
        usable: a benchmark summary whose key matches these settings, or None.
        rows: (rows that must be 0, padding rows) of the tensor (`structural_rows`).
    """
    t = settings.thresholds
    params = _params(case, settings)
    name = geom.name
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
    if STANDARDS[settings.standard].needs_benchmark and bench_stats is None:
        raise ValueError(f"standard {settings.label!r} needs the benchmark (kernel-faithful) outputs of {name}")
    assert dev_stats is not None and dev_rows is not None
    block_map, spans = _block_map(
        geom, dev_rows, bench_rows, bench_stats.rmse if bench_stats else 0.0, dev_stats.rmse, t.get("tile_floor", 0.1)
    )
    tile_max = None
    if bench_rows is not None:
        ratios = [float(t.ratio.max()) for t in spans.values() if t.ratio is not None and t.ratio.size]
        tile_max = max(ratios, default=0.0)
    extra: dict[str, float] = {}
    if settings.standard == "fa-ratio":
        extra["ulp_floor"] = _fa_floor(gold, case.dtype, t["floor_factor"])
    checks = _structural_checks(name, geom, dev, dev_stats, nonfinite_rows, rows, settings)
    checks += _standard_checks(name, settings, dev_stats, bench_stats, tile_max, extra)
    estimate = None
    if math.isfinite(t["bias_z"]) and bench_stats is not None and bench_stats.bias is not None:
        estimate = _bias(dev_stats, bench_stats, (dev, bench, gold), geom, params, t["bias_floor"])
        checks.append(_bias_check(name, estimate, t["bias_z"], t["bias_floor"]))
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
        worst=_worst_elements(geom, dev_rows, dev, gold, bench, case.dtype, err_thd=params.err_thd),
        hot_blocks=_hot_blocks(block_map, spans, geom, keep_tiles=failed),
        block_map=block_map,
        extra=extra,
        ulp_chart=chart,
        golden_dtype=str(gold.dtype),
        bias=estimate,
    )
