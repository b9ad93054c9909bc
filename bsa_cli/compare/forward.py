"""Judging the forward's outputs: `out` by the case's standard and `lse` against the benchmark's own lse
error, both on the rows the forward writes, and the structural check `rows-written`.

The forward (aclnnBlockSparseAttention) leaves query rows with no selected kv block, and BNSD rows past
the actual lengths, unwritten (neither out nor lse); with softmaxLseFlag 0 it writes no lse at all. Those
rows are never judged: the golden and benchmark hold out 0 and the empty-row lse there. A device that
pre-fills its output buffers with NaN (run.json `device.prefilled_outputs: "nan"`) lets `rows-written`
also check that the rows the forward must leave alone were left alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ..core.case import Case
from ..golden import written_rows
from ..standards import Settings
from ..standards.base import Check, fmt, upper
from .buffers import CHUNK_ELEMENTS
from .geometry import _Geometry, _geometry, only_rows
from .judge import judge_tensor
from .locate import _worst_elements
from .metrics import _measure, _Params
from .results import TensorResult
from .structural import _structural_checks
from .summary import BenchmarkSummary, summary_key

#: The forward's outputs, as the manifest names them.
FORWARD_NAMES = ("out", "lse")

#: The floor of the benchmark's lse error (absolute, in the natural-log units of the scaled scores), by
#: innerPrecise: 1 computes lse in fp16 (err_thd of float16, 2^-11), 0 in fp32 (err_thd of float32, 2^-14). An
#: lse error of e is a relative error e in every probability the backward recomputes from it.
LSE_FLOOR = {1: 2.0**-11, 0: 2.0**-14}

#: The lse checks: each with the double-benchmark key whose limit it takes (the case's, with its preset,
#: where its standard has that key), the default used under another standard, its label, and the metric
#: (an `ErrorStats` field) it compares.
LSE_LIMITS = {
    "lse_max_ratio": ("mare_ratio", 10.0, "max abs error ratio", "max_abs_err"),
    "lse_rmse_ratio": ("rmse_ratio", 2.0, "RMSE ratio", "rmse"),
}

#: How `rows-written` says that rows the forward must write were not (the pair's `lse-unwritten` reads it).
NOT_WRITTEN = "rows the forward must write hold NaN/Inf"

#: The NaN a device pre-fills the forward's output buffers with, by dtype (run.json `prefilled_outputs: "nan"`).
PREFILL_BITS = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000}


@dataclass(frozen=True)
class ForwardSettings:
    """What judging the forward needs beyond the case's geometry: its own parameters and the device's prefill."""

    inner_precise: int = 0
    softmax_lse_flag: int = 1
    prefilled: bool = False  # the device pre-filled out and lse with NaN (run.json prefilled_outputs "nan")


def lse_floor(inner_precise: int) -> tuple[float, str]:
    """Return the floor of the lse ratio for an innerPrecise and why (which precision computes lse)."""
    if inner_precise == 1:
        return LSE_FLOOR[1], "fp16 lse (innerPrecise 1): err_thd of float16, 2^-11"
    return LSE_FLOOR[0], f"fp32 lse (innerPrecise {inner_precise}): err_thd of float32, 2^-14"


def judge_forward(
    case: Case,
    settings: Settings,
    device: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    benchmark: Mapping[str, np.ndarray] | None,
    block_mask: np.ndarray,
    forward: ForwardSettings,
    summary: BenchmarkSummary | None = None,
) -> tuple[tuple[TensorResult, ...], tuple[Check, ...], tuple[str, ...]]:
    """Judge the forward's out and lse on the rows it writes.

    Args:
        device, golden, benchmark: {"out", "lse"} arrays (out of query's shape; lse of `case.lse_shape_dims`
            or the query shape without D); device out in the case dtype, lse float32.
        forward: innerPrecise, softmaxLseFlag and whether the device pre-filled its outputs.
        summary: a benchmark summary; its `out` stands for measuring the benchmark's out when its key matches.

    Returns:
        The tensors judged (out, and lse unless softmaxLseFlag is 0), case-level checks (lse's `rows-written`
        when lse is not judged) and notes (why lse is not judged).

    Raises:
        ValueError: an array is not of its tensor's shape.
    """
    written = written_rows(case, block_mask)
    usable = summary if summary is not None and summary.key == summary_key(case, settings) else None
    full = _geometry(case, "out")
    geom = only_rows(full, written)
    none = np.zeros(full.rows, dtype=bool)  # no row must be 0, none is padding; with softmax_lse_flag 0, none written
    out = judge_tensor(case, settings, geom, device["out"], golden["out"], benchmark, usable, (none, none))
    out_rows = rows_written_check(full, device["out"], written.reshape(-1), forward.prefilled, case.dtype)
    tensors = [replace(out, checks=(out_rows, *out.checks))]  # rows-written first: it decides a NaN row
    lse_geom = replace(_geometry(case, "lse"), shape=(*case.q_shape[:-1], 1), dim=1)
    lse_device = _lse_array(device["lse"], lse_geom, "device")
    if forward.softmax_lse_flag == 0:
        check = rows_written_check(lse_geom, lse_device, none, forward.prefilled, "float32", flag_zero=True)
        note = "lse not judged: softmax_lse_flag 0 (the forward leaves softmaxLse unwritten)"
        return tuple(tensors), (check,), (note,)
    bench_lse = benchmark.get("lse") if benchmark else None
    bench = None if bench_lse is None else _lse_array(bench_lse, lse_geom, "benchmark")
    gold = _lse_array(golden["lse"], lse_geom, "golden")
    lse = _judge_lse(settings, only_rows(lse_geom, written), lse_device, gold, bench, forward.inner_precise)
    if tuple(device["lse"].shape) != lse_geom.shape:  # a squeezed lse: no trailing 1
        lse = replace(lse, shape=tuple(device["lse"].shape), axes=lse.axes[:-1])
    lse_rows = rows_written_check(lse_geom, lse_device, written.reshape(-1), forward.prefilled, "float32")
    tensors.append(replace(lse, checks=(lse_rows, *lse.checks)))
    return tuple(tensors), (), ()


def _lse_array(values: np.ndarray, geom: _Geometry, label: str) -> np.ndarray:
    """Return an lse array as [*rows, 1] (trailing 1 or squeezed alike); ValueError when its size differs."""
    if values.size != geom.rows:
        raise ValueError(f"lse: {label} shape {list(values.shape)} does not hold the {geom.rows} query rows")
    return values.reshape(geom.shape)


def _judge_lse(
    settings: Settings,
    geom: _Geometry,
    device: np.ndarray,
    golden: np.ndarray,
    bench: np.ndarray | None,
    inner_precise: int,
) -> TensorResult:
    """Judge lse on the written rows: its max and RMSE absolute errors against the benchmark's, floored."""
    floor, why = lse_floor(inner_precise)
    t = settings.thresholds
    params = _Params("float32", floor, 2.0**-30, t["rtol"], t["atol"], None)  # float32 values, relative above the floor
    dev_stats, dev_rows, nonfinite_rows, bench_stats, _ = _measure(device, bench, golden, geom, params)
    assert dev_stats is not None and dev_rows is not None
    none = np.zeros(geom.rows, dtype=bool)
    checks = _structural_checks("lse", geom, device, dev_stats, nonfinite_rows, (none, none), settings)
    for key, (standard_key, default, label, metric) in LSE_LIMITS.items():
        limit, own = t.get(standard_key, default), standard_key in t
        source = f"{standard_key} of {settings.label}" if own else f"double-benchmark's default ({settings.label})"
        dev = getattr(dev_stats, metric)
        ref = 0.0 if bench_stats is None else getattr(bench_stats, metric)
        shown = f"benchmark {fmt(ref)}" + (" floored" if ref < floor else "")
        detail = f" (device {fmt(dev)}, {shown}; floor {fmt(floor)}: {why}; limit {source})"
        checks.append(upper(key, "lse", dev / max(ref, floor), limit, label, detail=detail))
    worst = _worst_elements(geom, dev_rows, device, golden, bench, params)
    return TensorResult(
        name="lse",
        shape=tuple(geom.shape),  # the query rows and a trailing 1 (lse_shape trailing_one)
        dtype="float32",
        axes=geom.axes,
        device=dev_stats,
        benchmark=bench_stats,
        checks=tuple(checks),
        worst=worst,
        hot_blocks=(),
        block_map=None,
        extra={"floor": floor},
        golden_dtype=str(golden.dtype),
    )


def rows_written_check(
    geom: _Geometry, values: np.ndarray, written: np.ndarray, prefilled: bool, dtype: str, flag_zero: bool = False
) -> Check:
    """The `rows-written` check of one forward output: rows it must write hold finite values, and (when the
    device pre-filled the buffer) rows it must leave alone still hold the NaN prefill.

    Args:
        geom: the tensor's geometry over all its rows (`locate` names a row).
        values: the device's array; `written`: bool per row (`written_rows`, flattened).
        flag_zero: lse with softmaxLseFlag 0: no row may be written.
    """
    name, rows = geom.name, geom.rows
    finite, prefill = _row_states(values.reshape(rows, -1), PREFILL_BITS.get(dtype) if prefilled else None)
    broken, touched = np.flatnonzero(written & ~finite), np.flatnonzero(~written & ~prefill)
    n_written = int(np.count_nonzero(written))
    n_left = rows - n_written
    parts = []
    if broken.size:
        parts.append(
            f"{broken.size} of {n_written} {NOT_WRITTEN} (never written?), first at {geom.where(int(broken[0]))}"
        )
    if touched.size:
        why = " (softmax_lse_flag 0: lse must stay unwritten)" if flag_zero else ""
        parts.append(
            f"{touched.size} of {n_left} rows the forward must leave alone were written (not the NaN prefill){why}, "
            f"first at {geom.where(int(touched[0]))}"
        )
    if parts:
        detail = f"{name} rows-written: " + "; ".join(parts)
        return Check("rows-written", name, float(broken.size + touched.size), 0.0, False, detail, math.inf)
    if flag_zero and prefilled:
        text = f"all {rows} rows hold the NaN prefill (softmax_lse_flag 0: lse left unwritten)"
    elif flag_zero:
        text = "not checked: softmax_lse_flag 0 and run.json records no NaN prefill"
    else:
        text = f"{n_written} written rows finite"
        if n_left:
            alone = "hold the NaN prefill" if prefilled else "not checked (run.json records no NaN prefill)"
            text += f"; {n_left} rows the forward leaves alone {alone}"
    return Check("rows-written", name, 0.0, 0.0, True, f"{name} rows-written: {text}", 0.0)


def _row_states(values2d: np.ndarray, bits: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Return, per row of [rows, cols] `values2d`, whether it is all finite and whether it is all the NaN
    prefill `bits` (True everywhere without a prefill to check: every row left alone passes)."""
    rows = values2d.shape[0]
    unsigned = np.uint16 if values2d.dtype.itemsize == 2 else np.uint32
    step = max(1, CHUNK_ELEMENTS // max(values2d.shape[1], 1))
    finite = np.empty(rows, dtype=bool)
    prefill = np.ones(rows, dtype=bool)
    for start in range(0, rows, step):
        chunk = values2d[start : start + step]
        with np.errstate(invalid="ignore"):
            finite[start : start + step] = np.isfinite(chunk.astype(np.float32)).all(axis=1)
        if bits is not None:
            prefill[start : start + step] = (chunk.view(unsigned) == unsigned(bits)).all(axis=1)
    return finite, prefill
