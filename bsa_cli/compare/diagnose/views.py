"""A case's inputs as float64 rows, converted block by block when the diagnosis first reads them.

The diagnosis recomputes a few blocks: a dq block reads one query block's rows and the key and value
rows of the kv blocks it selects, a dk/dv block one kv block's rows and the query rows that select it.
Converting whole heads to float64 (and, for Dsum, multiplying out by dout over them) cost as much as the
recomputation itself on long sequences, most of it for rows no hypothesis reads. `InputRows` converts
only the blocks read, once each, and keeps them; `Held` keeps products and recomputed blocks up to a
bound on the memory they take.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.case import Case, SequenceSpan
from ...core.layout import kv_view, lse_view, q_view

#: Inputs of the key's shape (kv_view, blocks of Y rows); the others have the query's (blocks of X rows).
KV_SIDE = ("key", "value")

#: What a `Held` keeps at most (bytes): past it, it forgets everything and starts again.
HELD_BYTES = 256 << 20
#: Arrays by name: a case's inputs, or its outputs (device, golden, benchmark).
Arrays = Mapping[str, np.ndarray]
#: A case's sequence spans by batch entry.
Spans = Mapping[int, SequenceSpan]
#: Some rows of a block (their indices within it), or None: all its rows.
Some = np.ndarray | None

#: Rows of a block a hypothesis is tried on first (`sample_rows`), when the block has more than twice as many.
SAMPLE_ROWS = 32


def dtype_eps(case: Case) -> float:
    """The case dtype's machine epsilon."""
    return 2.0 ** -(11 if case.dtype == "float16" else 8)


def noise_floor(case: Case, energy: Any) -> Any:
    """The rounding noise of values of this golden `energy` (sum of squares): a quarter of the dtype's
    epsilon of it, squared (per element or summed; a float or an array of them)."""
    return energy * (dtype_eps(case) / 4) ** 2 + 1e-30


def sample_rows(err: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of a block to try a hypothesis on first, by each row's excess error `err`: (the rows, the
    worst half, the half evenly spread over the rest)."""
    worst = np.argsort(-err, kind="stable")[: SAMPLE_ROWS // 2]
    rest = np.setdiff1d(np.arange(err.size), worst)
    spread = rest[np.linspace(0, rest.size - 1, SAMPLE_ROWS // 2).astype(np.int64)]
    return np.unique(np.concatenate([worst, spread])), worst, spread


def falls(ratios: Mapping[str, tuple[float, float]], failing: Sequence[str], empty: str = "nothing to explain") -> str:
    """Words for each failing output's error under a hypothesis and without it (`ratios`: in benchmark units)."""
    parts = [
        f"{n}'s error {'falls' if h <= z else 'rises'} to {h:.3g}x the benchmark's (from {z:.3g}x)"
        for n, (h, z) in ratios.items()
        if n in failing
    ]
    return ", ".join(parts) or empty


def share_of(left: float, null: float) -> float:
    """The share of an excess error `null` a hypothesis leaving `left` explains, in [0, 1]."""
    return max(0.0, min(1.0, 1.0 - left / null))


@dataclass
class InputRows:
    """A case's inputs as float64 rows of one batch entry and head, converted by blocks on first read.

    Names: query, dout, attention_out (rows [n, D]); key, value ([n, D] of a kv head); lse and dsum
    (rows [n]: softmaxLse, and Dsum = rowsum(out * dout) in float64)."""

    case: Case
    inputs: Arrays
    spans: Spans
    _held: dict[tuple[str, int, int], tuple[np.ndarray | None, np.ndarray, np.ndarray]] = field(default_factory=dict)
    _blocks: dict[tuple[str, int, int, int], np.ndarray] = field(default_factory=dict)  # `block`'s views

    def __call__(self, name: str, batch: int, head: int, index: np.ndarray) -> np.ndarray:
        """Rows `index` (positions within the batch entry) of input `name` of (batch, head), float64."""
        converted = self._buffer(name, batch, head)[1]
        if index.size:
            self._convert(name, batch, head, np.unique(np.asarray(index) // self._size(name)))
        return converted[index]

    def block(self, name: str, batch: int, head: int, block: int) -> np.ndarray:
        """The rows of one block (X rows of a query-side input, Y of key or value) of (batch, head), float64:
        a read-only view, no copy."""
        key = (name, batch, head, block)
        view = self._blocks.get(key)
        if view is None:
            converted = self._buffer(name, batch, head)[1]
            self._convert(name, batch, head, np.array([block]))
            size = self._size(name)
            view = converted[block * size : (block + 1) * size]
            view.flags.writeable = False
            self._blocks[key] = view
        return view

    def _size(self, name: str) -> int:
        return self.case.block_shape[1 if name in KV_SIDE else 0]

    def _convert(self, name: str, batch: int, head: int, blocks: np.ndarray) -> None:
        source, converted, done = self._buffer(name, batch, head)
        size = self._size(name)
        for block in blocks[~done[blocks]]:
            part = slice(int(block) * size, (int(block) + 1) * size)
            if source is None:  # dsum: from the float64 rows of out and dout
                out, dout = (self.block(n, batch, head, int(block)) for n in ("attention_out", "dout"))
                converted[part] = (out * dout).sum(axis=1)
            else:
                converted[part] = np.asarray(source[part], dtype=np.float64)
        done[blocks] = True

    def _buffer(self, name: str, batch: int, head: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        key = (name, batch, head)
        if key not in self._held:
            case, span = self.case, self.spans[batch]
            source: np.ndarray | None = None  # dsum's: computed from out and dout (`_convert`)
            if name == "lse":
                source = lse_view(case, np.asarray(self.inputs["softmax_lse"]), span)[head]
            elif name != "dsum":
                source = (kv_view if name in KV_SIDE else q_view)(case, self.inputs[name], span)[head]
            shape = (span.q_len,) if source is None else source.shape
            size = self._size(name)
            blocks = -(-shape[0] // size) if size else 0
            self._held[key] = (source, np.zeros(shape), np.zeros(blocks, dtype=bool))
        return self._held[key]


class Held:
    """Values kept by key (products, recomputed blocks) while they take under `HELD_BYTES`; read-only, as
    every hypothesis that asks for them shares them."""

    def __init__(self, limit: int = HELD_BYTES) -> None:
        self.limit = limit
        self.bytes = 0
        self._values: dict[Hashable, tuple[np.ndarray, ...]] = {}

    def get(self, key: Hashable) -> tuple[np.ndarray, ...] | None:
        return self._values.get(key)

    def put(self, key: Hashable, *values: np.ndarray) -> tuple[np.ndarray, ...]:
        size = sum(v.nbytes for v in values)
        if self.bytes + size > self.limit:
            self._values.clear()
            self.bytes = 0
        for value in values:
            value.flags.writeable = False
        self._values[key] = values
        self.bytes += size
        return values
