"""Deterministic input tensors and block-sparse masks for a `Case`.

Every tensor draws from its own random stream, keyed by the case seed and the tensor's name, so a case's
data depends only on its own spec (not on its place in a suite or on which other tensors are drawn), and
NumPy's PCG64 streams make it bit-identical across runs and machines. Values are drawn in float64 and
rounded once to the case dtype; everything later starts from the rounded values.
"""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .case import Case, Distribution, numpy_dtype

STREAMS = ("query", "key", "value", "dout", "mask", "empty_rows", "attention_out")


def rng(case: Case, stream: str) -> np.random.Generator:
    """Return the random generator of one named stream of a case."""
    return np.random.default_rng([case.seed, zlib.crc32(stream.encode())])


_DRAW_CHUNK = 1 << 20
"""Values drawn (in float64) at a time: a stream gives the same values in chunks as in one go."""


def draw(case: Case, stream: str, shape: tuple[int, ...], dist: Distribution, dtype: np.dtype) -> np.ndarray:
    """Draw `shape` values of `dist` from `stream`, rounded to `dtype`."""
    generator = rng(case, stream)
    drawn = np.empty(shape, dtype=dtype)
    flat = drawn.reshape(-1)
    for first in range(0, flat.size, _DRAW_CHUNK):
        count = min(_DRAW_CHUNK, flat.size - first)
        if dist.kind == "uniform":
            values = generator.uniform(dist.low, dist.high, size=count)
        else:
            values = generator.standard_normal(size=count)
            values *= dist.std
            values += dist.mean
        flat[first : first + count] = values  # rounded as `astype` rounds
    return drawn


def make_tensors(case: Case, jobs: int = 1) -> dict[str, np.ndarray]:
    """Return query, key, value and dout in the case dtype, in the case layout (drawn in `jobs` threads)."""
    dtype = numpy_dtype(case.dtype)
    init = case.init
    streams = {
        "query": (case.q_shape, init.query),
        "key": (case.kv_shape, init.key),
        "value": (case.kv_shape, init.value),
        "dout": (case.q_shape, init.dout),
    }

    def draw_one(name: str) -> np.ndarray:
        shape, dist = streams[name]
        return draw(case, name, shape, dist, dtype)

    if jobs <= 1:
        return {name: draw_one(name) for name in streams}
    with ThreadPoolExecutor(min(jobs, len(streams))) as pool:  # NumPy draws and casts without the GIL
        return dict(zip(streams, pool.map(draw_one, streams), strict=True))


def pattern_mask(case: Case) -> np.ndarray:
    """Return the block mask the sparsity pattern selects, as bool [B, N1, nQ, nKV] (before empty rows)."""
    sparsity = case.sparsity
    shape = case.mask_shape
    n_q, n_kv = shape[2], shape[3]
    i = np.arange(n_q)[:, None]
    j = np.arange(n_kv)[None, :]
    if sparsity.pattern == "dense":
        grid = np.ones((n_q, n_kv), dtype=bool)
    elif sparsity.pattern == "causal":
        grid = j <= i
    elif sparsity.pattern == "sliding_window":
        grid = (j <= i) & (j > i - sparsity.window)
    elif sparsity.pattern == "strided":
        grid = (j <= i) & ((j > i - sparsity.window) | (j % sparsity.stride == sparsity.stride - 1))
    elif sparsity.pattern == "random":
        draw_shape = shape if sparsity.per_head else (shape[0], 1, n_q, n_kv)
        grid = rng(case, "mask").random(draw_shape) < sparsity.density
    elif sparsity.pattern == "explicit":
        assert sparsity.explicit is not None
        grid = fit_explicit(sparsity.explicit, shape)
    else:  # spec.py admits only the patterns above
        raise ValueError(f"unknown sparsity pattern {sparsity.pattern!r}")
    return np.broadcast_to(grid, shape).copy()


def fit_explicit(explicit: np.ndarray, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Broadcast an explicit mask to the mask shape, or raise ValueError naming both shapes."""
    if explicit.ndim == 3:
        explicit = explicit[None]
    try:
        return np.broadcast_to(explicit, shape)
    except ValueError:
        raise ValueError(
            f"explicit mask of shape {list(explicit.shape)} does not fit the mask shape {list(shape)} "
            "[B, N1, ceil(maxSq/X), ceil(maxSkv/Y)]"
        ) from None


def make_mask(case: Case) -> np.ndarray:
    """Return blockSparseMask as uint8 [B, N1, nQ, nKV]: the pattern, then the forced empty rows."""
    mask = pattern_mask(case)
    n_q = mask.shape[2]
    empty_rows = case.sparsity.empty_rows
    if isinstance(empty_rows, float):
        count = round(empty_rows * n_q)
        if count:
            generator = rng(case, "empty_rows")
            for b in range(mask.shape[0]):
                for n in range(mask.shape[1]):
                    mask[b, n, generator.choice(n_q, size=count, replace=False)] = False
    else:
        rows = [r for r in empty_rows if r < n_q]
        mask[:, :, rows] = False
    return mask.astype(np.uint8)


def block_extents(length: int, block: int, count: int) -> np.ndarray:
    """Return how many real tokens each of `count` blocks of size `block` holds for a sequence of `length`."""
    starts = np.arange(count) * block
    return np.clip(length - starts, 0, block)


def mask_stats(case: Case, mask: np.ndarray) -> dict[str, float | int]:
    """Return selected blocks, density and FLOPs of a case, counting only real rows and columns.

    FLOPs follow DOMAIN.md section 6: forward 4*rows*cols*D, backward 10*rows*cols*D per selected pair.
    """
    x, y = case.mask_block_shape
    selected = 0
    total = 0
    cells = 0
    for span in case.spans():
        rows = block_extents(span.q_len, x, mask.shape[2])
        cols = block_extents(span.kv_len, y, mask.shape[3])
        reachable = (rows[:, None] > 0) & (cols[None, :] > 0)
        chosen = (mask[span.batch] != 0) & reachable
        selected += int(chosen.sum())
        total += int(reachable.sum()) * mask.shape[1]
        cells += int((chosen * (rows[:, None] * cols[None, :])).sum())
    d = case.head_dim
    return {
        "selected_blocks": selected,
        "total_blocks": total,
        "density": selected / total if total else 0.0,
        "flops_forward": 4 * cells * d,
        "flops_backward": 10 * cells * d,
    }
