"""Generate a case's folders, one per op it tests: inputs, golden and kernel-faithful benchmark, manifest.

The arrays come from `case_arrays` (inputs drawn once per case, each golden computed once); this module
writes them (`store.CaseWriter`), with the benchmark summary of a backward folder, the fingerprint of
each folder, and runs suites in worker processes.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, fields, replace
from pathlib import Path
from queue import Empty
from typing import Any

import numpy as np

from .. import compare, golden
from .._version import __version__
from ..core import rounding
from ..core.case import PRECISIONS as PRECISIONS
from ..core.case import Case, Precision, numpy_dtype
from ..core.errors import DataError
from ..core.untrusted import is_case_name
from ..core.workers import worker_pool
from ..inputs import mask_stats
from ..ops import Op, folder_name, get
from ..store import MANIFEST, CaseWriter, load_manifest, remove_leftovers, verify_inputs
from ..store.manifest import build_manifest, flat_params
from .arrays import DEFAULT_SETTINGS, OpArrays, each_op
from .arrays import compute_case as compute_case
from .arrays import compute_ops as compute_ops
from .schedule import available_memory, estimate
from .settings import GenSettings

#: (path, default) of case fields added after fingerprints were first written: left out of the fingerprint
#: at their default, so cases that do not use them keep the fingerprint they had.
FINGERPRINT_DEFAULTS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("sparsity", "causal_alignment"), "top_left"),
    (("init", "sink"), None),
    (("init", "logit_std"), None),
    (("expect", "verdict"), "PASS"),
    (("expect", "cause"), None),
    (("inner_precise",), 0),
    (("softmax_lse_flag",), 1),
    (("step_scales",), ()),
    (("copies",), ()),
    *(
        (("init", tensor, key), None)
        for tensor in ("query", "key", "value", "dout")
        for key in ("outliers", "row_scale")
    ),
)


def fingerprint(case: Case, precision: Precision, op: str = "backward") -> str:
    """Return a digest of everything that determines the files of one op's folder of a case (spec values,
    precision, bsa version, the op and what it must return).

    The ops a case lists are left out (each folder has its own), and so are the forward's parameters from
    the backward's: a case of the default ops keeps the fingerprint it had before ops existed.
    """
    fields = asdict(case)
    forward_params = () if get(op).calls_forward else ("inner_precise", "softmax_lse_flag")
    step_scales = () if get(op).scales_per_step else ("step_scales",)  # only a chain's folder calls them
    for key in ("source", "warnings", "ops", "op_expect", "skipped_ops", *forward_params, *step_scales):
        fields.pop(key)
    fields["expect"] = asdict(case.expect_of(op))
    if not get(op).is_default:
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


def is_current(case: Case, case_dir: Path, precision: Precision, op: str = "backward") -> bool:
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


def generate_case(case: Case, out_root: Path, settings: GenSettings = DEFAULT_SETTINGS) -> Path:
    """Write the case's folders (`generate_case_ops`) and return the first: `out_root/<case.name>` for a case
    of the default ops (the backward alone), whose folder is exactly the case of old."""
    return generate_case_ops(case, out_root, settings)[0]


def generate_case_ops(case: Case, out_root: Path, settings: GenSettings = DEFAULT_SETTINGS) -> list[Path]:
    """Write one folder per op of the case (`settings.ops`: only those, default all of `case.ops`), each
    atomically, and return them in `OPS` order (progress as `compute_case`, over every op).

    Each folder is written before the next op is computed (`each_op`), so one op's arrays are held at a time.

    Raises:
        DataError: an op's golden is not finite (the case's values overflow: that folder and the later ones
            are not written), or a folder cannot be written (a full disk, no permission); nothing of a
            folder is left half-written.

    With `settings.jobs` > 1 the files are written (and hashed) in threads while this thread measures the
    benchmark.
    """
    if not is_case_name(case.name):
        raise DataError(
            str(Path(out_root) / case.name), "a case name must name one visible folder inside the output folder"
        )
    written: list[Path] = []
    computed = each_op(case, settings)
    while True:
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below, once
            found = next(computed, None)
        if found is None:
            return written
        op, arrays = found
        final_dir = Path(out_root) / folder_name(case.name, op)
        _check_finite(arrays.golden, final_dir, settings.precision)
        try:
            written.append(_write_case(case, final_dir, settings, op, arrays))
        except OSError as exc:
            raise DataError(str(final_dir), f"cannot be written: {exc.strerror or exc}") from None


def _check_finite(gold: Mapping[str, np.ndarray], final_dir: Path, precision: Precision) -> None:
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


def _write_case(case: Case, final_dir: Path, settings: GenSettings, op: Op, arrays: OpArrays) -> Path:
    tensors, gold, bench, precision = arrays.inputs, arrays.golden, arrays.benchmark, settings.precision
    files = [(f"inputs/{name}.bin", array, _dtype_name(array)) for name, array in tensors.items()]
    files += [(f"golden/{name}.bin", array, precision) for name, array in gold.items()]
    files += [(f"benchmark/{name}.bin", a, "float32" if name == "lse" else case.dtype) for name, a in bench.items()]
    with CaseWriter(final_dir) as writer, _Writers(writer, settings.jobs) as written:
        pending = written.all(files)
        summary = None
        if bench:  # out over the forward's written rows (the mask), dq, dk, dv; lse is measured when judged
            masked = () if arrays.block_mask is None else (arrays.block_mask,)
            summary = compare.summarize_benchmark(case.as_called(), compare.case_settings(case), gold, bench, *masked)
        entries = pending()
        inputs = {name: entries[f"inputs/{name}.bin"] for name in tensors}
        golden_entries = {name: entries[f"golden/{name}.bin"] for name in gold}
        bench_entries = {name: entries[f"benchmark/{name}.bin"] for name in bench}
        mask, stats = tensors.get("block_sparse_mask"), arrays.stats
        if op.is_default:  # the case folder of old: its own mask's statistics, as it always had
            stats = mask_stats(case, mask) if mask is not None and mask.shape == case.mask_shape else {}
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


#: Share of the nonzero P or dS values of the kernel path flushed to zero from which the manifest notes it.
UNDERFLOW_NOTE_SHARE = 0.01


def kernel_path_record(kernel_range: golden.KernelRange) -> dict[str, Any]:
    """Return the range of the benchmark's P and dS before rounding, as the manifest records it."""
    names = [field.name for field in fields(kernel_range) if field.repr]  # its counts, in order (not its lock)
    return {name.replace("flushed", "flushed_to_zero"): getattr(kernel_range, name) for name in names}


def kernel_path_notes(
    case: Case, kernel_range: golden.KernelRange, gold: Mapping[str, np.ndarray], bench: Mapping[str, np.ndarray]
) -> list[str]:
    """Say where the kernel path overflows or underflows the input dtype, as the benchmark (which rounds P and
    dS, and the gradients, as the kernel does) shows it: dS (or P) beyond the dtype's largest number rounds to
    inf; a share of nonzero P or dS values that flush to zero beyond `UNDERFLOW_NOTE_SHARE`; a benchmark
    gradient that is not finite where the golden is."""
    notes = []
    dtype = numpy_dtype(case.dtype)
    largest = rounding.largest(dtype)
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
    settings: GenSettings = DEFAULT_SETTINGS,
    *,
    skip_current: bool = False,
    on_done: Callable[[Case, str, Path], None] | None = None,
    memory_budget: int | None = None,
) -> list[Path]:
    """Generate every case; return their folders in the order of `cases`, each case's ops in `OPS` order
    (`case_folders`: one folder per op, the backward's `NAME`, the others `NAME@op`).

    With `settings.jobs` > 1 and several cases, cases run in up to `jobs` processes, largest first, and only
    as many at once as their estimated peak memory allows within `memory_budget` bytes (default: the memory
    available now; 0 or unknown: no limit; a case too large for the budget runs alone). A single case
    runs its golden and benchmark walks in up to `jobs` threads instead. With `skip_current`, the folders
    that already hold the same generation (`is_current`) are left as they are (a case whose folders are
    all current is not computed at all; otherwise only its other ops are).
    `on_done(case, outcome, path)` is called as each case ends, outcome "generated" or "current", `path` its
    first folder; `settings.on_progress(case, fraction)` as its arithmetic advances (from worker processes,
    in steps of 1%).
    """
    out_root = Path(out_root)
    remove_leftovers(out_root)
    todo: list[tuple[Case, GenSettings]] = []
    for case in cases:
        ops = tuple(
            get(op)
            for op in case.ops
            if not (skip_current and is_current(case, out_root / folder_name(case.name, op), settings.precision, op))
        )
        if not ops:
            if on_done:
                on_done(case, "current", case_folders(case, out_root)[0])
        else:
            todo.append((case, replace(settings, ops=ops)))
    if settings.jobs > 1 and len(todo) > 1:
        budget = available_memory() if memory_budget is None else memory_budget
        _generate_in_processes(todo, out_root, min(settings.jobs, len(todo)), budget, on_done, settings.on_progress)
    else:
        for case, stale in todo:
            paths = generate_case_ops(case, out_root, stale)
            if on_done:
                on_done(case, "generated", paths[0])
    return [path for case in cases for path in case_folders(case, out_root)]


def _generate_in_processes(
    todo: Sequence[tuple[Case, GenSettings]],
    out_root: Path,
    jobs: int,
    budget: int,
    on_done: Callable[[Case, str, Path], None] | None,
    on_progress: Callable[[Case, float], None] | None,
) -> None:
    """Generate cases (each with its settings: the ops to make) in `jobs` processes, largest first, keeping the
    running cases' peak memory in `budget`.

    Workers send their cases' progress back through a queue, read here between completions; each worker
    makes its case in one thread.
    """
    peaks = {case.name: estimate(case).peak_memory for case, _ in todo}
    waiting = sorted(todo, key=lambda item: (-peaks[item[0].name], item[0].name))
    running: dict[Future[list[Path]], Case] = {}
    queue = multiprocessing.get_context("spawn").Queue() if on_progress is not None else None
    with worker_pool(jobs, initializer=_report_to, initargs=(queue,)) as pool:
        try:
            while waiting or running:
                in_use = sum(peaks[c.name] for c in running.values())
                for case, settings in list(waiting):
                    if len(running) == jobs:
                        break
                    if not running or not budget or in_use + peaks[case.name] <= budget:
                        alone = replace(settings, jobs=1, on_progress=None)
                        running[pool.submit(_generate_reporting, case, out_root, alone)] = case
                        in_use += peaks[case.name]
                        waiting.remove((case, settings))
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


#: How often the progress of cases in worker processes is read.
_PROGRESS_SECONDS = 0.25

#: In a worker process: the queue its cases' progress goes back through (None: not reported).
_REPORTS: Any = None


def _report_to(queue: Any) -> None:
    global _REPORTS
    _REPORTS = queue
    if queue is not None:
        queue.cancel_join_thread()  # a worker never waits at exit for progress nobody reads any more


def _generate_reporting(case: Case, out_root: Path, settings: GenSettings) -> list[Path]:
    """`generate_case_ops` in a worker, sending (case name, fraction done) back at each 1% (`_report_to`)."""
    queue = _REPORTS
    sent = [0.0]

    def report(_case: Case, fraction: float) -> None:
        if queue is not None and fraction - sent[0] >= 0.01:
            sent[0] = fraction
            queue.put((case.name, fraction))

    return generate_case_ops(case, out_root, replace(settings, on_progress=report))


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
    return "bfloat16" if rounding.is_bfloat16(array.dtype) else array.dtype.name
