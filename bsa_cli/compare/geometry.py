"""How a gradient's rows map to batch entries, heads, positions and blocks, and which rows must be 0."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..core.case import Case
from ..core.layout import mask_view
from ..store.manifest import GRAD_NAMES

#: Side of the cube unit's fractal: the tile the localized check and the hot-block map work in.
TILE = 16

#: Tensors whose rows are query rows (the others, dk and dv, have kv rows).
Q_ROWS = ("dq", "out", "lse")


@dataclass(frozen=True)
class _Geometry:
    """How a gradient's rows map to batch entries, heads, positions and blocks."""

    name: str
    kind: str  # q | kv
    layout: str
    shape: tuple[int, ...]
    heads: int
    dim: int
    block: int
    lengths: tuple[int, ...]
    starts: tuple[int, ...]  # TND token offsets of each batch entry
    judged: tuple[tuple[int, int], ...] | None = None  # row ranges judged, when not every real row is (`only_rows`)

    @property
    def axes(self) -> tuple[str, ...]:
        return ("t", "n", "d") if self.layout == "TND" else ("b", "n", "s", "d")

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64))

    def seq_view(self, per_row: np.ndarray, batch: int) -> np.ndarray:
        """Return batch entry `batch` of a per-row array ([rows, ...]) as [heads, length, ...]."""
        length = self.lengths[batch]
        tail = per_row.shape[1:]
        if self.layout == "TND":
            start = self.starts[batch]
            return per_row.reshape(-1, self.heads, *tail)[start : start + length].swapaxes(0, 1)
        seq = self.shape[2]
        return per_row.reshape(-1, self.heads, seq, *tail)[batch, :, :length]

    def segments(self) -> list[tuple[int, int]]:
        """Return the [start, stop) row ranges that hold real positions (all rows unless BNSD padding), or
        the ranges `judged` names (the rows the forward writes)."""
        if self.judged is not None:
            return list(self.judged)
        if self.layout == "TND" or all(n == self.shape[2] for n in self.lengths):
            return [(0, self.rows)] if self.rows else []
        seq = self.shape[2]
        return [
            (first, first + length)
            for b, length in enumerate(self.lengths)
            if length
            for first in ((b * self.heads + n) * seq for n in range(self.heads))
        ]

    def locate(self, row: int) -> tuple[int, int, int]:
        """Return (batch, head, position in the sequence) of a row."""
        if self.layout == "TND":
            t, n = divmod(row, self.heads)
            b = int(np.searchsorted(np.asarray(self.starts) + np.asarray(self.lengths), t, side="right"))
            return b, n, t - self.starts[b]
        seq = self.shape[2]
        bn, s = divmod(row, seq)
        b, n = divmod(bn, self.heads)
        return b, n, s

    def where(self, row: int) -> str:
        """Name a row for a message: "b=0 n=1 s=17 (q block 0)"."""
        b, n, s = self.locate(row)
        return f"b={b} n={n} s={s} ({self.kind} block {s // self.block})"

    def index(self, row: int, col: int) -> tuple[tuple[int, ...], dict[str, int]]:
        """Return the layout index of an element and its named coordinates (with b and s for TND)."""
        b, n, s = self.locate(row)
        if self.layout == "TND":
            t = row // self.heads
            return (t, n, col), {"t": t, "n": n, "d": col, "b": b, "s": s}
        return (b, n, s, col), {"b": b, "n": n, "s": s, "d": col}


def _geometry(case: Case, name: str) -> _Geometry:
    query = name in Q_ROWS
    spans = case.spans()
    shape, heads = (case.q_shape, case.num_heads) if query else (case.kv_shape, case.num_kv_heads)
    lengths = tuple(s.q_len if query else s.kv_len for s in spans)
    starts = tuple(s.q_start if query else s.kv_start for s in spans)
    block = case.block_shape[0 if query else 1]
    kind = "q" if query else "kv"
    return _Geometry(name, kind, case.layout, tuple(shape), heads, case.head_dim, max(block, 1), lengths, starts)


def structural_rows(case: Case, block_mask: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return, per gradient, (rows that must be 0, padding rows) as bool arrays over the tensor's rows.

    Rows that must be 0: dq rows of query rows whose blocks are all unselected, dk/dv rows of kv positions
    no query head of the GQA group selects (all derived from the block mask cut to the actual lengths).
    Padding rows: BNSD positions past a batch entry's honored actual length.
    """
    x, y = case.block_shape
    group = case.group_size
    result = {}
    geometries = {name: _geometry(case, name) for name in GRAD_NAMES}  # once: each walks every batch entry
    for name, geom in geometries.items():
        zero, padding = np.zeros(geom.rows, dtype=bool), np.zeros(geom.rows, dtype=bool)
        if geom.layout != "TND" and geom.rows:
            padding.reshape(case.batch, geom.heads, -1)[...] = True
        result[name] = (zero, padding)
    for span in case.spans():
        mask = mask_view(case, block_mask, span)  # [N1, nQ, nKV]
        empty = ~mask.any(axis=2)  # [N1, nQ]
        never = ~mask.reshape(case.num_kv_heads, group, *mask.shape[1:]).any(axis=(1, 2))  # [N2, nKV]
        for name, geom in geometries.items():
            zero, padding = result[name]
            if geom.layout != "TND" and geom.rows:
                geom.seq_view(padding, span.batch)[...] = False
            if name == "dq":
                geom.seq_view(zero, span.batch)[...] = np.repeat(empty, x, axis=1)[:, : span.q_len]
            else:
                geom.seq_view(zero, span.batch)[...] = np.repeat(never, y, axis=1)[:, : span.kv_len]
    return result


def only_rows(geom: _Geometry, rows: np.ndarray) -> _Geometry:
    """Return `geom` judging only the rows flagged in `rows` (bool over the tensor's rows), as row ranges."""
    flags = np.concatenate(([False], np.asarray(rows, dtype=bool).reshape(-1), [False]))
    edges = np.flatnonzero(flags[1:] != flags[:-1])
    ranges = tuple((int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True))
    return replace(geom, judged=ranges)
