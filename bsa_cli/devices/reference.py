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
docs/design.md (a case directory in, dq.bin/dk.bin/dv.bin and status.txt out; other ops: `reference_ops`).
"""

from __future__ import annotations

import math
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..core import blas
from ..core.case import Case, SequenceSpan, numpy_dtype
from ..core.errors import BsaError, suggest
from ..core.layout import kv_view, lse_view, q_view
from ..core.rounding import BACKWARD_TIES, round_float32, to_dtype
from ..core.streams import seeded
from ..ops import interface
from ..store import MANIFEST, load_manifest, read_array
from ..store.manifest import Manifest
from . import faults, software
from .base import Attempt, DeviceKind, Execution, RunConfigError, RunOrder, fresh_outputs, write_status
from .binary import ChildExit
from .reference_ops import Emulated, Unsupported, case_of, emulate_op, unsupported, write_outputs

#: How the built-in reference device is named in records and output: never presented as device results.
REFERENCE_DEVICE = "reference (bsa emulate)"

_LOG2E = np.float32(math.log2(math.e))

#: Backward FLOPs per second of the reference device on the 2-core development machine (one BLAS thread),
#: as measured by `benchmarks/reference_estimate.py` (CPU seconds, best of two rounds, in process as `bsa run`
#: runs it): 14-33 GFLOP/s on MHA cases of 1k-16k tokens, the longest the slowest.
REFERENCE_FLOPS_PER_SECOND = 25e9
#: How much faster per FLOP a GQA case runs (N1 > N2: 41-50 GFLOP/s measured, several query heads' rows
#: in each product against a kv block).
REFERENCE_GQA_SPEEDUP = 1.6
#: Seconds per selected (query head, query block, kv block) pair beyond its FLOPs: the per-block NumPy calls.
REFERENCE_SECONDS_PER_PAIR = 2e-5
#: Seconds per case beyond its blocks: the interface check, reading and checking the inputs, writing outputs.
REFERENCE_SECONDS_PER_CASE = 0.02


def estimate_seconds(flops_backward: float, pairs: int = 0, group: int = 1) -> float:
    """Return the reference device's estimated seconds for a case of `flops_backward` backward FLOPs over
    `pairs` selected block pairs with `group` query heads per kv head (N1 / N2), on the quiet 2-core
    development machine (another busy process can make it about twice as long)."""
    rate = REFERENCE_FLOPS_PER_SECOND * (REFERENCE_GQA_SPEEDUP if group > 1 else 1.0)
    return REFERENCE_SECONDS_PER_CASE + pairs * REFERENCE_SECONDS_PER_PAIR + flops_backward / rate


#: Resident memory of a `bsa run` process on the reference device before it holds any case (interpreter,
#: NumPy, bsa), as `schedule.BASE_MEMORY` is gen's.
REFERENCE_BASE_MEMORY = 64 << 20


def estimate_peak_memory(case: Case, input_bytes: int) -> int:
    """Return the reference device's estimated peak memory in bytes for `case`, from what `emulate` holds at
    once: the inputs as read (`input_bytes`, gen's estimate), the float32 dq/dk/dv, one sequence's float32
    query/dout/key/value with its own float32 gradients, one kv block's dK and dV partials (every query block of
    the group: a dense row), one tile's products, the sequence's attention_out in float32 (for dsum), the
    rounding of the largest gradient to the case dtype (two float32 temporaries) and the outputs in the case
    dtype. Measured (`/usr/bin/time` max RSS of `bsa run` on one case, 2-core development machine): 0.35 GiB
    for nightly-random-8k.fp16 (estimate 0.35), 0.53 for nightly-tail-varlen (0.49), 0.57 for
    nightly-window-32k (0.66): within 16%, an upper bound where few query blocks select a kv block."""
    itemsize = numpy_dtype(case.dtype).itemsize
    grads = math.prod(case.q_shape) + 2 * math.prod(case.kv_shape)
    spans = [span for span in case.spans() if span.q_len and span.kv_len] or [case.spans()[0]]
    q_len, kv_len = max(s.q_len for s in spans), max(s.kv_len for s in spans)
    x, y = case.mask_block_shape
    group = case.num_heads // max(case.num_kv_heads, 1)
    sequence = 2 * (2 * case.num_heads * q_len + 2 * case.num_kv_heads * kv_len) * case.head_dim * 4
    partials = group * math.ceil(q_len / x) * 2 * y * case.head_dim * 4
    tile = 4 * _CHUNK_ROWS * max(y, case.head_dim) * 4  # scores, probs, their rounded copies
    out32 = case.num_heads * q_len * case.head_dim * 4
    rounding = 2 * max(math.prod(case.q_shape), math.prod(case.kv_shape)) * 4
    return REFERENCE_BASE_MEMORY + input_bytes + grads * (4 + itemsize) + sequence + partials + tile + out32 + rounding


# ---- progress ---------------------------------------------------------------------------------------

_REPORTERS: list[Callable[[str, float], None]] = []
_REPORTERS_LOCK = threading.Lock()
#: Least time between two progress calls of one case (the first and the last always come).
PROGRESS_INTERVAL_S = 0.25


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
    broken rule decides. `tensors` is `Manifest.call_tensors()`: what a harness would pass.

    Returns:
        (0, "") for a valid call, else the aclnn status and a message naming the bad value.
    """
    return interface.check(params, tensors, release)


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
    batch: int


def _load_sequence(case: Case, tensors: Mapping[str, np.ndarray], span: SequenceSpan) -> _Sequence:
    io_dtype = numpy_dtype(case.dtype)
    query, dout = (
        _io32(q_view(case, tensors[name], span), io_dtype).reshape(-1, case.head_dim) for name in ("query", "dout")
    )
    out = q_view(case, tensors["attention_out"], span).reshape(-1, case.head_dim)  # upcast slice by slice below
    key, value = (_io32(kv_view(case, tensors[name], span), io_dtype) for name in ("key", "value"))
    lse = np.ascontiguousarray(lse_view(case, np.asarray(tensors["softmax_lse"]), span), dtype=np.float32)
    dsum = np.empty(len(dout), dtype=np.float32)
    for first in range(0, len(dout), _DSUM_ROWS):  # each row's own sum: the same bits in any slicing
        rows = slice(first, first + _DSUM_ROWS)
        dsum[rows] = (dout[rows] * _io32(out[rows], io_dtype)).sum(axis=1, dtype=np.float32)
    return _Sequence(query, dout, dsum, lse.reshape(-1), key, value, span.q_len, span.batch)


#: Query rows per tile of the kv-block-major loop: dK and dV of a kv block are summed tile by tile.
_CHUNK_ROWS = 512

#: Rows per slice of dsum's product: its temporaries stay in cache instead of two sequence-sized arrays.
_DSUM_ROWS = 1024


def _sequence_grads(
    seq: _Sequence,
    mask: np.ndarray,
    case: Case,
    fault: str | None,
    order: np.random.Generator | None,
    lose_update: bool,
    ticker: _Ticker | None = None,
    dk_skipped: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Return one batch entry's unscaled fp32 dq [N1*sq, D], dk and dv [N2, skv, D], kv-block major, and
    whether it lost a partial.

    For each kv head and kv block, the (query head, query block) pairs that select the block are taken
    in (head, block) order, in tiles of about `_CHUNK_ROWS` query rows; each tile adds its share to the
    dQ of its rows (a row has one owner: the same sums in the same order on every run) and computes
    each pair's dK and dV partial products. The partials are then added to the block's fp32 dK and dV
    one by one, as the kernel's atomic adds do: in (head, block) order, or in the order `order`
    permutes them into, which changes the last bits whenever three or more pairs meet in a block.
    With `lose_update` (race-lost-update fault, while no partial is lost yet) the first block that two or
    more partials meet in loses its last add. With `dk_skipped` (query head, query block: the dk-missing-q-block
    fault) that pair's dK partials are never added.
    """
    x, y = case.block_shape
    kv_heads, kv_len, _ = seq.key.shape
    group = mask.shape[0] // kv_heads
    dq, dk, dv = (np.zeros(grad_of.shape, np.float32) for grad_of in (seq.query, seq.key, seq.value))
    block_rows = [np.arange(i * x, min((i + 1) * x, seq.q_len)) for i in range(mask.shape[1])]
    pairs_per_tile = max(1, _CHUNK_ROWS // x)
    lost = False
    for kv_head in range(kv_heads):
        group_mask = mask[kv_head * group : (kv_head + 1) * group]  # [G, nQ, nKV]
        # batch-order: entries of odd index sum dQ over kv blocks from the last (a split of its own)
        backwards = fault == "batch-order" and seq.batch % 2 == 1
        for block in reversed(range(mask.shape[2])) if backwards else range(mask.shape[2]):
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
                tile_partials = _tile_grads(seq, rows, in_sum, kv_head, cols, case, fault, dq)
                for index, (m, i) in enumerate(zip(members[tile], q_blocks[tile], strict=True)):
                    if (kv_head * group + int(m), int(i)) == dk_skipped:
                        tile_partials[index] = (np.zeros_like(tile_partials[index][0]), tile_partials[index][1])
                partials += tile_partials
            if ticker is not None:
                ticker.add(int(members.size))
            sequence = list(range(len(partials)) if order is None else order.permutation(len(partials)))
            if lose_update and not lost and len(sequence) >= 2:
                lost = True
                sequence.pop()  # the last add of this block never lands
            for index in sequence:
                dk_part, dv_part = partials[index]
                dk[kv_head, cols] += dk_part
                dv[kv_head, cols] += dv_part
    return dq, dk, dv, lost


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
    key, value = seq.key[kv_head, cols], seq.value[kv_head, cols]
    query, dout = seq.query[rows], seq.dout[rows]
    probs = query @ key.T
    probs *= faults.kernel_scale(case, fault)
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
    dscores_io = round_float32(dscores, io_dtype, BACKWARD_TIES, out=dscores)
    probs_io = round_float32(probs, io_dtype, BACKWARD_TIES, out=probs)
    dq_tile = dscores_io @ key
    partials = []
    start = 0
    for pair, counted in zip(pair_rows, in_sum, strict=True):
        part = slice(start, start + len(pair))
        start += len(pair)
        if len(pair):  # a pair's rows are consecutive: a slice, not a fancy gather and scatter
            dq[pair[0] : pair[-1] + 1] += dq_tile[part]
        if counted:
            partials.append((dscores_io[part].T @ query[part], probs_io[part].T @ dout[part]))
    return partials


# ---- whole case -----------------------------------------------------------------------------------


@np.errstate(over="ignore", invalid="ignore", divide="ignore")
@blas.one_thread_each()  # one BLAS thread, always: its bits can change with its threads (blas.py), and
# on a shared machine threads on products of a few blocks only spin against other processes
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
    if fault is not None and fault not in faults.ALL_FAULTS:
        raise ValueError(f"unknown fault {fault!r}: expected one of {', '.join(faults.ALL_FAULTS)}")
    if fault == "heads-interleaved":
        return _emulate_interleaved(case, tensors, order_seed)
    io_dtype = numpy_dtype(case.dtype)
    block_mask = np.asarray(tensors["block_sparse_mask"])
    order = None if order_seed is None else seeded(order_seed)
    lose_update = fault == "race-lost-update" and (order_seed is None or order_seed % 2 == 1)
    dq, dk, dv = (np.zeros(shape, dtype=np.float32) for shape in (case.q_shape, case.kv_shape, case.kv_shape))
    spans = [span for span in case.spans() if span.q_len and span.kv_len]
    masks = {span.batch: faults.effective_mask(case, block_mask, span, fault) for span in spans}
    ticker = _Ticker(case.name, sum(int(np.count_nonzero(m)) for m in masks.values())) if _REPORTERS else None
    site = faults.fault_site(case, block_mask) if fault == "dk-missing-q-block" else None
    for span in spans:
        seq = _load_sequence(case, tensors, span)
        mask = masks[span.batch]
        if fault == "lse-row-max":
            seq.lse = faults.row_max_scores(case, seq.query, seq.key, mask, faults.kernel_scale(case, fault))
        skipped = (site.head, site.q_block) if site is not None and site.span.batch == span.batch else None
        dq_seq, dk_seq, dv_seq, lost = _sequence_grads(seq, mask, case, fault, order, lose_update, ticker, skipped)
        lose_update = lose_update and not lost
        q_view(case, dq, span)[...] = dq_seq.reshape(case.num_heads, span.q_len, case.head_dim)
        kv_view(case, dk, span)[...] = dk_seq
        kv_view(case, dv, span)[...] = dv_seq
    scale32 = faults.kernel_scale(case, fault)
    dq *= scale32
    if fault != "dk-no-scale":
        dk *= scale32
    if fault == "dq-scaled-twice":
        dq *= scale32
    if fault == "dv-slightly-scaled":
        dv *= np.float32(1 + 2**-8)
    grads = {name: to_dtype(grad, io_dtype, BACKWARD_TIES) for name, grad in (("dq", dq), ("dk", dk), ("dv", dv))}
    if fault == "stale-output":
        return {name: np.zeros_like(grad) for name, grad in grads.items()}
    if fault in faults.SHAPE_FAULTS:
        faults.plant_shape_fault(case, grads, fault)
    if fault in ("nan-row", "tile-noise", "rows-swapped"):
        site = faults.fault_site(case, block_mask)
        if fault == "rows-swapped":
            faults.plant_rows_swapped(case, site, grads["dq"])
        elif fault == "nan-row":
            faults.plant_nan_row(case, grads["dq"], site)
        elif site is not None:
            faults.plant_tile_noise(case, tensors, block_mask, grads["dq"], site)
    return grads


#: The inputs with a query-head axis (axis 1 in BNSD [B, N1, ...], TND [T, N1, ...] and the mask).
_Q_SIDE = ("query", "dout", "attention_out", "softmax_lse", "block_sparse_mask")


def _emulate_interleaved(
    case: Case, tensors: Mapping[str, np.ndarray], order_seed: int | None
) -> dict[str, np.ndarray]:
    """The heads-interleaved fault: query head n reads kv head n % N2. Planted by ordering the query heads
    so that the kernel's n // G mapping meets that kv head, then putting dq's heads back in place."""
    kv_heads = case.num_kv_heads
    order = np.array(sorted(range(case.num_heads), key=lambda n: (n % kv_heads, n)))
    moved = {
        name: np.take(np.asarray(tensors[name]), order, axis=1) if name in _Q_SIDE else tensors[name]
        for name in tensors
    }
    grads = emulate(case, moved, None, order_seed)
    dq = np.empty_like(grads["dq"])
    dq[:, order] = grads["dq"]
    return {**grads, "dq": dq}


# ---- the binary contract ----------------------------------------------------------------------------


def emulate_case_dir(case_dir: Path, output_dir: Path, fault: str | None = None, order_seed: int | None = None) -> int:
    """Act as the device binary on one case directory; return the aclnn status written to status.txt.

    Checks the interface first: a rejected call writes only status.txt (status, message). A valid call
    reads and verifies the inputs, emulates (every BLAS call on one thread: its products are of a few
    blocks, which BLAS threads do not speed up, and on a shared machine they spin against other
    processes, several times slower; the results are the same), writes dq.bin, dk.bin, dv.bin as the
    manifest's `outputs` say, then status.txt "0". Old status and gradient files are removed first and
    every file is written atomically, so an interrupted run never leaves a result that looks complete.
    A forward or chain folder (`Manifest.op`) goes to `reference_ops.emulate_op`.

    Raises:
        DataError: the manifest or an input file is missing, malformed or stale.
        reference_ops.Unsupported: an autograd folder, or a folder gen skipped (`Manifest.skip`).
    """
    return emulate_into(case_dir, output_dir, fault, order_seed).status


def emulate_into(case_dir: Path, output_dir: Path, fault: str | None = None, order_seed: int | None = None) -> Emulated:
    """Do what `emulate_case_dir` does; return the status and whether the planted fault applied."""
    case_dir, output_dir = Path(case_dir), Path(output_dir)
    manifest = load_manifest(case_dir)
    if manifest.skip is not None:
        raise Unsupported(f"{case_dir}: gen skipped this op, no device runs it: {manifest.skip}")
    reason = unsupported(manifest)
    if reason is not None:
        raise Unsupported(reason)
    paths = fresh_outputs(output_dir, manifest)
    if manifest.op.calls_forward:
        return emulate_op(manifest, case_dir, output_dir, paths, emulate, fault, order_seed)
    status, message = check_interface(manifest.params, manifest.call_tensors(), manifest.release)
    if status != 0:
        return Emulated(write_status(output_dir, status, message))
    case = case_of(case_dir, manifest)
    tensors = {name: read_array(case_dir, entry) for name, entry in manifest.entries("inputs")}
    grads = emulate(case, tensors, fault, order_seed)  # on one BLAS thread (its decorator)
    write_outputs(paths, manifest, grads, str(case_dir / MANIFEST), "the case")
    write_status(output_dir, 0)
    not_applied = faults.fault_not_applied(fault, case, tensors["block_sparse_mask"]) if fault is not None else None
    return Emulated(0, not_applied, guards=faults.guard_writes(fault, grads))


# ---- the device ---------------------------------------------------------------------------------------


class _Stopped(Exception):
    """Raised inside the reference device when Ctrl-C cancelled the run."""


@dataclass(frozen=True)
class ReferenceDevice:
    """The built-in reference device (`bsa emulate`), run in this process, optionally with a planted fault.

    Build one with `create`, which checks the fault's name."""

    fault: str | None = None

    kind: ClassVar[DeviceKind] = "reference"
    reference_results = True
    seeded = True
    reports_progress = True
    binary_record = None
    #: What run.json's `timing.not_timed` says of it under `bsa run --time`.
    untimed = (
        "the reference device is not a device: it computes on this host's CPU in NumPy, so it records no kernel time"
    )

    @classmethod
    def create(cls, fault: str | None = None) -> ReferenceDevice:
        """Check the fault and return the device.

        Raises:
            RunConfigError: an unknown fault.
        """
        if fault is not None and fault not in faults.ALL_FAULTS:
            known = ", ".join(sorted(faults.ALL_FAULTS)) or "none"
            raise RunConfigError(f"unknown fault '{fault}'{suggest(fault, faults.ALL_FAULTS)}; known faults: {known}")
        return cls(fault=fault)

    @property
    def name(self) -> str:
        return REFERENCE_DEVICE + (f" with fault '{self.fault}'" if self.fault else "")

    @property
    def announcement(self) -> str:
        return f"device: {self.name}: reference results, not device results"

    def argv(self, case_dir: Path, output_dir: Path, device_id: int) -> list[str]:
        """Return the `bsa emulate` call that does what one run does."""
        argv = ["bsa", "emulate", str(case_dir / MANIFEST), str(output_dir)]
        return argv + (["--fault", self.fault] if self.fault else [])

    def unsupported(self, manifest: Manifest) -> str | None:
        return unsupported(manifest)  # autograd

    def run_order(self, seed: int | None, case_name: str, index: int, deterministic: bool) -> RunOrder:
        """Return run `index`'s `--seed` (and `--deterministic`) and the seed of its dK/dV order: None in
        deterministic mode (one fixed order: (head, query block), as the mode's fixed-order sum), unless the
        fault `deterministic-ignored` ignores the mode."""
        order_seed = zlib.crc32(f"{seed}:{case_name}:{index}".encode())
        args = ["--seed", str(order_seed)]
        if not deterministic:
            return args, order_seed
        return [*args, "--deterministic"], order_seed if self.fault == "deterministic-ignored" else None

    def time_limit(self, timeout: float | None) -> float | None:
        return None  # it runs in this process: Ctrl-C stops it, no timeout

    def execute(self, attempt: Attempt, execution: Execution) -> None:
        """Run the reference device in this process (same contract, same record). Ctrl-C stops it within
        one kv block (its progress calls look at the cancel flag): the case is recorded as interrupted."""
        (execution.output_dir / attempt.stdout_log).write_text("")
        stderr = execution.output_dir / attempt.stderr_log
        cancelled = execution.cancel.event

        def stop_if_cancelled(*_progress: object) -> None:  # also a progress callback (case name, fraction)
            if cancelled.is_set():
                raise _Stopped

        try:
            stop_if_cancelled()
            with reporting(stop_if_cancelled):
                done = emulate_into(execution.case_dir, attempt.staging, self.fault, attempt.order_seed)
            stop_if_cancelled()
        except _Stopped:
            stderr.write_text("interrupted by Ctrl-C\n")
            attempt.interrupted = True
            return
        except (BsaError, OSError) as exc:
            stderr.write_text(f"Error: {exc}\n", errors="backslashreplace")
            attempt.exit_code = ChildExit.USAGE
            if isinstance(exc, OSError):
                attempt.problems.append(f"the reference device could not write its outputs: {exc.strerror or exc}")
            else:
                attempt.problems.append(f"the reference device refused the case: {exc}")
            return
        except Exception as exc:
            stderr.write_text(traceback.format_exc())
            attempt.exception = type(exc).__name__
            return
        stderr.write_text("")
        attempt.exit_code = ChildExit.STATUS
        attempt.fault_not_applied = done.fault_not_applied
        attempt.prefilled_outputs = done.prefilled_outputs
        attempt.guards = done.guards

    def software(self, stdout_log: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
        return software.reference()

    def reporting(self, callback: Callable[[str, float], None]) -> AbstractContextManager[None]:
        return reporting(callback)
