"""How many threads NumPy's BLAS uses, so that threads of this process that each call BLAS can share the cores.

OpenBLAS keeps one thread count for the whole process (its `openblas_set_num_threads_local` is, despite the
name, the same process-wide setting). `one_thread_each()` sets it to one for a block in which several
threads of bsa call BLAS side by side, and restores it after. Other BLAS builds (MKL, Accelerate), or a
system whose loaded libraries cannot be listed (no /proc), cannot be told: the block then says so and
callers stay sequential. The thread count can change results: OpenBLAS splits a product's rows and
columns between threads (never a sum), but at places that move with the count, and on some CPUs its
kernels for a split's edges round differently (an AMD EPYC with OpenBLAS 0.3.31's Haswell kernels: a
300 x 64 by 64 x 64 product differs in the last bit between 1 and 2 threads). So everything whose bits are
promised (the golden walks, the reference device) runs inside `one_thread_each()`, however many lanes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Callable, Iterator

_SYMBOLS = (  # (getter, setter) as OpenBLAS builds name them: plain, 64-bit integers, NumPy's scipy-openblas
    ("openblas_get_num_threads", "openblas_set_num_threads"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
)


@functools.cache
def _controls() -> tuple[tuple[Callable[[], int], Callable[[int], None]], ...]:
    """Return the (get, set) thread-count functions of every OpenBLAS loaded in this process."""
    import numpy  # noqa: F401  (loads NumPy's BLAS, if nothing has yet)

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "openblas" in line.lower()}
    except OSError:
        return ()
    found = []
    for path in sorted(p for p in paths if p.startswith("/")):
        try:
            library = ctypes.CDLL(path)  # already loaded: the same library, not a second copy
        except OSError:
            continue
        for getter, setter in _SYMBOLS:
            get, set_ = getattr(library, getter, None), getattr(library, setter, None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                found.append((get, set_))
                break
    return tuple(found)


def thread_counts() -> list[int]:
    """Return the thread count of each OpenBLAS loaded in this process (empty: none can be told)."""
    return [get() for get, _ in _controls()]


class _Held:
    """Blocks of `one_thread_each` open now, and the thread counts to restore when the last one closes."""

    lock = threading.Lock()
    count = 0
    saved: list[int] = []


@contextlib.contextmanager
def one_thread_each() -> Iterator[bool]:
    """Within the block, every BLAS call of this process runs on one thread; yield whether that could be set.

    Blocks may nest or overlap (in several threads): the thread counts come back when the last one ends.
    """
    controls = _controls()
    if not controls:
        yield False
        return
    with _Held.lock:
        if _Held.count == 0:
            _Held.saved = [get() for get, _ in controls]
            for _, set_ in controls:
                set_(1)
        _Held.count += 1
    try:
        yield True
    finally:
        with _Held.lock:
            _Held.count -= 1
            if _Held.count == 0:
                for (_, set_), saved in zip(controls, _Held.saved, strict=True):
                    set_(max(1, saved))
