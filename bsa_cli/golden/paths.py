"""The precision paths: what a walk over one kv head's selected blocks computes per tile of query rows.

* `_Forward`: always float64, so the generated `attentionOut` and `softmaxLse` are stable across machines
  once rounded to the tensor dtypes.
* `_Golden`: the formulas of docs/operator.md section 1 on the GIVEN out and lse, computed in float32 (the
  CANN "golden": inputs upcast to fp32) or float64.
* `_Kernel`: the A2/A3 kernel's precision path (docs/operator.md section 2): fp32 scores and probabilities,
  P and dS rounded to the input dtype before the products that use them, fp32 accumulation, scale applied
  to dQ and dK at the end, outputs cast to the input dtype. Within `watching`, it records the range of P
  and dS before that rounding (`KernelRange`).
* `_ForwardGolden`: the first two in one pass (the package's docstring says how).

`_Entry` is one batch entry as the paths read it: heads-major views, the block mask as bool, the geometry.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import operator
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..core.rounding import BACKWARD_TIES, FORWARD_TIES, round_float32, to_dtype
from .numerics import _add_products, _chunks, _mask_tail, _padded_blocks, _Scratch, _to_io_fp32

#: dq, dk, dv (of a batch entry, a case, or a view of either).
Grads = tuple[np.ndarray, np.ndarray, np.ndarray]

#: dout (None for the forward), query, key, value and the block mask: of a case, or heads-major of a batch entry.
Inputs = tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


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

    def _fold(self, field: str, value: float, how: Callable[[Any, Any], Any] = operator.add) -> None:
        setattr(self, field, how(getattr(self, field), value))

    def add(self, other: KernelRange) -> None:
        with self.lock:
            for name in ("probs", "dscores"):
                self._fold(f"max_abs_{name}", getattr(other, f"max_abs_{name}"), max)
                self._fold(f"{name}_nonzero", getattr(other, f"{name}_nonzero"))
                self._fold(f"{name}_flushed", getattr(other, f"{name}_flushed"))

    def before(self, name: str, values: np.ndarray) -> None:
        """Add one chunk of `name` ('probs' or 'dscores') before rounding: two reductions and a count."""
        if values.size:
            self._fold(f"max_abs_{name}", max(float(values.max()), -float(values.min())), max)
        count = int(np.count_nonzero(values))
        self._fold(f"{name}_nonzero", count)
        self._fold(f"{name}_flushed", count)

    def after(self, name: str, values: np.ndarray) -> None:
        """Take the same chunk after rounding: the nonzero values that remain were not flushed."""
        self._fold(f"{name}_flushed", -int(np.count_nonzero(values)))


_WATCH: contextvars.ContextVar[KernelRange | None] = contextvars.ContextVar("watch", default=None)


@contextlib.contextmanager
def watching(kernel_range: KernelRange) -> Iterator[None]:
    """Within the block, kernel-path walks started here add the range of their P and dS to `kernel_range`."""
    token = _WATCH.set(kernel_range)
    try:
        yield
    finally:
        _WATCH.reset(token)


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
    def of(cls, inputs: Inputs, block_shape: Sequence[int], scale: float) -> _Entry:
        """Check one entry's shapes (GQA group, the block mask [N1, ceil(q_len/X), ceil(kv_len/Y)]) and return it,
        its mask as bool."""
        dout, query, key, value, block_mask = inputs
        heads, q_len = query.shape[:2]
        kv_heads, kv_len = key.shape[:2]
        if kv_heads <= 0 or heads % kv_heads:  # N1 a multiple of N2: the GQA group size N1 / N2
            raise ValueError(f"query heads ({heads}) must be a positive multiple of kv heads ({kv_heads})")
        x, y = block_shape
        expected = (heads, -(-q_len // x), -(-kv_len // y))
        mask = np.asarray(block_mask)
        if mask.shape != expected:
            raise ValueError(
                f"block_mask has shape {mask.shape}, expected {expected} for {heads} heads, "
                f"q_len {q_len}, kv_len {kv_len} and block shape {tuple(block_shape)}"
                " (cut it with layout.mask_view)"
            )
        mask = mask if mask.dtype == np.bool_ else mask != 0
        return cls(dout, query, key, value, mask, (x, y), scale, heads // kv_heads, mask.shape[2] * y - kv_len)


class _Path:
    """A precision path: what a walk over one kv head's selected blocks computes per tile of query rows.

    One instance serves one walk (one entry, one kv head): it keeps that walk's accumulators. Every path has
    the entry's out and lse rows ([N1, sq, D] and [N1, sq] views): the forward paths write them, the backward
    paths read them.
    """

    #: Dtype of the padded key and value blocks the walk gathers for `tile`.
    block_dtype: np.dtype
    #: The walks whose work this path does: progress counts a row once for each.
    walks = 1

    def __init__(self, entry: _Entry, out: np.ndarray, lse: np.ndarray) -> None:
        self.entry, self.out, self.lse = entry, out, lse

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
        super().__init__(entry, out, lse)
        self.empty = empty

    def tile(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, values: np.ndarray, scratch: _Scratch
    ) -> None:
        e = self.entry
        tile = _forward_tile(e, e.query[head, rows], keys, values, selected, scratch)
        self.out[head, rows], self.lse[head, rows] = tile[:2]
        self.empty[head, rows] = False


class _Golden(_Path):
    """The golden backward (docs/operator.md section 1) in dq's dtype (float32 or float64), from the given out, lse."""

    def __init__(self, entry: _Entry, out: np.ndarray, lse: np.ndarray, grads: Grads) -> None:
        super().__init__(entry, out, lse)
        self.dq, self.dk, self.dv = grads
        self.block_dtype = self.dq.dtype
        self.scale_cast = self.block_dtype.type(entry.scale)

    def start(self, kv_head: int, key_blocks: np.ndarray) -> None:
        self.dk_blocks = _accumulator(self.dk[kv_head], key_blocks)
        self.dv_blocks = _accumulator(self.dv[kv_head], key_blocks)

    def tile(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, values: np.ndarray, scratch: _Scratch
    ) -> None:
        """Compute the tile's P [rows, cols] (`scores`, cast to the precision if it is float64), add its dV and dK
        shares, write its dQ rows."""
        exp_scores, dout, query_scaled, dsum = self.scores(head, rows, selected, keys, scratch)
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

    def scores(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, scratch: _Scratch
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Return the tile's P [rows, cols], its dout rows and scaled query rows, and its Dsum."""
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
        return probs, dout_rows, query_scaled, dsum

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

    def __init__(self, entry: _Entry, out: np.ndarray, lse: np.ndarray, empty: np.ndarray, grads: Grads) -> None:
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

    def scores(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, scratch: _Scratch
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        e, precision = self.entry, self.block_dtype
        assert e.dout is not None
        query_rows = e.query[head, rows].astype(precision)  # a copy: scaled in place below
        out64, lse64, exp_scores, row_max = _forward_tile(e, query_rows, self.keys64, self.values64, selected, scratch)
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
        return exp_scores, dout_rows, query_rows, dsum

    def finish(self, kv_head: int) -> None:
        super().finish(kv_head)
        self.keys64 = self.values64 = np.empty((0, 0))  # scratch of the walk, which is over


class _KernelInputs(_Path):
    """A kernel's path: it reads key and value rounded to its input dtype `io_dtype`, in float32 blocks."""

    block_dtype = np.dtype(np.float32)
    io_dtype: np.dtype

    def blocks(self, tensor: np.ndarray) -> np.ndarray:
        return _padded_blocks(_to_io_fp32(tensor, self.io_dtype), self.entry.block_shape[1], np.float32)


class _Kernel(_KernelInputs):
    """The A2/A3 kernel's precision path (docs/operator.md section 2) from the given out and lse, in the input dtype."""

    def __init__(self, entry: _Entry, out: np.ndarray, lse: np.ndarray, grads: Grads) -> None:
        super().__init__(entry, out, lse)
        self.dq, self.dk, self.dv = grads
        self.io_dtype = self.dq.dtype
        self.scale32 = np.float32(entry.scale)
        self.watch = _WATCH.get()
        self.seen = KernelRange() if self.watch is not None else None

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
            for name, chunk in (("probs", chunk_probs), ("dscores", chunk_dscores)):  # rounded: P16, dS16
                if self.seen is not None:
                    self.seen.before(name, chunk)
                round_float32(chunk, io_dtype, BACKWARD_TIES, out=chunk)
                if self.seen is not None:
                    self.seen.after(name, chunk)
        _add_products(self.dv_blocks, selected, probs, dout_rows, scratch)
        dq_rows = dscores @ keys
        dq_rows *= self.scale32
        self.dq[head, rows] = to_dtype(dq_rows, io_dtype, BACKWARD_TIES)
        _add_products(self.dk_blocks, selected, dscores, query_rows, scratch)

    def finish(self, kv_head: int) -> None:
        dim, kv_len = self.entry.key.shape[2], self.entry.key.shape[1]
        self.dk_blocks *= self.scale32
        self.dk[kv_head] = to_dtype(self.dk_blocks.reshape(-1, dim)[:kv_len], self.io_dtype, BACKWARD_TIES)
        self.dv[kv_head] = to_dtype(self.dv_blocks.reshape(-1, dim)[:kv_len], self.io_dtype, BACKWARD_TIES)
        del self.dk_blocks, self.dv_blocks  # while other walks go on
        if self.watch is not None and self.seen is not None:
            self.watch.add(self.seen)
            self.seen = KernelRange()


class _Both(_Path):
    """Two paths that read the same padded blocks (the golden, then the benchmark of its out and lse) in one walk:
    each block row is gathered once for both, and each tile runs the first path's, then the second's.

    Each path computes what it would in a walk of its own, in the same order (the second reads the out and lse
    rows the first has just written, as its own walk would after waiting for them); they take turns with the
    walk's work buffers, as no buffer a tile uses outlives it but the row's gathered (shared) blocks.
    """

    def __init__(self, first: _Path, second: _Path) -> None:
        super().__init__(first.entry, first.out, first.lse)
        self.paths = (first, second)
        self.walks = first.walks + second.walks
        self.block_dtype = first.block_dtype

    def blocks(self, tensor: np.ndarray) -> np.ndarray:
        return self.paths[0].blocks(tensor)

    def start(self, kv_head: int, key_blocks: np.ndarray) -> None:
        for path in self.paths:
            path.start(kv_head, key_blocks)

    def row(self, keys: np.ndarray, values: np.ndarray, scratch: _Scratch) -> None:
        for path in self.paths:
            path.row(keys, values, scratch)

    def tile(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, values: np.ndarray, scratch: _Scratch
    ) -> None:
        for path in self.paths:
            path.tile(head, rows, selected, keys, values, scratch)

    def finish(self, kv_head: int) -> None:
        for path in self.paths:
            path.finish(kv_head)


def _accumulator(grad: np.ndarray, key_blocks: np.ndarray) -> np.ndarray:
    """Return zeroed [nKV, Y, D] accumulators for one kv head's [skv, D] gradient `grad` (zero-filled, as callers
    make it): `grad` itself, seen as blocks, when it has no padding and the blocks' dtype (no second copy of it)."""
    if grad.dtype == key_blocks.dtype and grad.flags.c_contiguous and grad.size == key_blocks.size:
        return grad.reshape(key_blocks.shape)
    return np.zeros_like(key_blocks)


def _forward_tile(
    entry: _Entry, query: np.ndarray, keys: np.ndarray, values: np.ndarray, selected: np.ndarray, scratch: _Scratch
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Forward of one tile of `entry`'s query rows against its selected keys, in float64.

    Returns:
        out [rows, D], lse [rows], exp(S - rowmax) [rows, cols] (a scratch buffer) and rowmax [rows, 1].
    """
    scores = scratch.get("scores", (query.shape[0], keys.shape[0]), np.float64)
    np.matmul(np.asarray(query, dtype=np.float64) * entry.scale, keys.T, out=scores)
    row_max = np.empty((scores.shape[0], 1))
    row_sum = np.empty(scores.shape[0])
    for part in _chunks(scores.shape):
        chunk = scores[part]
        _mask_tail(chunk, selected, entry.mask.shape[2], entry.tail_pad)
        np.max(chunk, axis=1, keepdims=True, out=row_max[part])
        chunk -= row_max[part]
        np.exp(chunk, out=chunk)
        np.sum(chunk, axis=1, out=row_sum[part])
    out = (scores @ values) / row_sum[:, None]
    lse = row_max[:, 0] + np.log(row_sum)
    return out, lse, scores, row_max
