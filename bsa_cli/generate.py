"""Generate one case directory: inputs, golden forward, golden and kernel-faithful backward, manifest."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

import ml_dtypes
import numpy as np

from . import compare, golden
from ._version import __version__
from .case import Case, numpy_dtype
from .errors import DataError
from .golden import KernelRange
from .inputs import call_inputs, draw, make_mask, make_tensors, mask_stats
from .manifest import GRAD_NAMES, build_manifest, flat_params
from .op_folders import OP_INPUT_NAMES, op_case
from .ops import FORWARD_OPS, Op, folder_name
from .schedule import available_memory, estimate
from .store import MANIFEST, CaseWriter, load_manifest, remove_leftovers, verify_inputs
from .untrusted import is_case_name
from .workers import worker_pool

PRECISIONS = ("float32", "float64")

FINGERPRINT_DEFAULTS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("sparsity", "causal_alignment"), "top_left"),
    (("init", "sink"), None),
    (("init", "logit_std"), None),
    (("expect", "verdict"), "PASS"),
    (("expect", "cause"), None),
    (("ops",), ("backward",)),
    (("inner_precise",), 0),
    (("softmax_lse_flag",), 1),
    (("op_expect",), ()),
    (("skipped_ops",), ()),
    *(
        (("init", tensor, key), None)
        for tensor in ("query", "key", "value", "dout")
        for key in ("outliers", "row_scale")
    ),
)
"""(path, default) of case fields added after fingerprints were first written: left out of the fingerprint
at their default, so cases that do not use them keep the fingerprint they had."""


def fingerprint(case: Case, precision: str, op: Op = "backward") -> str:
    """Return a digest of everything that determines the files of one op's folder of a case (spec values,
    precision, bsa version, the op and what it must return).

    The ops a case lists are left out (each folder has its own), and so are the forward's parameters from
    the backward's: a case of the default ops keeps the fingerprint it had before ops existed.
    """
    fields = asdict(case)
    fields.pop("source", None)
    fields.pop("warnings", None)
    for key in (
        "ops",
        "op_expect",
        "skipped_ops",
        *(() if op in FORWARD_OPS else ("inner_precise", "softmax_lse_flag")),
    ):
        fields.pop(key)
    fields["expect"] = asdict(case.expect_of(op))
    if op != "backward":
        fields["op"] = op
    if case.skip_reason(op) is not None:
        fields["skip"] = case.skip_reason(op)
    for (*parents, key), default in FINGERPRINT_DEFAULTS:
        node = fields
        for parent in parents:
            node = node[parent]
        if key in node and node.get(key) == default:
            node.pop(key)  # a key added later leaves earlier cases' fingerprints as they were
    explicit = case.sparsity.explicit
    fields["sparsity"]["explicit"] = None if explicit is None else np.packbits(explicit).tobytes().hex()
    text = json.dumps([fields, precision, __version__], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def is_current(case: Case, case_dir: Path, precision: str, op: Op = "backward") -> bool:
    """Return whether `case_dir` already holds this op of the case, generated the same way, with intact inputs."""
    if case_dir.is_symlink() or not (case_dir / MANIFEST).is_file():
        return False  # a link is never taken for a case: it is replaced, its target left alone
    try:
        manifest = load_manifest(case_dir)
        if manifest.fingerprint != fingerprint(case, precision, op):
            return False
        verify_inputs(case_dir, manifest)
    except DataError:
        return False
    return True


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
    progress = _Progress(int(mask_stats(case, mask)["selected_blocks"]) * _PASSES, on_progress)
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


_OP_PASSES: Mapping[Op, int] = {"backward": _PASSES, "forward": 2, "chain": 4, "autograd": 4}
"""Walks over the selected blocks per op (the forward: golden and kernel forward; the pair: both of each)."""


def compute_ops(
    case: Case,
    precision: str = "float32",
    jobs: int = 1,
    on_progress: Callable[[float], None] | None = None,
    ops: Sequence[Op] | None = None,
) -> dict[Op, OpArrays]:
    """Return the arrays of each op's folder of a case (`ops`: those of `case.ops` to make, default all).

    The inputs are drawn once and shared (the same bytes in every folder; the forward's mask as int8); each
    golden is computed once: the backward's as `compute_case`, the forward's by
    `golden.forward_golden_and_benchmark`, the pair's (chain and autograd alike) by
    `golden.chain_golden_and_benchmark`. A skipped op gets only its reason, a negative op (its
    `case.expect_of` not ok) its call's inputs. Progress as `compute_case`, over every op made.
    """
    todo = [op for op in case.ops if ops is None or op in ops]
    tensors, mask = make_tensors(case, jobs), make_mask(case)
    pairs = int(mask_stats(case, mask)["selected_blocks"])  # counted once more below: cheap beside a walk
    made = [op for op in todo if case.skip_reason(op) is None and case.expect_of(op).ok]
    progress = _Progress(
        pairs * sum(_OP_PASSES[op] for op in made if op != "autograd" or "chain" not in made), on_progress
    )
    found: dict[Op, OpArrays] = {}
    pair: OpArrays | None = None
    stats = mask_stats(case, mask)
    for op in todo:
        reason = case.skip_reason(op)
        if reason is not None:
            found[op] = OpArrays(skip=reason, stats=stats)
        elif op == "backward":
            kernel_range = golden.KernelRange()
            found[op] = OpArrays(*_backward_arrays(case, tensors, mask, precision, jobs, progress, kernel_range))
            found[op].kernel_range = kernel_range
        else:
            called = {name: tensors[name] for name in OP_INPUT_NAMES[op] if name in tensors}
            inputs = call_inputs(op_case(case, op), {**called, "block_sparse_mask": mask})
            if not case.expect_of(op).ok:
                found[op] = OpArrays(inputs, stats=stats)
            elif op == "forward":
                with golden.reporting(progress.pairs):
                    computed = golden.forward_golden_and_benchmark(
                        case, tensors["query"], tensors["key"], tensors["value"], mask, precision, jobs
                    )
                gold = dict(zip(("out", "lse"), computed[:2], strict=True))
                bench = dict(zip(("out", "lse"), computed[2:], strict=True))
                found[op] = OpArrays(inputs, _lse_shaped(case, gold), _lse_shaped(case, bench), stats=stats)
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
                found[op] = OpArrays(inputs, pair.golden, pair.benchmark, None, pair.kernel_range, stats)
    return found


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


def case_folders(case: Case, out_root: Path) -> list[Path]:
    """Return the folders of a case's ops under `out_root`, in `OPS` order (the backward's: `NAME`)."""
    return [Path(out_root) / folder_name(case.name, op) for op in case.ops]


def generate_case(
    case: Case,
    out_root: Path,
    precision: str = "float32",
    jobs: int = 1,
    on_progress: Callable[[float], None] | None = None,
) -> Path:
    """Write the case's folders (`generate_case_ops`) and return the first: `out_root/<case.name>` for a case
    of the default ops (the backward alone), whose folder is exactly the case of old."""
    return generate_case_ops(case, out_root, precision, jobs, on_progress)[0]


def generate_case_ops(
    case: Case,
    out_root: Path,
    precision: str = "float32",
    jobs: int = 1,
    on_progress: Callable[[float], None] | None = None,
    ops: Sequence[Op] | None = None,
) -> list[Path]:
    """Write one folder per op of the case (`ops`: only those, default all of `case.ops`), each atomically,
    and return them in `OPS` order (progress as `compute_case`, over every op).

    Raises:
        DataError: a golden is not finite (the case's values overflow), or a folder cannot be written
            (a full disk, no permission); nothing of it is left half-written, and no folder is written when
            a golden is not finite.

    With `jobs` > 1 the files are written (and hashed) in threads while this thread measures the benchmark.
    """
    if not is_case_name(case.name):
        raise DataError(
            str(Path(out_root) / case.name), "a case name must name one visible folder inside the output folder"
        )
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below, once
        computed = compute_ops(case, precision, jobs, on_progress, ops)
    for op, arrays in computed.items():
        for name, array in arrays.golden.items():
            # lse is the empty-row value where nothing is selected (inf, by default): never judged there
            if name != "lse" and array.size and not (np.isfinite(array.max()) and np.isfinite(array.min())):
                bad = int(np.count_nonzero(~np.isfinite(array)))
                raise DataError(
                    str(Path(out_root) / folder_name(case.name, op)),
                    f"the golden {name} has {bad} non-finite values ({precision}): "
                    "the case's scale or init values overflow; make them smaller",
                )
    written = []
    for op, arrays in computed.items():
        final_dir = Path(out_root) / folder_name(case.name, op)
        try:
            written.append(_write_case(case, final_dir, precision, jobs, op, arrays))
        except OSError as exc:
            raise DataError(str(final_dir), f"cannot be written: {exc.strerror or exc}") from None
    return written


def _write_case(case: Case, final_dir: Path, precision: str, jobs: int, op: Op, arrays: OpArrays) -> Path:
    tensors, gold, bench = arrays.inputs, arrays.golden, arrays.benchmark
    files = [(f"inputs/{name}.bin", array, _dtype_name(array)) for name, array in tensors.items()]
    files += [(f"golden/{name}.bin", array, precision) for name, array in gold.items()]
    files += [(f"benchmark/{name}.bin", a, "float32" if name == "lse" else case.dtype) for name, a in bench.items()]
    with CaseWriter(final_dir) as writer, _Writers(writer, jobs) as written:
        pending = written.all(files)
        # the summary measures dq, dk, dv; an op folder's compare measures its benchmark from the files
        measured = bench and op == "backward"
        summary = compare.summarize_benchmark(case, compare.case_settings(case), gold, bench) if measured else None
        entries = pending()
        inputs = {name: entries[f"inputs/{name}.bin"] for name in tensors}
        golden_entries = {name: entries[f"golden/{name}.bin"] for name in gold}
        bench_entries = {name: entries[f"benchmark/{name}.bin"] for name in bench}
        mask = tensors.get("block_sparse_mask")
        stats = arrays.stats if op != "backward" else {}
        if op == "backward" and mask is not None and mask.shape == case.mask_shape:
            stats = mask_stats(case, mask)
        manifest = build_manifest(case, inputs, golden_entries, bench_entries, stats, op, arrays.skip)
        if bench:
            kernel_range = arrays.kernel_range or golden.KernelRange()
            if arrays.kernel_range is not None:
                manifest["kernel_path"] = kernel_path_record(kernel_range)
            manifest["notes"] = kernel_path_notes(case, kernel_range, gold, bench)
        if summary is not None:
            document = compare.summary_document(summary)
            document["tiles"] = {
                name: writer.array(f"benchmark/{name}.tiles.bin", tiles, "float32")
                for name, tiles in summary.tiles.items()
            }
            manifest["benchmark_summary"] = document
        manifest["generator"]["fingerprint"] = fingerprint(case, precision, op)
        manifest["generator"]["golden_precision"] = precision
        if case.sparsity.explicit_source:
            manifest["generator"]["explicit_mask"] = case.sparsity.explicit_source
        return writer.commit(manifest, flat_params(manifest))


UNDERFLOW_NOTE_SHARE = 0.01
"""Share of the nonzero P or dS values of the kernel path flushed to zero from which the manifest notes it."""


def kernel_path_record(kernel_range: golden.KernelRange) -> dict[str, Any]:
    """Return the range of the benchmark's P and dS before rounding, as the manifest records it."""
    return {
        "max_abs_probs": kernel_range.max_abs_probs,
        "max_abs_dscores": kernel_range.max_abs_dscores,
        "probs_nonzero": kernel_range.probs_nonzero,
        "probs_flushed_to_zero": kernel_range.probs_flushed,
        "dscores_nonzero": kernel_range.dscores_nonzero,
        "dscores_flushed_to_zero": kernel_range.dscores_flushed,
    }


def kernel_path_notes(
    case: Case, kernel_range: golden.KernelRange, gold: Mapping[str, np.ndarray], bench: Mapping[str, np.ndarray]
) -> list[str]:
    """Say where the kernel path overflows or underflows the input dtype, as the benchmark (which rounds P and
    dS, and the gradients, as the kernel does) shows it: dS (or P) beyond the dtype's largest number rounds to
    inf; a share of nonzero P or dS values that flush to zero beyond `UNDERFLOW_NOTE_SHARE`; a benchmark
    gradient that is not finite where the golden is."""
    notes = []
    dtype = numpy_dtype(case.dtype)
    largest = float(ml_dtypes.finfo(dtype).max)
    for name, what in (("dscores", "dS"), ("probs", "P")):
        top = getattr(kernel_range, f"max_abs_{name}")
        if top > largest:
            notes.append(
                f"{case.dtype} overflow: max |{what}| in the kernel path is {top:.6g}, beyond {case.dtype}'s "
                f"largest number {largest:.6g}: the benchmark's {what} rounds to inf there"
            )
        nonzero, flushed = getattr(kernel_range, f"{name}_nonzero"), getattr(kernel_range, f"{name}_flushed")
        if nonzero and flushed / nonzero > UNDERFLOW_NOTE_SHARE:
            notes.append(
                f"{case.dtype} underflow: {flushed} of {nonzero} nonzero {what} values "
                f"({100 * flushed / nonzero:.1f}%) in the kernel path flush to zero when rounded to "
                f"{case.dtype}"
            )
    for name, array in bench.items():
        if array.size and not np.isfinite(array.astype(np.float32)).all():
            bad = int(np.count_nonzero(~np.isfinite(array.astype(np.float32))))
            if np.isfinite(gold[name]).all():
                notes.append(
                    f"{case.dtype} overflow: the benchmark {name} has {bad} non-finite values where the "
                    "golden is finite"
                )
    return notes


class _Writers:
    """Writes a case's arrays through a `CaseWriter`: in this thread, or in threads of its own (`jobs` > 1)."""

    def __init__(self, writer: CaseWriter, jobs: int) -> None:
        self.writer = writer
        self.pool = ThreadPoolExecutor(min(jobs, 4), thread_name_prefix="bsa-write") if jobs > 1 else None

    def __enter__(self) -> _Writers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def all(self, files: list[tuple[str, np.ndarray, str]]) -> Callable[[], dict[str, dict[str, Any]]]:
        """Start writing (relative path, array, dtype name) files; return a call that waits and gives their entries."""
        if self.pool is None:
            entries = {path: self.writer.array(path, array, dtype) for path, array, dtype in files}
            return lambda: entries
        futures = {path: self.pool.submit(self.writer.array, path, array, dtype) for path, array, dtype in files}
        return lambda: {path: future.result() for path, future in futures.items()}


def generate_suite(
    cases: Sequence[Case],
    out_root: Path,
    precision: str = "float32",
    jobs: int = 1,
    *,
    skip_current: bool = False,
    on_done: Callable[[Case, str, Path], None] | None = None,
    on_progress: Callable[[Case, float], None] | None = None,
    memory_budget: int | None = None,
) -> list[Path]:
    """Generate every case; return their folders in the order of `cases`, each case's ops in `OPS` order
    (`case_folders`: one folder per op, the backward's `NAME`, the others `NAME@op`).

    With `jobs` > 1 and several cases, cases run in up to `jobs` processes, largest first, and only as
    many at once as their estimated peak memory allows within `memory_budget` bytes (default: the memory
    available now; 0 or unknown: no limit; a case too large for the budget runs alone). A single case
    runs its golden and benchmark walks in up to `jobs` threads instead. With `skip_current`, the folders
    that already hold the same generation (`is_current`) are left as they are (a case whose folders are
    all current is not computed at all; otherwise only its other ops are).
    `on_done(case, outcome, path)` is called as each case ends, outcome "generated" or "current", `path` its
    first folder; `on_progress(case, fraction)` as its arithmetic advances (from worker processes, in steps
    of 1%).
    """
    out_root = Path(out_root)
    remove_leftovers(out_root)
    todo, stale = [], {}
    for case in cases:
        ops = tuple(
            op
            for op in case.ops
            if not (skip_current and is_current(case, out_root / folder_name(case.name, op), precision, op))
        )
        if not ops:
            if on_done:
                on_done(case, "current", case_folders(case, out_root)[0])
        else:
            todo.append(case)
            stale[case.name] = ops
    if jobs > 1 and len(todo) > 1:
        budget = available_memory() if memory_budget is None else memory_budget
        _generate_in_processes(
            todo, out_root, precision, min(jobs, len(todo)), budget, on_done, on_progress, stale=stale
        )
    else:
        for case in todo:
            listen = None if on_progress is None else functools.partial(on_progress, case)
            paths = generate_case_ops(case, out_root, precision, jobs, listen, stale[case.name])
            if on_done:
                on_done(case, "generated", paths[0])
    return [path for case in cases for path in case_folders(case, out_root)]


def _generate_in_processes(
    cases: Sequence[Case],
    out_root: Path,
    precision: str,
    jobs: int,
    budget: int,
    on_done: Callable[[Case, str, Path], None] | None,
    on_progress: Callable[[Case, float], None] | None = None,
    *,
    stale: Mapping[str, Sequence[Op]] | None = None,
) -> None:
    """Generate cases in `jobs` processes, largest first, keeping the running cases' peak memory in `budget`.

    Workers send their cases' progress back through a queue, read here between completions. `stale`: the
    ops to make of each case by name (default all).
    """
    peaks = {case.name: estimate(case).peak_memory for case in cases}
    waiting = sorted(cases, key=lambda c: (-peaks[c.name], c.name))
    running: dict[Future[list[Path]], Case] = {}
    queue = multiprocessing.get_context("spawn").Queue() if on_progress is not None else None
    with worker_pool(jobs, initializer=_report_to, initargs=(queue,)) as pool:
        try:
            while waiting or running:
                in_use = sum(peaks[c.name] for c in running.values())
                for case in list(waiting):
                    if len(running) == jobs:
                        break
                    if not running or not budget or in_use + peaks[case.name] <= budget:
                        ops = None if stale is None else stale.get(case.name)
                        running[pool.submit(_generate_reporting, case, out_root, precision, ops)] = case
                        in_use += peaks[case.name]
                        waiting.remove(case)
                finished, _ = wait(running, timeout=_PROGRESS_SECONDS if queue else None, return_when=FIRST_COMPLETED)
                if queue is not None and on_progress is not None:
                    _pass_on(queue, {case.name: case for case in running.values()}, on_progress)
                for future in finished:
                    case = running.pop(future)
                    try:
                        path = future.result()[0]
                    except BrokenProcessPool:
                        raise DataError(
                            str(out_root / case.name),
                            "its worker process died (out of memory? killed?); try fewer processes with -j",
                        ) from None
                    if on_done:
                        on_done(case, "generated", path)
        except BaseException:
            for future in running:
                future.cancel()
            raise


_PROGRESS_SECONDS = 0.25
"""How often the progress of cases in worker processes is read."""

_REPORTS: Any = None
"""In a worker process: the queue its cases' progress goes back through (None: not reported)."""


def _report_to(queue: Any) -> None:
    global _REPORTS
    _REPORTS = queue
    if queue is not None:
        queue.cancel_join_thread()  # a worker never waits at exit for progress nobody reads any more


def _generate_reporting(case: Case, out_root: Path, precision: str, ops: Sequence[Op] | None = None) -> list[Path]:
    """`generate_case_ops` in a worker, sending (case name, fraction done) back at each 1% (`_report_to`)."""
    queue = _REPORTS
    sent = [0.0]

    def report(fraction: float) -> None:
        if queue is not None and fraction - sent[0] >= 0.01:
            sent[0] = fraction
            queue.put((case.name, fraction))

    return generate_case_ops(case, out_root, precision, on_progress=report, ops=ops)


def _pass_on(queue: Any, running: Mapping[str, Case], on_progress: Callable[[Case, float], None]) -> None:
    """Hand the progress waiting in `queue` to `on_progress`, for cases still running (late news of a case
    already done is dropped)."""
    while True:
        try:
            name, fraction = queue.get_nowait()
        except Empty:
            return
        if name in running:
            on_progress(running[name], fraction)


def _dtype_name(array: np.ndarray) -> str:
    name = "bfloat16" if array.dtype == numpy_dtype("bfloat16") else array.dtype.name
    return name
