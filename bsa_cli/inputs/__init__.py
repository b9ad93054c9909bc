"""Deterministic input tensors and block-sparse masks for a `Case`.

Every tensor draws from its own random stream, keyed by the case seed and the tensor's name, so a case's
data depends only on its own spec (not on its place in a suite or on which other tensors are drawn).
Same spec, same bytes, on every machine and supported library version:
- a stream is a PCG64 bit generator seeded by `SeedSequence([seed, crc32(name)])`, named explicitly
  (NumPy may change the bit generator `default_rng` picks; PCG64's raw stream is one it promises to keep);
- uniform values are bsa's own transform of the raw 64-bit draws (`uniform01`);
- normal values and draws without replacement use NumPy's `Generator` (ziggurat, Floyd), whose streams
  NumPy may change in a feature release: `check_streams` compares them with pinned known answers once per
  process and refuses to generate where they differ, rather than write other bytes;
- values are drawn in float64 and rounded once to the case dtype by `rounding.to_dtype` (bsa's own rule,
  not the installed ml_dtypes'); everything later starts from the rounded values.
"""

from __future__ import annotations

import functools
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from ..core import rounding
from ..core.case import Case, Distribution, numpy_dtype
from ..core.layout import kv_view, lse_view, q_view
from ..core.rounding import to_dtype
from ..core.streams import check_streams, seeded, uniform, uniform01
from . import stress
from .stress import Adjust


def rng(case: Case, stream: str) -> np.random.Generator:
    """Return the random generator of one named stream of a case."""
    check_streams()
    return seeded([case.seed, zlib.crc32(stream.encode())])


#: Values drawn (in float64) at a time: a stream gives the same values in chunks as in one go.
_DRAW_CHUNK = 1 << 20


def draw(
    case: Case, stream: str, shape: tuple[int, ...], dist: Distribution, dtype: np.dtype, adjust: Adjust | None = None
) -> np.ndarray:
    """Draw `shape` values of `dist` from `stream`, changed by `adjust` (stress shapes), rounded to `dtype`."""
    generator = rng(case, stream)
    drawn = np.empty(shape, dtype=dtype)
    flat = drawn.reshape(-1)
    for first in range(0, flat.size, _DRAW_CHUNK):
        count = min(_DRAW_CHUNK, flat.size - first)
        if dist.kind == "uniform":
            values = uniform(generator, dist.low, dist.high, count)
        elif dist.kind == "exact":  # k / 2 for an integer k in [2 low, 2 high], each equally likely
            values = np.floor(uniform(generator, 2.0 * dist.low, 2.0 * dist.high + 1.0, count))
            np.minimum(values, 2.0 * dist.high, out=values)  # uniform's rounding may reach the open end
            values /= 2.0
        else:
            values = generator.standard_normal(size=count)
            values *= dist.std
            values += dist.mean
        if adjust is not None:
            adjust(values, first)
        flat[first : first + count] = to_dtype(values, dtype)
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

    if init.logit_std is not None:  # peaked or near-uniform softmax: q and k spread for that score std
        spread = stress.logit_std_spread(case)
        streams["query"] = (case.q_shape, replace(init.query, kind="normal", mean=0.0, std=spread))
        streams["key"] = (case.kv_shape, replace(init.key, kind="normal", mean=0.0, std=spread))

    def draw_one(name: str) -> np.ndarray:
        shape, dist = streams[name]
        adjust = stress.adjuster(case, name, shape, dtype, functools.partial(rng, case))
        return draw(case, name, shape, dist, dtype, adjust)

    if jobs <= 1:
        return copy_sequences(case, {name: draw_one(name) for name in streams})
    with ThreadPoolExecutor(min(jobs, len(streams))) as pool:  # NumPy draws and casts without the GIL
        return copy_sequences(case, dict(zip(streams, pool.map(draw_one, streams), strict=True)))


def copy_sequences(case: Case, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Make each `case.copies` entry hold its source entry's sequence, in place, in every tensor given (query-
    or key-shaped in the case layout, the lse, or the [B, N1, nQ, nKV] mask); return the tensors."""
    if not case.copies:
        return tensors
    spans = case.spans()
    for name, tensor in tensors.items():
        for copy, source in case.copies:
            if name == "block_sparse_mask":
                tensor[copy] = tensor[source]
            elif name in ("key", "value"):
                kv_view(case, tensor, spans[copy])[...] = kv_view(case, tensor, spans[source])
            elif name == "softmax_lse":
                lse_view(case, tensor, spans[copy])[...] = lse_view(case, tensor, spans[source])
            else:
                q_view(case, tensor, spans[copy])[...] = q_view(case, tensor, spans[source])
    return tensors


def call_inputs(case: Case, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Return the inputs as the call passes them: null ones left out, overridden dtypes and shapes applied.

    A tensor whose dtype or shape a case overrides (a negative case: the op refuses the call before it
    reads any data) is drawn anew from its own stream in that dtype and shape; a bool mask keeps the
    mask's selection. `tensors` holds every input in its own dtype and shape.
    """
    descs = case.tensor_descs()
    result = {}
    for name in (*tensors, "atten_mask"):
        if name not in descs:
            continue
        dtype, shape = numpy_dtype(descs[name]["dtype"]), tuple(descs[name]["shape"])
        array = tensors.get(name)
        if array is not None and array.shape == shape:
            result[name] = to_dtype(array, dtype)
        elif np.issubdtype(dtype, np.floating) or rounding.is_bfloat16(dtype):
            result[name] = draw(case, name, shape, Distribution(), dtype)
        else:
            result[name] = (uniform01(rng(case, name), shape) < 0.5).astype(dtype)
    return result


#: Patterns built around a diagonal, which `causal_alignment` places.
DIAGONAL_PATTERNS = ("causal", "sliding_window", "strided")

ALIGNMENTS = ("top_left", "bottom_right")


def diagonal_blocks(case: Case, q_len: int, kv_len: int, rows: np.ndarray) -> np.ndarray:
    """Return, for query-block rows `rows` of a batch entry, the last kv block on or left of the diagonal.

    top_left (bsa's block rule): row i's diagonal is kv block i, whatever the lengths. bottom_right: query
    token t sees key tokens k <= t + (kv_len - q_len); row i's last query token min((i+1)X, q_len) - 1 sees
    up to kv block floor((that + kv_len - q_len) / Y). -1 marks a row that selects nothing (no query token,
    or no visible key).
    """
    rows = np.asarray(rows, dtype=np.int64)
    if case.sparsity.causal_alignment == "top_left":
        return rows
    x, y = case.mask_block_shape
    last_query = np.minimum((rows + 1) * x, q_len) - 1
    last_key = last_query + (kv_len - q_len)
    diagonal = np.where(last_key >= 0, last_key // y, -1)
    return np.where(rows * x < q_len, diagonal, -1)


def diagonal_grid(case: Case, diagonal: np.ndarray, n_kv: int) -> np.ndarray:
    """Return the pattern's bool [..., nQ, nKV] selection around per-row diagonals `diagonal` [..., nQ]."""
    sparsity = case.sparsity
    d = diagonal[..., :, None]
    j = np.arange(n_kv)
    grid = j <= d
    if sparsity.pattern == "sliding_window":
        grid &= j > d - sparsity.window
    elif sparsity.pattern == "strided":
        grid &= (j > d - sparsity.window) | (j % sparsity.stride == sparsity.stride - 1)
    return grid


def pattern_mask(case: Case) -> np.ndarray:
    """Return the block mask the sparsity pattern selects, as bool [B, N1, nQ, nKV] (before empty rows)."""
    sparsity = case.sparsity
    shape = case.mask_shape
    n_q, n_kv = shape[2], shape[3]
    if sparsity.pattern == "dense":
        grid = np.ones((n_q, n_kv), dtype=bool)
    elif sparsity.pattern in DIAGONAL_PATTERNS and sparsity.causal_alignment == "top_left":
        grid = diagonal_grid(case, np.arange(n_q), n_kv)
    elif sparsity.pattern in DIAGONAL_PATTERNS:  # per batch entry: the diagonal follows its lengths
        pairs = list(zip(case.q_lengths(), case.kv_lengths(), strict=True))
        diagonals = {pair: diagonal_blocks(case, *pair, np.arange(n_q)) for pair in set(pairs)}  # one per length pair
        grid = diagonal_grid(case, np.stack([diagonals[pair] for pair in pairs]), n_kv)[:, None]
    elif sparsity.pattern == "random":
        draw_shape = shape if sparsity.per_head else (shape[0], 1, n_q, n_kv)
        grid = uniform01(rng(case, "mask"), draw_shape) < sparsity.density
    elif sparsity.pattern == "explicit":
        assert sparsity.explicit is not None
        grid = fit_explicit(sparsity.explicit, shape)
    else:  # the spec (bsa_cli/specs/) admits only the patterns above
        raise ValueError(f"unknown sparsity pattern {sparsity.pattern!r}")
    return np.broadcast_to(grid, shape).copy()


def unreachable_kv_blocks(case: Case) -> list[str]:
    """Describe kv blocks holding real keys that no query block of the same batch entry can ever select.

    Only patterns with a diagonal have such blocks: those right of the last query block's diagonal (with
    top_left, a sequence with more keys than queries ends in them). One line per distinct pair of lengths,
    naming the batch entries, the blocks and their key tokens.
    """
    if case.sparsity.pattern not in DIAGONAL_PATTERNS:
        return []
    x, y = case.mask_block_shape
    found: dict[tuple[int, int], list[int]] = {}
    for b, (q_len, kv_len) in enumerate(zip(case.q_lengths(), case.kv_lengths(), strict=True)):
        if q_len and kv_len:
            found.setdefault((q_len, kv_len), []).append(b)
    notes = []
    for (q_len, kv_len), entries in found.items():
        last_row = -(-q_len // x) - 1
        reach = int(diagonal_blocks(case, q_len, kv_len, np.array([last_row]))[0])
        kv_blocks = min(-(-kv_len // y), case.num_kv_blocks)
        if reach + 1 >= kv_blocks:
            continue
        first = max(reach + 1, 0)
        blocks = f"kv block {first}" if first == kv_blocks - 1 else f"kv blocks {first}..{kv_blocks - 1}"
        shown = ", ".join(str(b) for b in entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
        notes.append(
            f"{case.sparsity.pattern} pattern with causal_alignment {case.sparsity.causal_alignment}: {blocks} "
            f"(key tokens {first * y}..{kv_len - 1} of {kv_len}, Sq {q_len}) of batch entr"
            f"{'y' if len(entries) == 1 else 'ies'} {shown} can never be selected by any query block"
        )
    return notes


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
            for b, n in np.ndindex(mask.shape[:2]):
                mask[b, n, generator.choice(n_q, size=count, replace=False)] = False
    else:
        mask[:, :, [r for r in empty_rows if r < n_q]] = False
    return copy_sequences(case, {"block_sparse_mask": mask.astype(np.uint8)})["block_sparse_mask"]


@dataclass(frozen=True)
class MaskCounts:
    """What a block mask selects, counting only real rows and columns of each batch entry's lengths."""

    selected_blocks: int  # selected (head, query block, kv block) triples that hold real tokens
    total_blocks: int  # such triples, selected or not
    cells: int  # query-token x kv-token pairs of the selected blocks
    active_rows: int  # (batch, head, query block) rows that select at least one block


#: Mask elements counted at a time (bounds the temporaries of `mask_counts` to a few MiB).
_CHUNK_ELEMENTS = 1 << 20


def mask_counts(case: Case, mask: np.ndarray) -> MaskCounts:
    """Count what `mask` selects within the lengths of each batch entry.

    The mask is taken in slabs of about `_CHUNK_ELEMENTS` elements: several batch entries at a time when
    they are small, a few query-block rows of one entry at a time when they are large.
    """
    x, y = case.mask_block_shape
    batch, heads, n_q, n_kv = mask.shape
    q_lengths = np.asarray(case.q_lengths(), dtype=np.int64)
    kv_lengths = np.asarray(case.kv_lengths(), dtype=np.int64)
    per_row = max(1, heads * n_kv)
    rows_per_slab = max(1, _CHUNK_ELEMENTS // per_row)
    batches_per_slab = max(1, rows_per_slab // max(n_q, 1)) if rows_per_slab >= n_q else 1
    exact = x * y < 1 << 40  # cell counts of one slab fit int64; else count in float64
    selected = total = active = 0
    cells: int | float = 0
    for first in range(0, batch, batches_per_slab):
        last = min(batch, first + batches_per_slab)
        cols = np.clip(kv_lengths[first:last, None] - np.arange(n_kv, dtype=np.int64) * y, 0, y)  # [c, nKV]
        for row0 in range(0, n_q, rows_per_slab):
            row1 = min(n_q, row0 + rows_per_slab)
            rows = np.clip(q_lengths[first:last, None] - np.arange(row0, row1, dtype=np.int64) * x, 0, x)
            reachable = (rows[:, :, None] > 0) & (cols[:, None, :] > 0)  # [c, r, nKV]
            chosen = (np.asarray(mask[first:last, :, row0:row1]) != 0) & reachable[:, None]  # [c, N1, r, nKV]
            selected += int(np.count_nonzero(chosen))
            total += int(np.count_nonzero(reachable)) * heads
            active += int(np.count_nonzero(chosen.any(axis=3)))
            per_block = chosen.sum(axis=1, dtype=np.int64 if exact else np.float64)  # heads per block
            per_row_cells = (per_block * cols[:, None, :]).sum(axis=2)  # [c, r]
            if exact:
                cells += int((per_row_cells * rows).sum(dtype=np.int64))
            else:
                cells += float((per_row_cells * rows.astype(np.float64)).sum())
    return MaskCounts(selected_blocks=selected, total_blocks=total, cells=int(cells), active_rows=active)


def mask_stats(case: Case, mask: np.ndarray) -> dict[str, float | int]:
    """Return selected blocks, density and FLOPs of a case, counting only real rows and columns.

    FLOPs follow docs/operator.md section 6: forward 4*rows*cols*D, backward 10*rows*cols*D per selected pair.
    """
    counts = mask_counts(case, mask)
    d = case.head_dim
    return {
        "selected_blocks": counts.selected_blocks,
        "total_blocks": counts.total_blocks,
        "density": counts.selected_blocks / counts.total_blocks if counts.total_blocks else 0.0,
        "flops_forward": 4 * counts.cells * d,
        "flops_backward": 10 * counts.cells * d,
    }
