"""The forward operator's numbers: the rows it writes, its kernel-faithful benchmark, and the golden of the pair.

* `written_rows`: the query rows aclnnBlockSparseAttention writes (out and lse): rows within the batch
  entry's actual query length whose block row selects at least one kv block within its kv length. BNSD
  actual lengths are always honoured here: the forward skips padding rows whatever `case.bnsd_lengths`
  says about the backward (the chain's pitfall "padding-rows-read" is exactly that difference).
* `forward_kernel`: the A2/A3 forward's precision path (docs/operator.md, "The forward's precision path"):
  per query row the selected kv blocks concatenated (real columns only), cut into stacks of at most
  `STACK_COLUMNS` columns, online softmax over the stacks (running max, rescale by exp(m_old - m_new)),
  P rounded ties-to-even to the case dtype before P V, fp32 accumulation, O / l in fp32, out rounded ties
  to even, lse = ln(l) + m in fp32; `case.inner_precise == 1`: the fp16 path (`_Fp16Softmax`).
* `forward_golden_and_benchmark`: what `bsa gen` writes for a forward folder: the float64 forward of
  `compute.forward` (bit for bit) in the gen precision, and `forward_kernel`.
* `chain_golden_and_benchmark`: the same for a chain folder: the golden is the exact gradient of the
  exact forward (the golden backward on the unrounded float64 out and lse), the benchmark is
  `forward_kernel` followed by `compute.backward_kernel` on its out and lse.

Rows the forward does not write hold out 0 and lse `case.empty_row_lse` in every array here (never judged).
Each (batch entry, kv head) is one walk of `walk`, as in `compute`, so `jobs` threads give the same bits. Every
BLAS call here runs on one thread (`walk._run` holds `blas.one_thread_each`): on a shared machine BLAS threads on
128-row products spin against other processes (a causal 4k-token case: 46 s with two BLAS threads, 3.4 s with one).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.typing import DTypeLike

from ..core.case import Case, SequenceSpan
from ..core.layout import lse_view, mask_view, q_view
from ..core.rounding import FLOAT16, FORWARD_TIES, round_float32, to_dtype
from .compute import _case_walks, _check_precision, _forward_arrays, _lanes, backward, backward_kernel, forward
from .numerics import _Scratch, _to_io_fp32
from .paths import _Entry, _KernelInputs, _Path
from .walk import _run

#: Most kv columns (of a row's concatenated selected blocks) one online-softmax step of the forward takes.
STACK_COLUMNS = 512


def forward_case(case: Case) -> Case:
    """Return `case` as the forward sees it: BNSD actual lengths honoured (the forward skips padding rows)."""
    if case.layout == "TND" or case.bnsd_lengths == "honored":
        return case
    return dataclasses.replace(case, bnsd_lengths="honored")


def written_rows(case: Case, block_mask: np.ndarray) -> np.ndarray:
    """Return which query rows the forward writes, bool of shape `case.q_shape[:-1]`.

    Row (b, n1, s) is written iff s < q_len[b] and head n1's block row s // X selects at least one kv block
    j < ceil(kv_len[b] / Y) (so never when kv_len[b] == 0); BNSD actual lengths are honoured (`forward_case`).
    """
    case = forward_case(case)
    rows = np.zeros(case.q_shape[:-1], dtype=bool)
    x = case.block_shape[0]
    for span in case.spans():
        if span.q_len == 0 or span.kv_len == 0:
            continue
        selects = mask_view(case, block_mask, span).any(axis=2)  # [N1, nQ]
        lse_view(case, rows, span)[...] = np.repeat(selects, x, axis=1)[:, : span.q_len]
    return rows


# ---- the kernel's path ------------------------------------------------------------------------------


class _Fp32Softmax:
    """innerPrecise 0: scores, maxima, exponentials, sums and rescale factors all in fp32."""

    def __init__(self, scale: float) -> None:
        self.scale = np.float32(scale)

    def held(self, values: np.ndarray) -> np.ndarray:
        """Return float32 `values` as the softmax holds them (in place): fp32 as they are."""
        return values

    def scores(self, products: np.ndarray) -> np.ndarray:
        products = self.held(products)
        products *= self.scale  # fp16: exact in fp32 (two 11-bit significands), then rounded: the fp16 product
        return self.held(products)

    def exp(self, values: np.ndarray) -> np.ndarray:
        return self.held(np.exp(values, out=values))

    def lse(self, row_sum: np.ndarray, row_max: np.ndarray) -> np.ndarray:
        logs = self.held(np.log(row_sum))
        logs += row_max
        return self.held(logs)


class _Fp16Softmax(_Fp32Softmax):
    """innerPrecise 1: the scale cast to fp16; scores, softmax and rescale held in fp16, lse in fp16.

    Each fp16 operation is the exact fp32 result rounded to fp16 (ties to even): S16 = fp16(fp16(S) *
    scale16), S16 - m and exp of it rounded, the row sum (fp32 over fp16 P) held in fp16, the rescale factor
    exp(fp16(m_old - m_new)) in fp16, l = fp16(l * factor + sum), lse = fp16(fp16(ln l) + m), then float32.
    The accumulator of P V stays fp32 (the matrix unit's), rescaled by the fp16 factor.
    """

    def __init__(self, scale: float) -> None:
        self.scale = np.float32(to_dtype(np.asarray(np.float32(scale)), FLOAT16))

    def held(self, values: np.ndarray) -> np.ndarray:
        """Round float32 `values` to float16 in place (ties to even), still float32: a value held in fp16."""
        return round_float32(values, FLOAT16, FORWARD_TIES, out=values)


def online_softmax_rows(
    query: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    scale: float,
    inner_precise: int,
    io_dtype: DTypeLike,
    stack: int = STACK_COLUMNS,
) -> tuple[np.ndarray, np.ndarray]:
    """Return out (io dtype) and lse (float32) of query rows against their concatenated selected columns.

    Args:
        query: [rows, D] float32 (values of the io dtype); keys, values: [cols, D] float32, real columns only.
        stack: columns per online-softmax step (the kernel's 512; tests pass others to show it matters).
    """
    softmax = _Fp16Softmax(scale) if inner_precise == 1 else _Fp32Softmax(scale)
    io_dtype = np.dtype(io_dtype)
    scores = softmax.scores(_fp32_product(query, keys.T))
    width = scores.shape[1]
    row_max = row_sum = accumulator = np.empty(0, dtype=np.float32)
    for first in range(0, width, stack):
        part = scores[:, first : first + stack]
        stack_max = part.max(axis=1)
        new_max = stack_max if first == 0 else np.maximum(row_max, stack_max)
        probs = softmax.exp(softmax.held(part - new_max[:, None]))
        part_sum = probs.sum(axis=1, dtype=np.float64).astype(np.float32)
        products = _fp32_product(round_float32(probs, io_dtype, FORWARD_TIES), values[first : first + stack])
        if first == 0:
            row_sum, accumulator = softmax.held(part_sum), products
        else:
            factor = softmax.exp(softmax.held(row_max - new_max))  # the rescale of what the earlier stacks added
            row_sum = softmax.held(row_sum * factor + part_sum)
            accumulator *= factor[:, None]
            accumulator += products
        row_max = new_max
    out = to_dtype(accumulator / row_sum[:, None], io_dtype, FORWARD_TIES)
    return out, softmax.lse(row_sum, row_max).astype(np.float32)


def _fp32_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return a @ b as an fp32 accumulation: the exact sum (float64: the terms are products of fp16/bf16
    values) rounded once to float32.

    A float32 BLAS would add in an order of its build's choosing, so the forward's out could move by an ULP
    with the NumPy wheel, and the chain's benchmark backward, fed that out, by many more. One rounding of
    the float64 sum gives the same float32 on every machine (but where a sum lies within float64's rounding
    of a float32 tie), so the benchmark's bytes depend on the spec alone.
    """
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


class _ForwardKernel(_KernelInputs):
    """The forward kernel's path over one kv head: out (io dtype) and lse (float32) rows of the tile."""

    def __init__(self, entry: _Entry, out: np.ndarray, lse: np.ndarray, inner_precise: int, stack: int) -> None:
        super().__init__(entry, out, lse)
        self.io_dtype = out.dtype
        self.inner_precise, self.stack = inner_precise, stack

    def tile(
        self, head: int, rows: slice, selected: np.ndarray, keys: np.ndarray, values: np.ndarray, scratch: _Scratch
    ) -> None:
        e = self.entry
        width = keys.shape[0] - (e.tail_pad if selected[-1] == e.mask.shape[2] - 1 else 0)
        query = _to_io_fp32(e.query[head, rows], self.io_dtype)
        out, lse = online_softmax_rows(
            query, keys[:width], values[:width], e.scale, self.inner_precise, self.io_dtype, self.stack
        )
        self.out[head, rows], self.lse[head, rows] = out, lse


@np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")
def forward_kernel(
    case: Case,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    jobs: int = 1,
    stack: int = STACK_COLUMNS,
) -> tuple[np.ndarray, np.ndarray]:
    """Compute a case's attentionOut and softmaxLse on the forward kernel's precision path (module docstring).

    Args:
        query, key, value: the case's tensors (case dtype, or any float dtype: rounded to it first).
        block_mask: [B, N1, nQ, nKV], nonzero = selected (int8 or uint8, the same bytes).
        jobs: walks (batch entry, kv head) in up to this many threads, with the same bits.
        stack: columns per online-softmax step; only tests change it.

    Returns:
        out of shape `case.q_shape` in the case dtype and lse of shape `case.q_shape[:-1]` in float32; rows
        the forward does not write (`written_rows`) hold 0 and `case.empty_row_lse`.
    """
    fcase = forward_case(case)
    out, lse = _forward_arrays(case, rounded=True)

    def path(span: SequenceSpan, entry: _Entry) -> _Path:
        return _ForwardKernel(entry, q_view(fcase, out, span), lse_view(fcase, lse, span), case.inner_precise, stack)

    _run(_case_walks(fcase, (None, query, key, value, block_mask), path), _lanes(fcase, block_mask, jobs))
    return out, lse


# ---- golden and benchmark -----------------------------------------------------------------------------


def _in_precision(array: np.ndarray, precision: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore"):
        return array.astype(precision, copy=False)


def forward_golden_and_benchmark(
    case: Case,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    precision: DTypeLike = np.float32,
    jobs: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compute what `bsa gen` writes for a forward folder.

    Returns:
        golden out and lse (the float64 forward in `precision`, float32 or float64), benchmark out (case
        dtype) and lse (float32) of `forward_kernel`; lse arrays have shape `case.q_shape[:-1]`.
    """
    precision = _check_precision(precision)
    out64, lse64 = forward(forward_case(case), query, key, value, block_mask, jobs)
    bench_out, bench_lse = forward_kernel(case, query, key, value, block_mask, jobs)
    return _in_precision(out64, precision), _in_precision(lse64, precision), bench_out, bench_lse


def chain_golden_and_benchmark(
    case: Case,
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    block_mask: np.ndarray,
    precision: DTypeLike = np.float32,
    jobs: int = 1,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Compute what `bsa gen` writes for a chain (or autograd) folder: golden and benchmark out, lse, dq, dk, dv.

    The golden is the exact gradient of the exact forward: `compute.backward` in `precision` on the float64
    out and lse, unrounded. The benchmark is the pair as the kernels compute it: `forward_kernel`, then
    `compute.backward_kernel` on its out (case dtype) and lse (float32). Both backwards see the forward's case
    (`forward_case`: BNSD lengths honoured), whatever the case says of the backward alone: the pair is
    judged against what a correct pair computes (a backward that reads the forward's unwritten padding rows
    fails: "padding-rows-read"). The benchmark's backward reads the lse it computed even when
    softmax_lse_flag is 0 (a correct pair's numbers, not what an unwritten buffer holds).

    Returns:
        (golden, benchmark): dicts with out, lse ([q_shape[:-1]]), dq, dk, dv; the golden's in `precision`,
        the benchmark's in the case dtype (lse float32).
    """
    precision = _check_precision(precision)
    fcase = forward_case(case)
    out64, lse64 = forward(fcase, query, key, value, block_mask, jobs)
    gold = backward(fcase, dout, query, key, value, out64, lse64, block_mask, precision)
    bench_out, bench_lse = forward_kernel(case, query, key, value, block_mask, jobs)
    bench = backward_kernel(fcase, dout, query, key, value, bench_out, bench_lse, block_mask)
    names = ("out", "lse", "dq", "dk", "dv")
    gold_arrays = (_in_precision(out64, precision), _in_precision(lse64, precision), *gold)
    return dict(zip(names, gold_arrays, strict=True)), dict(zip(names, (bench_out, bench_lse, *bench), strict=True))
