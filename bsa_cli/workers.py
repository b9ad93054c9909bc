"""Worker processes: how many CPUs this process may use, and pools of fresh processes with a BLAS share each."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpu_count() -> int:
    """Return the CPUs this process may run on (its affinity mask where the OS tells it, else all of them)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def worker_pool(
    jobs: int,
    blas_threads: int | None = None,
    ignore_interrupt: bool = False,
    initializer: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
) -> Iterator[ProcessPoolExecutor]:
    """Yield a pool of `jobs` fresh (spawned) processes.

    Args:
        jobs: processes.
        blas_threads: BLAS threads of each worker (default: its share of the CPUs), passed through the
            environment, which a spawned worker reads before NumPy loads.
        ignore_interrupt: workers ignore Ctrl-C (SIGINT) and leave it to this process, which decides what
            becomes of their work; otherwise they are interrupted with it.
        initializer, initargs: called in each worker as it starts (a queue back to this process, say).
    """
    threads = str(blas_threads or max(1, cpu_count() // jobs))
    saved = {var: os.environ.get(var) for var in BLAS_THREAD_VARS}
    os.environ.update({var: threads for var in BLAS_THREAD_VARS})
    try:
        context = multiprocessing.get_context("spawn")
        start = (ignore_interrupt, initializer, initargs)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start, initargs=start) as pool:
            yield pool
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _start(ignore_interrupt: bool, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    if ignore_interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)
