"""Shrink a failing fuzz case: the smaller and simpler cases to try next, most reducing first.

`candidates(raw)` lists raw case mappings, each one step smaller or simpler than `raw` (as Hypothesis shrinks):
fewer batch entries, fewer heads, shorter sequences, fewer selected blocks, a smaller head dim, square or
smaller blocks, simpler values (fp16, BNSD, normal values). The fuzzer keeps the first that the rules accept,
that costs no more and that still fails with the same diagnosis, and starts over from it. Pure.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

#: The smallest head dim a shrink tries.
MIN_HEAD_DIM = 16


def _with(raw: dict[str, Any], **changes: Any) -> dict[str, Any]:
    changed = copy.deepcopy(raw)
    for key, value in changes.items():
        if value is None:
            changed.pop(key, None)
        else:
            changed[key] = value
    return changed


def _shorter(length: int, block: int) -> list[int]:
    """Shorter lengths to try for one sequence, shortest first, keeping a tail's remainder where it can."""
    tail = length % block
    options = [1, 2, tail, block + tail if length > block + tail else 0, length // 2, length - block, length - 1]
    return sorted({n for n in options if 0 < n < length})


def candidates(raw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield the cases one step smaller or simpler than `raw`, most reducing first."""
    yield from _fewer_entries(raw)
    yield from _fewer_heads(raw)
    yield from _shorter_sequences(raw)
    yield from _fewer_blocks(raw)
    dim = raw.get("head_dim", 128)
    for smaller in (MIN_HEAD_DIM, 32, 64, dim // 2):
        if MIN_HEAD_DIM <= smaller < dim:
            yield _with(raw, head_dim=smaller)
    x, y = raw["block_shape"]
    for shape in ([min(x, y)] * 2, [x // 2, y], [x, y // 2]):
        if shape != [x, y] and min(shape) >= 16:
            yield _with(raw, block_shape=shape)
    yield from _simpler_values(raw)


def _fewer_entries(raw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    lengths = raw.get("actual_seq_lengths")
    if lengths is not None and raw.get("layout") == "TND":
        kv = raw.get("actual_seq_lengths_kv")
        keeps = [[0], [len(lengths) - 1]] if len(lengths) > 1 else []
        keeps += [[i for i in range(len(lengths)) if i != drop] for drop in range(len(lengths)) if len(lengths) > 1]
        for keep in keeps:
            yield _with(
                raw,
                actual_seq_lengths=[lengths[i] for i in keep],
                actual_seq_lengths_kv=_pick(kv, keep),
                copies=_kept_copies(raw.get("copies"), keep),
            )
    elif raw.get("batch", 1) > 1:
        for batch in (1, raw["batch"] - 1):
            yield _with(raw, batch=batch, copies=_kept_copies(raw.get("copies"), list(range(batch))))


def _kept_copies(copies: list[list[int]] | None, keep: list[int]) -> list[list[int]] | None:
    """The copies among the kept entries, renumbered (None when none is left)."""
    kept = [[keep.index(c), keep.index(s)] for c, s in copies or [] if c in keep and s in keep]
    return kept or None


def _pick(values: list[int] | None, keep: list[int]) -> list[int] | None:
    return None if values is None else [values[i] for i in keep]


def _fewer_heads(raw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    heads, kv_heads = raw["num_heads"], raw.get("num_kv_heads", raw["num_heads"])
    group = heads // kv_heads
    if kv_heads > 1:
        yield _with(raw, num_heads=group, num_kv_heads=1)
    if group > 1:
        yield _with(raw, num_heads=kv_heads, num_kv_heads=kv_heads)
        yield _with(raw, num_heads=kv_heads * (group // 2), num_kv_heads=kv_heads)


def _shorter_sequences(raw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    x, y = raw["block_shape"]
    lengths = raw.get("actual_seq_lengths")
    if lengths is not None and raw.get("layout") == "TND":
        kv = raw.get("actual_seq_lengths_kv")
        for i, length in enumerate(lengths):
            for shorter in _shorter(length, x):
                changed = list(lengths)
                changed[i] = shorter
                kv_changed = None if kv is None else [min(k, shorter) if k else 0 for k in kv]
                yield _with(raw, actual_seq_lengths=changed, actual_seq_lengths_kv=kv_changed)
        for i, length in enumerate(kv or []):
            for shorter in _shorter(length, y):
                assert kv is not None
                yield _with(raw, actual_seq_lengths_kv=[*kv[:i], shorter, *kv[i + 1 :]])
        return
    q_len = raw.get("q_seq_len", 1)
    kv_len = raw.get("kv_seq_len")
    if kv_len is not None:
        yield _with(raw, kv_seq_len=None)
        for shorter in _shorter(kv_len, y):
            yield _with(raw, kv_seq_len=shorter)
    for shorter in _shorter(q_len, x):
        yield _with(raw, q_seq_len=shorter)


def _fewer_blocks(raw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    sparsity = raw.get("sparsity", {})
    density = sparsity.get("density")
    if sparsity.get("pattern") == "random" and density is not None and density > 0.1:
        yield _with(raw, sparsity={**sparsity, "density": round(density / 2, 3)})
    if sparsity.get("pattern") != "dense":
        yield _with(raw, sparsity={"pattern": "dense"})


def _simpler_values(raw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if raw.get("dtype") != "float16":
        yield _with(raw, dtype="float16")
    if raw.get("init") is not None:
        yield _with(raw, init=None)
    lengths = raw.get("actual_seq_lengths")
    if raw.get("layout") == "TND" and lengths and len(set(lengths)) == 1 and lengths[0]:
        kv = raw.get("actual_seq_lengths_kv")
        if kv is None or len(set(kv)) == 1 and kv[0]:
            yield _with(
                raw,
                layout="BNSD",
                batch=len(lengths),
                q_seq_len=lengths[0],
                kv_seq_len=None if kv is None else kv[0],
                actual_seq_lengths=None,
                actual_seq_lengths_kv=None,
            )
    if raw.get("copies") is not None:
        yield _with(raw, copies=None)
    if raw.get("seed", 0) != 0:
        yield _with(raw, seed=0)
