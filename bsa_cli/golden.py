"""Block-sparse attention forward and backward on arrays: the golden and the kernel-faithful path.

Pure computation: arrays in, arrays out. Nothing here prints or touches files.

Every function works block row by block row: for one query head and one query block row it gathers the
selected key/value blocks into one contiguous array and does one matrix product per formula, so no
Sq x Skv matrix ever exists and memory grows with the sequence length, not its square. A block row whose
selection is very wide (long causal rows) is cut into groups of query rows (`_TILE_ELEMENTS`), and the dK/dV
products are added a bounded number of blocks at a time, so working memory stays bounded too. Work buffers
are reused from row to row, and inputs are upcast one block row at a time.

One walker (`_walk`) does that for every function here; what it computes per tile of query rows is a
precision path, its parameter:

* `_Forward` (`forward` / `forward_sequence`): always float64, so the generated `attentionOut` and
  `softmaxLse` are stable across machines once rounded to the tensor dtypes.
* `_Golden` (`backward` / `backward_sequence`): the formulas of docs/operator.md section 1 on the GIVEN out and
  lse, computed in float32 (the CANN "golden": inputs upcast to fp32) or float64.
* `_Kernel` (`backward_kernel` / `backward_sequence_kernel`): the A2/A3 kernel's precision path (docs/operator.md
  section 2): fp32 scores and probabilities, P and dS rounded to the input dtype before the products that use
  them, fp32 accumulation, scale applied to dQ and dK at the end, outputs cast to the input dtype.
* `_ForwardGolden` (`forward_backward` / `forward_backward_sequence`): the first two in one pass: per block
  row the float64 forward, out and lse rounded to the tensor dtypes right there, then that row's golden
  backward from the ROUNDED out and lse. The scores are not computed again: the backward's
  `P = exp(S - lse)` is the forward's float64 `exp(S - rowmax)` times `exp(rowmax - lse)`, which is the same
  formula on the same given lse, only more accurate than a float32 recomputation. Out and lse are bit for bit
  those of `forward` rounded; the gradients agree with `backward`'s to its own rounding.

`golden_and_benchmark` is what `bsa gen` computes: `_ForwardGolden` and, reading the out and lse it rounds,
`_Kernel`. Each (path, batch entry, kv head) is one walk with accumulators of its own, so walks can run in
threads side by side (`jobs`, BLAS on one thread each) and give the same bits as one after the other:
the benchmark walk of a kv head follows its golden walk tile by tile.

Semantics shared by all: a query block row with no selected kv block is empty (dq = 0 there, out = 0);
a kv position that no query selects gets dk = dv = 0; in a partial last block only real rows and
columns take part. The lse of an empty row is never read.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

import numpy as np
from numpy.typing import DTypeLike

from . import blas
from .case import Case, SequenceSpan, numpy_dtype
from .layout import kv_view, lse_view, mask_view, q_view
from .rounding import BACKWARD_TIES, FORWARD_TIES, round_float32, to_dtype

__all__ = [
    "forward_sequence",
    "backward_sequence",
    "backward_sequence_kernel",
    "forward_backward_sequence",
    "forward",
    "backward",
    "backward_kernel",
    "forward_backward",
    "golden_and_benchmark",
    "reporting",
]


# ---- helpers ------------------------------------------------------------------------------------

_TILE_ELEMENTS = 1 << 23
"""Most query rows x selected columns one score tile holds (64 MiB in float64); wider block rows go in row groups.

Rows are independent in the forward (same products, same row sums), so out and lse do not depend on the cut
(checked bit for bit on OpenBLAS: tiles of `_MIN_TILE_ROWS` rows or more of such wide rows keep to its regular
gemm path); the backward then sums a row's dK/dV share group by group."""

_PRODUCT_ELEMENTS = 1 << 20
"""Most elements of one dK/dV share (selected columns x D) computed before it is added to its blocks."""


def _check_mask(block_mask: np.ndarray, heads: int, q_len: int, kv_len: int, block_shape: Sequence[int]) -> np.ndarray:
    """Return `block_mask` as bool, after checking it is [N1, ceil(q_len/X), ceil(kv_len/Y)]."""
    x, y = block_shape
    expected = (heads, -(-q_len // x), -(-kv_len // y))
    mask = np.asarray(block_mask)
    if mask.shape != expected:
        raise ValueError(
            f"block_mask has shape {mask.shape}, expected {expected} for {heads} heads, "
            f"q_len {q_len}, kv_len {kv_len} and block shape {tuple(block_shape)}"
            " (cut it with layout.mask_view)"
        )
    return mask if mask.dtype == np.bool_ else mask != 0


def _check_heads(num_heads: int, num_kv_heads: int) -> int:
    """Return the GQA group size N1 / N2, after checking N1 is a multiple of N2."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a positive multiple of kv heads ({num_kv_heads})")
    return num_heads // num_kv_heads


def _check_precision(precision: DTypeLike) -> np.dtype:
    """Return `precision` as a dtype, after checking it is float32 or float64."""
    precision = np.dtype(precision)
    if precision not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"precision must be float32 or float64, got {precision}")
    return precision


def _selections(mask_rows: np.ndarray) -> list[np.ndarray]:
    """Return, per query block row of one head's [nQ, nKV] mask, the selected kv block indices (ascending)."""
    return [np.flatnonzero(row) for row in mask_rows]


def _padded_blocks(tensor: np.ndarray, block: int, dtype: DTypeLike) -> np.ndarray:
    """Return [len, D] `tensor` as zero-padded [ceil(len/block), block, D] blocks of `dtype`."""
    length, dim = tensor.shape
    n_blocks = -(-length // block)
    blocks = np.zeros((n_blocks * block, dim), dtype=dtype)
    blocks[:length] = tensor
    return blocks.reshape(n_blocks, block, dim)


class _Scratch:
    """Named work buffers reused from one block row to the next instead of fresh allocations."""

    SLACK = 1 << 21
    """Most elements a buffer grows by beyond the request (growing rows, as in a causal mask, reallocate rarely)."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        """Return an uninitialised C-contiguous array of `shape` and `dtype`, backed by buffer `name`."""
        dtype = np.dtype(dtype)
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            slack = 0 if buffer is None else min(buffer.size // 2, self.SLACK)
            self._buffers.pop(name, None)
            buffer = self._buffers[name] = np.empty(size + slack, dtype=dtype)
        return buffer[:size].reshape(shape)


def _consecutive(selected: np.ndarray) -> bool:
    """Return whether the (ascending, unique) selected block indices have no gap."""
    return bool(selected[-1] - selected[0] + 1 == selected.size)


def _gather(blocks: np.ndarray, selected: np.ndarray, scratch: _Scratch, name: str) -> np.ndarray:
    """Return blocks[selected] as [len(selected) * Y, D]: a view when the blocks are consecutive."""
    _, block, dim = blocks.shape
    if _consecutive(selected):
        return blocks[selected[0] : selected[-1] + 1].reshape(-1, dim)
    gathered = scratch.get(name, (selected.size, block, dim), blocks.dtype)
    np.take(blocks, selected, axis=0, out=gathered, mode="clip")  # "clip": no buffer (the indices are valid)
    return gathered.reshape(-1, dim)


_MIN_TILE_ROWS = 16
"""Fewest query rows in a tile: thinner products may take other BLAS code paths (gemv, small-matrix kernels)."""


def _selected_rows(
    mask: np.ndarray,
    group: int,
    kv_head: int,
    block_rows: int,
    q_len: int,
    key_blocks: np.ndarray,
    value_blocks: np.ndarray,
    scratch: _Scratch,
    report: Callable[[int], None] | None,
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, list[slice]]]:
    """Yield (head, selected, keys, values, row tiles) for each query-block row of a kv head's group.

    Rows that select no block are skipped. keys/values hold the row's selected blocks, gathered into
    scratch buffers that the next row reuses. When the caller is done with a row, `report` (if any)
    hears how many selected block pairs it held.
    """
    for head in range(kv_head * group, (kv_head + 1) * group):
        for row, selected in enumerate(_selections(mask[head])):
            if selected.size == 0:
                continue
            keys = _gather(key_blocks, selected, scratch, "keys")
            values = _gather(value_blocks, selected, scratch, "values")
            yield (
                head,
                selected,
                keys,
                values,
                _row_tiles(row * block_rows, min(q_len, (row + 1) * block_rows), keys.shape[0]),
            )
            if report is not None:
                report(int(selected.size))


@dataclasses.dataclass
class KernelRange:
    """What the kernel path's P and dS hold before they are rounded to the input dtype (`watching`).

    `*_flushed` counts nonzero float32 values that round to zero (underflow below the dtype's smallest
    subnormal); `max_abs_*` beyond the dtype's largest finite number rounds to inf (overflow).
    """

    max_abs_probs: float = 0.0
    max_abs_dscores: float = 0.0
    probs_nonzero: int = 0
    probs_flushed: int = 0
    dscores_nonzero: int = 0
    dscores_flushed: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, other: KernelRange) -> None:
        with self.lock:
            self.max_abs_probs = max(self.max_abs_probs, other.max_abs_probs)
            self.max_abs_dscores = max(self.max_abs_dscores, other.max_abs_dscores)
            self.probs_nonzero += other.probs_nonzero
            self.probs_flushed += other.probs_flushed
            self.dscores_nonzero += other.dscores_nonzero
            self.dscores_flushed += other.dscores_flushed

    def before(self, name: str, values: np.ndarray) -> None:
        """Add one chunk of `name` ('probs' or 'dscores') before rounding: two reductions and a count."""
        if values.size:
            top = max(float(values.max()), -float(values.min()))
            setattr(self, f"max_abs_{name}", max(getattr(self, f"max_abs_{name}"), top))
        count = int(np.count_nonzero(values))
        setattr(self, f"{name}_nonzero", getattr(self, f"{name}_nonzero") + count)
        setattr(self, f"{name}_flushed", getattr(self, f"{name}_flushed") + count)

    def after(self, name: str, values: np.ndarray) -> None:
        """Take the same chunk after rounding: the nonzero values that remain were not flushed."""
        setattr(self, f"{name}_flushed", getattr(self, f"{name}_flushed") - int(np.count_nonzero(values)))


_WATCH: contextvars.ContextVar[KernelRange | None] = contextvars.ContextVar("watch", default=None)


@contextlib.contextmanager
def watching(kernel_range: KernelRange) -> Iterator[None]:
    """Within the block, kernel-path walks started here add the range of their P and dS to `kernel_range`."""
    token = _WATCH.set(kernel_range)
    try:
        yield
    finally:
        _WATCH.reset(token)


_PROGRESS: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("progress", default=None)


@contextlib.contextmanager
def reporting(callback: Callable[[int], None]) -> Iterator[None]:
    """Within the block, every function here calls `callback(pairs)` after each query-block row it finishes.

    `pairs` is the number of selected (query block, kv block) pairs of the row: progress for long cases,
    in the units of `inputs.mask_stats`'s `selected_blocks` (pairs within each batch entry's lengths).
    """
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _row_tiles(start: int, stop: int, width: int) -> list[slice]:
    """Cut query rows [start, stop) into near-equal groups whose score tiles (rows x `width`) fit `_TILE_ELEMENTS`.

    No group has fewer than `_MIN_TILE_ROWS` rows (unless the block row has): that wins over the budget.
    """
    rows_per_tile = _TILE_ELEMENTS // max(width, 1)
    count = max(1, min(-(-(stop - start) // max(rows_per_tile, 1)), (stop - start) // _MIN_TILE_ROWS))
    bounds = [start + (stop - start) * i // count for i in range(count + 1)]
    return [slice(first, last) for first, last in zip(bounds[:-1], bounds[1:], strict=True)]


_CHUNK_ELEMENTS = 1 << 18
"""Most elements of the row chunks in which a tile's elementwise steps run, chunk after chunk.

It bounds the temporaries of those steps (the float16 rounding's) on wide tiles (long causal rows: up to
`_TILE_ELEMENTS`); a tile of typical width is one chunk (smaller chunks only add NumPy calls, which
threads then take turns to make). Elementwise steps and row reductions give the same values in any chunks;
the products still take whole tiles."""


def _chunks(shape: tuple[int, ...]) -> list[slice]:
    """Cut the rows of a [rows, cols] tile into chunks of at most `_CHUNK_ELEMENTS` elements (one row at least)."""
    rows, cols = shape
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    return [slice(first, min(first + step, rows)) for first in range(0, rows, step)]


def _mask_tail(scores: np.ndarray, selected: np.ndarray, n_kv_blocks: int, tail_pad: int) -> None:
    """Set the padding columns of a selected partial last kv block to -inf (they are the last columns)."""
    if tail_pad and selected[-1] == n_kv_blocks - 1:
        scores[:, -tail_pad:] = -np.inf


_SCATTER_LOOP_MIN = 4096
"""Block size (Y * D elements) from which adding block by block beats one fancy-indexed add."""


def _scatter_add(blocks: np.ndarray, selected: np.ndarray, contribution: np.ndarray) -> None:
    """Add contribution [len(selected) * Y, D] to `blocks[selected]` ([nKV, Y, D]); indices are unique."""
    contribution = contribution.reshape(selected.size, blocks.shape[1], blocks.shape[2])
    if _consecutive(selected):
        target = blocks[selected[0] : selected[-1] + 1]
        np.add(target, contribution, out=target)
    elif blocks.shape[1] * blocks.shape[2] < _SCATTER_LOOP_MIN:
        blocks[selected] += contribution
    else:
        for block, index in zip(contribution, selected, strict=True):
            target = blocks[index]
            np.add(target, block, out=target)


def _add_products(
    blocks: np.ndarray, selected: np.ndarray, left: np.ndarray, right: np.ndarray, scratch: _Scratch
) -> None:
    """Add left^T @ right ([len(selected) * Y, D]) to `blocks[selected]`, a bounded number of blocks at a time.

    Args:
        blocks: [nKV, Y, D] accumulators.
        left: [rows, len(selected) * Y] (probabilities or dS of one tile); right: [rows, D].
    """
    _, block, dim = blocks.shape
    step = max(1, _PRODUCT_ELEMENTS // (block * dim))
    for first in range(0, selected.size, step):
        part = selected[first : first + step]
        columns = left[:, first * block : (first + part.size) * block]
        product = scratch.get("product", (part.size * block, dim), blocks.dtype)
        np.matmul(columns.T, right, out=product)
        _scatter_add(blocks, part, product)


def _to_io_fp32(tensor: np.ndarray, io_dtype: np.dtype) -> np.ndarray:
    """Return `tensor` rounded to the kernel's input dtype, then upcast (exactly) to float32."""
    return to_dtype(tensor, io_dtype).astype(np.float32)


# ---- precision paths ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One batch entry: heads-major views ([N, S, D]) of its inputs, its block mask as bool, its geometry."""

    dout: np.ndarray | None
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    mask: np.ndarray
    block_shape: tuple[int, int]
    scale: float
    group: int
    tail_pad: int  # padding columns of the last kv block

    @classmethod
    def of(
        cls,
        dout: np.ndarray | None,
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        block_mask: np.ndarray,
        block_shape: Sequence[int],
        scale: float,
    ) -> _Entry:
        """Check one entry's shapes (GQA group, mask) and return it."""
        heads, q_len = query.shape[:2]
        kv_heads, kv_len = key.shape[:2]
        group = _check_heads(heads, kv_heads)
        mask = _check_mask(block_mask, heads, q_len, kv_len, block_shape)
        x, y = block_shape
        return cls(dout, query, key, value, mask, (x, y), scale, group, mask.shape[2] * y - kv_len)


class _Path:
    """A precision path: what a walk over one kv head's selected blocks computes per tile of query rows.

    One instance serves one walk (one entry, one kv head): it keeps that walk's accumulators.
    """

    block_dtype: np.dtype
    """Dtype of the padded key and value blocks the walk gathers for `tile`."""

    def __init__(self, entry: _Entry) -> None:
        self.entry = entry

    def blocks(self, tensor: np.ndarray) -> np.ndarray:
        """Return one kv head's [skv, D] key or value as zero-padded [nKV, Y, D] blocks of `block_dtype`."""
        return _padded_blocks(tensor, self.entry.block_shape[1], self.block_dtype)

    def start(self, kv_head: int, key_blocks: np.ndarray) -> None:
        """Prepare for the walk over `kv_head` (accumulators of the padded blocks' shape)."""

    def row(self, keys: np.ndarray, values: np.ndarray, scratch: _Scratch) -> None:
        """Prepare for one block row, given its gathered keys and values."""

    def tile(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, values: np.ndarray, scratch: _Scratch
    ) -> None:
        """Compute one tile: query rows `rows` of `head` against the selected blocks `keys`/`values`."""
        raise NotImplementedError

    def finish(self, kv_head: int) -> None:
        """Write what the walk over `kv_head` accumulated."""


class _Forward(_Path):
    """The float64 forward: out and lse rows (stored in the dtypes of `out` and `lse`) and the empty rows."""

    block_dtype = np.dtype(np.float64)

    def __init__(self, entry: _Entry, out: np.ndarray, lse: np.ndarray, empty: np.ndarray) -> None:
        super().__init__(entry)
        self.out, self.lse, self.empty = out, lse, empty

    def tile(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, values: np.ndarray, scratch: _Scratch
    ) -> None:
        e = self.entry
        tile = _forward_tile(e.query[head, rows], keys, values, selected, e.mask.shape[2], e.tail_pad, e.scale, scratch)
        self.out[head, rows], self.lse[head, rows] = tile[:2]
        self.empty[head, rows] = False


class _Golden(_Path):
    """The golden backward (docs/operator.md section 1) in dq's dtype (float32 or float64), from the given out, lse."""

    def __init__(
        self, entry: _Entry, out: np.ndarray, lse: np.ndarray, grads: tuple[np.ndarray, np.ndarray, np.ndarray]
    ) -> None:
        super().__init__(entry)
        self.out, self.lse = out, lse
        self.dq, self.dk, self.dv = grads
        self.block_dtype = self.dq.dtype
        self.scale_cast = self.block_dtype.type(entry.scale)

    def start(self, kv_head: int, key_blocks: np.ndarray) -> None:
        self.dk_blocks = _accumulator(self.dk[kv_head], key_blocks)
        self.dv_blocks = _accumulator(self.dv[kv_head], key_blocks)

    def tile(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, values: np.ndarray, scratch: _Scratch
    ) -> None:
        e, precision = self.entry, self.block_dtype
        assert e.dout is not None
        query_scaled = np.asarray(e.query[head, rows], dtype=precision) * self.scale_cast
        dout_rows = np.asarray(e.dout[head, rows], dtype=precision)
        dsum = np.einsum("ij,ij->i", dout_rows, np.asarray(self.out[head, rows], dtype=precision))
        with np.errstate(over="ignore"):  # a huge finite empty-row sentinel may overflow; never read
            lse_rows = np.asarray(self.lse[head, rows], dtype=precision)
        probs = scratch.get("probs", (query_scaled.shape[0], keys.shape[0]), precision)
        np.matmul(query_scaled, keys.T, out=probs)
        for part in _chunks(probs.shape):
            chunk = probs[part]
            chunk -= lse_rows[part, None]
            _mask_tail(chunk, selected, e.mask.shape[2], e.tail_pad)
            np.exp(chunk, out=chunk)
        self.finish_tile(head, rows, probs, dout_rows, query_scaled, dsum, selected, keys, values, scratch)

    def finish_tile(
        self,
        head: int,
        rows: slice,
        exp_scores: np.ndarray,
        dout: np.ndarray,
        query_scaled: np.ndarray,
        dsum: np.ndarray,
        selected: np.ndarray,
        keys: np.ndarray,
        values: np.ndarray,
        scratch: _Scratch,
    ) -> None:
        """Finish one tile from its P [rows, cols] (`exp_scores`, cast to the precision if it is float64):
        add its dV and dK shares, write its dQ rows."""
        precision = self.block_dtype
        probs = exp_scores
        if exp_scores.dtype != precision:
            probs = scratch.get("probs", exp_scores.shape, precision)
        dscores = scratch.get("dscores", exp_scores.shape, precision)
        np.matmul(dout, values.T, out=dscores)
        for part in _chunks(dscores.shape):
            if probs is not exp_scores:
                np.copyto(probs[part], exp_scores[part], casting="same_kind")
            chunk = dscores[part]
            chunk -= dsum[part, None]
            chunk *= probs[part]
        _add_products(self.dv_blocks, selected, probs, dout, scratch)
        _add_products(self.dk_blocks, selected, dscores, query_scaled, scratch)
        dq_rows = dscores @ keys
        dq_rows *= self.scale_cast
        self.dq[head, rows] = dq_rows

    def finish(self, kv_head: int) -> None:
        dim, kv_len = self.entry.key.shape[2], self.entry.key.shape[1]
        for grad, blocks in ((self.dk, self.dk_blocks), (self.dv, self.dv_blocks)):
            if not np.may_share_memory(grad, blocks):  # else the blocks are the gradient itself
                grad[kv_head] = blocks.reshape(-1, dim)[:kv_len]
        del self.dk_blocks, self.dv_blocks  # while other walks go on


class _ForwardGolden(_Golden):
    """The float64 forward, rounded to the dtypes of `out` and `lse`, and the golden backward from the rounded values.

    Per tile of query rows: the forward leaves E = exp(S - rowmax) (float64); with f = exp(rowmax - lse) on
    the ROUNDED lse, P = exp(S - lse) = f E. The row factor f goes onto dout (dO' = f dO, Dsum' = f Dsum,
    both [rows, D] or [rows]) rather than onto E, so the wide arrays see one cast: dP' = dO' V^T = f dP,
    dS = E (dP' - Dsum') = P (dP - Dsum), dV += E^T dO' = P^T dO; dQ and dK as in `_Golden`.
    """

    def __init__(
        self,
        entry: _Entry,
        out: np.ndarray,
        lse: np.ndarray,
        empty: np.ndarray,
        grads: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        super().__init__(entry, out, lse, grads)
        self.empty = empty
        self.keys64 = self.values64 = np.empty((0, 0))

    def row(self, keys: np.ndarray, values: np.ndarray, scratch: _Scratch) -> None:
        self.keys64, self.values64 = keys, values
        if self.block_dtype != np.float64:  # exact upcasts of the gathered blocks for the float64 forward
            self.keys64 = scratch.get("keys64", keys.shape, np.float64)
            self.values64 = scratch.get("values64", values.shape, np.float64)
            np.copyto(self.keys64, keys)
            np.copyto(self.values64, values)

    def tile(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, values: np.ndarray, scratch: _Scratch
    ) -> None:
        e, precision = self.entry, self.block_dtype
        assert e.dout is not None
        query_rows = e.query[head, rows].astype(precision)  # a copy: scaled in place below
        out64, lse64, exp_scores, row_max = _forward_tile(
            query_rows, self.keys64, self.values64, selected, e.mask.shape[2], e.tail_pad, e.scale, scratch
        )
        with np.errstate(under="ignore"):  # rounding tiny outputs to the tensor dtype is the point
            out_rows = self.out[head, rows] = to_dtype(out64, self.out.dtype, FORWARD_TIES)
        lse_rows = self.lse[head, rows] = lse64.astype(np.float32)
        self.empty[head, rows] = False
        factor = np.exp(row_max - lse_rows[:, None].astype(np.float64)).astype(precision)
        dout_rows = e.dout[head, rows].astype(precision)
        dsum = np.einsum("ij,ij->i", dout_rows, out_rows.astype(precision))
        dout_rows *= factor
        dsum *= factor[:, 0]
        query_rows *= self.scale_cast
        self.finish_tile(head, rows, exp_scores, dout_rows, query_rows, dsum, selected, keys, values, scratch)

    def finish(self, kv_head: int) -> None:
        super().finish(kv_head)
        self.keys64 = self.values64 = np.empty((0, 0))  # scratch of the walk, which is over


class _Kernel(_Path):
    """The A2/A3 kernel's precision path (docs/operator.md section 2) from the given out and lse, in the input dtype."""

    block_dtype = np.dtype(np.float32)

    def __init__(
        self, entry: _Entry, out: np.ndarray, lse: np.ndarray, grads: tuple[np.ndarray, np.ndarray, np.ndarray]
    ) -> None:
        super().__init__(entry)
        self.out, self.lse = out, lse
        self.dq, self.dk, self.dv = grads
        self.io_dtype = self.dq.dtype
        self.scale32 = np.float32(entry.scale)
        self.watch = _WATCH.get()
        self.seen = KernelRange() if self.watch is not None else None

    def blocks(self, tensor: np.ndarray) -> np.ndarray:
        return _padded_blocks(_to_io_fp32(tensor, self.io_dtype), self.entry.block_shape[1], np.float32)

    def start(self, kv_head: int, key_blocks: np.ndarray) -> None:
        self.dk_blocks = np.zeros_like(key_blocks)
        self.dv_blocks = np.zeros_like(key_blocks)

    def tile(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, values: np.ndarray, scratch: _Scratch
    ) -> None:
        e, io_dtype = self.entry, self.io_dtype
        assert e.dout is not None
        query_rows = _to_io_fp32(e.query[head, rows], io_dtype)
        dout_rows = _to_io_fp32(e.dout[head, rows], io_dtype)
        dsum = (dout_rows * _to_io_fp32(self.out[head, rows], io_dtype)).sum(axis=1, dtype=np.float32)
        with np.errstate(over="ignore"):
            lse_rows = np.asarray(self.lse[head, rows], dtype=np.float32)
        shape = (query_rows.shape[0], keys.shape[0])
        probs, dscores = scratch.get("probs", shape, np.float32), scratch.get("dscores", shape, np.float32)
        np.matmul(query_rows, keys.T, out=probs)
        np.matmul(dout_rows, values.T, out=dscores)
        for part in _chunks(shape):  # P and dS, then rounded in place: P16 and dS16
            chunk_probs, chunk_dscores = probs[part], dscores[part]
            chunk_probs *= self.scale32
            chunk_probs -= lse_rows[part, None]
            _mask_tail(chunk_probs, selected, e.mask.shape[2], e.tail_pad)
            np.exp(chunk_probs, out=chunk_probs)
            chunk_dscores -= dsum[part, None]
            chunk_dscores *= chunk_probs
            if self.seen is not None:
                self.seen.before("probs", chunk_probs)
                self.seen.before("dscores", chunk_dscores)
            round_float32(chunk_probs, io_dtype, BACKWARD_TIES, out=chunk_probs)  # P16
            round_float32(chunk_dscores, io_dtype, BACKWARD_TIES, out=chunk_dscores)  # dS16
            if self.seen is not None:
                self.seen.after("probs", chunk_probs)
                self.seen.after("dscores", chunk_dscores)
        probs_io, dscores_io = probs, dscores
        _add_products(self.dv_blocks, selected, probs_io, dout_rows, scratch)
        dq_rows = dscores_io @ keys
        dq_rows *= self.scale32
        self.dq[head, rows] = to_dtype(dq_rows, io_dtype, BACKWARD_TIES)
        _add_products(self.dk_blocks, selected, dscores_io, query_rows, scratch)

    def finish(self, kv_head: int) -> None:
        dim, kv_len = self.entry.key.shape[2], self.entry.key.shape[1]
        self.dk_blocks *= self.scale32
        self.dk[kv_head] = to_dtype(self.dk_blocks.reshape(-1, dim)[:kv_len], self.io_dtype, BACKWARD_TIES)
        self.dv[kv_head] = to_dtype(self.dv_blocks.reshape(-1, dim)[:kv_len], self.io_dtype, BACKWARD_TIES)
        del self.dk_blocks, self.dv_blocks  # while other walks go on
        if self.watch is not None and self.seen is not None:
            self.watch.add(self.seen)
            self.seen = KernelRange()


def _accumulator(grad: np.ndarray, key_blocks: np.ndarray) -> np.ndarray:
    """Return zeroed [nKV, Y, D] accumulators for one kv head's [skv, D] gradient `grad` (zero-filled, as callers
    make it): `grad` itself, seen as blocks, when it has no padding and the blocks' dtype (no second copy of it)."""
    if grad.dtype == key_blocks.dtype and grad.flags.c_contiguous and grad.size == key_blocks.size:
        return grad.reshape(key_blocks.shape)
    return np.zeros_like(key_blocks)


def _forward_tile(
    query: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    selected: np.ndarray,
    n_kv_blocks: int,
    tail_pad: int,
    scale: float,
    scratch: _Scratch,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Forward of one tile of query rows against its selected keys, in float64.

    Returns:
        out [rows, D], lse [rows], exp(S - rowmax) [rows, cols] (a scratch buffer) and rowmax [rows, 1].
    """
    scores = scratch.get("scores", (query.shape[0], keys.shape[0]), np.float64)
    np.matmul(np.asarray(query, dtype=np.float64) * scale, keys.T, out=scores)
    row_max = np.empty((scores.shape[0], 1))
    row_sum = np.empty(scores.shape[0])
    for part in _chunks(scores.shape):
        chunk = scores[part]
        _mask_tail(chunk, selected, n_kv_blocks, tail_pad)
        np.max(chunk, axis=1, keepdims=True, out=row_max[part])
        chunk -= row_max[part]
        np.exp(chunk, out=chunk)
        np.sum(chunk, axis=1, out=row_sum[part])
    out = (scores @ values) / row_sum[:, None]
    lse = row_max[:, 0] + np.log(row_sum)
    return out, lse, scores, row_max


# ---- the walk -----------------------------------------------------------------------------------


class _Stopped(Exception):
    """A walk gave up: another one failed, or the run was interrupted."""


class _Tiles:
    """How many tiles a walk has finished, for a walk that reads what they wrote (the benchmark reads out and lse)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._finished = 0
        self._ended = False

    def finished_one(self) -> None:
        with self._changed:
            self._finished += 1
            self._changed.notify_all()

    def end(self) -> None:
        """Say the walk is over (finished or failed): nobody waits for more."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, count: int) -> None:
        """Return once `count` tiles are finished; raise `_Stopped` if the walk ended before."""
        with self._changed:
            self._changed.wait_for(lambda: self._finished >= count or self._ended)
            if self._finished < count:
                raise _Stopped


class _SharedBlocks:
    """One kv head's padded key and value blocks for walks that read the same values (golden float32 and benchmark
    of io-dtype tensors): built by the first walk that asks, dropped when the last one is done."""

    def __init__(self, walks: int) -> None:
        self._lock = threading.Lock()
        self._walks = walks
        self._blocks: tuple[np.ndarray, np.ndarray] | None = None

    def get(self, build: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if self._blocks is None:
                self._blocks = build()
            return self._blocks

    def done(self) -> None:
        with self._lock:
            self._walks -= 1
            if self._walks == 0:
                self._blocks = None


@dataclasses.dataclass
class _Task:
    """One walk: a path over one kv head's query heads of its entry, and the tiles it waits for or announces."""

    path: _Path
    kv_head: int
    after: _Tiles | None = None  # each tile waits for the same tile of this walk
    announce: _Tiles | None = None  # each finished tile is counted here
    shared: _SharedBlocks | None = None  # its padded blocks, if another walk reads the same

    def pairs(self) -> int:
        """Return the selected block pairs of the walk (its share of the work)."""
        entry = self.path.entry
        return int(entry.mask[self.kv_head * entry.group : (self.kv_head + 1) * entry.group].sum())


def _walk(task: _Task, report: Callable[[int], None] | None, stop: threading.Event | None = None) -> None:
    """Hand every tile of one kv head's selected rows to the task's path, then let it write its results."""
    path, kv_head = task.path, task.kv_head
    entry = path.entry
    q_len, kv_len = entry.query.shape[1], entry.key.shape[1]
    try:
        if q_len == 0 or kv_len == 0:
            return

        def build() -> tuple[np.ndarray, np.ndarray]:
            return path.blocks(entry.key[kv_head]), path.blocks(entry.value[kv_head])

        key_blocks, value_blocks = build() if task.shared is None else task.shared.get(build)
        path.start(kv_head, key_blocks)
        scratch = _Scratch()
        tiles = 0
        for head, selected, keys, values, row_tiles in _selected_rows(
            entry.mask, entry.group, kv_head, entry.block_shape[0], q_len, key_blocks, value_blocks, scratch, report
        ):
            if stop is not None and stop.is_set():
                raise _Stopped
            path.row(keys, values, scratch)
            for rows in row_tiles:
                tiles += 1
                if task.after is not None:
                    task.after.wait_for(tiles)
                path.tile(head, rows, selected, keys, values, scratch)
                if task.announce is not None:
                    task.announce.finished_one()
        path.finish(kv_head)
    finally:
        if task.announce is not None:
            task.announce.end()
        if task.shared is not None:
            task.shared.done()


def _run(tasks: list[_Task], jobs: int = 1) -> None:
    """Walk every task: one after the other in this thread, or in up to `jobs` threads.

    Threads take the tasks in order (a task that waits for another's tiles comes after it, so it never
    waits for one not started), each BLAS call on one thread (`blas.one_thread_each`); where BLAS cannot
    be told, the tasks run one after the other. The `reporting` callback of this thread hears every walk's
    rows, one at a time.
    """
    report = _PROGRESS.get()
    lanes = min(jobs, len(tasks))
    if lanes > 1:
        with blas.one_thread_each() as single:
            if single:
                _run_in_threads(tasks, lanes, report)
                return
    for task in tasks:
        _walk(task, report)


def _run_in_threads(tasks: list[_Task], lanes: int, report: Callable[[int], None] | None) -> None:
    """Walk the tasks in `lanes` threads; on the first failure (or Ctrl-C here) stop the rest and raise it."""
    stop = threading.Event()
    if report is not None:
        lock, callback = threading.Lock(), report

        def report(pairs: int) -> None:
            with lock:
                callback(pairs)

    errstate = np.geterr()  # threads start with NumPy's defaults: give them the caller's floating-point handling
    with ThreadPoolExecutor(lanes, "bsa-walk", initializer=functools.partial(np.seterr, **errstate)) as pool:
        futures: list[Future[None]] = [pool.submit(_walk, task, report, stop) for task in tasks]
        errors: list[BaseException] = []
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
            errors = [e for f in futures if f.done() and not f.cancelled() and (e := f.exception()) is not None]
        finally:
            if errors or not all(f.done() for f in futures):
                stop.set()
                for future in futures:
                    future.cancel()
                for task in tasks:
                    if task.announce is not None:
                        task.announce.end()
        if errors:
            raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])


# ---- one batch entry ----------------------------------------------------------------------------


def _zeros_grads(
    q_shape: tuple[int, ...], kv_shape: tuple[int, ...], dtype: DTypeLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return zero-filled (dq, dk, dv) of the query's and the key's shape."""
    return np.zeros(q_shape, dtype=dtype), np.zeros(kv_shape, dtype=dtype), np.zeros(kv_shape, dtype=dtype)


def _each_kv_head(entry: _Entry, path: Callable[[], _Path]) -> list[_Task]:
    """Return one walk per kv head of `entry`, each with a path of its own from `path()`."""
    return [_Task(path(), kv_head) for kv_head in range(entry.key.shape[0])]


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
    heads, q_len, dim = query.shape
    out = np.zeros((heads, q_len, dim))
    lse = np.full((heads, q_len), -np.inf)
    empty = np.ones((heads, q_len), dtype=bool)
    entry = _Entry.of(None, query, key, value, block_mask, block_shape, scale)
    _run(_each_kv_head(entry, lambda: _Forward(entry, out, lse, empty)))
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute dq, dk, dv of one batch entry in `precision` (float32 or float64) from the given out and lse.

    Args:
        dout, query, out: [N1, sq, D]; lse: [N1, sq] (its value on empty rows is never read).
        key, value: [N2, skv, D].
        block_mask: [N1, ceil(sq/X), ceil(skv/Y)], nonzero = selected.

    Returns:
        dq [N1, sq, D], dk and dv [N2, skv, D], all of `precision`.
    """
    grads = _zeros_grads(query.shape, key.shape, _check_precision(precision))
    entry = _Entry.of(dout, query, key, value, block_mask, block_shape, scale)
    _run(_each_kv_head(entry, lambda: _Golden(entry, out, lse, grads)))
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute dq, dk, dv of one batch entry the way the A2/A3 kernel does (docs/operator.md section 2).

    Tensors are first rounded to `io_dtype` and lse to float32, as the kernel sees them.
    Arguments as `backward_sequence`.

    Returns:
        dq, dk, dv of `io_dtype` (float16 or bfloat16).
    """
    grads = _zeros_grads(query.shape, key.shape, io_dtype)
    entry = _Entry.of(dout, query, key, value, block_mask, block_shape, scale)
    _run(_each_kv_head(entry, lambda: _Kernel(entry, out, lse, grads)))
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
    heads, q_len, dim = query.shape
    out = np.zeros((heads, q_len, dim), dtype=io_dtype)
    lse = np.full((heads, q_len), -np.inf, dtype=np.float32)
    empty = np.ones((heads, q_len), dtype=bool)
    grads = _zeros_grads(query.shape, key.shape, precision)
    entry = _Entry.of(dout, query, key, value, block_mask, block_shape, scale)
    _run(_each_kv_head(entry, lambda: _ForwardGolden(entry, out, lse, empty, grads)))
    return (out, lse, empty, *grads)


# ---- whole case ---------------------------------------------------------------------------------


def _zero_case_grads(case: Case, dtype: DTypeLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.zeros(case.q_shape, dtype=dtype),
        np.zeros(case.kv_shape, dtype=dtype),
        np.zeros(case.kv_shape, dtype=dtype),
    )


def _grad_views(
    case: Case, grads: tuple[np.ndarray, ...], span: SequenceSpan
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dq, dk, dv = grads
    return q_view(case, dq, span), kv_view(case, dk, span), kv_view(case, dv, span)


def _case_entries(
    case: Case,
    dout: np.ndarray | None,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
) -> Iterator[tuple[SequenceSpan, _Entry]]:
    """Yield (span, entry) for each batch entry of a case with query rows."""
    for span in case.spans():
        if span.q_len == 0:
            continue
        entry = _Entry.of(
            None if dout is None else q_view(case, dout, span),
            q_view(case, query, span),
            kv_view(case, key, span),
            kv_view(case, value, span),
            mask_view(case, block_mask, span),
            case.block_shape,
            case.kernel_scale,
        )
        yield span, entry


def forward(
    case: Case, query: np.ndarray, key: np.ndarray, value: np.ndarray, block_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Compute attentionOut and softmaxLse of a case in float64.

    Returns:
        attention_out of shape `case.q_shape` and softmax_lse of shape `case.q_shape[:-1]` (no trailing 1).
        Empty rows and rows past a batch entry's length have out 0 and lse `case.empty_row_lse`.
    """
    attention_out = np.zeros(case.q_shape)
    softmax_lse = np.full(case.q_shape[:-1], case.empty_row_lse, dtype=np.float64)
    for span, entry in _case_entries(case, None, query, key, value, block_mask):
        out, lse = q_view(case, attention_out, span), lse_view(case, softmax_lse, span)
        empty = np.ones(lse.shape, dtype=bool)
        _run(_each_kv_head(entry, lambda: _Forward(entry, out, lse, empty)))  # noqa: B023 (called at once)
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute dq, dk, dv of a case on the kernel's precision path, in the case dtype."""
    arrays = (dout, query, key, value, attention_out, softmax_lse, block_mask)
    return _backward_case(case, arrays, numpy_dtype(case.dtype), _Kernel)


def _backward_case(
    case: Case,
    arrays: tuple[np.ndarray, ...],
    dtype: DTypeLike,
    path: Callable[[_Entry, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]], _Path],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Walk a backward precision path (`_Golden`, `_Kernel`) over every batch entry and kv head of a case,
    from the given out and lse, into dq, dk, dv of `dtype`."""
    dout, query, key, value, attention_out, softmax_lse, block_mask = arrays
    grads = _zero_case_grads(case, dtype)
    for span, entry in _case_entries(case, dout, query, key, value, block_mask):
        out, lse, views = (
            q_view(case, attention_out, span),
            lse_view(case, softmax_lse, span),
            _grad_views(case, grads, span),
        )
        _run(_each_kv_head(entry, lambda: path(entry, out, lse, views)))  # noqa: B023 (called at once)
    return grads


def _rounded_forward_arrays(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Return attentionOut (zeros, case dtype) and softmaxLse ([q_shape[:-1]] float32, the empty-row sentinel)."""
    attention_out = np.zeros(case.q_shape, dtype=numpy_dtype(case.dtype))
    with np.errstate(over="ignore"):  # a huge finite sentinel becomes inf, as when `forward`'s lse is cast
        empty_row_lse = np.float64(case.empty_row_lse).astype(np.float32)
    return attention_out, np.full(case.q_shape[:-1], empty_row_lse, dtype=np.float32)


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
    attention_out, softmax_lse, (dq, dk, dv), _ = _generate(
        case, dout, query, key, value, block_mask, precision, jobs, False
    )
    return attention_out, softmax_lse, dq, dk, dv


def golden_and_benchmark(
    case: Case,
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    precision: DTypeLike = np.float32,
    jobs: int = 1,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """Compute what `bsa gen` writes: `forward_backward`'s out, lse and golden, and the kernel-faithful benchmark.

    The benchmark is `backward_kernel` of the rounded out and lse, bit for bit. Its walk over a kv head
    follows the golden's tile by tile; with `jobs` > 1 the walks run in up to `jobs` threads, largest first,
    when the case's rows carry enough arithmetic to share (`_THREADS_MIN_ROW_FLOPS`).

    Returns:
        attention_out, softmax_lse ([q_shape[:-1]] float32), golden (dq, dk, dv) of `precision`, and
        benchmark (dq, dk, dv) of the case dtype.
    """
    return _generate(case, dout, query, key, value, block_mask, precision, jobs, True)


def _generate(
    case: Case,
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    precision: DTypeLike,
    jobs: int,
    benchmark: bool,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """Run the golden walks (and the benchmark walks after them) of every entry and kv head."""
    precision = _check_precision(precision)
    attention_out, softmax_lse = _rounded_forward_arrays(case)
    gold = _zero_case_grads(case, precision)
    bench = _zero_case_grads(case, numpy_dtype(case.dtype)) if benchmark else ()
    jobs = _lanes(case, block_mask, jobs)
    walks: list[tuple[_Task, _Task | None]] = []  # (golden, benchmark) of entries and kv heads, one round
    for span, entry in _case_entries(case, dout, query, key, value, block_mask):
        out, lse = q_view(case, attention_out, span), lse_view(case, softmax_lse, span)
        empty = np.ones(lse.shape, dtype=bool)
        gold_views = _grad_views(case, gold, span)
        bench_views = _grad_views(case, bench, span) if benchmark else None
        io_inputs = all(a.dtype == attention_out.dtype for a in (entry.key, entry.value))
        for kv_head in range(case.num_kv_heads):
            golden_walk = _Task(_ForwardGolden(entry, out, lse, empty, gold_views), kv_head)
            kernel_walk = None
            if bench_views is not None:
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


_WALKS_PER_ROUND = 64
"""Golden walks (each with its benchmark walk) made and run together; the next are made once they are done,
so a case of many batch entries or kv heads never holds the walks of all of them at once."""


def _run_round(walks: list[tuple[_Task, _Task | None]], jobs: int) -> None:
    """Run the golden walks (in threads: largest first), then their benchmark walks in the same order."""
    if jobs > 1:
        walks.sort(key=lambda pair: -pair[0].pairs())
    _run([g for g, _ in walks] + [k for _, k in walks if k is not None], jobs)


_THREADS_MIN_ROW_FLOPS = 4e6
"""Arithmetic per query-block row (14 X Y D per selected block pair) from which walks run in threads.

Below it a row's few dozen NumPy calls take longer than their arithmetic, and threads would only take
turns at the interpreter (tiny blocks, head dims or sequences)."""


def _lanes(case: Case, block_mask: np.ndarray, jobs: int) -> int:
    """Return `jobs` if the case's rows carry enough arithmetic to gain from threads, else 1."""
    if jobs <= 1:
        return 1
    selected = np.asarray(block_mask) != 0
    rows = int(np.count_nonzero(selected.any(axis=-1)))
    x, y = case.block_shape
    per_row = 14 * x * y * case.head_dim * np.count_nonzero(selected) / max(rows, 1)
    return jobs if per_row >= _THREADS_MIN_ROW_FLOPS else 1
