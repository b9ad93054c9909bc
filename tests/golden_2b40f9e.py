"""The golden module as of commit 2b40f9e, kept verbatim: the reference that tests/golden/test_golden_bits.py holds
today's bsa_cli/golden/ to, bit for bit (golden float32 and float64, the kernel-faithful benchmark, out, lse).

Not used by bsa. Only the imports (absolute instead of relative), the name of the operator notes
(docs/operator.md) and the 16-bit casts differ from that commit: the kernel path's casts round half away
from zero (the kernel's CAST_ROUND) and the forward's out is rounded through float32 for bfloat16, both
through bsa_cli.core.rounding, as today's code has them. Its own docstring:

Block-sparse attention forward and backward on arrays: the golden and the kernel-faithful path.

Pure computation: arrays in, arrays out. Nothing here prints or touches files.

Every function works block row by block row: for one query head and one query block row it gathers the
selected key/value blocks into one contiguous array and does one matrix product per formula, so no
Sq x Skv matrix ever exists and memory grows with the sequence length, not its square. A block row whose
selection is very wide (long causal rows) is cut into groups of query rows (`_TILE_ELEMENTS`), and the dK/dV
products are added a bounded number of blocks at a time, so working memory stays bounded too. Work buffers
are reused from row to row, and inputs are upcast one block row at a time.

Three precisions:

* `forward` / `forward_sequence`: always float64, so the generated `attentionOut` and `softmaxLse`
  are stable across machines once rounded to the tensor dtypes.
* `backward` / `backward_sequence`: the formulas of docs/operator.md section 1 on the GIVEN out and lse,
  computed in float32 (the CANN "golden": inputs upcast to fp32) or float64.
* `backward_kernel` / `backward_sequence_kernel`: the A2/A3 kernel's precision path (docs/operator.md section 2):
  fp32 scores and probabilities, P and dS rounded to the input dtype before the products that use them,
  fp32 accumulation, scale applied to dQ and dK at the end, outputs cast to the input dtype.

`forward_backward` / `forward_backward_sequence` do the first two in one pass, as `bsa gen` needs them:
per block row the float64 forward, out and lse rounded to the tensor dtypes right there, then that row's
golden backward from the ROUNDED out and lse. The scores are not computed again: the backward's
`P = exp(S - lse)` is the forward's float64 `exp(S - rowmax)` times `exp(rowmax - lse)`, which is the same
formula on the same given lse, only more accurate than a float32 recomputation. Out and lse are bit for bit
those of `forward` rounded; the gradients agree with `backward`'s to its own rounding.

Semantics shared by all: a query block row with no selected kv block is empty (dq = 0 there, out = 0);
a kv position that no query selects gets dk = dv = 0; in a partial last block only real rows and
columns take part. The lse of an empty row is never read.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from numpy.typing import DTypeLike

from bsa_cli.core.case import Case, numpy_dtype
from bsa_cli.core.layout import kv_view, lse_view, mask_view, q_view
from bsa_cli.core.rounding import round_float32, to_dtype

__all__ = [
    "forward_sequence",
    "backward_sequence",
    "backward_sequence_kernel",
    "forward_backward_sequence",
    "forward",
    "backward",
    "backward_kernel",
    "forward_backward",
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
    for target, index in zip(gathered, selected, strict=True):
        target[...] = blocks[index]
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
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, list[slice]]]:
    """Yield (head, selected, keys, values, row tiles) for each query-block row of a kv head's group.

    Rows that select no block are skipped. keys/values hold the row's selected blocks, gathered into
    scratch buffers that the next row reuses. When the caller is done with a row, the `reporting`
    callback (if any) hears how many selected block pairs it held.
    """
    report = _PROGRESS.get()
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


def _round_to_float16(values: np.ndarray) -> np.ndarray:
    """Return float32 `values` rounded to float16 (nearest, ties to even; overflow to inf), still as float32.

    Bit for bit `values.astype(np.float16).astype(np.float32)` (checked on all 2**32 float32 values),
    about four times faster: NumPy converts to float16 one element at a time.
    """
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    with np.errstate(invalid="ignore"):
        subnormal = np.abs(values)  # float16 subnormals are multiples of 2**-24, the ulp of float32 at 0.5
        subnormal += np.float32(0.5)
        subnormal -= np.float32(0.5)
    np.copysign(subnormal, values, out=subnormal)
    rounded = bits >> np.uint32(13)  # normal range: drop 13 of 23 mantissa bits, ties to even
    rounded &= np.uint32(1)
    rounded += np.uint32(0x0FFF)
    rounded += bits
    rounded &= np.uint32(0xFFFFE000)
    result = rounded.view(np.float32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    np.copyto(result, subnormal, where=magnitude < np.uint32(0x38800000))  # below 2**-14
    np.copyto(result, values, where=magnitude > np.uint32(0x7F800000))  # NaN stays NaN
    magnitude = rounded & np.uint32(0x7FFFFFFF)
    overflow = (magnitude > np.uint32(0x477FE000)) & (magnitude <= np.uint32(0x7F800000))  # past 65504
    if overflow.any():
        result[overflow] = np.copysign(np.float32(np.inf), values[overflow])
    return result


def _round_to_io(values: np.ndarray, io_dtype: np.dtype) -> np.ndarray:
    """Return float32 `values` rounded to `io_dtype` as the kernel's CAST_ROUND does (half away from zero), as
    float32. (2b40f9e rounded ties to even here and in the final casts; the kernel does not.)"""
    return round_float32(values, io_dtype, "away")


def _to_io_fp32(tensor: np.ndarray, io_dtype: np.dtype) -> np.ndarray:
    """Return `tensor` rounded to the kernel's input dtype, then upcast (exactly) to float32."""
    return np.asarray(tensor).astype(io_dtype, copy=False).astype(np.float32)


# ---- one batch entry ----------------------------------------------------------------------------


def _geometry(
    query: np.ndarray, key: np.ndarray, block_mask: np.ndarray, block_shape: Sequence[int]
) -> tuple[int, np.ndarray, int]:
    """Check one entry's shapes; return the GQA group size, the bool mask and the padding of the last kv block."""
    heads, q_len = query.shape[:2]
    kv_heads, kv_len = key.shape[:2]
    group = _check_heads(heads, kv_heads)
    mask = _check_mask(block_mask, heads, q_len, kv_len, block_shape)
    return group, mask, mask.shape[2] * block_shape[1] - kv_len


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
    _mask_tail(scores, selected, n_kv_blocks, tail_pad)
    row_max = scores.max(axis=1, keepdims=True)
    scores -= row_max
    np.exp(scores, out=scores)
    row_sum = scores.sum(axis=1)
    out = (scores @ values) / row_sum[:, None]
    lse = row_max[:, 0] + np.log(row_sum)
    return out, lse, scores, row_max


def _backward_tile(
    probs: np.ndarray,
    dout: np.ndarray,
    query_scaled: np.ndarray,
    dsum: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    selected: np.ndarray,
    dk_blocks: np.ndarray,
    dv_blocks: np.ndarray,
    scratch: _Scratch,
) -> np.ndarray:
    """Finish one tile's golden backward from its P [rows, cols]: add its dV and dK shares, return dS @ K."""
    dscores = scratch.get("dscores", probs.shape, probs.dtype)
    np.matmul(dout, values.T, out=dscores)
    dscores -= dsum[:, None]
    dscores *= probs
    _add_products(dv_blocks, selected, probs, dout, scratch)
    _add_products(dk_blocks, selected, dscores, query_scaled, scratch)
    return dscores @ keys


def _forward_into(
    out: np.ndarray,
    lse: np.ndarray,
    empty: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    block_shape: Sequence[int],
    scale: float,
) -> None:
    """Fill heads-major out [N1, sq, D], lse and empty [N1, sq] with the float64 forward of one entry."""
    x, y = block_shape
    q_len = query.shape[1]
    group, mask, tail_pad = _geometry(query, key, block_mask, block_shape)
    scratch = _Scratch()
    for kv_head in range(key.shape[0]):
        key_blocks = _padded_blocks(key[kv_head], y, np.float64)
        value_blocks = _padded_blocks(value[kv_head], y, np.float64)
        for head, selected, keys, values, row_tiles in _selected_rows(
            mask, group, kv_head, x, q_len, key_blocks, value_blocks, scratch
        ):
            for rows in row_tiles:
                tile = _forward_tile(query[head, rows], keys, values, selected, mask.shape[2], tail_pad, scale, scratch)
                out[head, rows], lse[head, rows] = tile[:2]
                empty[head, rows] = False


def _backward_into(
    grads: tuple[np.ndarray, np.ndarray, np.ndarray],
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    block_mask: np.ndarray,
    block_shape: Sequence[int],
    scale: float,
) -> None:
    """Fill heads-major (dq, dk, dv), zero-filled, with one entry's golden backward in their dtype."""
    dq, dk, dv = grads
    precision = dq.dtype
    x, y = block_shape
    q_len, dim = query.shape[1:]
    kv_len = key.shape[1]
    group, mask, tail_pad = _geometry(query, key, block_mask, block_shape)
    if q_len == 0 or kv_len == 0:
        return
    scale_cast = precision.type(scale)
    scratch = _Scratch()
    for kv_head in range(key.shape[0]):
        key_blocks = _padded_blocks(key[kv_head], y, precision)
        value_blocks = _padded_blocks(value[kv_head], y, precision)
        dk_blocks = np.zeros_like(key_blocks)
        dv_blocks = np.zeros_like(value_blocks)
        for head, selected, keys, values, row_tiles in _selected_rows(
            mask, group, kv_head, x, q_len, key_blocks, value_blocks, scratch
        ):
            for rows in row_tiles:
                query_scaled = np.asarray(query[head, rows], dtype=precision) * scale_cast
                dout_rows = np.asarray(dout[head, rows], dtype=precision)
                dsum = np.einsum("ij,ij->i", dout_rows, np.asarray(out[head, rows], dtype=precision))
                with np.errstate(over="ignore"):  # a huge finite empty-row sentinel may overflow; never read
                    lse_rows = np.asarray(lse[head, rows], dtype=precision)
                probs = scratch.get("probs", (query_scaled.shape[0], keys.shape[0]), precision)
                np.matmul(query_scaled, keys.T, out=probs)
                probs -= lse_rows[:, None]
                _mask_tail(probs, selected, mask.shape[2], tail_pad)
                np.exp(probs, out=probs)
                dq_rows = _backward_tile(
                    probs, dout_rows, query_scaled, dsum, keys, values, selected, dk_blocks, dv_blocks, scratch
                )
                dq_rows *= scale_cast
                dq[head, rows] = dq_rows
        dk[kv_head] = dk_blocks.reshape(-1, dim)[:kv_len]
        dv[kv_head] = dv_blocks.reshape(-1, dim)[:kv_len]


def _backward_kernel_into(
    grads: tuple[np.ndarray, np.ndarray, np.ndarray],
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    block_mask: np.ndarray,
    block_shape: Sequence[int],
    scale: float,
) -> None:
    """Fill heads-major (dq, dk, dv), zero-filled and of the input dtype, on the kernel's precision path."""
    dq, dk, dv = grads
    io_dtype = dq.dtype
    x, y = block_shape
    q_len, dim = query.shape[1:]
    kv_len = key.shape[1]
    group, mask, tail_pad = _geometry(query, key, block_mask, block_shape)
    if q_len == 0 or kv_len == 0:
        return
    scale32 = np.float32(scale)
    scratch = _Scratch()
    for kv_head in range(key.shape[0]):
        key_blocks = _padded_blocks(_to_io_fp32(key[kv_head], io_dtype), y, np.float32)
        value_blocks = _padded_blocks(_to_io_fp32(value[kv_head], io_dtype), y, np.float32)
        dk_blocks = np.zeros_like(key_blocks)
        dv_blocks = np.zeros_like(value_blocks)
        for head, selected, keys, values, row_tiles in _selected_rows(
            mask, group, kv_head, x, q_len, key_blocks, value_blocks, scratch
        ):
            for rows in row_tiles:
                query_rows = _to_io_fp32(query[head, rows], io_dtype)
                dout_rows = _to_io_fp32(dout[head, rows], io_dtype)
                dsum = (dout_rows * _to_io_fp32(out[head, rows], io_dtype)).sum(axis=1, dtype=np.float32)
                with np.errstate(over="ignore"):
                    lse_rows = np.asarray(lse[head, rows], dtype=np.float32)
                probs = scratch.get("probs", (query_rows.shape[0], keys.shape[0]), np.float32)
                np.matmul(query_rows, keys.T, out=probs)
                probs *= scale32
                probs -= lse_rows[:, None]
                _mask_tail(probs, selected, mask.shape[2], tail_pad)
                np.exp(probs, out=probs)
                probs_io = _round_to_io(probs, io_dtype)
                dscores = scratch.get("dscores", probs.shape, np.float32)
                np.matmul(dout_rows, values.T, out=dscores)
                dscores -= dsum[:, None]
                dscores *= probs
                dscores_io = _round_to_io(dscores, io_dtype)
                _add_products(dv_blocks, selected, probs_io, dout_rows, scratch)
                dq_rows = dscores_io @ keys
                dq_rows *= scale32
                dq[head, rows] = to_dtype(dq_rows, dq.dtype, "away")
                _add_products(dk_blocks, selected, dscores_io, query_rows, scratch)
        dk_blocks *= scale32
        dk[kv_head] = to_dtype(dk_blocks.reshape(-1, dim)[:kv_len], dk.dtype, "away")
        dv[kv_head] = to_dtype(dv_blocks.reshape(-1, dim)[:kv_len], dv.dtype, "away")


def _forward_backward_into(
    forward: tuple[np.ndarray, np.ndarray, np.ndarray],
    grads: tuple[np.ndarray, np.ndarray, np.ndarray],
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    block_shape: Sequence[int],
    scale: float,
) -> None:
    """Fill (out, lse, empty) with the rounded float64 forward and (dq, dk, dv) with the golden backward from it.

    out is of the input dtype, lse float32; the backward's precision is that of dq. Per tile of query rows:
    the forward leaves E = exp(S - rowmax) (float64); with f = exp(rowmax - lse) on the ROUNDED lse,
    P = exp(S - lse) = f E. The row factor f goes onto dout (dO' = f dO, Dsum' = f Dsum, both [rows, D] or
    [rows]) rather than onto E, so the wide arrays see one cast: dP' = dO' V^T = f dP,
    dS = E (dP' - Dsum') = P (dP - Dsum), dV += E^T dO' = P^T dO; dQ and dK as in `_backward_tile`.
    """
    out, lse, empty = forward
    dq, dk, dv = grads
    io_dtype, precision = out.dtype, dq.dtype
    x, y = block_shape
    q_len, dim = query.shape[1:]
    kv_len = key.shape[1]
    group, mask, tail_pad = _geometry(query, key, block_mask, block_shape)
    if q_len == 0 or kv_len == 0:
        return
    scale_cast = precision.type(scale)
    scratch = _Scratch()
    for kv_head in range(key.shape[0]):
        key_blocks = _padded_blocks(key[kv_head], y, precision)
        value_blocks = _padded_blocks(value[kv_head], y, precision)
        dk_blocks = np.zeros_like(key_blocks)
        dv_blocks = np.zeros_like(value_blocks)
        for head, selected, keys, values, row_tiles in _selected_rows(
            mask, group, kv_head, x, q_len, key_blocks, value_blocks, scratch
        ):
            keys64, values64 = keys, values
            if precision != np.float64:  # exact upcasts of the gathered blocks for the float64 forward
                keys64 = scratch.get("keys64", keys.shape, np.float64)
                values64 = scratch.get("values64", values.shape, np.float64)
                np.copyto(keys64, keys)
                np.copyto(values64, values)
            for rows in row_tiles:
                query_rows = query[head, rows].astype(precision)  # a copy: scaled in place below
                out64, lse64, exp_scores, row_max = _forward_tile(
                    query_rows, keys64, values64, selected, mask.shape[2], tail_pad, scale, scratch
                )
                with np.errstate(under="ignore"):  # rounding tiny outputs to the tensor dtype is the point
                    # bfloat16 through float32, as ml_dtypes before 0.7 cast it (0.7 casts float64 directly)
                    through = np.float32 if io_dtype != np.float16 else np.float64
                    out_rows = out[head, rows] = out64.astype(through).astype(io_dtype)
                lse_rows = lse[head, rows] = lse64.astype(np.float32)
                empty[head, rows] = False
                factor = np.exp(row_max - lse_rows[:, None].astype(np.float64)).astype(precision)
                if precision == np.float64:
                    probs = exp_scores
                else:
                    probs = scratch.get("probs", exp_scores.shape, precision)
                    np.copyto(probs, exp_scores, casting="same_kind")
                dout_rows = dout[head, rows].astype(precision)
                dsum = np.einsum("ij,ij->i", dout_rows, out_rows.astype(precision))
                dout_rows *= factor
                dsum *= factor[:, 0]
                query_rows *= scale_cast
                dq_rows = _backward_tile(
                    probs, dout_rows, query_rows, dsum, keys, values, selected, dk_blocks, dv_blocks, scratch
                )
                dq_rows *= scale_cast
                dq[head, rows] = dq_rows
        dk[kv_head] = dk_blocks.reshape(-1, dim)[:kv_len]
        dv[kv_head] = dv_blocks.reshape(-1, dim)[:kv_len]


def _zeros_grads(
    q_shape: tuple[int, ...], kv_shape: tuple[int, ...], dtype: DTypeLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return zero-filled (dq, dk, dv) of the query's and the key's shape."""
    return np.zeros(q_shape, dtype=dtype), np.zeros(kv_shape, dtype=dtype), np.zeros(kv_shape, dtype=dtype)


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
    _forward_into(out, lse, empty, query, key, value, block_mask, block_shape, scale)
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
    precision = _check_precision(precision)
    grads = _zeros_grads(query.shape, key.shape, precision)
    _backward_into(grads, dout, query, key, value, out, lse, block_mask, block_shape, scale)
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
    _backward_kernel_into(grads, dout, query, key, value, out, lse, block_mask, block_shape, scale)
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
    forward = (
        np.zeros((heads, q_len, dim), dtype=io_dtype),
        np.full((heads, q_len), -np.inf, dtype=np.float32),
        np.ones((heads, q_len), dtype=bool),
    )
    grads = _zeros_grads(query.shape, key.shape, precision)
    _forward_backward_into(forward, grads, dout, query, key, value, block_mask, block_shape, scale)
    return (*forward, *grads)


# ---- whole case ---------------------------------------------------------------------------------


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
    for span in case.spans():
        if span.q_len == 0:
            continue
        lse = lse_view(case, softmax_lse, span)
        _forward_into(
            q_view(case, attention_out, span),
            lse,
            np.ones(lse.shape, dtype=bool),
            q_view(case, query, span),
            kv_view(case, key, span),
            kv_view(case, value, span),
            mask_view(case, block_mask, span),
            case.block_shape,
            case.scale,
        )
    return attention_out, softmax_lse


def _zero_case_grads(case: Case, dtype: DTypeLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.zeros(case.q_shape, dtype=dtype),
        np.zeros(case.kv_shape, dtype=dtype),
        np.zeros(case.kv_shape, dtype=dtype),
    )


def _grad_views(case: Case, grads: tuple[np.ndarray, ...], span) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dq, dk, dv = grads
    return q_view(case, dq, span), kv_view(case, dk, span), kv_view(case, dv, span)


def _backward_case(
    case: Case,
    tensors: tuple[np.ndarray, ...],
    softmax_lse: np.ndarray,
    block_mask: np.ndarray,
    fill,
    out_dtype: DTypeLike,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run `fill` (`_backward_into` or `_backward_kernel_into`) on every batch entry, into zero-filled tensors."""
    dout, query, key, value, attention_out = tensors
    grads = _zero_case_grads(case, out_dtype)
    for span in case.spans():
        if span.q_len == 0 or span.kv_len == 0:
            continue
        fill(
            _grad_views(case, grads, span),
            q_view(case, dout, span),
            q_view(case, query, span),
            kv_view(case, key, span),
            kv_view(case, value, span),
            q_view(case, attention_out, span),
            lse_view(case, softmax_lse, span),
            mask_view(case, block_mask, span),
            case.block_shape,
            case.scale,
        )
    return grads


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
    tensors = (dout, query, key, value, attention_out)
    return _backward_case(case, tensors, softmax_lse, block_mask, _backward_into, _check_precision(precision))


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
    tensors = (dout, query, key, value, attention_out)
    return _backward_case(case, tensors, softmax_lse, block_mask, _backward_kernel_into, numpy_dtype(case.dtype))


def forward_backward(
    case: Case,
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    precision: DTypeLike = np.float32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compute a case's attentionOut and softmaxLse, rounded as written, and the golden dq, dk, dv from them.

    One pass instead of `forward` then `backward` (see `forward_backward_sequence`).

    Returns:
        attention_out of shape `case.q_shape` in the case dtype and softmax_lse of shape `case.q_shape[:-1]` in
        float32: bit for bit `forward`'s, cast; then dq, dk, dv in `precision` (float32 or float64), as
        `backward` gives for that out and lse, to its rounding.
    """
    precision = _check_precision(precision)
    attention_out = np.zeros(case.q_shape, dtype=numpy_dtype(case.dtype))
    with np.errstate(over="ignore"):  # a huge finite sentinel becomes inf, as when `forward`'s lse is cast
        empty_row_lse = np.float64(case.empty_row_lse).astype(np.float32)
    softmax_lse = np.full(case.q_shape[:-1], empty_row_lse, dtype=np.float32)
    grads = _zero_case_grads(case, precision)
    for span in case.spans():
        if span.q_len == 0:
            continue
        lse = lse_view(case, softmax_lse, span)
        _forward_backward_into(
            (q_view(case, attention_out, span), lse, np.ones(lse.shape, dtype=bool)),
            _grad_views(case, grads, span),
            q_view(case, dout, span),
            q_view(case, query, span),
            kv_view(case, key, span),
            kv_view(case, value, span),
            mask_view(case, block_mask, span),
            case.block_shape,
            case.scale,
        )
    return (attention_out, softmax_lse, *grads)
