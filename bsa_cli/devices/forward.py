"""The reference device's forward: aclnnBlockSparseAttention played with its own tiling, optionally with a fault.

Its results are a *reference*, never device results. It follows the forward kernel's precision path
(docs/operator.md, "The forward's precision path") with code of its own, distinct from
`golden.forward_kernel` (which walks block rows with the golden's walker and multiplies a row's scores at once):

* batch entries located from the actual lengths by this module's arithmetic (BNSD lengths always honoured:
  the forward skips padding rows), query heads one by one, each query block row cut into pieces of at most
  `PIECE_ROWS` rows (the kernel's 128-row pieces);
* per piece, the kv positions of its selected blocks listed (real columns only, ascending) and taken
  `STACK_COLUMNS` at a time: each stack's keys and values gathered by position and multiplied on their own,
  then the online softmax step (running max, rescale of the running sum and accumulator by
  exp(m_old - m_new)), P rounded ties-to-even to the case dtype before P V, fp32 accumulation;
* O / l in fp32 rounded ties to even; lse = ln(l) + m in fp32. innerPrecise 1: the scale rounded to fp16 and
  every softmax step held in fp16 (each the exact fp32 result rounded to fp16), lse in fp16, then float32.

The outputs are buffers pre-filled with NaN (fp16 0x7E00, bf16 0x7FC0, fp32 0x7FC00000), as the device
harness fills them: only the rows the forward writes are written, and lse only with softmax_lse_flag 1.
Planted faults (`faults.FORWARD_FAULTS`): `lse-not-written`, `rescale-skipped`, `stack-off-by-one`, and the
misreadings `forward-mask-transposed`, `forward-block-shift`, `forward-drop-tail-block`,
`forward-heads-interleaved`, `forward-no-scale`, `forward-lse-base2`, `forward-rows-swapped`,
`forward-tile-noise`; a fault of the backward leaves the forward clean.

Callers: `run_forward(case, tensors, fault)` for a forward folder; for a chain, `run_forward` then
`backward_tensors` (the backward's inputs from the forward's own outputs, the mask in the manifest's dtype)
and the backward device; `forward_mask` is the mask as the forward receives it (int8, same bytes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..core import blas
from ..core.case import Case, numpy_dtype
from ..core.rounding import FLOAT16, FORWARD_TIES, round_float32, to_dtype
from ..golden import forward_case
from .faults import FORWARD_FAULTS, fault_site, forward_selection, plant_rows_swapped

#: Most query rows the forward kernel takes at once (a block row of X > 128 rows is cut into pieces).
PIECE_ROWS = 128

#: Most kv columns of a piece's concatenated selected blocks one online-softmax step takes.
STACK_COLUMNS = 512

#: log2(e): a natural log times it is the base-2 log (`forward-lse-base2`).
LOG2E = float(np.log2(np.e))

#: The quiet NaN the output buffers are pre-filled with, per dtype (as the C++ harness fills them).
NAN_BITS = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000}


def prefilled(shape: tuple[int, ...], dtype_name: str) -> np.ndarray:
    """Return a buffer of `shape` and dtype `dtype_name` filled with that dtype's quiet NaN (`NAN_BITS`)."""
    dtype = numpy_dtype(dtype_name)
    uint = {2: np.uint16, 4: np.uint32}[dtype.itemsize]
    return np.full(shape, NAN_BITS[dtype_name], dtype=uint).view(dtype)


def forward_mask(block_mask: np.ndarray) -> np.ndarray:
    """Return the mask as the forward receives it: int8 (the forward's registered dtype), the same bytes."""
    return np.ascontiguousarray(block_mask).view(np.int8)


# ---- one piece --------------------------------------------------------------------------------------


class _Softmax:
    """The softmax steps of one innerPrecise: fp32 (0), or each step held in fp16 (1)."""

    def __init__(self, inner_precise: int, scale: float) -> None:
        self.half = inner_precise == 1
        scale32 = np.float32(scale)
        self.scale = np.float32(to_dtype(np.asarray(scale32), FLOAT16)) if self.half else scale32

    def hold(self, values: np.ndarray) -> np.ndarray:
        """Return `values` as the step holds them: rounded to fp16 (innerPrecise 1) or as they are."""
        return round_float32(values, FLOAT16, FORWARD_TIES) if self.half else values

    def scores(self, products: np.ndarray) -> np.ndarray:
        return self.hold(self.hold(products) * self.scale)

    def exp_of(self, values: np.ndarray) -> np.ndarray:
        return self.hold(np.exp(self.hold(values)))

    def lse(self, row_sum: np.ndarray, row_max: np.ndarray) -> np.ndarray:
        return self.hold(self.hold(np.log(row_sum)) + row_max).astype(np.float32)


def _stacks(width: int, fault: str | None) -> list[tuple[int, int]]:
    """Return the [first, stop) column ranges of the online-softmax steps over `width` columns.

    stack-off-by-one: every stack after the first starts one column late (its first column is dropped).
    """
    bounds = []
    for index, start in enumerate(range(0, width, STACK_COLUMNS)):
        first = start + 1 if fault == "stack-off-by-one" and index > 0 else start
        if first < min(start + STACK_COLUMNS, width):  # a stack of one column loses it altogether
            bounds.append((first, min(start + STACK_COLUMNS, width)))
    return bounds


def _piece(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    positions: np.ndarray,
    softmax: _Softmax,
    io_dtype: np.dtype,
    fault: str | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Return out rows (fp32, before the final cast) and lse rows of one piece.

    Args:
        query: [rows, D] float32; key, value: [kv_len, D] float32 of the piece's kv head.
        positions: the kv positions the piece selects, ascending (at least one).
    """
    running_max = running_sum = accumulator = np.empty(0, dtype=np.float32)
    for index, (first, stop) in enumerate(_stacks(positions.size, fault)):
        columns = positions[first:stop]
        scores = softmax.scores(_fp32_sum_of_products(query, key[columns].T))
        stack_max = scores.max(axis=1)
        new_max = stack_max if index == 0 else np.maximum(running_max, stack_max)
        probs = softmax.exp_of(scores - new_max[:, None])
        stack_sum = probs.sum(axis=1, dtype=np.float64).astype(np.float32)
        products = _fp32_sum_of_products(round_float32(probs, io_dtype, FORWARD_TIES), value[columns])
        if index == 0:
            running_sum, accumulator = softmax.hold(stack_sum), products
        elif fault == "rescale-skipped":  # the max moved on, the old sum and accumulator did not follow
            running_sum = softmax.hold(running_sum + stack_sum)
            accumulator = accumulator + products
        else:
            rescale = softmax.exp_of(running_max - new_max)
            running_sum = softmax.hold(running_sum * rescale + stack_sum)
            accumulator = accumulator * rescale[:, None] + products
        running_max = new_max
    return accumulator / running_sum[:, None], softmax.lse(running_sum, running_max)


# ---- whole case ------------------------------------------------------------------------------------


def _entries(case: Case) -> list[tuple[int, int, int, int, int]]:
    """Return (batch, q_start, q_len, kv_start, kv_len) per batch entry as the forward reads its lengths.

    BNSD: the actual lengths when given (the forward honours them), else the S dimensions; rows start at 0
    in the entry's own slice. TND: token offsets are the running sums of the per-batch lengths.
    """
    q_lengths = case.actual_seq_lengths or (case.q_seq_len,) * case.batch
    kv_lengths = case.actual_seq_lengths_kv or (case.kv_seq_len,) * case.batch
    if case.layout != "TND":
        return [(b, 0, int(q_lengths[b]), 0, int(kv_lengths[b])) for b in range(case.batch)]
    q_starts = np.concatenate([[0], np.cumsum(q_lengths)[:-1]]).astype(int)
    kv_starts = np.concatenate([[0], np.cumsum(kv_lengths)[:-1]]).astype(int)
    return [(b, int(q_starts[b]), int(q_lengths[b]), int(kv_starts[b]), int(kv_lengths[b])) for b in range(case.batch)]


def _heads_major(case: Case, tensor: np.ndarray, batch: int, start: int, length: int) -> np.ndarray:
    """Return one entry of a BNSD/TND tensor as [N, length, D] (a view)."""
    if case.layout == "TND":
        return tensor[start : start + length].transpose(1, 0, 2)
    return tensor[batch, :, start : start + length]


def _fp32_sum_of_products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return a @ b accumulated as the kernel's fp32 sums are modelled: each exact sum (float64 holds every
    product of two fp16/bf16 values) rounded once to float32, the same on every machine and NumPy."""
    return np.matmul(a, b, dtype=np.float64).astype(np.float32)


@np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")
@blas.one_thread_each()  # small products: threads of BLAS only spin against other processes
def run_forward(case: Case, tensors: Mapping[str, np.ndarray], fault: str | None = None) -> dict[str, np.ndarray]:
    """Compute attentionOut and softmaxLse of a case as the forward kernel does, into NaN-filled buffers.

    Args:
        case: the case geometry and forward parameters (`inner_precise`, `softmax_lse_flag`).
        tensors: query, key, value (case dtype) and block_sparse_mask (int8 or uint8, nonzero = selected),
            keyed by the manifest's input names; other entries are ignored.
        fault: None, a name of `faults.FORWARD_FAULTS` (planted here), or any other fault (a backward's:
            the forward stays clean).

    Returns:
        {"out": case.q_shape in the case dtype, "lse": case.lse_shape_dims float32}: pre-filled with NaN and
        written only where the forward writes (lse only with softmax_lse_flag 1, and not with lse-not-written).
        Like the kernel it raises no floating-point warnings.
    """
    fault = fault if fault in FORWARD_FAULTS else None
    io_dtype = numpy_dtype(case.dtype)
    out = prefilled(case.q_shape, case.dtype)
    lse = prefilled(case.lse_shape_dims, "float32")
    lse_rows = lse.reshape(case.q_shape[:-1])  # a view: the trailing 1 (if any) dropped
    write_lse = case.softmax_lse_flag == 1 and fault != "lse-not-written"
    softmax = _Softmax(case.inner_precise, 1.0 if fault == "forward-no-scale" else case.kernel_scale)
    x, y = case.block_shape
    block_mask = np.asarray(tensors["block_sparse_mask"])
    fcase = forward_case(case)
    spans = {s.batch: s for s in fcase.spans()}
    group = case.num_heads // case.num_kv_heads
    site = fault_site(fcase, block_mask) if fault == "forward-tile-noise" else None
    # (batch, head, query block, first row) of the piece forward-tile-noise lands in: the middle written block
    noisy_piece = None if site is None else (site.span.batch, site.head, site.q_block, site.q_block * x)
    for batch, q_start, q_len, kv_start, kv_len in _entries(case):
        if q_len == 0 or kv_len == 0:
            continue
        selection = forward_selection(fcase, block_mask, spans[batch], fault)  # [N1, nQ, nKV] as the kernel reads it
        query = _heads_major(case, tensors["query"], batch, q_start, q_len)
        key, value = (_heads_major(case, tensors[name], batch, kv_start, kv_len) for name in ("key", "value"))
        out_entry = _heads_major(case, out, batch, q_start, q_len)
        lse_entry = _heads_major(case, lse_rows[..., None], batch, q_start, q_len)[..., 0]
        n_q = -(-q_len // x)
        for kv_head in range(case.num_kv_heads):
            key32, value32 = (to_dtype(kv[kv_head], io_dtype).astype(np.float32) for kv in (key, value))
            heads: Sequence[int] = range(kv_head * group, (kv_head + 1) * group)
            if fault == "forward-heads-interleaved":
                heads = [n for n in range(case.num_heads) if n % case.num_kv_heads == kv_head]
            for head in heads:
                for q_block in range(n_q):
                    blocks = np.flatnonzero(selection[head, q_block])
                    if blocks.size == 0:
                        continue  # never written: the NaN prefill stays
                    positions = (blocks[:, None] * y + np.arange(y)[None, :]).reshape(-1)
                    positions = positions[positions < kv_len]
                    for first in range(q_block * x, min((q_block + 1) * x, q_len), PIECE_ROWS):
                        rows = slice(first, min(first + PIECE_ROWS, (q_block + 1) * x, q_len))
                        query32 = to_dtype(query[head, rows], io_dtype).astype(np.float32)
                        out32, lse32 = _piece(query32, key32, value32, positions, softmax, io_dtype, fault)
                        if (batch, head, q_block, first) == noisy_piece:
                            out32 = _noisy_tile(case, query32, key32[positions], value32[positions], out32)
                        out_entry[head, rows] = to_dtype(out32, io_dtype, FORWARD_TIES)
                        if write_lse:
                            lse_entry[head, rows] = lse32 * np.float32(LOG2E) if fault == "forward-lse-base2" else lse32
    if fault == "forward-rows-swapped":
        plant_rows_swapped(fcase, fault_site(fcase, block_mask), out, lse_rows)
    return {"out": out, "lse": lse}


def _noisy_tile(case: Case, query: np.ndarray, keys: np.ndarray, values: np.ndarray, out32: np.ndarray) -> np.ndarray:
    """Return a piece's out with the error of its first 16 rows and middle 16 columns (against the float64
    forward of those rows) made 8x larger."""
    rows = min(16, out32.shape[0])
    col0 = (case.head_dim // 16 // 2) * 16
    scores = case.kernel_scale * (query[:rows].astype(np.float64) @ keys.astype(np.float64).T)
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    exact = (probs @ values.astype(np.float64))[:, col0 : col0 + 16] / probs.sum(axis=1, keepdims=True)
    rounded = to_dtype(out32[:rows, col0 : col0 + 16], numpy_dtype(case.dtype), FORWARD_TIES).astype(np.float64)
    noisy = out32.copy()
    noisy[:rows, col0 : col0 + 16] = exact + 8.0 * (rounded - exact)
    return noisy


def backward_tensors(
    tensors: Mapping[str, np.ndarray], forward_outputs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Return the chain's backward inputs: the case's dout, query, key, value and mask (in the manifest's dtype,
    as the backward takes it) with the forward's OWN out and lse as attention_out and softmax_lse (as they are:
    with softmax_lse_flag 0 the lse buffer still holds its NaN prefill, which the backward then reads)."""
    names = ("dout", "query", "key", "value", "block_sparse_mask")
    backward = {name: tensors[name] for name in names if name in tensors}
    backward["attention_out"] = forward_outputs["out"]
    backward["softmax_lse"] = forward_outputs["lse"]
    return backward
