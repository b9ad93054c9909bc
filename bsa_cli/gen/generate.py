"""Generate a case's folders, one per op it tests: inputs, golden and kernel-faithful benchmark, manifest.

The arrays come from `case_arrays` (inputs drawn once per case, each golden computed once); this module
writes them (`store.CaseWriter`), with the benchmark summary of a backward folder, the fingerprint of
each folder, and runs suites in worker processes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path
from queue import Empty
from typing import Any

import ml_dtypes
import numpy as np

from .. import compare, golden
from .._version import __version__
from ..core.case import Case, numpy_dtype
from ..core.errors import DataError
from ..core.untrusted import is_case_name
from ..core.workers import worker_pool
from ..inputs import mask_stats
from ..ops import FORWARD_OPS, Op, folder_name
from ..store import MANIFEST, CaseWriter, load_manifest, remove_leftovers, verify_inputs
from ..store.manifest import build_manifest, flat_params
from .arrays import OpArrays, each_op
from .arrays import compute_case as compute_case
from .arrays import compute_ops as compute_ops
from .schedule import available_memory, estimate

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

    Each folder is written before the next op is computed (`each_op`), so one op's arrays are held at a time.

    Raises:
        DataError: an op's golden is not finite (the case's values overflow: that folder and the later ones
            are not written), or a folder cannot be written (a full disk, no permission); nothing of a
            folder is left half-written.

    With `jobs` > 1 the files are written (and hashed) in threads while this thread measures the benchmark.
    """
    if not is_case_name(case.name):
        raise DataError(
            str(Path(out_root) / case.name), "a case name must name one visible folder inside the output folder"
        )
    written: list[Path] = []
    computed = each_op(case, precision, jobs, on_progress, ops)
    while True:
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below, once
            found = next(computed, None)
        if found is None:
            return written
        op, arrays = found
        final_dir = Path(out_root) / folder_name(case.name, op)
        _check_finite(arrays.golden, final_dir, precision)
        try:
            written.append(_write_case(case, final_dir, precision, jobs, op, arrays))
        except OSError as exc:
            raise DataError(str(final_dir), f"cannot be written: {exc.strerror or exc}") from None


def _check_finite(gold: Mapping[str, np.ndarray], final_dir: Path, precision: str) -> None:
    """Raise DataError naming the first golden array with non-finite values (lse aside: it holds the empty
    rows' value, inf by default, where nothing is selected, and is never judged there)."""
    for name, array in gold.items():
        if name != "lse" and array.size and not (np.isfinite(array.max()) and np.isfinite(array.min())):
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise DataError(
                str(final_dir),
                f"the golden {name} has {bad} non-finite values ({precision}): "
                "the case's scale or init values overflow; make them smaller",
            )


def _write_case(case: Case, final_dir: Path, precision: str, jobs: int, op: Op, arrays: OpArrays) -> Path:
    tensors, gold, bench = arrays.inputs, arrays.golden, arrays.benchmark
    files = [(f"inputs/{name}.bin", array, _dtype_name(array)) for name, array in tensors.items()]
    files += [(f"golden/{name}.bin", array, precision) for name, array in gold.items()]
    files += [(f"benchmark/{name}.bin", a, "float32" if name == "lse" else case.dtype) for name, a in bench.items()]
    with CaseWriter(final_dir) as writer, _Writers(writer, jobs) as written:
        pending = written.all(files)
        summary = None
        if bench:  # out over the forward's written rows (the mask), dq, dk, dv; lse is measured when judged
            masked = () if arrays.block_mask is None else (arrays.block_mask,)
            summary = compare.summarize_benchmark(case, compare.case_settings(case), gold, bench, *masked)
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
    return "bfloat16" if array.dtype == numpy_dtype("bfloat16") else array.dtype.name
