"""Stress shapes of input values: outlier tokens or channels, rows of mixed magnitude, an attention sink,
and a chosen spread of scores (peaked or near-uniform softmax).

Each shape is a change of the float64 values of a tensor before they are rounded to the case dtype (so
inputs are still rounded once), drawn from random streams of its own (the tensor's name plus a suffix):
a case's base values are the same with and without them, and a case without them is drawn exactly as
before. Values are clipped to the dtype's largest finite number, so inputs stay finite in float16.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..core import rounding
from ..core.case import Case, Distribution
from ..core.streams import uniform

#: Changes a chunk of float64 values in place, given the flat index of its first element.
Adjust = Callable[[np.ndarray, int], None]


def logit_std_spread(case: Case) -> float:
    """Return the std s of query and key values for which scale * q.k has std `init.logit_std`."""
    assert case.init.logit_std is not None
    return math.sqrt(case.init.logit_std / (abs(case.kernel_scale) * math.sqrt(case.head_dim)))


def spread(dist: Distribution) -> float:
    """Return the standard deviation of a distribution."""
    return (dist.high - dist.low) / math.sqrt(12.0) if dist.kind in ("uniform", "exact") else dist.std


def query_spread(case: Case) -> float:
    """Return the std of the query values as drawn (`logit_std` decides it when given)."""
    return logit_std_spread(case) if case.init.logit_std is not None else spread(case.init.query)


def sink_query_shift(case: Case) -> float:
    """Return how far along u every query moves: twice its std, so q.u > 0 for about 98% of queries."""
    return 2.0 * query_spread(case)


def sink_key_length(case: Case) -> float:
    """Return the sink key's norm c, so that scale * (q_shift u).(c u) = strength."""
    assert case.init.sink is not None
    return case.init.sink.strength / (abs(case.kernel_scale) * sink_query_shift(case))


def _rows(case: Case, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Return (head, sequence position or token) of every row (one token of one head) of a tensor."""
    if case.layout == "TND":
        tokens, heads = shape[0], shape[1]
        return np.tile(np.arange(heads), tokens), np.repeat(np.arange(tokens), heads)
    batch, heads, seq = shape[0], shape[1], shape[2]
    row = np.arange(batch * heads * seq)
    return (row // seq) % heads, row % seq


def _sink_rows(case: Case, shape: tuple[int, ...]) -> np.ndarray:
    """Return a bool per key row: the sink token of its sequence (sequences shorter than it have none)."""
    assert case.init.sink is not None
    token = case.init.sink.token
    heads, positions = _rows(case, "key", shape)
    if case.layout == "TND":
        starts = [s.kv_start + token for s in case.spans() if s.kv_len > token]
        return np.isin(positions, starts)
    lengths = np.asarray(case.kv_lengths())
    batch = np.arange(positions.size) // (shape[1] * shape[2])
    return (positions == token) & (lengths[batch] > token)


#: The commercial standard's noisy ("离群点") distribution: k = max(1, floor(n / NOISE_EVERY)) distinct positions of a
#: tensor's n values, drawn uniformly, scaled by NOISE_FACTOR (opbase docs/zh/ops_precision_standard/
#: commercial_standard.md at 56922c3e667df071af471d78d938b6158a012343, section 5.1.2: "随机0.1%的值乘以1000").
NOISE_FACTOR = 1000.0
#: Values per noisy position (0.1%).
NOISE_EVERY = 1000


def noisy_positions(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The sorted flat positions a noisy distribution scales: k = max(1, n // 1000), distinct."""
    count = math.prod(shape)
    return np.sort(rng.choice(count, size=max(1, count // NOISE_EVERY), replace=False))


def adjuster(
    case: Case, name: str, shape: tuple[int, ...], dtype: np.dtype, rng: Callable[[str], np.random.Generator]
) -> Adjust | None:
    """Return the stress changes of tensor `name` as one `Adjust`, or None when it has none."""
    init = case.init
    dist: Distribution = getattr(init, name)
    sink = init.sink if name in ("query", "key") else None
    if dist.outliers is None and dist.row_scale is None and sink is None and dist.kind != "noisy":
        return None
    noisy = noisy_positions(shape, rng(f"{name}.noisy")) if dist.kind == "noisy" else None
    dim = shape[-1]
    n_rows = math.prod(shape[:-1])
    row_factor = np.ones(n_rows)
    channel_factor = np.ones(dim)
    if dist.row_scale is not None:
        low, high = math.log(dist.row_scale.low), math.log(dist.row_scale.high)
        row_factor *= np.exp(uniform(rng(f"{name}.row_scale"), low, high, n_rows))
    if dist.outliers is not None:
        out = dist.outliers
        count = n_rows if out.axis == "token" else dim
        chosen = rng(f"{name}.outliers").choice(count, size=max(1, round(out.fraction * count)), replace=False)
        (row_factor if out.axis == "token" else channel_factor)[chosen] *= out.factor
    direction: np.ndarray | None = None  # [N2, D] unit vectors of the sink
    kv_head_of_row: np.ndarray | None = None
    sink_rows: np.ndarray | None = None
    length = 0.0
    if sink is not None:
        # one unit vector u per kv head [N2, D]: the direction the queries share with the sink key
        u = rng("sink").standard_normal((case.num_kv_heads, case.head_dim))
        direction = u / np.linalg.norm(u, axis=1, keepdims=True)
        heads, _ = _rows(case, name, shape)
        if name == "query":
            kv_head_of_row, length = heads // case.group_size, sink_query_shift(case)
        else:
            kv_head_of_row, length = heads, sink_key_length(case)
            sink_rows = _sink_rows(case, shape)
    largest = rounding.largest(dtype)

    def adjust(values: np.ndarray, first: int) -> None:
        if noisy is not None:
            hits = noisy[np.searchsorted(noisy, first) : np.searchsorted(noisy, first + values.size)]
            values[hits - first] *= NOISE_FACTOR
        index = np.arange(first, first + values.size)
        rows, channels = index // dim, index % dim
        values *= row_factor[rows]
        values *= channel_factor[channels]
        if direction is not None and kv_head_of_row is not None:
            along = length * direction[kv_head_of_row[rows], channels]
            if sink_rows is None:
                values += along  # every query moves along its group's direction
            else:
                at = sink_rows[rows]
                values[at] = along[at]  # the sink key is a multiple of that direction
        np.clip(values, -largest, largest, out=values)

    return adjust
