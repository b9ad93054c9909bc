"""Worker processes: how many CPUs this process may use, and pools of fresh processes with a BLAS share each."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from .exit_codes import ExitCode

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

    Workers start with Ctrl-C (SIGINT) ignored, so one pressed while they start up, or while they wait for
    work, never ends them with a traceback of their own.

    Args:
        jobs: processes.
        blas_threads: BLAS threads of each worker (default: its share of the CPUs), passed through the
            environment, which a spawned worker reads before NumPy loads.
        ignore_interrupt: workers ignore Ctrl-C and leave it to this process, which decides what becomes
            of their work; otherwise a task running in a worker is interrupted with it (KeyboardInterrupt
            comes back as the task's result).
        initializer, initargs: called in each worker as it starts (a queue back to this process, say).
    """
    threads = str(blas_threads or max(1, cpu_count() // jobs))
    saved = {var: os.environ.get(var) for var in BLAS_THREAD_VARS}
    os.environ.update({var: threads for var in BLAS_THREAD_VARS})
    try:
        with _Pool(jobs, multiprocessing.get_context("spawn"), ignore_interrupt, (initializer, initargs)) as pool:
            yield pool
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGTERM and SIGHUP while the pool's manager thread starts: raised while its start is awaited,
    they left a thread that shutdown could not join (a traceback instead of exit 143). Held, they arrive
    once it runs, and the pool shuts down whole. Threads started meanwhile keep them held: only the main
    thread handles signals."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class _Pool(ProcessPoolExecutor):
    """A pool whose workers are all started at once, from this thread, with SIGINT ignored (a spawned
    Python keeps a SIGINT its parent ignored ignored until it says otherwise).

    Ctrl-C stays ignored here too until the pool is entered (`with`), so that an interrupt can only come
    once leaving the pool waits for the workers: a worker still starting up reads its queues' semaphores,
    which go when this process ends. (An interrupt in those few milliseconds is lost, not half-handled.)
    """

    def __init__(
        self, jobs: int, context: Any, ignore_interrupt: bool, start: tuple[Callable[..., None] | None, Any]
    ) -> None:
        super().__init__(max_workers=jobs, mp_context=context, initializer=_start, initargs=(*start, os.getpid()))
        self.interruptible = not ignore_interrupt
        self._previous: Any = None
        launch = getattr(self, "_launch_processes", None)
        manage = getattr(self, "_start_executor_manager_thread", None)
        if launch is None or manage is None or threading.current_thread() is not threading.main_thread():
            return  # workers start on demand, as in any pool
        self._previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            launch()
            with _signals_held():
                manage()  # managed from now on: leaving the pool waits for every worker
        except BaseException:
            self._restore()
            self.shutdown(wait=True)
            raise

    def __enter__(self) -> _Pool:
        self._restore()
        return self

    def _restore(self) -> None:
        if self._previous is not None:
            previous, self._previous = self._previous, None
            signal.signal(signal.SIGINT, previous)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if self.interruptible:
            return super().submit(_interruptible, fn, *args, **kwargs)
        return super().submit(fn, *args, **kwargs)


#: How often a worker checks that the process that started it is alive (it ends within this once it is not).
PARENT_POLL_S = 0.1


def _start(initializer: Callable[..., None] | None, initargs: tuple[Any, ...], parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(parent)
    if initializer is not None:
        initializer(*initargs)


def _interruptible(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one task of a worker with Ctrl-C raising KeyboardInterrupt, as in the process that asked for it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def watch_parent(parent: int, poll_s: float = PARENT_POLL_S) -> None:
    """End this process (exit code 1, at once) as soon as its parent is gone: a worker never outlives the
    bsa that started it, whether that was killed with SIGKILL or ended any other way. Once the workers
    are gone, multiprocessing's resource tracker (which waits for every holder of its pipe) ends too.
    `parent` is the pid of the process that started this one (given, not read here: it may be gone already)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(ExitCode.FAILED)

    threading.Thread(target=watch, name="bsa-parent-watch", daemon=True).start()
