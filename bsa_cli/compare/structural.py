"""Structural checks, run under every standard.

NaN/Inf where the golden has none; dq rows of empty query rows and dk/dv rows of never-selected kv
positions exactly 0 (`zero_atol` relaxes); padding rows of BNSD cases whose actual lengths are honored are
ignored, or required to be 0 with `padding: zero`; an output that is all zero where the golden is not.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.case import Case
from ..core.layout import kv_view, q_view
from ..standards import Settings
from .buffers import CHUNK_ELEMENTS
from .geometry import _Geometry
from .results import Check, ErrorStats, _fmt


def _zero_check(
    name: str, check: str, label: str, values: np.ndarray, rows: np.ndarray, geom: _Geometry, zero_atol: float
) -> Check | None:
    """Check that the rows flagged in `rows` hold only |value| <= zero_atol; None when no row is flagged."""
    if not rows.any():
        return None
    values2d = values.reshape(geom.rows, geom.dim)
    flagged = np.flatnonzero(rows)
    bad_count = 0
    first_bad: int | None = None
    worst = 0.0
    step = max(1, CHUNK_ELEMENTS // max(geom.dim, 1))
    for start in range(0, len(flagged), step):
        ids = flagged[start : start + step]
        magnitude = np.abs(values2d[ids].astype(np.float32))
        bad = ~(magnitude <= zero_atol)
        n_bad = int(np.count_nonzero(bad))
        if n_bad:
            bad_count += n_bad
            if first_bad is None:
                first_bad = int(ids[np.flatnonzero(bad.any(axis=1))[0]])
            worst_here = magnitude[bad]
            worst = max(worst, float(np.where(np.isnan(worst_here), np.inf, worst_here).max()))
    total = len(flagged) * geom.dim
    if bad_count == 0:
        return Check(check, name, 0.0, 0.0, True, f"{name} {label}: all {total} elements 0", 0.0)
    assert first_bad is not None
    where = geom.where(first_bad)
    text = f"{name} {label}: {bad_count} of {total} elements nonzero (largest |value| {_fmt(worst)}), first at {where}"
    return Check(check, name, float(bad_count), 0.0, False, text, math.inf)


def _all_zero_check(name: str, values: np.ndarray, stats: ErrorStats) -> Check | None:
    """Return a failed check when the device output is all zero and the golden is not; else None.

    An output that is all zero was most likely never written: every ratio against it is huge, and a
    headline such as "tile ratio 4214" would hide what happened. The metrics tell the case for free
    (the cosine of a zero vector with a nonzero golden is exactly 0); only then are the values read.
    """
    # Only a golden whose zeros would be errors counts: a true gradient of exactly 0 that the golden carries as
    # float32 rounding noise (|g| <= small_value_thd everywhere) is not "never written" when the device writes 0.
    if stats.cosine != 0.0 or stats.large_count + stats.small_value_err_count == 0:
        return None
    flat = values.reshape(-1)
    step = CHUNK_ELEMENTS * 8
    for start in range(0, flat.size, step):
        chunk = flat[start : start + step]
        magnitude = chunk.view(np.uint16) & np.uint16(0x7FFF) if chunk.dtype.itemsize == 2 else np.abs(chunk)
        if np.count_nonzero(magnitude):
            return None
    detail = f"{name} is all zero, as if never written, where the golden is not"
    if stats.large_count:
        detail += f" ({stats.large_count} elements with |golden| > err_thd)"
    return Check("all_zero", name, float(flat.size), 0.0, False, detail, math.inf)


def _structural_checks(
    name: str,
    geom: _Geometry,
    values: np.ndarray,
    stats: ErrorStats,
    nonfinite_rows: list[int],
    rows: tuple[np.ndarray, np.ndarray],
    settings: Settings,
) -> list[Check]:
    checks = []
    bad = stats.nonfinite_mismatch
    if bad:
        places = [geom.where(row) for row in nonfinite_rows[:3]]
        elements = f"{bad} element{'s' if bad != 1 else ''} ({stats.nan_count} NaN, {stats.inf_count} Inf)"
        detail = f"{name} NaN/Inf where the golden is finite: {elements}, rows {', '.join(places)}"
        checks.append(Check("nonfinite", name, float(bad), 0.0, False, detail, math.inf))
    else:
        checks.append(Check("nonfinite", name, 0.0, 0.0, True, f"{name} no NaN/Inf where the golden is finite", 0.0))
    found = [_all_zero_check(name, values, stats)]
    zero_rows, padding_rows = rows
    zero_atol = settings.thresholds["zero_atol"]
    if math.isfinite(zero_atol):
        kind = ("empty_rows", "empty query rows") if geom.kind == "q" else ("unselected_kv", "never-selected kv rows")
        found.append(_zero_check(name, *kind, values, zero_rows & ~padding_rows, geom, zero_atol))
        if settings.padding == "zero":
            padding = "padding past the actual length"
            found.append(_zero_check(name, "padding", padding, values, padding_rows, geom, zero_atol))
    return checks + [check for check in found if check is not None]


#: Gradients that atomic adds sum in an order of the run (as `--repeat` allows): bit-identical across copies only
#: when the run asked for deterministic mode (its fixed-order sum, ops-transformer master's `GetDeterministic()`).
RUN_ORDERED = ("dk", "dv")


def batch_consistency_check(name: str, case: Case, values: np.ndarray, deterministic: bool = False) -> Check | None:
    """Return whether each copy of a sequence in the batch (`case.copies`) got its source's dq (or out; dk and dv
    too in a `deterministic` run) bit for bit (TTK's --dl 3): no golden needed, and no tolerance, since the kernel saw
    the same inputs. None without copies, and for `RUN_ORDERED` gradients of a run that is not deterministic."""
    if not case.copies or (name in RUN_ORDERED and not deterministic):
        return None
    spans = case.spans()
    view = kv_view if name in RUN_ORDERED else q_view
    differing, first = 0, None
    total = 0
    for copy, source in case.copies:
        got, want = view(case, values, spans[copy]), view(case, values, spans[source])
        bits = np.dtype(f"u{values.dtype.itemsize}")
        unequal = np.ascontiguousarray(got).view(bits) != np.ascontiguousarray(want).view(bits)
        total += unequal.size
        if unequal.any():
            differing += int(np.count_nonzero(unequal))
            first = first or (copy, source)
    if first is None:
        pairs = ", ".join(f"{c}={s}" for c, s in case.copies)
        return Check("batch_consistency", name, 0.0, 0.0, True, f"{name} copies bit-identical (entries {pairs})", 0.0)
    detail = (
        f"{name} of batch entry {first[0]} differs from its copy, entry {first[1]}, though both saw the same "
        f"sequence: {differing} of {total} elements not bit-identical"
    )
    return Check("batch_consistency", name, float(differing), 0.0, False, detail, math.inf)
