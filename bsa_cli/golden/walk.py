"""The walker: every tile of one kv head's selected block rows handed to a precision path, walks in threads.

A walk (`_Task`) is one path over one kv head of one batch entry. `_walk` goes query head by query head
and block row by block row, skips rows that select nothing, gathers the selected key/value blocks once
per row and cuts a wide row into tiles of query rows (`_TILE_ELEMENTS`). `_run` walks tasks one after
the other or in threads (each BLAS call on one thread); a benchmark walk waits tile by tile for the golden
walk whose out and lse it reads (`_Tiles`), and two walks that read the same padded blocks share them
(`_SharedBlocks`). Within `reporting`, every finished block row is reported (progress).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

import numpy as np

from ..core import blas
from .numerics import _gather, _Scratch
from .paths import _Entry, _Path

#: Most query rows x selected columns one score tile holds (64 MiB in float64); wider block rows go in row groups.
#:
#: Rows are independent in the forward (same products, same row sums), so out and lse do not depend on the cut
#: (checked bit for bit on OpenBLAS: tiles of `_MIN_TILE_ROWS` rows or more of such wide rows keep to its regular
#: gemm path); the backward then sums a row's dK/dV share group by group.
_TILE_ELEMENTS = 1 << 23


#: What hears a finished block row's selected pairs (`reporting`), if anything does.
Reporter = Callable[[int], None] | None


#: Fewest query rows in a tile: thinner products may take other BLAS code paths (gemv, small-matrix kernels).
_MIN_TILE_ROWS = 16


def _selected_rows(
    entry: _Entry, kv_head: int, blocks: tuple[np.ndarray, np.ndarray], scratch: _Scratch, report: Reporter
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, list[slice]]]:
    """Yield (head, selected, keys, values, row tiles) for each query-block row of a kv head's group of `entry`.

    Rows that select no block are skipped. keys/values hold the row's selected blocks, gathered into
    scratch buffers that the next row reuses. When the caller is done with a row, `report` (if any)
    hears how many selected block pairs it held.
    """
    block_rows, q_len = entry.block_shape[0], entry.query.shape[1]
    for head in range(kv_head * entry.group, (kv_head + 1) * entry.group):
        for row, mask_row in enumerate(entry.mask[head]):
            selected = np.flatnonzero(mask_row)  # the row's selected kv blocks, ascending
            if selected.size == 0:
                continue
            keys = _gather(blocks[0], selected, scratch, "keys")
            values = _gather(blocks[1], selected, scratch, "values")
            tiles = _row_tiles(row * block_rows, min(q_len, (row + 1) * block_rows), keys.shape[0])
            yield head, selected, keys, values, tiles
            if report is not None:
                report(int(selected.size))


_PROGRESS: contextvars.ContextVar[Reporter] = contextvars.ContextVar("progress", default=None)


@contextlib.contextmanager
def reporting(callback: Callable[[int], None]) -> Iterator[None]:
    """Within the block, every walk (every function of the package) calls `callback(pairs)` after each query-block
    row it finishes.

    `pairs` is the number of selected (query block, kv block) pairs of the row: progress for long cases,
    in the units of `inputs.mask_stats`'s `selected_blocks` (pairs within each batch entry's lengths).
    """
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _row_tiles(start: int, stop: int, width: int) -> list[slice]:
    """Cut query rows [start, stop) into near-equal groups whose score tiles (rows x `width`) fit `_TILE_ELEMENTS`.

    No group has fewer than `_MIN_TILE_ROWS` rows (unless the block row has): that wins over the budget.
    """
    rows_per_tile = _TILE_ELEMENTS // max(width, 1)
    count = max(1, min(-(-(stop - start) // max(rows_per_tile, 1)), (stop - start) // _MIN_TILE_ROWS))
    bounds = [start + (stop - start) * i // count for i in range(count + 1)]
    return [slice(first, last) for first, last in zip(bounds[:-1], bounds[1:], strict=True)]


class _Stopped(Exception):
    """A walk gave up: another one failed, or the run was interrupted."""


class _Tiles:
    """How many tiles a walk has finished, for a walk that reads what they wrote (the benchmark reads out and lse)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._finished = 0
        self._ended = False

    def finished_one(self) -> None:
        with self._changed:
            self._finished += 1
            self._changed.notify_all()

    def end(self) -> None:
        """Say the walk is over (finished or failed): nobody waits for more."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, count: int) -> None:
        """Return once `count` tiles are finished; raise `_Stopped` if the walk ended before."""
        with self._changed:
            self._changed.wait_for(lambda: self._finished >= count or self._ended)
            if self._finished < count:
                raise _Stopped


class _SharedBlocks:
    """One kv head's padded key and value blocks for walks that read the same values (golden float32 and benchmark
    of io-dtype tensors): built by the first walk that asks, dropped when the last one is done."""

    def __init__(self, walks: int) -> None:
        self._lock = threading.Lock()
        self._walks = walks
        self._blocks: tuple[np.ndarray, np.ndarray] | None = None

    def get(self, build: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if self._blocks is None:
                self._blocks = build()
            return self._blocks

    def done(self) -> None:
        with self._lock:
            self._walks -= 1
            if self._walks == 0:
                self._blocks = None


@dataclasses.dataclass
class _Task:
    """One walk: a path over one kv head's query heads of its entry, and the tiles it waits for or announces."""

    path: _Path
    kv_head: int
    after: _Tiles | None = None  # each tile waits for the same tile of this walk
    announce: _Tiles | None = None  # each finished tile is counted here
    shared: _SharedBlocks | None = None  # its padded blocks, if another walk reads the same

    def pairs(self) -> int:
        """Return the selected block pairs of the walk (its share of the work)."""
        entry = self.path.entry
        return int(entry.mask[self.kv_head * entry.group : (self.kv_head + 1) * entry.group].sum())


def _report_walks(report: Callable[[int], None], walks: int, pairs: int) -> None:
    report(pairs * walks)


def _walk(task: _Task, report: Reporter, stop: threading.Event | None = None) -> None:
    """Hand every tile of one kv head's selected rows to the task's path, then let it write its results."""
    path, kv_head = task.path, task.kv_head
    entry = path.entry
    q_len, kv_len = entry.query.shape[1], entry.key.shape[1]
    try:
        if q_len == 0 or kv_len == 0:
            return

        def build() -> tuple[np.ndarray, np.ndarray]:
            return path.blocks(entry.key[kv_head]), path.blocks(entry.value[kv_head])

        blocks = build() if task.shared is None else task.shared.get(build)
        if report is not None and path.walks > 1:
            report = functools.partial(_report_walks, report, path.walks)
        path.start(kv_head, blocks[0])
        scratch = _Scratch()
        tiles = 0
        for head, selected, keys, values, row_tiles in _selected_rows(entry, kv_head, blocks, scratch, report):
            if stop is not None and stop.is_set():
                raise _Stopped
            path.row(keys, values, scratch)
            for rows in row_tiles:
                tiles += 1
                if task.after is not None:
                    task.after.wait_for(tiles)
                path.tile(head, rows, selected, keys, values, scratch)
                if task.announce is not None:
                    task.announce.finished_one()
        path.finish(kv_head)
    finally:
        if task.announce is not None:
            task.announce.end()
        if task.shared is not None:
            task.shared.done()


def _run(tasks: list[_Task], jobs: int = 1) -> None:
    """Walk every task: one after the other in this thread, or in up to `jobs` threads.

    Threads take the tasks in order (a task that waits for another's tiles comes after it, so it never
    waits for one not started); where BLAS cannot be told, the tasks run one after the other. Every BLAS
    call runs on one thread (`blas.one_thread_each`), with one lane too: OpenBLAS splits a product between
    its threads at places that move with their count, and its kernels for the edges of a split round
    differently on some CPUs (an AMD EPYC with OpenBLAS 0.3.31's Haswell kernels: 1 and 2 threads differ
    in the last bit), so a golden computed with BLAS threads would depend on the machine's cores and on -j.
    The `reporting` callback of this thread hears every walk's rows, one at a time.
    """
    report = _PROGRESS.get()
    lanes = min(jobs, len(tasks))
    with blas.one_thread_each() as single:  # one thread always: OpenBLAS's bits can change with its threads
        if lanes > 1 and single:
            _run_in_threads(tasks, lanes, report)
            return
        for task in tasks:
            _walk(task, report)


def _run_in_threads(tasks: list[_Task], lanes: int, report: Reporter) -> None:
    """Walk the tasks in `lanes` threads; on the first failure (or Ctrl-C here) stop the rest and raise it."""
    stop = threading.Event()
    if report is not None:
        lock, callback = threading.Lock(), report

        def report(pairs: int) -> None:
            with lock:
                callback(pairs)

    errstate = np.geterr()  # threads start with NumPy's defaults: give them the caller's floating-point handling
    with ThreadPoolExecutor(lanes, "bsa-walk", initializer=functools.partial(np.seterr, **errstate)) as pool:
        futures: list[Future[None]] = [pool.submit(_walk, task, report, stop) for task in tasks]
        errors: list[BaseException] = []
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
            errors = [e for f in futures if f.done() and not f.cancelled() and (e := f.exception()) is not None]
        finally:
            if errors or not all(f.done() for f in futures):
                stop.set()
                for future in futures:
                    future.cancel()
                for task in tasks:
                    if task.announce is not None:
                        task.announce.end()
        if errors:
            raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])
