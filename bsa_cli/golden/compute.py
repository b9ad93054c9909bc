"""What callers compute: the golden of one batch entry's arrays, of a whole case, and what `bsa gen` writes.

Per batch entry ([N, S, D] arrays): `forward_sequence`, `backward_sequence`, `backward_sequence_kernel`,
`forward_backward_sequence`. Per case (BNSD or TND tensors, cut into batch entries by `layout`): `forward`,
`backward`, `backward_kernel`, `forward_backward`, and `golden_and_benchmark`, the golden and benchmark
walks of every entry and kv head in rounds, in threads when the rows carry enough arithmetic (`_lanes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import cast

import numpy as np
from numpy.typing import DTypeLike

from ..core.case import Case, SequenceSpan, numpy_dtype
from ..core.layout import kv_view, lse_view, mask_view, q_view
from .paths import Grads, Inputs, _Both, _Entry, _Forward, _ForwardGolden, _Golden, _Kernel, _Path
from .walk import _run, _SharedBlocks, _Task, _Tiles

# ---- one batch entry ----------------------------------------------------------------------------


def _check_precision(precision: DTypeLike) -> np.dtype:
    """Return `precision` as a dtype, after checking it is float32 or float64."""
    precision = np.dtype(precision)
    if precision not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"precision must be float32 or float64, got {precision}")
    return precision


def _zeros_grads(q_shape: tuple[int, ...], kv_shape: tuple[int, ...], dtype: DTypeLike) -> Grads:
    """Return zero-filled (dq, dk, dv) of the query's and the key's shape."""
    return np.zeros(q_shape, dtype=dtype), np.zeros(kv_shape, dtype=dtype), np.zeros(kv_shape, dtype=dtype)


def _forward_rows(
    query: np.ndarray, out_dtype: DTypeLike = np.float64, lse_dtype: DTypeLike = np.float64
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return one entry's out (zeros), lse (-inf) and empty (True) rows for a [N1, sq, D] `query`."""
    heads, q_len, dim = query.shape
    out = np.zeros((heads, q_len, dim), dtype=out_dtype)
    return out, np.full((heads, q_len), -np.inf, dtype=lse_dtype), np.ones((heads, q_len), dtype=bool)


def _walk_entry(inputs: Inputs, block_shape: Sequence[int], scale: float, path: Callable[[_Entry], _Path]) -> None:
    """Check one batch entry's inputs and walk each of its kv heads, with a path of its own from `path(entry)`."""
    entry = _Entry.of(inputs, block_shape, scale)
    _run([_Task(path(entry), kv_head) for kv_head in range(entry.key.shape[0])])


def forward_sequence(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    block_shape: Sequence[int],
    scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute block-sparse attention of one batch entry in float64.

    Args:
        query: [N1, sq, D], any float dtype.
        key, value: [N2, skv, D]; query head n uses kv head n // (N1 / N2).
        block_mask: [N1, ceil(sq/X), ceil(skv/Y)], nonzero = selected.
        block_shape: (X, Y).
        scale: factor applied to Q K^T.

    Returns:
        out [N1, sq, D] float64 (0 on empty rows), lse [N1, sq] float64 (natural log of the sum of exp
        of the scaled scores over the selected positions; -inf on empty rows), and empty [N1, sq] bool.
    """
    out, lse, empty = _forward_rows(query)
    _walk_entry((None, query, key, value, block_mask), block_shape, scale, lambda e: _Forward(e, out, lse, empty))
    return out, lse, empty


def backward_sequence(
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    block_mask: np.ndarray,
    block_shape: Sequence[int],
    scale: float,
    precision: DTypeLike = np.float32,
) -> Grads:
    """Compute dq, dk, dv of one batch entry in `precision` (float32 or float64) from the given out and lse.

    Args:
        dout, query, out: [N1, sq, D]; lse: [N1, sq] (its value on empty rows is never read).
        key, value: [N2, skv, D].
        block_mask: [N1, ceil(sq/X), ceil(skv/Y)], nonzero = selected.

    Returns:
        dq [N1, sq, D], dk and dv [N2, skv, D], all of `precision`.
    """
    grads = _zeros_grads(query.shape, key.shape, _check_precision(precision))
    _walk_entry((dout, query, key, value, block_mask), block_shape, scale, lambda e: _Golden(e, out, lse, grads))
    return grads


def backward_sequence_kernel(
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    block_mask: np.ndarray,
    block_shape: Sequence[int],
    scale: float,
    io_dtype: DTypeLike,
) -> Grads:
    """Compute dq, dk, dv of one batch entry the way the A2/A3 kernel does (docs/operator.md section 2).

    Tensors are first rounded to `io_dtype` and lse to float32, as the kernel sees them.
    Arguments as `backward_sequence`.

    Returns:
        dq, dk, dv of `io_dtype` (float16 or bfloat16).
    """
    grads = _zeros_grads(query.shape, key.shape, io_dtype)
    _walk_entry((dout, query, key, value, block_mask), block_shape, scale, lambda e: _Kernel(e, out, lse, grads))
    return grads


def forward_backward_sequence(
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    block_shape: Sequence[int],
    scale: float,
    io_dtype: DTypeLike,
    precision: DTypeLike = np.float32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compute one entry's forward, rounded to the tensor dtypes, and the golden backward from the rounded values.

    Args:
        dout, query: [N1, sq, D]; key, value: [N2, skv, D]; block_mask, block_shape, scale as `forward_sequence`.
            Their values are read through `precision` (exact for the op's float16/bfloat16 tensors).
        io_dtype: the dtype out is rounded to (float16 or bfloat16); lse is rounded to float32.
        precision: of the backward, float32 or float64.

    Returns:
        out [N1, sq, D] of `io_dtype` and lse [N1, sq] float32, bit for bit `forward_sequence`'s rounded
        (0 and -inf on empty rows), empty [N1, sq] bool, and dq [N1, sq, D], dk, dv [N2, skv, D] of `precision`,
        the golden backward of that out and lse (as `backward_sequence`, to its rounding).
    """
    precision = _check_precision(precision)
    out, lse, empty = _forward_rows(query, io_dtype, np.float32)
    grads = _zeros_grads(query.shape, key.shape, precision)
    inputs = (dout, query, key, value, block_mask)
    _walk_entry(inputs, block_shape, scale, lambda entry: _ForwardGolden(entry, out, lse, empty, grads))
    return (out, lse, empty, *grads)


# ---- whole case ---------------------------------------------------------------------------------


def _grad_views(case: Case, grads: tuple[np.ndarray, ...], span: SequenceSpan) -> Grads:
    dq, dk, dv = grads
    return q_view(case, dq, span), kv_view(case, dk, span), kv_view(case, dv, span)


def _case_entries(case: Case, inputs: Inputs) -> Iterator[tuple[SequenceSpan, _Entry]]:
    """Yield (span, entry) for each batch entry of a case with query rows."""
    for span in case.spans():
        if span.q_len == 0:
            continue
        views = (q_view, q_view, kv_view, kv_view, mask_view)
        arrays = tuple(None if a is None else view(case, a, span) for view, a in zip(views, inputs, strict=True))
        yield span, _Entry.of(cast(Inputs, arrays), case.block_shape, case.kernel_scale)


def _case_walks(case: Case, inputs: Inputs, path: Callable[[SequenceSpan, _Entry], _Path]) -> list[_Task]:
    """Return one walk per batch entry (with query rows) and kv head of a case, with a path of its own from
    `path(span, entry)`."""
    entries = _case_entries(case, inputs)
    return [_Task(path(span, entry), kv_head) for span, entry in entries for kv_head in range(entry.key.shape[0])]


def _forward_arrays(case: Case, rounded: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Return attentionOut (zeros) and softmaxLse ([q_shape[:-1]], the empty-row sentinel) of a case: float64, or
    `rounded` as written (the case dtype, float32)."""
    out_dtype, lse_dtype = (numpy_dtype(case.dtype), np.float32) if rounded else (np.float64, np.float64)
    with np.errstate(over="ignore"):  # a huge finite sentinel becomes inf, as when `forward`'s lse is cast
        empty_row_lse = np.float64(case.empty_row_lse).astype(lse_dtype)
    return np.zeros(case.q_shape, dtype=out_dtype), np.full(case.q_shape[:-1], empty_row_lse, dtype=lse_dtype)


def forward(
    case: Case, query: np.ndarray, key: np.ndarray, value: np.ndarray, block_mask: np.ndarray, jobs: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Compute attentionOut and softmaxLse of a case in float64, its walks in up to `jobs` threads (same bits).

    Returns:
        attention_out of shape `case.q_shape` and softmax_lse of shape `case.q_shape[:-1]` (no trailing 1).
        Empty rows and rows past a batch entry's length have out 0 and lse `case.empty_row_lse`.
    """
    attention_out, softmax_lse = _forward_arrays(case)

    def path(span: SequenceSpan, entry: _Entry) -> _Path:
        lse = lse_view(case, softmax_lse, span)
        return _Forward(entry, q_view(case, attention_out, span), lse, np.ones(lse.shape, dtype=bool))

    _run(_case_walks(case, (None, query, key, value, block_mask), path), _lanes(case, block_mask, jobs))
    return attention_out, softmax_lse


def backward(
    case: Case,
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    attention_out: np.ndarray,
    softmax_lse: np.ndarray,
    block_mask: np.ndarray,
    precision: DTypeLike = np.float32,
) -> Grads:
    """Compute the golden dq, dk, dv of a case in `precision` (float32 or float64).

    `softmax_lse` may have the trailing axis of size one or not. Padding stays 0.
    """
    arrays = (dout, query, key, value, attention_out, softmax_lse, block_mask)
    return _backward_case(case, arrays, _check_precision(precision), _Golden)


def backward_kernel(
    case: Case,
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    attention_out: np.ndarray,
    softmax_lse: np.ndarray,
    block_mask: np.ndarray,
) -> Grads:
    """Compute dq, dk, dv of a case on the kernel's precision path, in the case dtype."""
    arrays = (dout, query, key, value, attention_out, softmax_lse, block_mask)
    return _backward_case(case, arrays, numpy_dtype(case.dtype), _Kernel)


def _backward_case(
    case: Case,
    arrays: tuple[np.ndarray, ...],
    dtype: DTypeLike,
    path: Callable[[_Entry, np.ndarray, np.ndarray, Grads], _Path],
) -> Grads:
    """Walk a backward precision path (`_Golden`, `_Kernel`) over every batch entry and kv head of a case,
    from the given out and lse, into dq, dk, dv of `dtype`."""
    dout, query, key, value, attention_out, softmax_lse, block_mask = arrays
    grads = _zeros_grads(case.q_shape, case.kv_shape, dtype)

    def walk_path(span: SequenceSpan, entry: _Entry) -> _Path:
        out, lse = q_view(case, attention_out, span), lse_view(case, softmax_lse, span)
        return path(entry, out, lse, _grad_views(case, grads, span))

    _run(_case_walks(case, (dout, query, key, value, block_mask), walk_path))
    return grads


def forward_backward(
    case: Case,
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    precision: DTypeLike = np.float32,
    jobs: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compute a case's attentionOut and softmaxLse, rounded as written, and the golden dq, dk, dv from them.

    One pass instead of `forward` then `backward` (see `forward_backward_sequence`); kv heads in up to
    `jobs` threads, with the same results.

    Returns:
        attention_out of shape `case.q_shape` in the case dtype and softmax_lse of shape `case.q_shape[:-1]` in
        float32: bit for bit `forward`'s, cast; then dq, dk, dv in `precision` (float32 or float64), as
        `backward` gives for that out and lse, to its rounding.
    """
    out, lse, (dq, dk, dv), _ = golden_and_benchmark(case, dout, query, key, value, block_mask, precision, jobs, False)
    return out, lse, dq, dk, dv


def golden_and_benchmark(
    case: Case,
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    precision: DTypeLike = np.float32,
    jobs: int = 1,
    benchmark: bool = True,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """Compute what `bsa gen` writes: `forward_backward`'s out, lse and golden, and the kernel-faithful benchmark.

    The benchmark is `backward_kernel` of the rounded out and lse, bit for bit. Its walk over a kv head
    follows the golden's tile by tile (on one thread, where both read the same float32 blocks, it is the
    golden's walk itself: `_Both`); with `jobs` > 1 the walks run in up to `jobs` threads, largest first,
    when the case's rows carry enough arithmetic to share (`_THREADS_MIN_ROW_FLOPS`). Without `benchmark`
    only the golden walks run (`forward_backward`) and the benchmark is ().

    Returns:
        attention_out, softmax_lse ([q_shape[:-1]] float32), golden (dq, dk, dv) of `precision`, and
        benchmark (dq, dk, dv) of the case dtype.
    """
    precision = _check_precision(precision)
    attention_out, softmax_lse = _forward_arrays(case, rounded=True)
    gold = _zeros_grads(case.q_shape, case.kv_shape, precision)
    bench = _zeros_grads(case.q_shape, case.kv_shape, numpy_dtype(case.dtype)) if benchmark else ()
    jobs = _lanes(case, block_mask, jobs)
    walks: list[tuple[_Task, _Task | None]] = []  # (golden, benchmark) of entries and kv heads, one round
    for span, entry in _case_entries(case, (dout, query, key, value, block_mask)):
        out, lse = q_view(case, attention_out, span), lse_view(case, softmax_lse, span)
        empty = np.ones(lse.shape, dtype=bool)
        gold_views = _grad_views(case, gold, span)
        bench_views = _grad_views(case, bench, span) if benchmark else None
        io_inputs = all(a.dtype == attention_out.dtype for a in (entry.key, entry.value))
        for kv_head in range(case.num_kv_heads):
            golden_walk = _Task(_ForwardGolden(entry, out, lse, empty, gold_views), kv_head)
            kernel_walk = None
            if bench_views is not None and jobs == 1 and io_inputs and precision == np.float32:
                # one walk: each row's blocks gathered once for both (the same float32 values)
                golden_walk.path = _Both(golden_walk.path, _Kernel(entry, out, lse, bench_views))
            elif bench_views is not None:
                golden_walk.announce = _Tiles()
                kernel_walk = _Task(_Kernel(entry, out, lse, bench_views), kv_head, after=golden_walk.announce)
                if io_inputs and precision == np.float32:  # both walks read float32 blocks of the same values
                    golden_walk.shared = kernel_walk.shared = _SharedBlocks(2)
            walks.append((golden_walk, kernel_walk))
            if len(walks) == _WALKS_PER_ROUND:
                _run_round(walks, jobs)
                walks = []
    _run_round(walks, jobs)
    return attention_out, softmax_lse, gold, bench


#: Golden walks (each with its benchmark walk) made and run together; the next are made once they are done,
#: so a case of many batch entries or kv heads never holds the walks of all of them at once.
_WALKS_PER_ROUND = 64


def _run_round(walks: list[tuple[_Task, _Task | None]], jobs: int) -> None:
    """Run the golden walks (in threads: largest first), then their benchmark walks in the same order."""
    if jobs > 1:
        walks.sort(key=lambda pair: -pair[0].pairs())
    _run([g for g, _ in walks] + [k for _, k in walks if k is not None], jobs)


#: Arithmetic per query-block row (14 X Y D per selected block pair) from which walks run in threads.
#:
#: Below it a row's few dozen NumPy calls take longer than their arithmetic, and threads would only take
#: turns at the interpreter (tiny blocks, head dims or sequences).
_THREADS_MIN_ROW_FLOPS = 4e6


def _lanes(case: Case, block_mask: np.ndarray, jobs: int) -> int:
    """Return `jobs` if the case's rows carry enough arithmetic to gain from threads, else 1."""
    if jobs <= 1:
        return 1
    selected = np.asarray(block_mask) != 0
    rows = int(np.count_nonzero(selected.any(axis=-1)))
    x, y = case.block_shape
    per_row = 14 * x * y * case.head_dim * np.count_nonzero(selected) / max(rows, 1)
    return jobs if per_row >= _THREADS_MIN_ROW_FLOPS else 1
