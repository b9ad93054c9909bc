"""Judge a suite of cases, in this process or side by side in worker processes (`compare_suite`)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fnmatch
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from ..core.errors import DataError
from ..core.workers import cpu_count, worker_pool
from ..standards import RunSettings, resolve_settings, validate_settings
from ..store import OUTPUTS_DIR, check_unique_names, find_leftovers, load_manifest
from ..store.manifest import GRAD_NAMES
from .results import CaseResult, SuiteResult
from .verdict import _compare_case


def _check_run_thresholds(case_dirs: Sequence[Path], run: RunSettings) -> None:
    """Raise ValueError before any judging when a run threshold does not apply to some case's standard."""
    for case_dir in case_dirs:
        try:
            manifest = load_manifest(Path(case_dir))
            dtype = manifest.params["dtype"]
            case_settings = manifest.compare_settings
            validate_settings(case_settings or {})
        except (DataError, KeyError, TypeError, ValueError):
            continue  # the case will be an ERROR; its settings do not matter here
        try:
            resolve_settings(dtype, case_settings, run)
        except ValueError as exc:
            raise ValueError(f"case {manifest.name!r}: {exc}") from None


#: Device output bytes (384 MiB) from which a suite is judged in several processes by default. A worker
#: takes about half a second to start: on the 2-core development machine, 300 MB of outputs took as long
#: with two processes as with one, 600 MB 20-30% less.
PARALLEL_MIN_BYTES = 384 << 20


def suite_jobs(case_dirs: Sequence[Path], outputs_root: Path | None, jobs: int | None) -> int:
    """Return how many processes judge the suite: `jobs` if given, else the CPU count for a large suite, else 1."""
    if jobs is not None:
        return max(1, min(jobs, len(case_dirs)))
    if len(case_dirs) < 2:
        return 1
    total = sum(_output_bytes(_output_dir(Path(case_dir), outputs_root)) for case_dir in case_dirs)
    return min(cpu_count(), len(case_dirs)) if total >= PARALLEL_MIN_BYTES else 1


def _output_dir(case_dir: Path, outputs_root: Path | None) -> Path:
    return case_dir / OUTPUTS_DIR if outputs_root is None else Path(outputs_root) / case_dir.name


def _judge_in_worker(case_dir: Path, output_dir: Path, run: RunSettings, verify_inputs: bool) -> CaseResult:
    """Judge one case in a worker process, hashing alongside on a thread of its own."""
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as hashing:
        return _compare_case(case_dir, output_dir, run, hashing, verify_inputs)


#: Threads hashing a case's golden, benchmark and input files while the metrics are measured.
HASH_THREADS = 2


def compare_suite(
    case_dirs: Sequence[Path],
    outputs_root: Path | None = None,
    run: RunSettings | None = None,
    workers: int | None = None,
    on_case: Callable[[CaseResult], None] | None = None,
    verify_inputs: bool = True,
    jobs: int | None = 1,
    missing: Sequence[tuple[str, Path, str]] = (),
) -> SuiteResult:
    """Judge every case directory; a case that cannot be judged is an ERROR, the others still get judged.

    Args:
        case_dirs: case directories (see `store.select_cases`).
        outputs_root: where device outputs are, as `<outputs_root>/<case dir name>`; default each case's
            `outputs/`.
        run: settings given for the whole run.
        workers: threads hashing files while the metrics are measured, when judging in this process only
            (default: the CPU count; 1 hashes in the measuring thread, before the metrics). With several
            processes each has `HASH_THREADS`.
        on_case: called with each result as it is done (progress).
        verify_inputs: hash every input file (default), not only the block mask the judge reads.
        jobs: processes judging cases side by side; None picks `suite_jobs`'s default. Results are the
            same as with one process and come back in the order of `case_dirs`.
        missing: cases that should be there but are not (name, where, why: `missing_cases`): each is an
            ERROR after the judged ones, so a suite that lost a case never passes.

    Raises:
        ValueError: the run settings are invalid, or a run threshold does not apply to a case's standard.
        DataError: two case folders' manifests name the same case.
    """
    run = run or RunSettings()
    run.validate()
    started = time.perf_counter()
    check_unique_names(case_dirs)
    if run.thresholds:
        _check_run_thresholds(case_dirs, run)
    work = [(Path(case_dir), _output_dir(Path(case_dir), outputs_root)) for case_dir in case_dirs]
    processes = suite_jobs(case_dirs, outputs_root, jobs)
    if processes > 1:
        results = _judge_in_processes(work, run, verify_inputs, processes, on_case)
    else:
        results = []
        workers = workers or os.cpu_count() or 1
        with ThreadPoolExecutor(max_workers=workers) if workers > 1 else contextlib.nullcontext() as pool:
            for case_dir, output_dir in work:
                result = _compare_case(case_dir, output_dir, run, pool, verify_inputs)
                results.append(result)
                if on_case is not None:
                    on_case(result)
    results.extend(_missing_result(name, where, why) for name, where, why in missing)
    return SuiteResult(tuple(_qualified_names(results)), time.perf_counter() - started)


def _qualified_names(results: Sequence[CaseResult]) -> list[CaseResult]:
    """Give cases that suites side by side share a name (OUT/smoke/x, OUT/edge/x) their suite's folder as a
    prefix ("smoke/x", "edge/x"), so that a report, a merge and a baseline name each case once."""
    counts = collections.Counter(result.name for result in results)
    if all(n == 1 for n in counts.values()):
        return list(results)
    renamed = [
        dataclasses.replace(r, name=f"{Path(r.case_dir).parent.name}/{r.name}")
        if counts[r.name] > 1 and r.case_dir
        else r
        for r in results
    ]
    names = [r.name for r in renamed]
    # the same suite folder name twice: the case folder's whole path
    return [dataclasses.replace(r, name=str(r.case_dir)) if names.count(r.name) > 1 else r for r in renamed]


def missing_cases(
    roots: Sequence[Path], case_dirs: Sequence[Path], patterns: Sequence[str] = ()
) -> list[tuple[str, Path, str]]:
    """Return the cases of the folders of cases `roots` that are missing while a `bsa gen` left their
    temporary folders (`store.find_leftovers`): a case killed while being replaced, or one never finished.
    Cases not matched by `patterns` (globs of names; none: all) are left out.
    """
    present = {(Path(c).parent.resolve(), Path(c).name) for c in case_dirs}
    found: list[tuple[str, Path, str]] = []
    for root in roots:
        for left in find_leftovers(root):
            if (Path(root).resolve(), left.name) in present:
                continue
            if patterns and not any(fnmatch.fnmatchcase(left.name, p) for p in patterns):
                continue
            if left.writer_alive:
                why = f"a bsa gen (pid {left.pid}) is writing it now"
            elif left.complete_copy is not None:
                why = "a bsa gen was killed while replacing it; `bsa gen` again restores the complete copy"
            else:
                why = "a bsa gen was killed before it finished; run `bsa gen` again"
            text = f"{Path(root) / left.name}: the case is missing, only {left.path.name} is left: {why}"
            found.append((left.name, left.path, text))
    return found


def _missing_result(name: str, where: Path, why: str) -> CaseResult:
    return CaseResult.unjudged(name, [why], case_dir=str(where), output_dir=str(where), seconds=0.0)


def _judge_in_processes(
    work: Sequence[tuple[Path, Path]],
    run: RunSettings,
    verify_inputs: bool,
    processes: int,
    on_case: Callable[[CaseResult], None] | None,
) -> list[CaseResult]:
    """Judge cases here and in `processes - 1` fresh worker processes; return results in the order of `work`.

    All draw from one queue, largest case first. This process starts judging at once (a worker takes
    about half a second to start), and a thread keeps each worker fed. The cases of a worker that dies
    go back to the queue and are judged here. Workers ignore Ctrl-C: on an interrupt here no new case
    starts, the workers' cases in flight end unreported, and the interrupt goes on.
    """
    queue = collections.deque(sorted(range(len(work)), key=lambda i: -_output_bytes(work[i][1])))
    results: list[CaseResult | None] = [None] * len(work)
    lock = threading.Lock()
    stop = threading.Event()

    def take() -> int | None:
        with lock:
            return None if stop.is_set() or not queue else queue.popleft()

    def hand_back(indices: list[int]) -> None:
        with lock:
            queue.extendleft(sorted(indices, reverse=True))

    def finish(index: int, result: CaseResult) -> None:
        with lock:
            results[index] = result
            if on_case is not None and not stop.is_set():
                on_case(result)

    def feed(pool: ProcessPoolExecutor) -> None:
        running: dict[Future[CaseResult], int] = {}
        while True:
            while len(running) < processes - 1 and (index := take()) is not None:
                try:
                    running[pool.submit(_judge_in_worker, *work[index], run, verify_inputs)] = index
                except BrokenProcessPool:  # a worker died since the last case came back
                    hand_back([index, *running.values()])
                    return
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                index = running.pop(future)
                try:
                    result = future.result()
                except BrokenProcessPool:  # a worker died (killed, out of memory): this process takes over
                    hand_back([index, *running.values()])
                    return
                finish(index, result)

    def judge_here(hashing: Executor) -> None:
        while (index := take()) is not None:
            finish(index, _compare_case(*work[index], run, hashing, verify_inputs))

    with worker_pool(processes - 1, blas_threads=1, ignore_interrupt=True) as pool, ThreadPoolExecutor(1) as feeding:
        feeder = feeding.submit(feed, pool)  # its result re-raises what it raised (a worker's unexpected exception)
        try:
            with ThreadPoolExecutor(max_workers=HASH_THREADS) as hashing:
                judge_here(hashing)
                feeder.result()
                judge_here(hashing)  # cases handed back by a worker that died
        except BaseException:
            stop.set()  # the feeder hands out no more cases; leaving `feeding` waits for it
            raise
    missing = [str(work[i][0]) for i, result in enumerate(results) if result is None]
    if missing:
        raise RuntimeError(f"cases left unjudged: {', '.join(missing)}")
    return [result for result in results if result is not None]


def _output_bytes(output_dir: Path) -> int:
    total = 0
    if output_dir.is_symlink():
        return 0
    for name in (*GRAD_NAMES, "out", "lse"):  # an op folder's outputs too (absent from a backward's)
        with contextlib.suppress(OSError):
            total += (output_dir / f"{name}.bin").stat().st_size
    return total
