"""A case's arrays, op by op: its inputs drawn once, each op's golden and benchmark computed once.

What `generate` writes into each op's folder (`bsa_cli/op_folders.py` says which tensors each holds): the
backward's arrays as bsa always computed them (`compute_case`), the forward's
(`golden.forward_golden_and_benchmark`) and the pair's, shared by chain and autograd
(`golden.chain_golden_and_benchmark`), with the progress of every walk. Pure computation: no files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import golden
from ..core.case import Case, numpy_dtype
from ..golden import KernelRange
from ..inputs import call_inputs, draw, make_mask, make_tensors, mask_stats
from ..ops import Op
from ..ops.folders import OP_INPUT_NAMES, op_case
from ..store.manifest import GRAD_NAMES

_PASSES = 2
"""Walks over the selected blocks per case: the forward with golden backward, then the kernel-faithful backward."""


def compute_case(
    case: Case,
    precision: str = "float32",
    jobs: int = 1,
    on_progress: Callable[[float], None] | None = None,
    kernel_range: golden.KernelRange | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Return (inputs, golden, benchmark) arrays of a case's backward; negative cases get no golden or benchmark.

    With `jobs` > 1 the inputs are drawn and the golden and benchmark walks (`golden.golden_and_benchmark`)
    run in up to `jobs` threads; each walk's arithmetic is the same as in one thread, so the results are
    bit-identical. `on_progress(fraction)` hears how much of the case's arithmetic is done, after every
    query-block row (the golden and the benchmark walks count alike). `kernel_range`, if given, gathers the
    range of the benchmark's P and dS before they are rounded (`golden.watching`).
    """
    tensors, mask = make_tensors(case, jobs), make_mask(case)
    pairs = int(mask_stats(case, mask)["selected_blocks"]) if case.expect_of("backward").ok else 0  # refused: no walk
    progress = _Progress(pairs * _PASSES, on_progress)
    return _backward_arrays(case, tensors, mask, precision, jobs, progress, kernel_range)


def _backward_arrays(
    case: Case,
    drawn: Mapping[str, np.ndarray],
    mask: np.ndarray,
    precision: str,
    jobs: int,
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
        out, lse, gold, bench = golden.golden_and_benchmark(case, *arrays, precision, jobs)
    tensors["attention_out"] = out
    tensors["softmax_lse"] = lse.reshape(case.lse_shape_dims)
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
    stats: dict[str, Any] = field(default_factory=dict)
    """The mask's statistics (`inputs.mask_stats`) for an op folder's manifest; the backward's are its own."""
    block_mask: np.ndarray | None = None
    """An op folder's mask as drawn (the forward's written rows for its benchmark summary); None: the backward."""


_OP_PASSES: Mapping[Op, int] = {"backward": _PASSES, "forward": 2, "chain": 4, "autograd": 4}
"""Walks over the selected blocks per op (the forward: golden and kernel forward; the pair: both of each)."""


def compute_ops(
    case: Case,
    precision: str = "float32",
    jobs: int = 1,
    on_progress: Callable[[float], None] | None = None,
    ops: Sequence[Op] | None = None,
) -> dict[Op, OpArrays]:
    """Return the arrays of each op's folder of a case (`ops`: those of `case.ops` to make, default all), as
    `each_op` computes them."""
    return dict(each_op(case, precision, jobs, on_progress, ops))


def each_op(
    case: Case,
    precision: str = "float32",
    jobs: int = 1,
    on_progress: Callable[[float], None] | None = None,
    ops: Sequence[Op] | None = None,
) -> Iterator[tuple[Op, OpArrays]]:
    """Yield (op, the arrays of its folder) for the ops of a case (`ops`: those of `case.ops` to make, default
    all), in `OPS` order, each computed when asked for (so a caller that writes each folder before asking
    for the next holds one op's arrays at a time, the pair's shared by chain and autograd).

    The inputs are drawn once and shared (the same bytes in every folder; the forward's mask as int8); each
    golden is computed once: the backward's as `compute_case`, the forward's by
    `golden.forward_golden_and_benchmark`, the pair's (chain and autograd alike) by
    `golden.chain_golden_and_benchmark`. A skipped op gets only its reason, a negative op (its
    `case.expect_of` not ok) its call's inputs. Progress as `compute_case`, over every op made.
    """
    todo = [op for op in case.ops if ops is None or op in ops]
    tensors, mask = make_tensors(case, jobs), make_mask(case)
    # a case every op refuses may have no geometry to count blocks in (the backward's folder counts its own)
    stats = mask_stats(case, mask) if any(case.expect_of(op).ok for op in todo) else {}
    made = [op for op in todo if case.skip_reason(op) is None and case.expect_of(op).ok]
    walks = sum(_OP_PASSES[op] for op in made if op != "autograd" or "chain" not in made)  # the pair once
    progress = _Progress(int(stats.get("selected_blocks", 0)) * walks, on_progress)
    pair: OpArrays | None = None
    for op in todo:
        reason = case.skip_reason(op)
        if reason is not None:
            yield op, OpArrays(skip=reason, stats=stats)
        elif op == "backward":
            kernel_range = golden.KernelRange()
            arrays = _backward_arrays(case, tensors, mask, precision, jobs, progress, kernel_range)
            yield op, OpArrays(*arrays, kernel_range=kernel_range)
        else:
            called = {name: tensors[name] for name in OP_INPUT_NAMES[op] if name in tensors}
            inputs = call_inputs(op_case(case, op), {**called, "block_sparse_mask": mask})
            if not case.expect_of(op).ok:
                yield op, OpArrays(inputs, stats=stats)
            elif op == "forward":
                with golden.reporting(progress.pairs):
                    computed = golden.forward_golden_and_benchmark(
                        case, tensors["query"], tensors["key"], tensors["value"], mask, precision, jobs
                    )
                gold = dict(zip(("out", "lse"), computed[:2], strict=True))
                bench = dict(zip(("out", "lse"), computed[2:], strict=True))
                yield op, OpArrays(inputs, _lse_shaped(case, gold), _lse_shaped(case, bench), None, None, stats, mask)
            else:
                if pair is None:
                    kernel_range = golden.KernelRange()
                    with golden.reporting(progress.pairs), golden.watching(kernel_range):
                        gold, bench = golden.chain_golden_and_benchmark(
                            case,
                            tensors["dout"],
                            tensors["query"],
                            tensors["key"],
                            tensors["value"],
                            mask,
                            precision,
                            jobs,
                        )
                    pair = OpArrays({}, _lse_shaped(case, gold), _lse_shaped(case, bench), None, kernel_range)
                yield op, OpArrays(inputs, pair.golden, pair.benchmark, None, pair.kernel_range, stats, mask)


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
