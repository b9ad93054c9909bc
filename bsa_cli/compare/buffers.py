"""Reusable work arrays of the metrics engine and the fast float16/bfloat16 upcast.

Chunks of `CHUNK_ELEMENTS` elements are measured with temporaries taken from a per-thread `_Scratch`,
never allocated afresh (fresh temporaries cost page faults on every chunk).
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import numpy as np

#: Elements per work item: small enough that a chunk's temporaries stay in cache, large enough to amortize.
CHUNK_ELEMENTS = 1 << 17


_F16_MAGIC = np.float32(2.0**112)


class _Scratch:
    """One thread's reusable work arrays: temporaries of a chunk are never allocated afresh.

    (Fresh half-megabyte temporaries cost page faults on every chunk; reusing buffers makes the metrics
    about a third faster.)
    """

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            buffer = np.empty(max(size, CHUNK_ELEMENTS), dtype=dtype)
            self.buffers[name] = buffer
        return buffer[:size].reshape(shape)


_SPARE: list[_Scratch] = []
_SPARE_LOCK = threading.Lock()


def _take_scratch() -> _Scratch:
    """Take a spare set of work arrays (they outlive pool threads, so their pages stay mapped)."""
    with _SPARE_LOCK:
        return _SPARE.pop() if _SPARE else _Scratch()


def _give_scratch(scratch: _Scratch) -> None:
    with _SPARE_LOCK:
        if len(_SPARE) < (os.cpu_count() or 1) * 2:
            _SPARE.append(scratch)


def _upcast(values: np.ndarray, io_dtype: str, scratch: _Scratch | None = None) -> np.ndarray:
    """Return float16/bfloat16 (or float32/64) values as float32; exact for finite 16-bit values.

    float16 goes through integer bit moves and one multiply (faster than NumPy's cast); its Inf/NaN come
    out as finite values >= 65536, which `_measure_array` detects and handles on its slow path. With `scratch`,
    the result lives in its "upcast" buffer (valid until the next call).
    """
    if values.dtype.itemsize != 2:
        return values.astype(np.float32)
    scratch = scratch or _Scratch()
    bits = scratch.get("upcast", np.uint32, values.shape)
    np.copyto(bits, values.view(np.uint16), casting="unsafe")
    np.left_shift(bits, np.uint32(16), out=bits)
    if io_dtype == "bfloat16":
        return bits.view(np.float32)
    sign = scratch.get("sign", np.uint32, values.shape)
    np.bitwise_and(bits, np.uint32(0x80000000), out=sign)
    np.bitwise_xor(bits, sign, out=bits)
    np.right_shift(bits, np.uint32(3), out=bits)
    magnitude = bits.view(np.float32)
    np.multiply(magnitude, _F16_MAGIC, out=magnitude)  # rebias the exponent; subnormals come out right too
    np.bitwise_or(bits, sign, out=bits)
    return magnitude


_FLOORS: dict[float, np.ndarray] = {}


def _floor_array(value: float, shape: tuple[int, ...]) -> np.ndarray:
    """Return a read-only float32 array of `value` of at least `shape`'s size, reshaped to it.

    NumPy's maximum against an array is several times faster than against a scalar.
    """
    size = math.prod(shape)
    array = _FLOORS.get(value)
    if array is None or array.size < size:
        array = np.full(max(size, CHUNK_ELEMENTS), value, dtype=np.float32)
        array.flags.writeable = False
        _FLOORS[value] = array
    return array[:size].reshape(shape)
