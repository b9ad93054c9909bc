"""The golden's array mechanics: work buffers, gathered and padded blocks, row chunks, scattered products.

What every precision path (`paths`) does to arrays besides its formulas: kv blocks padded and gathered
into one contiguous array per block row (a view where the blocks are consecutive), named work buffers
reused from row to row (`_Scratch`), a tile's elementwise steps cut into bounded row chunks, the padding
columns of a partial last kv block masked, dK/dV shares added into their blocks a bounded number at a
time, and the kernel's rounding of an input to its dtype (`_to_io_fp32`, through `rounding`).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import DTypeLike

from ..core.rounding import to_dtype

#: Most elements of one dK/dV share (selected columns x D) computed before it is added to its blocks.
_PRODUCT_ELEMENTS = 1 << 20


def _padded_blocks(tensor: np.ndarray, block: int, dtype: DTypeLike) -> np.ndarray:
    """Return [len, D] `tensor` as zero-padded [ceil(len/block), block, D] blocks of `dtype`."""
    length, dim = tensor.shape
    n_blocks = -(-length // block)
    blocks = np.zeros((n_blocks * block, dim), dtype=dtype)
    blocks[:length] = tensor
    return blocks.reshape(n_blocks, block, dim)


class _Scratch:
    """Named work buffers reused from one block row to the next instead of fresh allocations."""

    #: Most elements a buffer grows by beyond the request (growing rows, as in a causal mask, reallocate rarely).
    SLACK = 1 << 21

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        """Return an uninitialised C-contiguous array of `shape` and `dtype`, backed by buffer `name`."""
        dtype = np.dtype(dtype)
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            slack = 0 if buffer is None else min(buffer.size // 2, self.SLACK)
            self._buffers.pop(name, None)
            buffer = self._buffers[name] = np.empty(size + slack, dtype=dtype)
        return buffer[:size].reshape(shape)


def _consecutive(selected: np.ndarray) -> bool:
    """Return whether the (ascending, unique) selected block indices have no gap."""
    return bool(selected[-1] - selected[0] + 1 == selected.size)


def _gather(blocks: np.ndarray, selected: np.ndarray, scratch: _Scratch, name: str) -> np.ndarray:
    """Return blocks[selected] as [len(selected) * Y, D]: a view when the blocks are consecutive."""
    _, block, dim = blocks.shape
    if _consecutive(selected):
        return blocks[selected[0] : selected[-1] + 1].reshape(-1, dim)
    gathered = scratch.get(name, (selected.size, block, dim), blocks.dtype)
    np.take(blocks, selected, axis=0, out=gathered, mode="clip")  # "clip": no buffer (the indices are valid)
    return gathered.reshape(-1, dim)


#: Most elements of the row chunks in which a tile's elementwise steps run, chunk after chunk.
#:
#: It bounds the temporaries of those steps (the float16 rounding's) on wide tiles (long causal rows: up to
#: `_TILE_ELEMENTS`); a tile of typical width is one chunk (smaller chunks only add NumPy calls, which
#: threads then take turns to make). Elementwise steps and row reductions give the same values in any chunks;
#: the products still take whole tiles.
_CHUNK_ELEMENTS = 1 << 18


def _chunks(shape: tuple[int, ...]) -> list[slice]:
    """Cut the rows of a [rows, cols] tile into chunks of at most `_CHUNK_ELEMENTS` elements (one row at least)."""
    rows, cols = shape
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    return [slice(first, min(first + step, rows)) for first in range(0, rows, step)]


def _mask_tail(scores: np.ndarray, selected: np.ndarray, n_kv_blocks: int, tail_pad: int) -> None:
    """Set the padding columns of a selected partial last kv block to -inf (they are the last columns)."""
    if tail_pad and selected[-1] == n_kv_blocks - 1:
        scores[:, -tail_pad:] = -np.inf


#: Block size (Y * D elements) from which adding block by block beats one fancy-indexed add.
_SCATTER_LOOP_MIN = 4096


def _scatter_add(blocks: np.ndarray, selected: np.ndarray, contribution: np.ndarray) -> None:
    """Add contribution [len(selected) * Y, D] to `blocks[selected]` ([nKV, Y, D]); indices are unique."""
    contribution = contribution.reshape(selected.size, blocks.shape[1], blocks.shape[2])
    if _consecutive(selected):
        target = blocks[selected[0] : selected[-1] + 1]
        np.add(target, contribution, out=target)
    elif blocks.shape[1] * blocks.shape[2] < _SCATTER_LOOP_MIN:
        blocks[selected] += contribution
    else:
        for block, index in zip(contribution, selected, strict=True):
            target = blocks[index]
            np.add(target, block, out=target)


def _add_products(
    blocks: np.ndarray, selected: np.ndarray, left: np.ndarray, right: np.ndarray, scratch: _Scratch
) -> None:
    """Add left^T @ right ([len(selected) * Y, D]) to `blocks[selected]`, a bounded number of blocks at a time.

    Args:
        blocks: [nKV, Y, D] accumulators.
        left: [rows, len(selected) * Y] (probabilities or dS of one tile); right: [rows, D].
    """
    _, block, dim = blocks.shape
    step = max(1, _PRODUCT_ELEMENTS // (block * dim))
    for first in range(0, selected.size, step):
        part = selected[first : first + step]
        columns = left[:, first * block : (first + part.size) * block]
        product = scratch.get("product", (part.size * block, dim), blocks.dtype)
        np.matmul(columns.T, right, out=product)
        _scatter_add(blocks, part, product)


def _to_io_fp32(tensor: np.ndarray, io_dtype: np.dtype) -> np.ndarray:
    """Return `tensor` rounded to the kernel's input dtype, then upcast (exactly) to float32."""
    return to_dtype(tensor, io_dtype).astype(np.float32)
