"""Block-sparse attention forward and backward on arrays: the golden and the kernel-faithful path.

Pure computation: arrays in, arrays out. Nothing here prints or touches files.

Every function works block row by block row: for one query head and one query block row it gathers the
selected key/value blocks into one contiguous array and does one matrix product per formula, so no
Sq x Skv matrix ever exists and memory grows with the sequence length, not its square.

Three precisions:

* `forward` / `forward_sequence`: always float64, so the generated `attentionOut` and `softmaxLse`
  are stable across machines once rounded to the tensor dtypes.
* `backward` / `backward_sequence`: the formulas of DOMAIN.md section 1 on the GIVEN out and lse,
  computed in float32 (the CANN "golden": inputs upcast to fp32) or float64.
* `backward_kernel` / `backward_sequence_kernel`: the A2/A3 kernel's precision path (DOMAIN.md section 2):
  fp32 scores and probabilities, P and dS rounded to the input dtype before the products that use them,
  fp32 accumulation, scale applied to dQ and dK at the end, outputs cast to the input dtype.

Semantics shared by all: a query block row with no selected kv block is empty (dq = 0 there, out = 0);
a kv position that no query selects gets dk = dv = 0; in a partial last block only real rows and
columns take part. The lse of an empty row is never read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import DTypeLike

from .case import Case, numpy_dtype
from .layout import kv_view, lse_view, mask_view, q_view

__all__ = [
    "forward_sequence",
    "backward_sequence",
    "backward_sequence_kernel",
    "forward",
    "backward",
    "backward_kernel",
]


# ---- helpers ------------------------------------------------------------------------------------


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


def _gather(blocks: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """Return blocks[selected] as [len(selected) * Y, D]; a view when the blocks are consecutive."""
    first, last = selected[0], selected[-1]
    if last - first + 1 == selected.size:
        return blocks[first : last + 1].reshape(-1, blocks.shape[2])
    return blocks[selected].reshape(-1, blocks.shape[2])


def _mask_tail(scores: np.ndarray, selected: np.ndarray, n_kv_blocks: int, tail_pad: int) -> None:
    """Set the padding columns of a selected partial last kv block to -inf (they are the last columns)."""
    if tail_pad and selected[-1] == n_kv_blocks - 1:
        scores[:, -tail_pad:] = -np.inf


_SCATTER_LOOP_MIN = 4096
"""Block size (Y * D elements) from which adding block by block beats one fancy-indexed add."""


def _scatter_add(blocks: np.ndarray, selected: np.ndarray, contribution: np.ndarray) -> None:
    """Add contribution [len(selected) * Y, D] to `blocks[selected]` ([nKV, Y, D]); indices are unique."""
    contribution = contribution.reshape(selected.size, blocks.shape[1], blocks.shape[2])
    if blocks.shape[1] * blocks.shape[2] < _SCATTER_LOOP_MIN:
        blocks[selected] += contribution
        return
    for block, index in zip(contribution, selected, strict=True):
        target = blocks[index]
        np.add(target, block, out=target)


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
    """Return float32 `values` rounded to `io_dtype` (round to nearest), as float32."""
    if io_dtype == np.float16:
        return _round_to_float16(values)
    return values.astype(io_dtype).astype(np.float32)


def _to_io_fp32(tensor: np.ndarray, io_dtype: np.dtype) -> np.ndarray:
    """Return `tensor` rounded to the kernel's input dtype, then upcast (exactly) to float32."""
    return np.asarray(tensor).astype(io_dtype, copy=False).astype(np.float32)


# ---- one batch entry ----------------------------------------------------------------------------


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
    x, y = block_shape
    heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[:2]
    group = _check_heads(heads, kv_heads)
    mask = _check_mask(block_mask, heads, q_len, kv_len, block_shape)
    out = np.zeros((heads, q_len, dim))
    lse = np.full((heads, q_len), -np.inf)
    empty = np.ones((heads, q_len), dtype=bool)
    n_kv_blocks = mask.shape[2]
    tail_pad = n_kv_blocks * y - kv_len
    for kv_head in range(kv_heads):
        key_blocks = _padded_blocks(key[kv_head], y, np.float64)
        value_blocks = _padded_blocks(value[kv_head], y, np.float64)
        for head in range(kv_head * group, (kv_head + 1) * group):
            query_head = np.asarray(query[head], dtype=np.float64) * scale
            for row, selected in enumerate(_selections(mask[head])):
                if selected.size == 0:
                    continue
                rows = slice(row * x, min(q_len, (row + 1) * x))
                keys = _gather(key_blocks, selected)
                scores = query_head[rows] @ keys.T
                _mask_tail(scores, selected, n_kv_blocks, tail_pad)
                row_max = scores.max(axis=1, keepdims=True)
                scores -= row_max
                np.exp(scores, out=scores)
                row_sum = scores.sum(axis=1)
                out[head, rows] = (scores @ _gather(value_blocks, selected)) / row_sum[:, None]
                lse[head, rows] = row_max[:, 0] + np.log(row_sum)
                empty[head, rows] = False
    return out, lse, empty


def _backward_head(
    dout: np.ndarray,
    query: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    key_blocks: np.ndarray,
    value_blocks: np.ndarray,
    selections: list[np.ndarray],
    block_rows: int,
    tail_pad: int,
    scale: float,
    dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Backward of one query head in `dtype` (DOMAIN.md section 1, scale folded into the query).

    Args:
        dout, query, out: [sq, D]; lse: [sq].
        key_blocks, value_blocks: the head's kv head as zero-padded [nKV, Y, D] blocks of `dtype`.
        selections: selected kv block indices per query block row.

    Returns:
        dq [sq, D] and this head's dk, dv contributions as [nKV, Y, D] blocks (padding rows are junk).
    """
    n_kv_blocks, _, dim = key_blocks.shape
    dout = np.asarray(dout, dtype=dtype)
    scale_cast = dtype.type(scale)
    query_scaled = np.asarray(query, dtype=dtype) * scale_cast
    with np.errstate(over="ignore"):  # a huge finite empty-row sentinel may overflow; it is never read
        lse = np.asarray(lse, dtype=dtype)
    dsum = np.einsum("ij,ij->i", dout, np.asarray(out, dtype=dtype))
    dq = np.zeros(query.shape, dtype=dtype)
    dk_blocks = np.zeros_like(key_blocks)
    dv_blocks = np.zeros_like(value_blocks)
    for row, selected in enumerate(selections):
        if selected.size == 0:
            continue
        rows = slice(row * block_rows, (row + 1) * block_rows)
        keys = _gather(key_blocks, selected)
        values = _gather(value_blocks, selected)
        probs = query_scaled[rows] @ keys.T
        probs -= lse[rows, None]
        _mask_tail(probs, selected, n_kv_blocks, tail_pad)
        np.exp(probs, out=probs)
        dscores = dout[rows] @ values.T
        dscores -= dsum[rows, None]
        dscores *= probs
        _scatter_add(dv_blocks, selected, probs.T @ dout[rows])
        dq[rows] = dscores @ keys
        _scatter_add(dk_blocks, selected, dscores.T @ query_scaled[rows])
    dq *= scale_cast
    return dq, dk_blocks, dv_blocks


def _backward_head_kernel(
    dout: np.ndarray,
    query: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    key_blocks: np.ndarray,
    value_blocks: np.ndarray,
    selections: list[np.ndarray],
    block_rows: int,
    tail_pad: int,
    scale: float,
    io_dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Backward of one query head on the kernel's precision path; fp32 results, dq and dk NOT yet scaled.

    Arguments as `_backward_head`; key_blocks/value_blocks are float32 holding io_dtype values.
    """
    n_kv_blocks, _, dim = key_blocks.shape
    dout = _to_io_fp32(dout, io_dtype)
    query = _to_io_fp32(query, io_dtype)
    with np.errstate(over="ignore"):
        lse = np.asarray(lse, dtype=np.float32)
    scale32 = np.float32(scale)
    dsum = (dout * _to_io_fp32(out, io_dtype)).sum(axis=1, dtype=np.float32)
    dq = np.zeros(query.shape, dtype=np.float32)
    dk_blocks = np.zeros_like(key_blocks)
    dv_blocks = np.zeros_like(value_blocks)
    for row, selected in enumerate(selections):
        if selected.size == 0:
            continue
        rows = slice(row * block_rows, (row + 1) * block_rows)
        keys = _gather(key_blocks, selected)
        values = _gather(value_blocks, selected)
        probs = query[rows] @ keys.T
        probs *= scale32
        probs -= lse[rows, None]
        _mask_tail(probs, selected, n_kv_blocks, tail_pad)
        np.exp(probs, out=probs)
        probs_io = _round_to_io(probs, io_dtype)
        dscores = dout[rows] @ values.T
        dscores -= dsum[rows, None]
        dscores *= probs
        dscores_io = _round_to_io(dscores, io_dtype)
        _scatter_add(dv_blocks, selected, probs_io.T @ dout[rows])
        dq[rows] = dscores_io @ keys
        _scatter_add(dk_blocks, selected, dscores_io.T @ query[rows])
    return dq, dk_blocks, dv_blocks


def _backward_sequence(
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    block_mask: np.ndarray,
    block_shape: Sequence[int],
    scale: float,
    io_dtype: np.dtype | None,
    precision: DTypeLike,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the per-head backward over all heads of one batch entry; kernel path when io_dtype is given."""
    x, y = block_shape
    heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[:2]
    group = _check_heads(heads, kv_heads)
    mask = _check_mask(block_mask, heads, q_len, kv_len, block_shape)
    precision = np.dtype(precision)
    dq = np.zeros((heads, q_len, dim), dtype=precision)
    dk = np.zeros((kv_heads, kv_len, dim), dtype=precision)
    dv = np.zeros((kv_heads, kv_len, dim), dtype=precision)
    if q_len == 0 or kv_len == 0:
        return dq, dk, dv
    tail_pad = mask.shape[2] * y - kv_len
    for kv_head in range(kv_heads):
        if io_dtype is None:
            key_blocks = _padded_blocks(np.asarray(key[kv_head], dtype=precision), y, precision)
            value_blocks = _padded_blocks(np.asarray(value[kv_head], dtype=precision), y, precision)
        else:
            key_blocks = _padded_blocks(_to_io_fp32(key[kv_head], io_dtype), y, np.float32)
            value_blocks = _padded_blocks(_to_io_fp32(value[kv_head], io_dtype), y, np.float32)
        dk_blocks = np.zeros_like(key_blocks)
        dv_blocks = np.zeros_like(value_blocks)
        for head in range(kv_head * group, (kv_head + 1) * group):
            args = (dout[head], query[head], out[head], lse[head], key_blocks, value_blocks)
            rest = (_selections(mask[head]), x, tail_pad, scale)
            if io_dtype is None:
                dq[head], dk_part, dv_part = _backward_head(*args, *rest, precision)
            else:
                dq[head], dk_part, dv_part = _backward_head_kernel(*args, *rest, io_dtype)
            dk_blocks += dk_part
            dv_blocks += dv_part
        dk[kv_head] = dk_blocks.reshape(-1, dim)[:kv_len]
        dv[kv_head] = dv_blocks.reshape(-1, dim)[:kv_len]
    return dq, dk, dv


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
    if np.dtype(precision) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"precision must be float32 or float64, got {np.dtype(precision)}")
    return _backward_sequence(dout, query, key, value, out, lse, block_mask, block_shape, scale, None, precision)


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
    """Compute dq, dk, dv of one batch entry the way the A2/A3 kernel does (DOMAIN.md section 2).

    Tensors are first rounded to `io_dtype` and lse to float32, as the kernel sees them.
    Arguments as `backward_sequence`.

    Returns:
        dq, dk, dv of `io_dtype` (float16 or bfloat16).
    """
    io_dtype = np.dtype(io_dtype)
    dq, dk, dv = _backward_sequence(
        dout, query, key, value, out, lse, block_mask, block_shape, scale, io_dtype, np.float32
    )
    scale32 = np.float32(scale)
    dq *= scale32
    dk *= scale32
    return dq.astype(io_dtype), dk.astype(io_dtype), dv.astype(io_dtype)


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
        out, lse, empty = forward_sequence(
            q_view(case, query, span),
            kv_view(case, key, span),
            kv_view(case, value, span),
            mask_view(case, block_mask, span),
            case.block_shape,
            case.scale,
        )
        lse[empty] = case.empty_row_lse
        q_view(case, attention_out, span)[...] = out
        lse_view(case, softmax_lse, span)[...] = lse
    return attention_out, softmax_lse


def _backward_case(
    case: Case,
    tensors: tuple[np.ndarray, ...],
    softmax_lse: np.ndarray,
    block_mask: np.ndarray,
    sequence_backward,
    out_dtype: DTypeLike,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run `sequence_backward` on every batch entry and write the results into zero-filled full tensors."""
    dout, query, key, value, attention_out = tensors
    dq = np.zeros(case.q_shape, dtype=out_dtype)
    dk = np.zeros(case.kv_shape, dtype=out_dtype)
    dv = np.zeros(case.kv_shape, dtype=out_dtype)
    for span in case.spans():
        if span.q_len == 0 or span.kv_len == 0:
            continue
        grads = sequence_backward(
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
        q_view(case, dq, span)[...] = grads[0]
        kv_view(case, dk, span)[...] = grads[1]
        kv_view(case, dv, span)[...] = grads[2]
    return dq, dk, dv


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

    def sequence_backward(*args):
        return backward_sequence(*args, precision=precision)

    tensors = (dout, query, key, value, attention_out)
    return _backward_case(case, tensors, softmax_lse, block_mask, sequence_backward, precision)


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
    io_dtype = numpy_dtype(case.dtype)

    def sequence_backward(*args):
        return backward_sequence_kernel(*args, io_dtype=io_dtype)

    tensors = (dout, query, key, value, attention_out)
    return _backward_case(case, tensors, softmax_lse, block_mask, sequence_backward, io_dtype)
