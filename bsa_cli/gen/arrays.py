"""A case's arrays, op by op: its inputs drawn once, each op's golden and benchmark computed once.

What `generate` writes into each op's folder (`bsa_cli/op_folders.py` says which tensors each holds): the
backward's arrays as bsa always computed them (`compute_case`), the forward's
(`golden.forward_golden_and_benchmark`) and the pair's, shared by chain and autograd
(`golden.chain_golden_and_benchmark`), with the progress of every walk. Pure computation: no files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import golden
from ..core.case import Case, numpy_dtype
from ..golden import KernelRange
from ..inputs import call_inputs, copy_sequences, draw, make_mask, make_tensors, mask_stats
from ..ops import Op, get
from ..ops.folders import op_case
from ..store.manifest import GRAD_NAMES
from .settings import GenSettings

DEFAULT_SETTINGS = GenSettings()

#: Walks over the selected blocks per case: the forward with golden backward, then the kernel-faithful backward.
_PASSES = 2


def compute_case(
    case: Case, settings: GenSettings = DEFAULT_SETTINGS, kernel_range: golden.KernelRange | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Return (inputs, golden, benchmark) arrays of a case's backward; negative cases get no golden or benchmark.

    With `settings.jobs` > 1 the inputs are drawn and the golden and benchmark walks
    (`golden.golden_and_benchmark`) run in up to `jobs` threads; each walk's arithmetic is the same as in one
    thread, so the results are bit-identical. `settings.on_progress` hears how much of the case's arithmetic
    is done, after every query-block row (the golden and the benchmark walks count alike). `kernel_range`, if
    given, gathers the range of the benchmark's P and dS before they are rounded (`golden.watching`).
    """
    tensors, mask = make_tensors(case, settings.jobs), make_mask(case)
    pairs = int(mask_stats(case, mask)["selected_blocks"]) if case.expect_of("backward").ok else 0  # refused: no walk
    progress = _Progress(pairs * _PASSES, settings.listener(case))
    return _backward_arrays(case, tensors, mask, settings, progress, kernel_range)


def _backward_arrays(
    case: Case,
    drawn: Mapping[str, np.ndarray],
    mask: np.ndarray,
    settings: GenSettings,
    progress: _Progress,
    kernel_range: golden.KernelRange | None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The backward's (inputs, golden, benchmark) of `compute_case`, from the case's drawn tensors and mask."""
    tensors = dict(drawn)
    if not case.expect_of("backward").ok:
        # The op rejects the call before reading data: any out and lse of the right shapes will do.
        tensors["attention_out"] = draw(case, "attention_out", case.q_shape, case.init.dout, numpy_dtype(case.dtype))
        tensors["softmax_lse"] = np.zeros(case.lse_shape_dims, dtype=np.float32)
        tensors["block_sparse_mask"] = mask
        return call_inputs(case, tensors), {}, {}
    tensors["block_sparse_mask"] = mask
    arrays = (tensors["dout"], tensors["query"], tensors["key"], tensors["value"], mask)
    watch = golden.watching(kernel_range) if kernel_range is not None else contextlib.nullcontext()
    with golden.reporting(progress.pairs), watch:
        out, lse, gold, bench = golden.golden_and_benchmark(case, *arrays, settings.precision, settings.jobs)
    tensors["attention_out"] = out
    tensors["softmax_lse"] = lse.reshape(case.lse_shape_dims)
    # A copy's out and lse are its source's bits, whatever the forward's BLAS did with another alignment.
    copy_sequences(case, {name: tensors[name] for name in ("attention_out", "softmax_lse")})
    gold_arrays = dict(zip(GRAD_NAMES, gold, strict=True))
    return call_inputs(case, tensors), gold_arrays, dict(zip(GRAD_NAMES, bench, strict=True))


@dataclass
class OpArrays:
    """What one op's folder of a case holds: its inputs, golden and benchmark arrays (none for a negative or
    skipped op), why it is skipped (`skip`), and the kernel path's range where the benchmark ran the backward."""

    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    golden: dict[str, np.ndarray] = field(default_factory=dict)
    benchmark: dict[str, np.ndarray] = field(default_factory=dict)
    skip: str | None = None
    kernel_range: KernelRange | None = None
    #: The mask's statistics (`inputs.mask_stats`) for an op folder's manifest; the backward's are its own.
    stats: dict[str, Any] = field(default_factory=dict)
    #: An op folder's mask as drawn (the forward's written rows for its benchmark summary); None: the backward.
    block_mask: np.ndarray | None = None


def compute_ops(case: Case, settings: GenSettings = DEFAULT_SETTINGS) -> dict[Op, OpArrays]:
    """Return the arrays of each op's folder of a case (`settings.ops`: those of `case.ops` to make, default
    all), as `each_op` computes them."""
    return dict(each_op(case, settings))


def each_op(case: Case, settings: GenSettings = DEFAULT_SETTINGS) -> Iterator[tuple[Op, OpArrays]]:
    """Yield (op, the arrays of its folder) for the ops of a case (`settings.ops`: those of `case.ops` to make,
    default all), in `OPS` order, each computed when asked for (so a caller that writes each folder before
    asking for the next holds one op's arrays at a time, the pair's shared by chain and autograd).

    The inputs are drawn once and shared (the same bytes in every folder; the forward's mask as int8); each
    golden is computed once: the backward's as `compute_case`, the forward's by
    `golden.forward_golden_and_benchmark`, the pair's (chain and autograd alike) by
    `golden.chain_golden_and_benchmark`. A skipped op gets only its reason, a negative op (its
    `case.expect_of` not ok) its call's inputs. Progress as `compute_case`, over every op made.
    """
    todo = [get(op) for op in case.ops if settings.ops is None or op in settings.ops]
    tensors, mask = make_tensors(case, settings.jobs), make_mask(case)
    # a case every op refuses may have no geometry to count blocks in (the backward's folder counts its own)
    stats = mask_stats(case, mask) if any(case.expect_of(op).ok for op in todo) else {}
    made = {
        (op.calls_forward, op.calls_backward) for op in todo if case.skip_reason(op) is None and case.expect_of(op).ok
    }
    walks = sum(_PASSES * (calls_forward + calls_backward) for calls_forward, calls_backward in made)  # a pair once
    progress = _Progress(int(stats.get("selected_blocks", 0)) * walks, settings.listener(case))
    pair: OpArrays | None = None
    for op in todo:
        reason = case.skip_reason(op)
        if reason is not None:
            yield op, OpArrays(skip=reason, stats=stats)
        elif not op.calls_forward:
            kernel_range = golden.KernelRange()
            arrays = _backward_arrays(case.as_called(), tensors, mask, settings, progress, kernel_range)
            yield op, OpArrays(*arrays, kernel_range=kernel_range)
        else:
            called = {name: tensors[name] for name in op.inputs if name in tensors}
            inputs = call_inputs(op_case(case, op), {**called, "block_sparse_mask": mask})
            if not case.expect_of(op).ok:
                yield op, OpArrays(inputs, stats=stats)
            elif not op.calls_backward:
                yield op, _forward_arrays(case.as_called(), op, tensors, mask, settings, progress, inputs, stats)
            else:
                pair = pair or _pair_arrays(case.as_called(), tensors, mask, settings, progress)
                yield op, OpArrays(inputs, pair.golden, pair.benchmark, None, pair.kernel_range, stats, mask)


def _forward_arrays(
    case: Case,
    op: Op,
    tensors: Mapping[str, np.ndarray],
    mask: np.ndarray,
    settings: GenSettings,
    progress: _Progress,
    inputs: dict[str, np.ndarray],
    stats: dict[str, Any],
) -> OpArrays:
    """The forward's folder: its golden and benchmark out and lse (`golden.forward_golden_and_benchmark`)."""
    with golden.reporting(progress.pairs):
        computed = golden.forward_golden_and_benchmark(
            case, tensors["query"], tensors["key"], tensors["value"], mask, settings.precision, settings.jobs
        )
    gold = dict(zip(op.outputs, computed[:2], strict=True))
    bench = dict(zip(op.outputs, computed[2:], strict=True))
    return OpArrays(inputs, _lse_shaped(case, gold), _lse_shaped(case, bench), None, None, stats, mask)


def _pair_arrays(
    case: Case, tensors: Mapping[str, np.ndarray], mask: np.ndarray, settings: GenSettings, progress: _Progress
) -> OpArrays:
    """The pair's golden and benchmark (out, lse, dq, dk, dv), shared by chain and autograd."""
    kernel_range = golden.KernelRange()
    with golden.reporting(progress.pairs), golden.watching(kernel_range):
        gold, bench = golden.chain_golden_and_benchmark(
            case,
            tensors["dout"],
            tensors["query"],
            tensors["key"],
            tensors["value"],
            mask,
            settings.precision,
            settings.jobs,
        )
    return OpArrays({}, _lse_shaped(case, gold), _lse_shaped(case, bench), None, kernel_range)


def _lse_shaped(case: Case, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Return an op's golden or benchmark arrays with lse in the case's lse shape (`case.lse_shape_dims`)."""
    return {name: a.reshape(case.lse_shape_dims) if name == "lse" else a for name, a in arrays.items()}


class _Progress:
    """Turns selected block pairs walked into the fraction of a case done (every walk counts alike).

    Pairs are counted as `mask_stats` counts them (within each batch entry's lengths), as the walks see them;
    `total` is the pairs of every walk the case's folders take.
    """

    def __init__(self, total: int, listener: Callable[[float], None] | None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.listener = listener

    def pairs(self, count: int) -> None:
        if self.listener is not None:
            self.done += count
            self.listener(min(1.0, self.done / self.total))
