"""The reference device's planted faults: what each does, which cases it can change, and how it is planted.

A planted fault is a realistic kernel bug the comparator must catch (`bsa run --fault NAME`). The reference
device (`reference.emulate`) plants them; `fault_applies` and `fault_not_applied` say whether one changes a
case's outputs, which the reference device records in run.json (`device.fault_not_applied`) and `bsa run`
warns about before a case runs. Pure: arrays in, arrays or words out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.case import Case, SequenceSpan, numpy_dtype
from ..core.layout import kv_view, lse_view, mask_view, q_view
from ..core.rounding import to_dtype
from ..golden import forward_case, written_rows
from ..ops import Op, get
from ..ops.backward import BACKWARD
from ..ops.base import FORWARD_OUTPUTS

#: Planted faults: name -> what the faulty kernel does. Faults that change nothing where no block is
#: selected (all but nan-row) apply only to cases with at least one selected block; see `fault_applies`.
FAULTS: dict[str, str] = {
    "drop-tail-block": "the partial last block of a sequence is skipped: the kv tail block when "
    "Skv % Y != 0, else the q tail block when Sq % X != 0 (applies when such a tail block is selected)",
    "no-gqa-sum": "dk/dv take only the first query head of each GQA group instead of the group sum "
    "(applies only with N1 > N2 and a selection in a non-first head of a group)",
    "dk-no-scale": "dK is not multiplied by scale at the end (applies when scale != 1)",
    "mask-transposed": "the block mask is read as [.., j, i] (out-of-range transposed indices read as "
    "as unselected; applies when the mask is not symmetric)",
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
    # The classes a fuzzer meets that the diagnosis must name (issue 31, item 3).
    "lse-row-max": "softmaxLse read as each row's largest scaled score over its selected columns, the log-sum "
    "term never added (the forward's final normalisation skipped): P = exp(S - max S), each row's P too large by "
    "its softmax sum",
    "dv-slightly-scaled": "dV is multiplied by 1 + 2^-8 at the end: a small constant factor, neither a named scale "
    "nor rounding noise",
    "dk-missing-q-block": "dK leaves out the partial of one (query head, query block), the middle one with a "
    "selection, in every kv block that block selects; dQ and dV take it",
}

#: Faults that leave every single run as clean as the reference and show only between repeated runs.
REPEAT_FAULTS: dict[str, str] = {
    "deterministic-ignored": "deterministic mode is ignored: dK/dV are summed in a run-dependent order although "
    "the run asked for one fixed order, so repeats differ in their last bits (shows only with --deterministic "
    "--repeat N; applies when a kv block is selected by two or more query blocks or heads)"
}

#: Faults of the forward (`devices.forward.run_forward` plants them): they apply to the ops that call the
#: forward (forward, chain, autograd), never to a backward folder; the faults above never to a forward folder.
FORWARD_FAULTS: dict[str, str] = {
    "lse-not-written": "softmaxLse is left as the buffer held it (the NaN prefill) although softmax_lse_flag is 1 "
    "(applies with softmax_lse_flag 1 and a row the forward writes)",
    "rescale-skipped": "the forward's online softmax does not rescale the running sum and accumulator by "
    "exp(m_old - m_new) when a later 512-column stack raises a row's max (applies to rows with more than 512 "
    "selected columns)",
    "stack-off-by-one": "the forward's 512-column stack boundary is off by one: every stack after the first starts "
    "one column late, so columns 512, 1024, ... of a row's selected columns are dropped (applies to rows with "
    "more than 512 selected columns)",
    "forward-mask-transposed": "the forward reads the block mask as [.., j, i] (out-of-range transposed indices read "
    "as unselected; applies when the mask is not symmetric)",
    "forward-block-shift": "the forward's kv block j > 0 reads the selection of block j - 1 (applies when some row's "
    "selection changes along the kv blocks)",
    "forward-drop-tail-block": "the forward skips the partial last kv block (applies when Skv % Y != 0 and that "
    "block is selected)",
    "forward-heads-interleaved": "the forward's query head n reads kv head n % N2 instead of n // (N1 / N2) "
    "(applies with N1 > N2 > 1)",
    "forward-no-scale": "the forward does not multiply the scores by scaleValue (applies when scale != 1)",
    "forward-lse-base2": "the forward writes softmaxLse as a base-2 log, log2(l) + m log2(e) (applies with "
    "softmax_lse_flag 1 and a row the forward writes)",
    "forward-rows-swapped": "the forward writes two rows of out and lse to each other's places: the first two rows of "
    "the middle written query block (applies when that block has a neighbouring row)",
    "forward-tile-noise": "in one 16x16 tile of out (the first rows of the middle written query block, the middle "
    "columns) each element's error against the float64 forward is made 8x larger (applies when a row is written)",
}


@dataclass(frozen=True)
class ShapeFault:
    """A backward fault that shows only in one shape, as data: where it strikes (a batch entry of a case),
    which gradients, which part of an entry's heads-major view [heads, rows, D] (`region`), and the factor
    that part is left times (0: never written). `bsa fuzz` must find these: no shipped suite holds the shape."""

    description: str
    strikes: Callable[[Case, SequenceSpan], bool]
    tensors: tuple[str, ...]
    region: Callable[[Case, SequenceSpan], tuple[slice, slice, slice]]
    factor: Callable[[Case], float] = lambda case: 0.0


_ALL = (slice(None), slice(None), slice(None))


def _after_empty(case: Case, span: SequenceSpan) -> bool:
    """Whether the entry before `span` is an empty sequence between others (not the first entry)."""
    spans = case.spans()
    return span.batch >= 2 and spans[span.batch - 1].q_len == 0


#: Faults of shapes no shipped suite holds (issue 31): each strikes one boundary only.
SHAPE_FAULTS: dict[str, ShapeFault] = {
    "tail-row-unwritten": ShapeFault(
        "the last query row of a sequence one row past a block (Sq % X == 1) is never written: its dq stays 0 "
        "(applies when a sequence's length leaves a tail of one row)",
        lambda case, span: span.q_len % case.block_shape[0] == 1,
        ("dq",),
        lambda case, span: (slice(None), slice(span.q_len - 1, span.q_len), slice(None)),
    ),
    "batch-past-second": ShapeFault(
        "dK of batch entries past the second is not multiplied by scale (a scale table of two entries) "
        "(applies with three or more batch entries and scale != 1)",
        lambda case, span: span.batch >= 2,
        ("dk",),
        lambda case, span: _ALL,
        lambda case: 1.0 / float(np.float32(case.kernel_scale)),
    ),
    "gqa8-head-unwritten": ShapeFault(
        "with 8 query heads per kv head, dq of the last query head of each group is never written "
        "(applies with N1 / N2 == 8)",
        lambda case, span: case.group_size == 8,
        ("dq",),
        lambda case, span: (slice(7, None, 8), slice(None), slice(None)),
    ),
    "nonsquare-d64-half": ShapeFault(
        "with a non-square block and D = 64, the second half of dk's head dim is never written "
        "(applies when X != Y and D == 64)",
        lambda case, span: case.block_shape[0] != case.block_shape[1] and case.head_dim == 64,
        ("dk",),
        lambda case, span: (slice(None), slice(None), slice(32, None)),
    ),
    "after-empty-skipped": ShapeFault(
        "the sequence after a zero-length sequence between others is skipped: its dq, dk, dv stay 0 "
        "(applies to TND with an empty sequence that is not the first)",
        _after_empty,
        ("dq", "dk", "dv"),
        lambda case, span: _ALL,
    ),
}

#: Faults only the batch-consistency check sees: every output within the standard's tolerance.
CONSISTENCY_FAULTS: dict[str, str] = {
    "batch-order": "batch entries of odd index sum dQ over their kv blocks from the last (a split of their own), so "
    "two copies of one sequence, one at an odd index and one at an even, differ in dq's last bits (applies to a "
    "case with `copies` of such a pair whose rows select three or more kv blocks)"
}

#: Faults that leave every output right and write outside one: only the guard zones around the outputs show
#: them (`guard_writes`; the C++ harness keeps such zones on the device, docs/run.md "Guard zones").
GUARD_FAULTS: dict[str, str] = {
    "dk-write-past-end": "the backward writes 8 elements past the end of dk (a tail tile stored one row too far): "
    "dq, dk and dv are right, only the guard zone after dk shows it (applies to every backward)",
    "lse-write-past-end": "the forward writes 8 elements past the end of softmaxLse (a tail row stored one row too "
    "far): out and lse are right, only the guard zone after lse shows it (applies to every forward)",
}
#: The output each guard fault writes past the end of (a forward output: the fault is the forward step's).
PAST_END_OF: dict[str, str] = {"dk-write-past-end": "dk", "lse-write-past-end": "lse"}

#: Every fault `bsa emulate --fault` and `bsa run --fault` accept.
ALL_FAULTS: dict[str, str] = {
    **FAULTS,
    **CONSISTENCY_FAULTS,
    **REPEAT_FAULTS,
    **FORWARD_FAULTS,
    **GUARD_FAULTS,
    **{name: fault.description for name, fault in SHAPE_FAULTS.items()},
}

#: Bytes of the guard zone the reference device keeps before and after each output, filled with bytes 0xFF
#: (NaN in float16, bfloat16 and float32), as the C++ harness does on the device with 64 KiB.
GUARD_BYTES = 4096
#: Elements dk-write-past-end writes, with zero bytes, from dk's end on.
PAST_END_ELEMENTS = 8

#: Selected columns beyond which a row takes two online-softmax stacks of the forward.
_LONG_ROW = 512


def kernel_scale(case: Case, fault: str | None) -> np.float32:
    """The scale the kernel multiplies by: the float32 scaleValue, or with `scale-rounded` the case dtype's."""
    scale = np.float32(case.kernel_scale)
    if fault == "scale-rounded":
        return np.float32(to_dtype(np.asarray(scale), numpy_dtype(case.dtype)))
    return scale


# ---- fault geometry -------------------------------------------------------------------------------


def effective_mask(case: Case, block_mask: np.ndarray, span: SequenceSpan, fault: str | None) -> np.ndarray:
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


def fault_applies(name: str, case: Case, block_mask: np.ndarray | None = None, op: Op = BACKWARD) -> bool:
    """Say whether fault `name` changes the outputs of the `op` folder of `case`.

    With `block_mask` (the full [B, N1, nQ, nKV] input) the answer is exact up to coincidences of the
    data (a zero dout, an lse of exactly 0, a max that no later stack raises); without it, only the
    geometry decides and faults that depend on the mask pattern are assumed to apply. A forward fault
    never applies to a backward folder, a backward fault never to a forward folder; on a chain (or
    autograd) both kinds apply, each to its step.
    """
    if name not in ALL_FAULTS:
        raise ValueError(f"unknown fault {name!r}: expected one of {', '.join(ALL_FAULTS)}")
    if not _fault_step(name, get(op)):
        return False
    if name in FORWARD_FAULTS:
        return _forward_fault_applies(name, case, block_mask)
    if name in GUARD_FAULTS:  # any element of the tensor it writes past
        return math.prod(case.q_shape[:-1] if _is_forwards(name) else case.kv_shape) > 0
    spans = [s for s in case.spans() if s.q_len and s.kv_len]
    if name in CONSISTENCY_FAULTS:
        parted = {c for pair in case.copies if (pair[0] - pair[1]) % 2 for c in pair}
        copied = [s for s in spans if s.batch in parted]
        if block_mask is None:
            return bool(copied)
        return any((mask_view(case, block_mask, span).sum(axis=2) >= 3).any() for span in copied)
    if name in SHAPE_FAULTS:
        fault = SHAPE_FAULTS[name]
        struck = [s for s in spans if fault.strikes(case, s)]
        if fault.factor(case) == 1.0:
            return False
        return any(mask_view(case, block_mask, s).any() for s in struck) if block_mask is not None else bool(struck)
    # One fixed order, or a lost update, shows only where two pairs add into one kv block.
    if name in REPEAT_FAULTS or name == "race-lost-update":
        return any(_shared_blocks(case, block_mask, span) for span in spans) if block_mask is not None else bool(spans)
    if name == "nan-row":
        return math.prod(case.q_shape) > 0
    if name == "no-gqa-sum" and case.group_size <= 1:
        return False
    if name in ("dk-no-scale", "dq-scaled-twice") and case.kernel_scale == 1.0:
        return False
    if name == "heads-interleaved" and not (case.group_size > 1 and case.num_kv_heads > 1):
        return False
    if name == "rows-swapped":
        return _rows_to_swap(case, block_mask, spans)
    if name == "scale-rounded" and kernel_scale(case, name) == np.float32(case.kernel_scale):
        return False
    if name == "drop-tail-block" and not any(
        s.kv_len % case.block_shape[1] or s.q_len % case.block_shape[0] for s in spans
    ):
        return False
    if block_mask is None:
        return bool(spans)
    for span in spans:
        mask = mask_view(case, block_mask, span)
        if name == "no-gqa-sum":  # the selection of the non-first heads of each group
            mask = mask.reshape(case.num_kv_heads, case.group_size, *mask.shape[1:])[:, 1:]
        elif name == "heads-interleaved":
            mask = mask[_moved_heads(case)]
        elif name in ("drop-tail-block", "mask-transposed", "block-shift") and mask.any():
            mask = mask != effective_mask(case, block_mask, span, name)  # where the fault reads another selection
        if mask.any():
            return True
    return False


#: The forward's faults that read the mask otherwise, and the backward's fault (`effective_mask`) reading it so.
FORWARD_MASK_FAULTS = {f"forward-{name}": name for name in ("mask-transposed", "block-shift", "drop-tail-block")}


def forward_selection(case: Case, block_mask: np.ndarray, span: SequenceSpan, fault: str | None) -> np.ndarray:
    """Return the [N1, nQ, nKV] selection of a batch entry as the (possibly faulty) forward reads it; the
    forward's drop-tail-block drops only the kv tail block."""
    how = FORWARD_MASK_FAULTS.get(fault or "")
    if how == "drop-tail-block":
        read = mask_view(case, block_mask, span).copy()
        if span.kv_len % case.block_shape[1] and read.shape[2]:
            read[:, :, -1] = False
        return read
    return effective_mask(case, block_mask, span, how)


def _forward_fault_applies(name: str, case: Case, block_mask: np.ndarray | None) -> bool:
    """Say whether a forward fault changes the forward's outputs (`fault_applies`)."""
    fcase = forward_case(case)
    spans = [s for s in fcase.spans() if s.q_len and s.kv_len]
    any_written = bool(written_rows(case, block_mask).any()) if block_mask is not None else bool(spans)
    if name == "lse-not-written" or name == "forward-lse-base2":
        return case.softmax_lse_flag == 1 and any_written
    if name == "forward-no-scale":
        return case.kernel_scale != 1.0 and any_written
    if name == "forward-tile-noise":
        return any_written
    if name == "forward-heads-interleaved":
        if not (case.group_size > 1 and case.num_kv_heads > 1):
            return False
        moved = _moved_heads(case)
        return any_written if block_mask is None else any(mask_view(fcase, block_mask, s)[moved].any() for s in spans)
    if name == "forward-rows-swapped":
        return _rows_to_swap(fcase, block_mask, spans)
    if name in FORWARD_MASK_FAULTS:
        if block_mask is None:
            return bool(spans) and (
                name != "forward-drop-tail-block" or any(s.kv_len % fcase.block_shape[1] for s in spans)
            )
        return any(
            not np.array_equal(mask_view(fcase, block_mask, s), forward_selection(fcase, block_mask, s, name))
            for s in spans
        )
    if block_mask is None:
        return any(s.kv_len > _LONG_ROW for s in spans)
    y = fcase.block_shape[1]
    for span in spans:
        mask = mask_view(fcase, block_mask, span)  # [N1, nQ, nKV]
        widths = np.full(mask.shape[2], y)
        widths[-1] = span.kv_len - y * (mask.shape[2] - 1)  # the real columns of a partial tail block
        if (mask @ widths > _LONG_ROW).any():
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


def fault_not_applied(name: str, case: Case, block_mask: np.ndarray | None = None, op: Op = BACKWARD) -> str | None:
    """Return why fault `name` leaves the outputs of the `op` folder of `case` as the clean reference's, or
    None if it applies.

    The sentence is meant for reports: a case that passes with a planted fault it could not carry must
    not read as a fault the comparator missed.

    Raises:
        ValueError: an unknown fault.
    """
    if fault_applies(name, case, block_mask, op):
        return None
    if not _fault_step(name, get(op)):
        step, other = ("forward", "backward") if _is_forwards(name) else ("backward", "forward")
        return (
            f"fault '{name}' is a fault of the {step}: it does not apply to a {other} folder (the reference "
            "device computed it without the fault)"
        )
    return (
        f"fault '{name}' does not apply to this case ({fault_condition(name)}): the reference device "
        "computed it without the fault"
    )


def _moved_heads(case: Case) -> list[int]:
    """Return the query heads that heads-interleaved moves to another kv head (n % N2 != n // G)."""
    return [n for n in range(case.num_heads) if n % case.num_kv_heads != n // case.group_size]


def _rows_to_swap(case: Case, block_mask: np.ndarray | None, spans: list[SequenceSpan]) -> bool:
    """Say whether rows-swapped finds a row with a neighbour (at its site; without a mask, in any span)."""
    if block_mask is None:
        return max((s.q_len for s in spans), default=0) >= 2
    site = fault_site(case, block_mask)
    return site is not None and site.span.q_len >= 2


def _fault_step(name: str, op: Op) -> bool:
    """Say whether the op calls the step a fault plants itself in (a forward fault in the forward)."""
    return op.calls_forward if _is_forwards(name) else op.calls_backward


def _is_forwards(name: str) -> bool:
    """Say whether a fault plants itself in the forward (a forward fault, or a guard fault past a forward output)."""
    return name in FORWARD_FAULTS or PAST_END_OF.get(name) in FORWARD_OUTPUTS


def _shared_blocks(case: Case, block_mask: np.ndarray, span: SequenceSpan) -> bool:
    """Say whether some kv block of a batch entry is selected by two or more (query head, query block) pairs."""
    mask = mask_view(case, block_mask, span)
    groups = mask.reshape(case.num_kv_heads, case.group_size * mask.shape[1], mask.shape[2])
    return bool((groups.sum(axis=1) >= 2).any())


def applicable_faults(case: Case, block_mask: np.ndarray | None = None) -> list[str]:
    """Return the names of the faults that change the outputs of `case` (see `fault_applies`)."""
    return [name for name in FAULTS if fault_applies(name, case, block_mask)]


# ---- planting --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """Where a row-level fault lands: batch entry, query head, query block."""

    span: SequenceSpan
    head: int
    q_block: int


def fault_site(case: Case, block_mask: np.ndarray) -> Site | None:
    """Return the middle (head, query block) with a selected kv block, in (span, head, block) order."""
    sites: list[Site] = []
    for span in case.spans():
        if span.q_len == 0 or span.kv_len == 0:
            continue
        heads, blocks = np.nonzero(mask_view(case, block_mask, span).any(axis=2))
        sites.extend(Site(span, int(h), int(i)) for h, i in zip(heads, blocks, strict=True))
    return sites[len(sites) // 2] if sites else None


def row_max_scores(case: Case, query: np.ndarray, key: np.ndarray, mask: np.ndarray, scale: np.float32) -> np.ndarray:
    """The lse-row-max fault's lse of one batch entry: each query row's largest scaled score over the columns
    its (kernel-read) selection holds, float32 [N1 * sq] (heads-major rows, as `query` [N1 * sq, D]; `key`
    [N2, skv, D], `mask` [N1, nQ, nKV]); the true lse where a row selects nothing."""
    x, y = case.block_shape
    heads, n_q, n_kv = mask.shape
    q_len, kv_len = query.shape[0] // heads, key.shape[1]
    found = np.full(query.shape[0], -np.inf, dtype=np.float32)
    for head in range(heads):
        for block in range(n_q):
            rows = slice(head * q_len + block * x, head * q_len + min((block + 1) * x, q_len))
            cols = np.concatenate(
                [np.arange(j * y, min((j + 1) * y, kv_len)) for j in np.flatnonzero(mask[head, block])]
                or [np.zeros(0, dtype=np.int64)]
            )
            if cols.size:
                scores = (query[rows] @ key[head // case.group_size, cols].T) * scale
                found[rows] = scores.max(axis=1)
    return found


def plant_nan_row(case: Case, dq: np.ndarray, site: Site | None) -> None:
    """Write NaN into the first row of the site's query block (the first dq row without a site)."""
    if site is None:
        if dq.size:
            dq.reshape(-1, case.head_dim)[0] = np.nan
    else:
        q_view(case, dq, site.span)[site.head, site.q_block * case.block_shape[0]] = np.nan


def plant_rows_swapped(case: Case, site: Site | None, *tensors: np.ndarray) -> None:
    """Swap the first two rows of the site's query block (its one row and the row before it when it has one) in
    each tensor: query-shaped (dq, out), or an lse's rows (the query shape without D)."""
    if site is None:
        return
    first = site.q_block * case.block_shape[0]
    a, b = (first, first + 1) if first + 1 < site.span.q_len else (first - 1, first)
    if a < 0:
        return
    for tensor in tensors:
        rows = (q_view if tensor.ndim == len(case.q_shape) else lse_view)(case, tensor, site.span)[site.head]
        rows[[a, b]] = rows[[b, a]]


def plant_tile_noise(
    case: Case, tensors: Mapping[str, np.ndarray], block_mask: np.ndarray, dq: np.ndarray, site: Site
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
    key, value = (kv_view(case, tensors[name], span)[kv_head, kv_pos].astype(np.float64) for name in ("key", "value"))
    query, dout, out = (
        q_view(case, tensors[name], span)[head, rows].astype(np.float64) for name in ("query", "dout", "attention_out")
    )
    lse = lse_view(case, np.asarray(tensors["softmax_lse"]), span)[head, rows].astype(np.float64)
    probs = np.exp(case.kernel_scale * (query @ key.T) - lse[:, None])
    dscores = probs * (dout @ value.T - (dout * out).sum(axis=1, keepdims=True))
    golden = case.kernel_scale * (dscores @ key)[:, cols]
    tile = q_view(case, dq, span)[head, rows, cols]
    error = tile.astype(np.float64) - golden
    tile[...] = to_dtype(golden + 5.0 * error, dq.dtype)


def plant_shape_fault(case: Case, grads: Mapping[str, np.ndarray], name: str) -> None:
    """Plant shape fault `name` in the gradients (in place): its region of every batch entry it strikes."""
    fault = SHAPE_FAULTS[name]
    factor = fault.factor(case)
    for span in case.spans():
        if not (span.q_len and span.kv_len and fault.strikes(case, span)):
            continue
        for tensor in fault.tensors:
            view = (q_view if tensor == "dq" else kv_view)(case, grads[tensor], span)[fault.region(case, span)]
            view[...] = to_dtype(view.astype(np.float32) * np.float32(factor), view.dtype)


def guard_writes(fault: str | None, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Play the guard zones around each output: place it between two zones of `GUARD_BYTES` bytes 0xFF, let
    a guard fault write past the end of its tensor (`PAST_END_OF`), and return run.json's `guards`: the
    zones' size and each zone written (tensor, first element written counted from the tensor's first,
    elements up to the last one written), as the C++ harness reports them (`devices.timing`)."""
    writes = []
    for name, output in outputs.items():
        data = np.ascontiguousarray(output).reshape(-1).view(np.uint8)
        buffer = np.full(2 * GUARD_BYTES + data.size, 0xFF, dtype=np.uint8)
        buffer[GUARD_BYTES : GUARD_BYTES + data.size] = data
        if fault in PAST_END_OF and PAST_END_OF[fault] == name:
            end = GUARD_BYTES + data.size
            buffer[end : end + PAST_END_ELEMENTS * output.itemsize] = 0
        for origin, zone in ((-GUARD_BYTES, buffer[:GUARD_BYTES]), (data.size, buffer[GUARD_BYTES + data.size :])):
            changed = np.flatnonzero(zone != 0xFF)
            if changed.size:
                size = output.itemsize
                first, last = (origin + int(changed[0])) // size, (origin + int(changed[-1])) // size
                writes.append({"tensor": name, "offset": first, "elements": last - first + 1})
    return {"bytes": GUARD_BYTES, "writes": writes}
