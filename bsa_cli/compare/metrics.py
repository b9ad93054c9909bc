"""The streaming metrics engine: device and benchmark arrays measured against the golden, chunk by chunk.

`_measure` walks a tensor's judged rows in chunks; `_measure_chunk` computes one chunk's sums and
extremes into a `_Partial`, and `_Partial.merge` folds chunks together before `_Partial.stats` turns them
into an `ErrorStats`. A new statistic is one field of `_Partial` (a sum unless listed in `_MAXES` or `_MINS`),
one line in `_measure_chunk`, and one field of `ErrorStats`. Per-row results (`_RowOut`) feed the block
maps and the worst elements (`locate.py`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields

import numpy as np

from ..core.case import Case
from ..core.layout import kv_view, q_view
from ..ops.base import ACCUMULATES_OVER
from ..standards import ERR_THD, SMALL_VALUE_THD, Settings
from ..standards.bias import RelativeSums, relative_errors
from .buffers import CHUNK_ELEMENTS, _floor_array, _give_scratch, _Scratch, _take_scratch, _upcast
from .geometry import TILE, _Geometry
from .results import ErrorStats
from .ulp import _MANTISSA_BITS, ULP_EDGES, _ulp_power

TOP_K = 5


@dataclass(frozen=True)
class _Params:
    io_dtype: str
    err_thd: float
    small_thd: float
    rtol: float
    atol: float
    diff_thd: float | None  # msOpST form
    side_tolerances: tuple[tuple[float, float], ...] = ()  # (rtol, atol) of each side-by-side standard
    #: The small-value bound per tensor row where batch entries differ (`noise_params`), else None: small_thd.
    small_thd_rows: np.ndarray | None = field(default=None, compare=False)


@dataclass
class _Partial:
    """Sums and extremes of one chunk of one array; `merge` folds chunks together."""

    count: int = 0
    sum_abs: float = 0.0
    sum_sq: float = 0.0
    max_abs: float = 0.0
    sum_rel: float = 0.0
    max_rel: float = 0.0
    large: int = 0
    sum_mre: float = 0.0
    max_mre: float = 0.0
    dot_ag: float = 0.0
    dot_aa: float = 0.0
    dot_gg: float = 0.0
    sum_signed_rel: float = 0.0  # signed relative errors (a - g) / g over large values: the bias check
    sum_signed_rel_sq: float = 0.0
    sum_balance: float = 0.0  # (a - g) / max(1, |g|): the error balance (device only)
    mismatch: int = 0
    side_mismatch: tuple[int, ...] = ()  # elements beyond each of `_Params.side_tolerances`
    max_abs_golden: float = 0.0  # the golden where the error is `max_abs` (device only)
    small: int = 0
    small_err: int = 0
    nan: int = 0
    inf: int = 0
    nonfinite_mismatch: int = 0
    ulp_sum: float = 0.0
    ulp_max: float = 0.0
    ulp_over: tuple[int, ...] = (0,) * len(ULP_EDGES)  # elements above each of ULP_EDGES
    msopst_err: int = 0
    msopst_max: float = 0.0
    within_1e3: int = 0
    within_5e3: int = 0
    value_sum: float = 0.0
    value_max: float = -math.inf
    value_min: float = math.inf
    golden_sum: float = 0.0
    golden_max: float = -math.inf
    golden_min: float = math.inf
    nonfinite_rows: list[int] = field(default_factory=list)

    _MAXES = ("max_abs", "max_rel", "max_mre", "ulp_max", "msopst_max", "value_max", "golden_max")
    _MINS = ("value_min", "golden_min")

    def merge(self, other: _Partial) -> None:
        if other.max_abs > self.max_abs:
            self.max_abs_golden = other.max_abs_golden
        mine = self.side_mismatch or (0,) * len(other.side_mismatch)
        self.side_mismatch = tuple(a + b for a, b in zip(mine, other.side_mismatch, strict=True))
        for names, pick in ((_SUMS, lambda a, b: a + b), (self._MAXES, max), (self._MINS, min)):
            for name in names:
                setattr(self, name, pick(getattr(self, name), getattr(other, name)))
        self.ulp_over = tuple(a + b for a, b in zip(self.ulp_over, other.ulp_over, strict=True))
        self.nonfinite_rows.extend(other.nonfinite_rows[: TOP_K - len(self.nonfinite_rows)])

    def stats(self, params: _Params, full: bool) -> ErrorStats:
        count = max(self.count, 1)
        norm = math.sqrt(self.dot_aa) * math.sqrt(self.dot_gg)
        cosine = self.dot_ag / norm if norm > 0 else (1.0 if self.dot_aa == self.dot_gg else 0.0)
        over = (self.count, *self.ulp_over, 0)
        histogram = tuple(int(over[i] - over[i + 1]) for i in range(len(ULP_EDGES) + 1))
        return ErrorStats(
            count=self.count,
            max_abs_err=self.max_abs,
            mean_abs_err=self.sum_abs / count,
            rmse=math.sqrt(self.sum_sq / count),
            max_rel_err=self.max_rel,
            mean_rel_err=self.sum_rel / max(self.large, 1),
            bias=self.sum_signed_rel / max(self.large, 1),
            bias_se=self._bias_se(),
            large_count=self.large,
            mare=self.max_mre if full else None,
            mere=self.sum_mre / count if full else None,
            cosine=min(cosine, 1.0) if full else None,
            mismatch_count=self.mismatch if full else None,
            mismatch_ratio=self.mismatch / count if full else None,
            side_mismatch_counts=(self.side_mismatch or (0,) * len(params.side_tolerances)) if full else None,
            max_abs_golden=self.max_abs_golden if full else None,
            error_balance=self.sum_balance / count if full else None,
            small_value_count=self.small,
            small_value_err_count=self.small_err,
            nan_count=self.nan,
            inf_count=self.inf,
            nonfinite_mismatch=self.nonfinite_mismatch,
            ulp_max=self.ulp_max if full else None,
            ulp_mean=self.ulp_sum / count if full else None,
            ulp_histogram=histogram if full else None,
            msopst_err_count=self.msopst_err if full and params.diff_thd is not None else None,
            msopst_max_err=self.msopst_max if full and params.diff_thd is not None else None,
            **(self._msprobe() if full and self.count else {}),
        )

    def _bias_se(self) -> float:
        """The standard error of the mean signed relative error (`compare.bias`)."""
        if not self.large:
            return 0.0
        mean = self.sum_signed_rel / self.large
        return math.sqrt(max(self.sum_signed_rel_sq - self.sum_signed_rel * mean, 0.0)) / self.large

    def _msprobe(self) -> dict[str, float]:
        """msprobe's figures of the measured elements (`ErrorStats.thousandth_ratio` and the rest)."""
        return {
            "thousandth_ratio": self.within_1e3 / self.count,
            "five_thousandths_ratio": self.within_5e3 / self.count,
            "value_max": self.value_max,
            "value_min": self.value_min,
            "value_mean": self.value_sum / self.count,
            "value_l2norm": math.sqrt(self.dot_aa),
            "golden_max": self.golden_max,
            "golden_min": self.golden_min,
            "golden_mean": self.golden_sum / self.count,
            "golden_l2norm": math.sqrt(self.dot_gg),
        }


#: The fields of `_Partial` that chunks add up: every one but its maxima, minima, ULP counts and rows.
_SUMS = tuple(
    f.name
    for f in fields(_Partial)
    if f.name
    not in (*_Partial._MAXES, *_Partial._MINS, "ulp_over", "nonfinite_rows", "side_mismatch", "max_abs_golden")
)


@dataclass
class _RowOut:
    """Per-row results written by the chunks (disjoint slices, so threads need no lock)."""

    tile_sse: np.ndarray  # [rows, ceil(D / 16)] float32: sum of squared errors per row and 16 columns
    max_abs: np.ndarray | None = None  # [rows] float32 (device only); -1 on rows never judged, inf if NaN/Inf
    argmax: np.ndarray | None = None  # [rows] int32


_ONES = np.ones(TILE, dtype=np.float32)


def _tile_sums(squared: np.ndarray) -> np.ndarray:
    """Sum [rows, D] squared errors over groups of 16 columns: [rows, ceil(D / 16)]."""
    rows, dim = squared.shape
    if dim % TILE == 0:
        return (squared.reshape(-1, TILE) @ _ONES).reshape(rows, dim // TILE)
    return np.add.reduceat(squared, np.arange(0, dim, TILE), axis=1)


@dataclass
class _Shared:
    """What the golden contributes to every array's metrics in one chunk, computed once."""

    golden: np.ndarray  # float32 [rows, D]
    abs_golden: np.ndarray
    large: np.ndarray  # bool: |g| > err_thd
    inv_large: np.ndarray  # 1 / g where large (signed, so (a - g) * inv_large is the signed relative error), else 0
    large_count: int
    max_abs: float  # largest |g|


def _shared(golden: np.ndarray, params: _Params, scratch: _Scratch) -> _Shared:
    shape = golden.shape
    if golden.dtype == np.float32:
        g = golden
    else:
        g = scratch.get("golden", np.float32, shape)
        np.copyto(g, golden, casting="same_kind")
    abs_g = np.abs(g, out=scratch.get("abs_golden", np.float32, shape))
    large = np.greater(abs_g, np.float32(params.err_thd), out=scratch.get("large", np.bool_, shape))
    # 1 / |g| where large, else 0; adding 1e-30 leaves every |g| > err_thd unchanged and keeps 0 / 0 away.
    # (NumPy's maximum with a scalar is several times slower than these two operations.)
    inv_large = np.add(abs_g, np.float32(1e-30), out=scratch.get("inv_large", np.float32, shape))
    np.divide(large, inv_large, out=inv_large)
    np.copysign(inv_large, g, out=inv_large)
    return _Shared(g, abs_g, large, inv_large, int(np.count_nonzero(large)), float(abs_g.max(initial=0.0)))


_INDEX = np.arange(CHUNK_ELEMENTS, dtype=np.intp)


def _measure_chunk(
    a: np.ndarray, s: _Shared, params: _Params, out: _RowOut, rows: slice | np.ndarray, full: bool, scratch: _Scratch
) -> _Partial:
    """Measure float32 values `a` [rows, D] (all finite) against the shared golden of the chunk."""
    part = _Partial()
    diff = np.subtract(a, s.golden, out=scratch.get("diff", np.float32, a.shape))
    work = np.multiply(diff, diff, out=scratch.get("work", np.float32, a.shape))
    tiles = _tile_sums(work)
    out.tile_sse[rows] = tiles
    part.count = diff.size
    part.sum_sq = float(tiles.sum(dtype=np.float64))
    np.multiply(diff, s.inv_large, out=work)  # signed relative errors, 0 on small values
    flat_rel = work.reshape(-1)
    part.sum_signed_rel = float(np.dot(flat_rel, _floor_array(1.0, flat_rel.shape)))
    part.sum_signed_rel_sq = float(np.dot(flat_rel, flat_rel))
    if full:
        balance = np.maximum(s.abs_golden, np.float32(1.0), out=scratch.get("balance", np.float32, a.shape))
        np.divide(diff, balance, out=balance)
        flat_balance = balance.reshape(-1)
        part.sum_balance = float(np.dot(flat_balance, _floor_array(1.0, flat_balance.shape)))
    abs_diff = np.abs(diff, out=diff)
    part.sum_abs = float(abs_diff.sum())
    np.abs(work, out=work)  # ATK's relative error, 0 on small values
    part.sum_rel = float(work.sum())
    part.max_rel = float(work.max(initial=0.0))
    part.large = s.large_count
    part.small = diff.size - s.large_count
    bound = np.float32(params.small_thd) if params.small_thd_rows is None else params.small_thd_rows[rows][:, None]
    flags = np.greater(abs_diff, bound, out=scratch.get("flags", np.bool_, a.shape))
    part.small_err = int(np.count_nonzero(np.greater(flags, s.large, out=flags)))
    if out.max_abs is not None and out.argmax is not None:
        arg = abs_diff.argmax(axis=1)
        row_max = abs_diff[_INDEX[: len(arg)], arg]
        out.argmax[rows] = arg
        out.max_abs[rows] = row_max
        part.max_abs = float(row_max.max(initial=0.0))
        if row_max.size:
            worst = int(row_max.argmax())
            part.max_abs_golden = float(s.golden[worst, arg[worst]])
    else:
        part.max_abs = float(abs_diff.max(initial=0.0))
    if not full:
        return part
    flat_a, flat_g = a.reshape(-1), s.golden.reshape(-1)
    part.dot_ag = float(np.dot(flat_a, flat_g))
    part.dot_aa = float(np.dot(flat_a, flat_a))
    part.dot_gg = float(np.dot(flat_g, flat_g))
    np.add(s.abs_golden, np.float32(1e-7), out=work)
    np.divide(abs_diff, work, out=work)  # the single standard's relative error
    part.sum_mre = float(work.sum())
    part.max_mre = float(work.max(initial=0.0))
    part.within_1e3 = int(np.count_nonzero(np.less(work, np.float32(1e-3), out=flags)))
    part.within_5e3 = int(np.count_nonzero(np.less(work, np.float32(5e-3), out=flags)))
    if flat_a.size:
        ones = _floor_array(1.0, flat_a.shape)  # a dot with ones: three times faster than NumPy's sum here
        part.value_sum, part.golden_sum = float(np.dot(flat_a, ones)), float(np.dot(flat_g, ones))
        part.value_max, part.value_min = float(flat_a.max()), float(flat_a.min())
        part.golden_max, part.golden_min = float(flat_g.max()), float(flat_g.min())
    np.multiply(s.abs_golden, np.float32(params.rtol), out=work)
    work += np.float32(params.atol)
    part.mismatch = int(np.count_nonzero(np.greater(abs_diff, work, out=flags)))
    sides = []
    for rtol, atol in params.side_tolerances:
        np.multiply(s.abs_golden, np.float32(rtol), out=work)
        work += np.float32(atol)
        sides.append(int(np.count_nonzero(np.greater(abs_diff, work, out=flags))))
    part.side_mismatch = tuple(sides)
    np.divide(abs_diff, _ulp_power(s.abs_golden, params.io_dtype, work, params.err_thd), out=work)  # ULP / 2^m
    unit = 2.0 ** _MANTISSA_BITS.get(params.io_dtype, 23)
    part.ulp_sum = float(work.sum()) * unit
    part.ulp_max = float(work.max(initial=0.0)) * unit
    part.ulp_over = tuple(
        int(np.count_nonzero(np.greater(work, np.float32(edge / unit), out=flags))) for edge in ULP_EDGES
    )
    if params.diff_thd is not None:
        # msOpST: absolute error below diff_thd, else relative to max(|a|, |g|, 2^-14 / diff_thd).
        floor = np.float32(2.0**-14 / params.diff_thd)
        denominator = np.maximum(np.maximum(np.abs(a), s.abs_golden), floor) + np.float32(1e-9)
        rdiff = np.where(abs_diff < params.diff_thd, abs_diff, abs_diff / denominator)
        part.msopst_err = int(np.count_nonzero(rdiff > params.diff_thd))
        part.msopst_max = float(rdiff.max(initial=0.0))
    return part


def _measure_array(
    values: np.ndarray | None,
    out: _RowOut | None,
    full: bool,
    shared: _Shared,
    params: _Params,
    rows: slice | np.ndarray,
    scratch: _Scratch,
) -> _Partial | None:
    """Measure one array of a chunk (the device's, or the benchmark's: [rows, D] in the case dtype) against
    the shared golden."""
    if values is None or out is None:
        return None
    a = _upcast(values, params.io_dtype, scratch)
    part = _measure_chunk(a, shared, params, out, rows, full, scratch)
    # float16 Inf/NaN come out of _upcast as finite values >= 65536: an error that large, or a golden
    # that large, sends the chunk to the exact (slow) path; bfloat16 Inf/NaN propagate as themselves.
    suspect = values.dtype == np.float16 and part.max_abs + shared.max_abs >= 65504.0
    if suspect or not math.isfinite(part.sum_sq + part.sum_abs):
        a = values.astype(np.float32)
        part = _measure_nonfinite(a, shared, params, out, rows, full)
        if full and out.max_abs is not None:
            bad_rows = np.flatnonzero(~np.isfinite(a).all(axis=1))
            out.max_abs[_global_rows(rows, bad_rows)] = np.inf
        part.nonfinite_rows = [int(r) for r in _global_rows(rows, np.asarray(part.nonfinite_rows, dtype=np.intp))]
    return part


def _global_rows(rows: slice | np.ndarray, local: np.ndarray) -> np.ndarray:
    """Return the tensor's rows of a chunk's row numbers `local` (0 is the chunk's first row)."""
    if isinstance(rows, slice):
        return (rows.start or 0) + local
    return rows[local]


def _measure_nonfinite(
    a: np.ndarray, s: _Shared, params: _Params, out: _RowOut, rows: slice | np.ndarray, full: bool
) -> _Partial:
    """The slow path of a chunk holding NaN/Inf (or errors too large to square in float32)."""
    finite_a, finite_g = np.isfinite(a), np.isfinite(s.golden)
    bad = finite_a != finite_g
    both = ~finite_a & ~finite_g
    bad |= both & (a != s.golden) & ~(np.isnan(a) & np.isnan(s.golden))
    golden = np.where(finite_g, s.golden, np.float32(0))
    cleaned = np.where(finite_a & finite_g, a, golden)
    limit = np.float32(1e18)  # squares of larger errors would overflow float32
    cleaned = np.clip(cleaned, golden - limit, golden + limit)
    scratch = _Scratch()  # not the thread's: `s` lives in those buffers
    shared = _shared(golden, params, scratch) if not finite_g.all() else s
    part = _measure_chunk(cleaned.astype(np.float32), shared, params, out, rows, full, scratch)
    left_out = ~(finite_a & finite_g)  # judged as equal to the golden above; now left out of the counts
    n_left, n_large = int(np.count_nonzero(left_out)), int(np.count_nonzero(left_out & shared.large))
    part.count -= n_left
    part.large -= n_large
    part.small -= n_left - n_large
    part.nan = int(np.count_nonzero(np.isnan(a)))
    part.inf = int(np.count_nonzero(np.isinf(a)))
    part.nonfinite_mismatch = int(np.count_nonzero(bad))
    part.nonfinite_rows = [int(r) for r in np.flatnonzero(bad.any(axis=1))[:TOP_K]]
    return part


#: Judged row ranges shorter on average than a chunk's rows / GATHER_BELOW are measured gathered (`_items`).
GATHER_BELOW = 4


def _items(geom: _Geometry) -> list[slice | np.ndarray]:
    """Return the work items of a tensor's judged rows: its row segments split into ranges of about
    CHUNK_ELEMENTS elements, or, where the judged rows are many short ranges (the rows the forward writes,
    heads interleaved in TND), the rows themselves gathered into index arrays of about CHUNK_ELEMENTS
    elements (thousands of tiny chunks cost seconds)."""
    step = max(1, CHUNK_ELEMENTS // max(geom.dim, 1))
    judged = geom.judged
    if judged is not None and len(judged) > 1:
        count = sum(stop - start for start, stop in judged)
        if count < len(judged) * step / GATHER_BELOW:
            rows = np.concatenate([np.arange(start, stop, dtype=np.intp) for start, stop in judged])
            return [rows[i : i + step] for i in range(0, len(rows), step)]
    return [slice(r, min(r + step, stop)) for start, stop in geom.segments() for r in range(start, stop, step)]


def _measure(
    device: np.ndarray | None, bench: np.ndarray | None, golden: np.ndarray, geom: _Geometry, params: _Params
) -> tuple[ErrorStats | None, _RowOut | None, list[int], ErrorStats | None, _RowOut | None]:
    """Measure the device and benchmark arrays (either may be None) against the golden over the judged
    rows, chunk by chunk: (device stats, device rows, device non-finite rows, benchmark stats and rows).

    Chunks run one after another in the calling thread: each is a few dozen short NumPy passes, and
    threads sharing them spend more time handing the GIL back and forth than they gain (measured: two
    threads no faster than one). Parallelism comes from hashing alongside, and from processes per case.
    """
    rows, dim = geom.rows, geom.dim
    golden2d = golden.reshape(rows, dim)
    device2d = None if device is None else device.reshape(rows, dim)
    bench2d = None if bench is None else bench.reshape(rows, dim)
    tiles = -(-dim // TILE)
    device_out = None
    if device is not None:
        device_out = _RowOut(
            np.zeros((rows, tiles), dtype=np.float32),
            np.full(rows, -1.0, dtype=np.float32),
            np.zeros(rows, dtype=np.int32),
        )
    bench_out = None if bench is None else _RowOut(np.zeros((rows, tiles), dtype=np.float32))

    device_total, bench_total = _Partial(), _Partial()
    sides = ((device2d, device_out, device_total, True), (bench2d, bench_out, bench_total, False))
    for item in _items(geom):  # the tensor's rows `item`: a range, or the rows themselves
        # Non-finite elements are counted, then judged as if equal to the golden (their error shows in the
        # counts and the structural check, not in every metric).
        scratch = _take_scratch()
        try:
            # Overflowing squares and sums of a wild device (huge errors) are expected: they mean failure.
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                shared = _shared(golden2d[item], params, scratch)
                for values, out, total, full in sides:
                    array = None if values is None else values[item]
                    part = _measure_array(array, out, full, shared, params, item, scratch)
                    if part is not None:
                        total.merge(part)
        finally:
            _give_scratch(scratch)
    device_stats = None if device is None else device_total.stats(params, full=True)
    bench_stats = None if bench is None else bench_total.stats(params, full=False)
    return device_stats, device_out, device_total.nonfinite_rows, bench_stats, bench_out


def paired_relative_sums(
    device: np.ndarray, bench: np.ndarray, golden: np.ndarray, geom: _Geometry, params: _Params
) -> RelativeSums:
    """Sum the per-element differences (device - benchmark) / g over the judged large values (|g| >
    err_thd) where both sides are finite: the bias check's paired estimate (`bias.py`).

    A pass of its own over the three arrays, run only when the two sides' biases differ by more than the
    check's floor (a clean device never gets here, so the benchmark stays unread when its summary stands
    for it).
    """
    rows, dim = geom.rows, geom.dim
    device2d, bench2d, golden2d = (a.reshape(rows, dim) for a in (device, bench, golden))
    sums = RelativeSums()
    with np.errstate(over="ignore", invalid="ignore"):  # a wild device's inf - inf is left out below
        for item in _items(geom):
            d = device2d[item].astype(np.float64)
            sums.add(*relative_errors(d - bench2d[item], golden2d[item], params.err_thd))
    return sums


def accumulation_length(case: Case, tensor: str) -> int:
    """How many products one element of `tensor` sums (`ACCUMULATES_OVER`); 1 for a tensor not listed."""
    axis = ACCUMULATES_OVER.get(tensor)
    if axis == "kv":
        return max(case.kv_lengths(), default=1)
    if axis == "q":
        return max(case.q_lengths(), default=1) * case.group_size
    return 1


def noise_params(params: _Params, case: Case, tensor: str, golden: np.ndarray) -> _Params:
    """`params` for one tensor: where its golden is noise-level (no |g| > err_thd, as where a row sees one key and
    dq, dk are exactly 0 but every side carries float32 cancellation noise), the small-value bound grows with the
    float32 rounding of a sum of n products, sqrt(n) (the standard's bound is one rounding's). That holds for the
    whole tensor, or for the rows of each batch entry whose golden is noise-level everywhere (a varlen entry of one
    key beside entries of real values); anywhere else the standard's bound stands."""
    peak = _peak(golden)
    if peak <= params.err_thd:
        return dataclasses.replace(params, small_thd=params.small_thd * math.sqrt(accumulation_length(case, tensor)))
    axis = ACCUMULATES_OVER.get(tensor)
    if axis is None or not math.isfinite(peak):  # NaN in the golden: the standard's bound
        return params
    view = q_view if axis == "kv" else kv_view  # dq is query-shaped and sums over keys; dk, dv the other way
    rows = np.full((*golden.shape[:-1], 1), params.small_thd, dtype=np.float32)
    grown = False
    for span in case.spans():
        entry = view(case, golden, span)
        if entry.size and _peak(entry) <= params.err_thd:
            terms = span.kv_len if axis == "kv" else span.q_len * case.group_size
            view(case, rows, span)[...] = params.small_thd * math.sqrt(max(terms, 1))
            grown = True
    return dataclasses.replace(params, small_thd_rows=rows.reshape(-1)) if grown else params


def _peak(golden: np.ndarray) -> float:
    """Largest |g| (NaN where the golden holds NaN)."""
    with np.errstate(invalid="ignore"):
        return max(float(golden.max(initial=0.0)), -float(golden.min(initial=0.0)))


def _params(case: Case, settings: Settings, sides: tuple[Settings, ...] = ()) -> _Params:
    """The measuring parameters of a case under `settings`, counting mismatches at each of `sides`' tolerances too."""
    t = settings.thresholds
    err_thd = t.get("err_thd", ERR_THD.get(case.dtype, ERR_THD["float32"]))
    small_thd = t.get("small_value_thd", SMALL_VALUE_THD.get(case.dtype, SMALL_VALUE_THD["float32"]))
    diff_thd = t["diff_thd"] if settings.msopst else None
    tolerances = tuple((side.thresholds["rtol"], side.thresholds["atol"]) for side in sides)
    return _Params(case.dtype, err_thd, small_thd, t["rtol"], t["atol"], diff_thd, tolerances)
