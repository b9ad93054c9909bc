"""Draw fuzz cases: raw spec mappings the operator accepts, biased to boundaries, sized by the cost model.

A case is a pure function of (seed, index): `draw(seed, index, bounds, ...)` draws from its own PCG64 stream
through bsa's own uniform transform (`core.streams.uniform01`), so the same seed gives the same cases in the
same order on any machine. What is legal is decided by `specs.build.build_case` (the interface rules of the
release, the same code a spec goes through): a draw it refuses is drawn again from the next stream, and a
draw the cost model (`gen.schedule.estimate`) finds too large for its size class is drawn again too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.case import Case
from ..core.errors import SpecError
from ..core.streams import seeded, uniform01
from ..gen.schedule import estimate
from ..ops import Op
from ..specs import build_alone

#: The name a fuzz case's spec is built under (errors never reach a user: a refused draw is drawn again).
FUZZ_SPEC = Path("fuzz.yaml")
#: Head dims drawn, the boundary ones weighed up: the smallest, the kernel's 64 and 128, odd sizes.
HEAD_DIMS = (16, 32, 64, 80, 128, 256)
HEAD_DIM_WEIGHTS = (3, 2, 4, 1, 3, 1)
#: Block sizes X and Y drawn (each on its own, so a third of blocks are non-square).
BLOCK_SIZES = (16, 32, 64, 128)
#: GQA group sizes N1 / N2 drawn: MHA, the common ratios, and 8.
GROUP_SIZES = (1, 2, 4, 8)
GROUP_WEIGHTS = (4, 2, 2, 2)
#: Sparsity patterns drawn, with their parameters.
PATTERNS = ("dense", "random", "causal", "sliding_window", "strided")
#: Value distributions drawn for all four inputs.
DISTRIBUTIONS = ("normal", "uniform", "exact")
#: Share of the draws of two or more batch entries that hold copies of a sequence (`copies`).
COPIES_SHARE = 0.2
#: Size classes: share of the draws, and the most estimated seconds (`bsa gen`) a case of the class may cost.
SIZE_CLASSES = ((0.75, 0.05), (0.2, 0.4), (0.05, 2.0))
#: Draws tried for one case before its lengths are cut down to fit its size class.
ATTEMPTS = 40


@dataclass(frozen=True)
class Bounds:
    """The ranges drawn: by default these; `--within SPEC` takes the largest of its cases."""

    batch: int = 5
    num_heads: int = 16
    seq_len: int = 1024
    head_dim: int = 256
    layouts: tuple[str, ...] = ("BNSD", "TND")
    dtypes: tuple[str, ...] = ("float16", "bfloat16")

    @classmethod
    def within(cls, cases: Sequence[Case]) -> Bounds:
        """Return the bounds the cases span: their largest sizes, their layouts and dtypes."""
        valid = [case for case in cases if case.expect.ok]
        if not valid:
            return cls()
        return cls(
            batch=max(case.batch for case in valid),
            num_heads=max(case.num_heads for case in valid),
            seq_len=max(max(case.q_seq_len, case.kv_seq_len) for case in valid),
            head_dim=max(case.head_dim for case in valid),
            layouts=tuple(sorted({case.layout for case in valid})),
            dtypes=tuple(sorted({case.dtype for case in valid})),
        )


class _Stream:
    """Choices from one seeded stream, through bsa's own uniform transform (stable across NumPy versions)."""

    def __init__(self, entropy: list[int]) -> None:
        self.generator = seeded(entropy)

    def unit(self) -> float:
        return float(uniform01(self.generator, 1)[0])

    def pick(self, options: Sequence[Any], weights: Sequence[float] | None = None) -> Any:
        weights = weights or [1.0] * len(options)
        point = self.unit() * sum(weights)
        for option, weight in zip(options, weights, strict=True):
            point -= weight
            if point < 0:
                return option
        return options[-1]

    def integer(self, low: int, high: int) -> int:
        """An integer in [low, high]."""
        return min(high, low + int(self.unit() * (high - low + 1)))


def boundary_length(stream: _Stream, block: int, most: int, zero: bool) -> int:
    """Draw a sequence length, biased to the block boundaries: 1, block - 1, block + 1, multiples and their
    neighbours, the largest, and (with `zero`) 0."""
    multiple = stream.integer(1, max(1, most // block))
    choices = [1, block - 1, block, block + 1, multiple * block - 1, multiple * block + 1, most]
    choices += [stream.integer(1, most)] * 3
    if zero:
        choices += [0, 0]
    length = stream.pick(choices)
    return max(0 if zero else 1, min(length, most))


def draw_raw(stream: _Stream, bounds: Bounds, name: str, seq_cap: int) -> dict[str, Any]:
    """Draw one raw case mapping (not yet checked against the rules)."""
    layout = stream.pick(bounds.layouts)
    dims = [(d, w) for d, w in zip(HEAD_DIMS, HEAD_DIM_WEIGHTS, strict=True) if d <= bounds.head_dim]
    head_dim = stream.pick([d for d, _ in dims], [w for _, w in dims]) if dims else bounds.head_dim
    x, y = stream.pick(BLOCK_SIZES), stream.pick(BLOCK_SIZES)
    if stream.unit() < 0.5:
        y = x  # square blocks half the time
    groups = [(g, w) for g, w in zip(GROUP_SIZES, GROUP_WEIGHTS, strict=True) if g <= bounds.num_heads]
    group = stream.pick([g for g, _ in groups], [w for _, w in groups])
    kv_heads = stream.integer(1, max(1, min(3, bounds.num_heads // group)))
    most = max(1, min(bounds.seq_len, seq_cap))
    batch_weights = [4, 3, 3, 2, 1, *[1] * max(0, bounds.batch - 5)][: bounds.batch]
    batch = stream.pick(list(range(1, bounds.batch + 1)), batch_weights)
    raw: dict[str, Any] = {
        "name": name,
        "layout": layout,
        "dtype": stream.pick(bounds.dtypes),
        "num_heads": kv_heads * group,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "block_shape": [x, y],
        "seed": stream.integer(0, 2**31 - 1),
    }
    if layout == "TND":
        lengths = [boundary_length(stream, x, most, zero=0 < b < batch - 1) for b in range(batch)]
        if not any(lengths):
            lengths[0] = 1
        raw["actual_seq_lengths"] = lengths
        if stream.unit() < 0.3:
            raw["actual_seq_lengths_kv"] = [boundary_length(stream, y, most, zero=not q) if q else 0 for q in lengths]
    else:
        raw["batch"] = batch
        raw["q_seq_len"] = boundary_length(stream, x, most, zero=False)
        if stream.unit() < 0.3:
            raw["kv_seq_len"] = boundary_length(stream, y, most, zero=False)
    if batch >= 2 and stream.unit() < COPIES_SHARE:
        _add_copies(raw, bounds.batch)
    raw["sparsity"] = _sparsity(stream)
    dist = stream.pick(DISTRIBUTIONS, (3, 1, 2))
    if dist == "uniform":
        raw["init"] = {"distribution": "uniform", "low": -1.0, "high": 1.0}
    elif dist == "exact":
        raw["init"] = {"distribution": "exact", "low": -2.0, "high": 2.0}
    return raw


def _add_copies(raw: dict[str, Any], most: int) -> None:
    """Make the last batch entry a copy of the first (BNSD, and TND where doubling would pass `most` entries), or
    append the sequences again in reverse order as copies (TND: a permutation), for the batch-consistency check."""
    lengths = raw.get("actual_seq_lengths")
    count = len(lengths) if lengths is not None else raw["batch"]
    if lengths is None or 2 * count > most:
        if lengths is not None:
            lengths[-1] = lengths[0]
            kv = raw.get("actual_seq_lengths_kv")
            if kv is not None:
                kv[-1] = kv[0]
        raw["copies"] = [[count - 1, 0]]
        return
    raw["actual_seq_lengths"] = lengths + lengths[::-1]
    if raw.get("actual_seq_lengths_kv") is not None:
        raw["actual_seq_lengths_kv"] = raw["actual_seq_lengths_kv"] + raw["actual_seq_lengths_kv"][::-1]
    raw["copies"] = [[count + i, count - 1 - i] for i in range(count)]


def _sparsity(stream: _Stream) -> dict[str, Any]:
    pattern = stream.pick(PATTERNS, (2, 4, 2, 1, 1))
    sparsity: dict[str, Any] = {"pattern": pattern}
    if pattern == "random":
        sparsity["density"] = stream.pick((0.1, 0.3, 0.6, 1.0))
    elif pattern == "sliding_window":
        sparsity["window"] = stream.integer(1, 3)
    elif pattern == "strided":
        sparsity["window"] = stream.integer(1, 2)
        sparsity["stride"] = stream.integer(2, 4)
    if pattern in ("causal", "sliding_window", "strided") and stream.unit() < 0.3:
        sparsity["causal_alignment"] = "bottom_right"
    return sparsity


def build(raw: dict[str, Any], release: str | None, ops: tuple[Op, ...] | None) -> Case | None:
    """Return the case the spec rules make of `raw`, or None where they refuse it (the oracle of legality)."""
    try:
        return build_alone(FUZZ_SPEC, raw, release=release, ops=ops)
    except SpecError:
        return None


def case_seconds(case: Case) -> float:
    """Estimated seconds of generating the case (the reference device and judging take about as long)."""
    return estimate(case).seconds


def draw(
    seed: int, index: int, bounds: Bounds, release: str | None = None, ops: tuple[Op, ...] | None = None
) -> tuple[dict[str, Any], Case]:
    """Draw case `index` of the sequence of `seed`: a raw case the rules accept, within its size class.

    Returns:
        (the raw spec mapping, the `Case` built from it).
    """
    size = _Stream([seed, index])
    point, limit = size.unit(), SIZE_CLASSES[-1][1]
    for share, seconds in SIZE_CLASSES:
        if point < share:
            limit = seconds
            break
        point -= share
    name = f"fuzz-{index:05d}"
    seq_cap = bounds.seq_len
    for attempt in range(ATTEMPTS * 4):
        if attempt and attempt % ATTEMPTS == 0:
            seq_cap = max(1, seq_cap // 4)  # too costly again and again: shorter sequences
        raw = draw_raw(_Stream([seed, index, attempt + 1]), bounds, name, seq_cap)
        case = build(raw, release, ops)
        if case is not None and case_seconds(case) <= limit:
            return raw, case
    raise RuntimeError(f"no legal case of seed {seed}, index {index} within the bounds {bounds}")


def flops(case: Case) -> int:
    """The cost model's FLOPs of a case (`schedule.estimate`: 14 x selected cells x D)."""
    return int(estimate(case).flops)


#: Head dims a kernel tiles apart (its own code paths): a repro holding one names it as a feature.
KERNEL_HEAD_DIMS = (64, 128, 256)


def features(case: Case) -> frozenset[str]:
    """The boundary features a case holds beyond the simplest case (BNSD, fp16, MHA, a small odd D, square
    blocks, two batch entries, full blocks), by which one failure's repro is told from another's: TND, bf16,
    a GQA group, a head dim the kernel tiles apart, a non-square block, a third batch entry, a tail of one row,
    an empty sequence between others, copies of a sequence."""
    x, y = case.block_shape
    spans = case.spans()
    found = set()
    if case.layout != "BNSD":
        found.add(f"layout={case.layout}")
    if case.dtype != "float16":
        found.add(f"dtype={case.dtype}")
    if case.group_size > 1:
        found.add(f"group={case.group_size}")
    if case.head_dim in KERNEL_HEAD_DIMS:
        found.add(f"D={case.head_dim}")
    if x != y:
        found.add("non-square")
    if case.batch >= 3:
        found.add("batch>=3")
    if any(s.q_len % x == 1 or s.kv_len % y == 1 for s in spans):
        found.add("tail-1")
    lengths = [s.q_len for s in spans]
    if any(not n for n in lengths[1:-1]):
        found.add("empty-between")
    if case.copies:
        found.add("copies")
    return frozenset(found)
