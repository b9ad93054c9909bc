"""The built-in reference device: plays the NPU so the whole pipeline runs without hardware.

Its results are a *reference*, never device results. It follows the A2/A3 kernel's precision path
(docs/operator.md section 2) exactly, with its own tiling and summation order, distinct from
`golden.backward_kernel`:

* kv-block major, as a FlashAttention-2 style backward: for each kv head and each kv block it gathers
  the query rows (over all query heads of the GQA group and all query blocks) that select the block, in
  tiles of about 512 rows, and adds each tile's share to that block's dK and dV (the GQA group sum
  happens inside the products) and to the dQ of its rows, so dQ is summed one kv block at a time, in
  ascending block order. `golden.backward_kernel` instead goes query-block-row major and multiplies all
  selected kv blocks of a row at once: same precision path, different summation order.
* fp32 scores times the fp32 scale, `P32 = exp(S - lse)`, `P16 = cast(P32)`, `Dsum` from the given out in
  fp32, `dS = P32 * (dP - Dsum)` in fp32, `dS16 = cast(dS)`, `dV += P16^T dout`, `dQ += dS16 K`,
  `dK += dS16^T Q` in fp32 workspaces; dQ and dK are multiplied by the fp32 scale at the end, then all
  three are cast to the case dtype.
* Only the real rows and columns of a partial tail block take part; rows with no selected block are never
  touched (dq = 0) and neither is their lse, so any empty-row lse (inf, -inf, nan) is harmless; kv
  positions no query selects get dk = dv = 0.

`emulate(..., fault=NAME)` plants one of `FAULTS`, a realistic kernel bug the comparator must catch.
`check_interface` plays the aclnn parameter checks, and `emulate_case_dir` the binary contract of
docs/design.md (a case directory in, dq.bin/dk.bin/dv.bin and status.txt out).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import blas, interface
from .case import Case, SequenceSpan, numpy_dtype
from .errors import DataError
from .layout import kv_view, lse_view, mask_view, q_view
from .manifest import GRAD_NAMES, INPUT_NAMES, call_tensors, case_from_manifest, release_of
from .rounding import BACKWARD_TIES, round_float32, to_dtype
from .store import MANIFEST, array_bytes, check_output_dir, inside_parent, iter_entries, load_manifest, read_array
from .streams import seeded

__all__ = [
    "FAULTS",
    "STATUS_FILE",
    "applicable_faults",
    "check_interface",
    "emulate",
    "emulate_case_dir",
    "fault_applies",
    "fault_condition",
    "fault_not_applied",
    "reporting",
    "estimate_seconds",
]

STATUS_FILE = "status.txt"

FAULTS: dict[str, str] = {
    "drop-tail-block": "the partial last block of a sequence is skipped: the kv tail block when "
    "Skv % Y != 0, else the q tail block when Sq % X != 0 (applies when such a tail block is selected)",
    "no-gqa-sum": "dk/dv take only the first query head of each GQA group instead of the group sum "
    "(applies only with N1 > N2 and a selection in a non-first head of a group)",
    "dk-no-scale": "dK is not multiplied by scale at the end (applies when scale != 1)",
    "mask-transposed": "the block mask is read as [.., j, i] (out-of-range transposed indices read as "
    "unselected; applies when the mask is not symmetric)",
    "block-shift": "kv block j > 0 reads the selection of block j - 1 (applies when some row's selection "
    "changes along the kv blocks)",
    "lse-base2": "softmaxLse read as a base-2 log: P = exp2(S * log2(e) - lse)",
    "no-dsum": "Dsum omitted: dS = P * dP",
    "nan-row": "one row of dq (a selected query row) is NaN",
    "stale-output": "dq, dk, dv all zero, as if never written",
    "race-lost-update": "a race in the dK/dV accumulation: the first kv block that two or more pairs select "
    "loses one pair's partial, a lost update, in the runs whose order seed is odd (about half of `bsa run`'s "
    "runs) and always without a seed (applies when a kv block is selected by two or more query blocks or heads)",
    "scale-rounded": "scaleValue is held in the case dtype (float16/bfloat16) instead of float32: every score "
    "and dQ, dK are off by the same relative error, about 1e-4 for 1/sqrt(128), well inside one ULP "
    "(applies when the scale is not exact in the case dtype)",
    "tile-noise": "in one 16x16 tile of dq inside a selected region, each element's error against the "
    "float64 golden is made 5x larger (4x extra): a precision bug confined to one tile",
    "rows-swapped": "two dq rows are written to each other's places: the first two rows of the middle selected "
    "query block (or that block's one row and the row before it; applies when a query row has a neighbour)",
    "heads-interleaved": "query head n reads kv head n % N2 instead of n // (N1 / N2), and dK/dV sum the query "
    "heads mapped to them (applies with N1 > N2 > 1)",
    "dq-scaled-twice": "dQ is multiplied by scale twice at the end (applies when scale != 1)",
}
"""Planted faults: name -> what the faulty kernel does. Faults that change nothing where no block is
selected (all but nan-row) apply only to cases with at least one selected block; see `fault_applies`."""

REPEAT_FAULTS: dict[str, str] = {
    "deterministic-ignored": "deterministic mode is ignored: dK/dV are summed in a run-dependent order although "
    "the run asked for one fixed order, so repeats differ in their last bits (shows only with --deterministic "
    "--repeat N; applies when a kv block is selected by two or more query blocks or heads)",
}
"""Faults that leave every single run as clean as the reference and show only between repeated runs."""

ALL_FAULTS: dict[str, str] = {**FAULTS, **REPEAT_FAULTS}
"""Every fault `bsa emulate --fault` and `bsa run --fault` accept."""

_LOG2E = np.float32(math.log2(math.e))

REFERENCE_FLOPS_PER_SECOND = 25e9
"""Backward FLOPs per second of the reference device on the 2-core development machine (one BLAS thread),
as measured by `benchmarks/reference_estimate.py` (CPU seconds, best of two rounds, in process as `bsa run`
runs it): 14-33 GFLOP/s on MHA cases of 1k-16k tokens, the longest the slowest."""
REFERENCE_GQA_SPEEDUP = 1.6
"""How much faster per FLOP a GQA case runs (N1 > N2: 41-50 GFLOP/s measured, several query heads' rows
in each product against a kv block)."""
REFERENCE_SECONDS_PER_PAIR = 2e-5
"""Seconds per selected (query head, query block, kv block) pair beyond its FLOPs: the per-block NumPy calls."""
REFERENCE_SECONDS_PER_CASE = 0.02
"""Seconds per case beyond its blocks: the interface check, reading and checking the inputs, writing outputs."""


def estimate_seconds(flops_backward: float, pairs: int = 0, group: int = 1) -> float:
    """Return the reference device's estimated seconds for a case of `flops_backward` backward FLOPs over
    `pairs` selected block pairs with `group` query heads per kv head (N1 / N2), on the quiet 2-core
    development machine (another busy process can make it about twice as long)."""
    rate = REFERENCE_FLOPS_PER_SECOND * (REFERENCE_GQA_SPEEDUP if group > 1 else 1.0)
    return REFERENCE_SECONDS_PER_CASE + pairs * REFERENCE_SECONDS_PER_PAIR + flops_backward / rate


# ---- progress ---------------------------------------------------------------------------------------

_REPORTERS: list[Callable[[str, float], None]] = []
_REPORTERS_LOCK = threading.Lock()
PROGRESS_INTERVAL_S = 0.25
"""Least time between two progress calls of one case (the first and the last always come)."""


@contextmanager
def reporting(callback: Callable[[str, float], None]) -> Iterator[None]:
    """While the block runs, every `emulate` call (in any thread) calls `callback(case name, fraction done)`
    as its kv blocks are done (at most every PROGRESS_INTERVAL_S), so a long case shows its progress."""
    with _REPORTERS_LOCK:
        _REPORTERS.append(callback)
    try:
        yield
    finally:
        with _REPORTERS_LOCK:
            _REPORTERS.remove(callback)


class _Ticker:
    """Counts a case's selected (query head, query block, kv block) pairs as they are done."""

    def __init__(self, name: str, total: int) -> None:
        with _REPORTERS_LOCK:
            self.callbacks = list(_REPORTERS)
        self.name, self.total, self.done, self.last = name, max(total, 1), 0, 0.0

    def add(self, pairs: int) -> None:
        if not self.callbacks:
            return
        self.done += pairs
        now = time.monotonic()
        if now - self.last >= PROGRESS_INTERVAL_S or self.done >= self.total:
            self.last = now
            for callback in self.callbacks:
                callback(self.name, min(self.done / self.total, 1.0))


# ---- interface checks -----------------------------------------------------------------------------


def check_interface(
    params: Mapping[str, Any], tensors: Mapping[str, Mapping[str, Any]], release: str = interface.DEFAULT_RELEASE
) -> tuple[int, str]:
    """Check a call the way `release`'s aclnn and A2/A3 tiling do; return (status, message).

    The rules live in `interface` (shared with spec validation, so a negative case's expected status and
    the reference device's answer cannot drift apart): ops-transformer master's `ValidateParams`
    (161001 for a null mandatory tensor or blockShape, 161002 for dtypes, shapes, attenMask, maskType,
    tokens, TND without lengths, mixed BNSD/non-BNSD layouts, a bad blockShape), then the tiling's
    refusals (561002: a layout other than TND/BNSD, N1 % N2 != 0 or N1 < N2, no query token). The first
    broken rule decides. `tensors` is `manifest.call_tensors(manifest)`: what a harness would pass.

    Returns:
        (0, "") for a valid call, else the aclnn status and a message naming the bad value.
    """
    return interface.check(params, tensors, release)


def _kernel_scale(case: Case, fault: str | None) -> np.float32:
    """The scale the kernel multiplies by: the float32 scaleValue, or with `scale-rounded` the case dtype's."""
    scale = np.float32(case.kernel_scale)
    if fault == "scale-rounded":
        return np.float32(to_dtype(np.asarray(scale), numpy_dtype(case.dtype)))
    return scale


# ---- fault geometry -------------------------------------------------------------------------------


def _effective_mask(case: Case, block_mask: np.ndarray, span: SequenceSpan, fault: str | None) -> np.ndarray:
    """Return the [N1, nQ, nKV] bool mask of a batch entry as the (possibly faulty) kernel reads it."""
    mask = mask_view(case, block_mask, span)
    n_q, n_kv = mask.shape[1:]
    if fault == "mask-transposed":
        full = np.asarray(block_mask[span.batch]) != 0  # [N1, nQmax, nKVmax]
        read = np.zeros_like(mask)
        rows, cols = min(n_q, full.shape[2]), min(n_kv, full.shape[1])
        read[:, :rows, :cols] = full[:, :cols, :rows].transpose(0, 2, 1)
        return read
    if fault == "block-shift":
        read = mask.copy()
        read[:, :, 1:] = mask[:, :, :-1]
        return read
    if fault == "drop-tail-block":
        x, y = case.block_shape
        read = mask.copy()
        if span.kv_len % y and n_kv:
            read[:, :, -1] = False
        elif span.q_len % x and n_q:
            read[:, -1, :] = False
        return read
    return mask


def fault_applies(name: str, case: Case, block_mask: np.ndarray | None = None) -> bool:
    """Say whether fault `name` changes the outputs of `case`.

    With `block_mask` (the full [B, N1, nQ, nKV] input) the answer is exact up to coincidences of the
    data (a zero dout, an lse of exactly 0); without it, only the geometry decides and faults that depend
    on the mask pattern are assumed to apply.
    """
    if name not in ALL_FAULTS:
        raise ValueError(f"unknown fault {name!r}: expected one of {', '.join(ALL_FAULTS)}")
    spans = [s for s in case.spans() if s.q_len and s.kv_len]
    if name in REPEAT_FAULTS:  # one fixed order is only visible where two pairs add into one kv block
        return any(_shared_blocks(case, block_mask, span) for span in spans) if block_mask is not None else bool(spans)
    if name == "nan-row":
        return math.prod(case.q_shape) > 0
    if name == "no-gqa-sum" and case.group_size <= 1:
        return False
    if name == "race-lost-update" and block_mask is not None:
        return any(_shared_blocks(case, block_mask, span) for span in spans)
    if name == "dk-no-scale" and case.kernel_scale == 1.0:
        return False
    if name == "dq-scaled-twice" and case.kernel_scale == 1.0:
        return False
    if name == "heads-interleaved" and not (case.group_size > 1 and case.num_kv_heads > 1):
        return False
    if name == "rows-swapped":
        if block_mask is None:
            return max((s.q_len for s in spans), default=0) >= 2
        site = _fault_site(case, block_mask)
        return site is not None and site.span.q_len >= 2
    if name == "scale-rounded" and _kernel_scale(case, name) == np.float32(case.kernel_scale):
        return False
    if name == "drop-tail-block" and not any(
        s.kv_len % case.block_shape[1] or s.q_len % case.block_shape[0] for s in spans
    ):
        return False
    if block_mask is None:
        return bool(spans)
    for span in spans:
        mask = mask_view(case, block_mask, span)
        if not mask.any():
            continue
        if name == "no-gqa-sum":
            group = case.group_size
            if mask.reshape(case.num_kv_heads, group, *mask.shape[1:])[:, 1:].any():
                return True
        elif name == "heads-interleaved":
            moved = [n for n in range(case.num_heads) if n % case.num_kv_heads != n // case.group_size]
            if mask[moved].any():
                return True
        elif name in ("drop-tail-block", "mask-transposed", "block-shift"):
            if not np.array_equal(mask, _effective_mask(case, block_mask, span, name)):
                return True
        else:
            return True
    return False


def fault_condition(name: str) -> str:
    """Return when fault `name` changes a case's outputs, in words ("applies when ...")."""
    if name == "drop-tail-block":
        return "applies when a partial tail block (Skv % Y != 0, or else Sq % X != 0) is selected"
    match = re.search(r"[(;] ?(applies [^)]*)\)", ALL_FAULTS[name])
    if match:
        return match.group(1)
    if name == "nan-row":
        return "applies to every case with a query row"
    return "applies when at least one block is selected"


def fault_not_applied(name: str, case: Case, block_mask: np.ndarray | None = None) -> str | None:
    """Return why fault `name` leaves the outputs of `case` as the clean reference's, or None if it applies.

    The sentence is meant for reports: a case that passes with a planted fault it could not carry must
    not read as a fault the comparator missed.

    Raises:
        ValueError: an unknown fault.
    """
    if fault_applies(name, case, block_mask):
        return None
    return (
        f"fault '{name}' does not apply to this case ({fault_condition(name)}): the reference device "
        "computed it without the fault"
    )


def _shared_blocks(case: Case, block_mask: np.ndarray, span: SequenceSpan) -> bool:
    """Say whether some kv block of a batch entry is selected by two or more (query head, query block) pairs."""
    mask = mask_view(case, block_mask, span)
    groups = mask.reshape(case.num_kv_heads, case.group_size * mask.shape[1], mask.shape[2])
    return bool((groups.sum(axis=1) >= 2).any())


def applicable_faults(case: Case, block_mask: np.ndarray | None = None) -> list[str]:
    """Return the names of the faults that change the outputs of `case` (see `fault_applies`)."""
    return [name for name in FAULTS if fault_applies(name, case, block_mask)]


# ---- the kernel path, one batch entry -------------------------------------------------------------


def _io32(tensor: np.ndarray, io_dtype: np.dtype) -> np.ndarray:
    """Return `tensor` rounded to the kernel's input dtype and upcast (exactly) to contiguous float32."""
    return np.ascontiguousarray(to_dtype(tensor, io_dtype).astype(np.float32))


@dataclass
class _Sequence:
    """One batch entry's inputs, flattened heads-major and upcast: rows of query-shaped tensors are
    indexed `head * q_len + position`."""

    query: np.ndarray  # [N1 * sq, D] float32
    dout: np.ndarray  # [N1 * sq, D] float32
    dsum: np.ndarray  # [N1 * sq] float32
    lse: np.ndarray  # [N1 * sq] float32
    key: np.ndarray  # [N2, skv, D] float32
    value: np.ndarray  # [N2, skv, D] float32
    q_len: int


def _load_sequence(case: Case, tensors: Mapping[str, np.ndarray], span: SequenceSpan) -> _Sequence:
    io_dtype = numpy_dtype(case.dtype)
    dim = case.head_dim
    dout = _io32(q_view(case, tensors["dout"], span), io_dtype).reshape(-1, dim)
    out = _io32(q_view(case, tensors["attention_out"], span), io_dtype).reshape(-1, dim)
    lse = np.ascontiguousarray(lse_view(case, np.asarray(tensors["softmax_lse"]), span), dtype=np.float32)
    return _Sequence(
        query=_io32(q_view(case, tensors["query"], span), io_dtype).reshape(-1, dim),
        dout=dout,
        dsum=(dout * out).sum(axis=1, dtype=np.float32),
        lse=lse.reshape(-1),
        key=_io32(kv_view(case, tensors["key"], span), io_dtype),
        value=_io32(kv_view(case, tensors["value"], span), io_dtype),
        q_len=span.q_len,
    )


_CHUNK_ROWS = 512
"""Query rows per tile of the kv-block-major loop: dK and dV of a kv block are summed tile by tile."""


def _sequence_grads(
    seq: _Sequence,
    mask: np.ndarray,
    case: Case,
    fault: str | None,
    order: np.random.Generator | None,
    lost_update: list[bool],
    ticker: _Ticker | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return one batch entry's unscaled fp32 dq [N1*sq, D], dk and dv [N2, skv, D], kv-block major.

    For each kv head and kv block, the (query head, query block) pairs that select the block are taken
    in (head, block) order, in tiles of about `_CHUNK_ROWS` query rows; each tile adds its share to the
    dQ of its rows (a row has one owner: the same sums in the same order on every run) and computes
    each pair's dK and dV partial products. The partials are then added to the block's fp32 dK and dV
    one by one, as the kernel's atomic adds do: in (head, block) order, or in the order `order`
    permutes them into, which changes the last bits whenever three or more pairs meet in a block.
    `lost_update` (race-lost-update fault) holds one flag while a partial is still to be lost.
    """
    x, y = case.block_shape
    kv_heads, kv_len, _ = seq.key.shape
    group = mask.shape[0] // kv_heads
    dq = np.zeros_like(seq.query)
    dk = np.zeros_like(seq.key)
    dv = np.zeros_like(seq.value)
    block_rows = [np.arange(i * x, min((i + 1) * x, seq.q_len)) for i in range(mask.shape[1])]
    pairs_per_tile = max(1, _CHUNK_ROWS // x)
    for kv_head in range(kv_heads):
        group_mask = mask[kv_head * group : (kv_head + 1) * group]  # [G, nQ, nKV]
        for block in range(mask.shape[2]):
            members, q_blocks = np.nonzero(group_mask[:, :, block])
            cols = slice(block * y, min((block + 1) * y, kv_len))
            partials: list[tuple[np.ndarray, np.ndarray]] = []
            for first in range(0, members.size, pairs_per_tile):
                tile = slice(first, first + pairs_per_tile)
                rows = [
                    (kv_head * group + m) * seq.q_len + block_rows[i]
                    for m, i in zip(members[tile], q_blocks[tile], strict=True)
                ]
                # no-gqa-sum: only the first query head of the group reaches dK and dV.
                in_sum = members[tile] == 0 if fault == "no-gqa-sum" else np.ones(len(rows), dtype=bool)
                partials += _tile_grads(seq, rows, in_sum, kv_head, cols, case, fault, dq)
            if ticker is not None:
                ticker.add(int(members.size))
            sequence = list(range(len(partials)) if order is None else order.permutation(len(partials)))
            if fault == "race-lost-update" and lost_update and len(sequence) >= 2:
                lost_update.pop()
                sequence.pop()  # the last add of this block never lands
            for index in sequence:
                dk_part, dv_part = partials[index]
                dk[kv_head, cols] += dk_part
                dv[kv_head, cols] += dv_part
    return dq, dk, dv


def _tile_grads(
    seq: _Sequence,
    pair_rows: list[np.ndarray],
    in_sum: np.ndarray,
    kv_head: int,
    cols: slice,
    case: Case,
    fault: str | None,
    dq: np.ndarray,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Add one tile (the query rows of some pairs against kv block `cols` of `kv_head`) to dq in place.

    Returns the (dK, dV) partial product of every pair whose rows `in_sum` marks, in pair order.
    """
    io_dtype = numpy_dtype(case.dtype)
    rows = np.concatenate(pair_rows)
    key = seq.key[kv_head, cols]
    value = seq.value[kv_head, cols]
    query = seq.query[rows]
    dout = seq.dout[rows]
    probs = query @ key.T
    probs *= _kernel_scale(case, fault)
    if fault == "lse-base2":
        probs *= _LOG2E
        probs -= seq.lse[rows, None]
        np.exp2(probs, out=probs)
    else:
        probs -= seq.lse[rows, None]
        np.exp(probs, out=probs)
    dscores = dout @ value.T
    if fault != "no-dsum":
        dscores -= seq.dsum[rows, None]
    dscores *= probs
    dscores_io = round_float32(dscores, io_dtype, BACKWARD_TIES)
    probs_io = round_float32(probs, io_dtype, BACKWARD_TIES)
    dq[rows] += dscores_io @ key  # rows are distinct within one kv block
    partials = []
    start = 0
    for pair, counted in zip(pair_rows, in_sum, strict=True):
        part = slice(start, start + len(pair))
        start += len(pair)
        if counted:
            partials.append((dscores_io[part].T @ query[part], probs_io[part].T @ dout[part]))
    return partials


# ---- whole case -----------------------------------------------------------------------------------


@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def emulate(
    case: Case, tensors: Mapping[str, np.ndarray], fault: str | None = None, order_seed: int | None = None
) -> dict[str, np.ndarray]:
    """Compute dq, dk, dv of a case the way the kernel does, in the case dtype, optionally with a fault.

    Args:
        case: the case geometry (`manifest.case_from_manifest` gives it for a case directory).
        tensors: query, key, value, dout, attention_out (case dtype), softmax_lse (float32, with or without
            the trailing 1) and block_sparse_mask (nonzero = selected), keyed by the manifest input names.
        fault: None for the clean reference, or a name from `FAULTS`.
        order_seed: None adds each kv block's dK/dV partials in (head, query block) order; a seed
            shuffles that order as a device's atomic adds do, differently for every seed (dq is the
            same for every seed, bit for bit).

    Returns:
        {"dq", "dk", "dv"} of the shapes of query and key, in the case dtype. Padding stays 0. Like the
        kernel it raises no floating-point warnings: an inf or NaN (a selected row with an infinite lse, a
        fault) just appears in the outputs, for the comparator to find.
    """
    if fault is not None and fault not in ALL_FAULTS:
        raise ValueError(f"unknown fault {fault!r}: expected one of {', '.join(ALL_FAULTS)}")
    if fault == "heads-interleaved":
        return _emulate_interleaved(case, tensors, order_seed)
    io_dtype = numpy_dtype(case.dtype)
    block_mask = np.asarray(tensors["block_sparse_mask"])
    order = None if order_seed is None else seeded(order_seed)
    strikes = fault == "race-lost-update" and (order_seed is None or order_seed % 2 == 1)
    lost_update = [True] if strikes else []
    dq = np.zeros(case.q_shape, dtype=np.float32)
    dk = np.zeros(case.kv_shape, dtype=np.float32)
    dv = np.zeros(case.kv_shape, dtype=np.float32)
    spans = [span for span in case.spans() if span.q_len and span.kv_len]
    masks = {span.batch: _effective_mask(case, block_mask, span, fault) for span in spans}
    ticker = _Ticker(case.name, sum(int(np.count_nonzero(m)) for m in masks.values())) if _REPORTERS else None
    for span in spans:
        seq = _load_sequence(case, tensors, span)
        mask = masks[span.batch]
        dq_seq, dk_seq, dv_seq = _sequence_grads(seq, mask, case, fault, order, lost_update, ticker)
        q_view(case, dq, span)[...] = dq_seq.reshape(case.num_heads, span.q_len, case.head_dim)
        kv_view(case, dk, span)[...] = dk_seq
        kv_view(case, dv, span)[...] = dv_seq
    scale32 = _kernel_scale(case, fault)
    dq *= scale32
    if fault != "dk-no-scale":
        dk *= scale32
    if fault == "dq-scaled-twice":
        dq *= scale32
    grads = {name: to_dtype(grad, io_dtype, BACKWARD_TIES) for name, grad in (("dq", dq), ("dk", dk), ("dv", dv))}
    if fault == "stale-output":
        return {name: np.zeros_like(grad) for name, grad in grads.items()}
    if fault in ("nan-row", "tile-noise", "rows-swapped"):
        site = _fault_site(case, block_mask)
        if fault == "rows-swapped":
            _plant_rows_swapped(case, grads["dq"], site)
        elif fault == "nan-row":
            _plant_nan_row(case, grads["dq"], site)
        elif site is not None:
            _plant_tile_noise(case, tensors, block_mask, grads["dq"], site)
    return grads


@dataclass(frozen=True)
class _Site:
    """Where a row-level fault lands: batch entry, query head, query block."""

    span: SequenceSpan
    head: int
    q_block: int


def _fault_site(case: Case, block_mask: np.ndarray) -> _Site | None:
    """Return the middle (head, query block) with a selected kv block, in (span, head, block) order."""
    sites: list[_Site] = []
    for span in case.spans():
        if span.q_len == 0 or span.kv_len == 0:
            continue
        heads, blocks = np.nonzero(mask_view(case, block_mask, span).any(axis=2))
        sites.extend(_Site(span, int(h), int(i)) for h, i in zip(heads, blocks, strict=True))
    return sites[len(sites) // 2] if sites else None


def _plant_nan_row(case: Case, dq: np.ndarray, site: _Site | None) -> None:
    """Write NaN into the first row of the site's query block (the first dq row without a site)."""
    if site is None:
        if dq.size:
            dq.reshape(-1, case.head_dim)[0] = np.nan
    else:
        q_view(case, dq, site.span)[site.head, site.q_block * case.block_shape[0]] = np.nan


_Q_SIDE = ("query", "dout", "attention_out", "softmax_lse", "block_sparse_mask")
"""The inputs with a query-head axis (axis 1 in BNSD [B, N1, ...], TND [T, N1, ...] and the mask)."""


def _emulate_interleaved(case: Case, tensors: Mapping[str, np.ndarray], order_seed: int | None) -> dict[str,
        np.ndarray]:
    """The heads-interleaved fault: query head n reads kv head n % N2. Planted by ordering the query heads
    so that the kernel's n // G mapping meets that kv head, then putting dq's heads back in place."""
    kv_heads = case.num_kv_heads
    order = np.array(sorted(range(case.num_heads), key=lambda n: (n % kv_heads, n)))
    moved = {name: np.take(np.asarray(tensors[name]), order, axis=1) if name in _Q_SIDE else tensors[name]
             for name in tensors}  # fmt: skip
    grads = emulate(case, moved, None, order_seed)
    dq = np.empty_like(grads["dq"])
    dq[:, order] = grads["dq"]
    return {**grads, "dq": dq}


def _plant_rows_swapped(case: Case, dq: np.ndarray, site: _Site | None) -> None:
    """Swap the first two rows of the site's query block (its one row and the row before it when it has one)."""
    if site is None:
        return
    first = site.q_block * case.block_shape[0]
    rows = q_view(case, dq, site.span)[site.head]
    a, b = (first, first + 1) if first + 1 < site.span.q_len else (first - 1, first)
    if a < 0:
        return
    rows[[a, b]] = rows[[b, a]]


def _plant_tile_noise(
    case: Case, tensors: Mapping[str, np.ndarray], block_mask: np.ndarray, dq: np.ndarray, site: _Site
) -> None:
    """Scale the error of one 16x16 dq tile at `site` (against a float64 golden of those rows) by 5."""
    x, y = case.block_shape
    span, head = site.span, site.head
    first = site.q_block * x
    rows = slice(first, min(first + 16, span.q_len))
    col0 = (case.head_dim // 16 // 2) * 16
    cols = slice(col0, min(col0 + 16, case.head_dim))
    kv_head = head // case.group_size
    selected = np.flatnonzero(mask_view(case, block_mask, span)[head, site.q_block])
    kv_pos = np.concatenate([np.arange(int(j) * y, min((int(j) + 1) * y, span.kv_len)) for j in selected])
    key = kv_view(case, tensors["key"], span)[kv_head, kv_pos].astype(np.float64)
    value = kv_view(case, tensors["value"], span)[kv_head, kv_pos].astype(np.float64)
    query = q_view(case, tensors["query"], span)[head, rows].astype(np.float64)
    dout = q_view(case, tensors["dout"], span)[head, rows].astype(np.float64)
    out = q_view(case, tensors["attention_out"], span)[head, rows].astype(np.float64)
    lse = lse_view(case, np.asarray(tensors["softmax_lse"]), span)[head, rows].astype(np.float64)
    probs = np.exp(case.kernel_scale * (query @ key.T) - lse[:, None])
    dscores = probs * (dout @ value.T - (dout * out).sum(axis=1, keepdims=True))
    golden = case.kernel_scale * (dscores @ key)[:, cols]
    tile = q_view(case, dq, span)[head, rows, cols]
    error = tile.astype(np.float64) - golden
    tile[...] = to_dtype(golden + 5.0 * error, dq.dtype)


# ---- the binary contract ----------------------------------------------------------------------------


def _write_atomic(path: Path, data: bytes) -> None:
    """Write bytes through a temporary file in the same directory and an atomic rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _case_of(case_dir: Path, manifest: Mapping[str, Any]) -> Case:
    """Rebuild a case from its manifest and check that its inputs and outputs have the case's shapes.

    Raises:
        DataError: the params cannot describe a case, or an entry's shape differs from what they give.
    """
    where = str(Path(case_dir) / MANIFEST)
    try:
        case = case_from_manifest(manifest)
        shapes = {"query": case.q_shape, "dout": case.q_shape, "attention_out": case.q_shape,
                  "key": case.kv_shape, "value": case.kv_shape, "block_sparse_mask": case.mask_shape,
                  "dq": case.q_shape, "dk": case.kv_shape, "dv": case.kv_shape}  # fmt: skip
        lse_shapes = (tuple(case.lse_shape_dims), tuple(case.q_shape[:-1]))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise DataError(where, f"params do not describe a case ({type(exc).__name__}: {exc})") from None
    for section, names in (("inputs", (*INPUT_NAMES,)), ("outputs", GRAD_NAMES)):
        entries = manifest.get(section) or {}
        for name in names:
            if name not in entries:
                raise DataError(where, f"{section}: no entry for {name}")
            shape = tuple(entries[name]["shape"])
            wanted = lse_shapes if name == "softmax_lse" else (tuple(shapes[name]),)
            if shape not in wanted:
                raise DataError(where, f"{section}.{name}.shape {list(shape)} differs from the case's "
                                f"{list(wanted[0])}")  # fmt: skip
    return case


def emulate_case_dir(
    case_dir: Path, output_dir: Path, fault: str | None = None, order_seed: int | None = None
) -> int:
    """Act as the device binary on one case directory; return the aclnn status written to status.txt.

    Checks the interface first: a rejected call writes only status.txt (status, message). A valid call
    reads and verifies the inputs, emulates (every BLAS call on one thread: its products are of a few
    blocks, which BLAS threads do not speed up, and on a shared machine they spin against other
    processes, several times slower; the results are the same), writes dq.bin, dk.bin, dv.bin as the
    manifest's `outputs` say, then status.txt "0". Old status and gradient files are removed first and
    every file is written atomically, so an interrupted run never leaves a result that looks complete.

    Raises:
        DataError: the manifest or an input file is missing, malformed or stale.
    """
    case_dir, output_dir = Path(case_dir), Path(output_dir)
    manifest = load_manifest(case_dir)
    check_output_dir(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    outputs = manifest.get("outputs") or {}
    paths = {name: inside_parent(output_dir, outputs[name]["file"]) for name in GRAD_NAMES if outputs.get(name)}
    for path in [output_dir / STATUS_FILE, *paths.values()]:
        if path.is_symlink() or path.is_file():
            path.unlink()
    status, message = check_interface(manifest["params"], call_tensors(manifest), release_of(manifest))
    if status != 0:
        _write_atomic(output_dir / STATUS_FILE, f"{status}\n{message}\n".encode())
        return status
    case = _case_of(case_dir, manifest)
    tensors = {name: read_array(case_dir, entry) for name, entry in iter_entries(manifest, "inputs")}
    with blas.one_thread_each():  # small products: threads of BLAS only spin against other processes
        grads = emulate(case, tensors, fault, order_seed)
    for name in GRAD_NAMES:
        entry = outputs[name]
        grad = grads[name]
        expected = numpy_dtype(entry["dtype"])
        if grad.dtype != expected or list(grad.shape) != list(entry["shape"]):
            wanted = f"{expected} {entry['shape']}"
            raise DataError(str(case_dir / MANIFEST), f"outputs.{name}: the case gives {grad.dtype} "
                            f"{list(grad.shape)}, the entry says {wanted}")  # fmt: skip
        path = paths[name]
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, array_bytes(grad))
    _write_atomic(output_dir / STATUS_FILE, b"0\n")
    return 0
