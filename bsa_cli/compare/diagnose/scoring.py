"""The target blocks of a diagnosis and how a hypothesis is scored on them.

`Blocks` holds the device's, the benchmark's and the golden's values of the target blocks (the worst
blocks of each failing tensor, and of each passing one) and scores a hypothesis by the share of the
device's excess error (beyond the benchmark's) it removes: 1 when the device equals the hypothesis as
closely as the benchmark equals the golden.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...core.case import Case, numpy_dtype
from ...store.manifest import GRAD_NAMES
from ..results import TensorResult
from .hypotheses import NULL, Context, Target, Variant, block_of, recompute
from .views import SAMPLE_ROWS, Arrays, falls, noise_floor, sample_rows, share_of

#: Failing blocks recomputed per failing tensor (the worst by the block map's score); a passing tensor
#: adds its worst, so that a hypothesis that would break it is scored down.
MAX_TARGETS = 3

# `views.SAMPLE_ROWS`: rows of the screen block a hypothesis is tried on first, when the block has more than
# twice as many: the 16 holding the most excess error (where a cause shows) and 16 evenly spread over the others (where
# a cause that spreads its error shows too). A hypothesis must explain `SAMPLED` of their error to be tried
# on the whole block: a wrong one explains nearly none of it, the true one nearly all, so the sample rules
# out the many wrong ones at a fraction of the cost and the whole block decides as before.
#: The share of the sampled rows' excess error a hypothesis must explain to be tried on the whole block.
SAMPLED = 0.3

#: Rows of some target blocks (`Blocks.sample_of`) a hypothesis was recomputed on; a block not in it, on
#: all its rows. Its score then weighs each sampled row by the rows it stands for (`Blocks.weights_of`).
Rows = Mapping[Target, np.ndarray]


@dataclass
class Blocks:
    """Device, benchmark and recomputed golden of the target blocks, and the benchmark's error energy.

    `targets` are the failing blocks (and a passing tensor's worst); `add` brings in more blocks (those
    a hypothesis changes), scored with them so that a hypothesis predicting errors where there are none
    is scored down."""

    case: Case
    ctx: Context
    device_arrays: Arrays
    bench_arrays: Arrays | None
    golden_arrays: Arrays
    failing: tuple[str, ...]
    targets: list[Target] = field(default_factory=list)
    data: dict[Target, tuple[np.ndarray, np.ndarray | None, np.ndarray, float]] = field(default_factory=dict)
    nonfinite: dict[Target, np.ndarray] = field(default_factory=dict)  # where the device has NaN/Inf
    samples: dict[Target, np.ndarray | None] = field(default_factory=dict)  # `sample_of`, kept
    weights: dict[Target, np.ndarray] = field(default_factory=dict)  # `weights_of`, kept
    _noise: tuple[int, dict[str, float]] | None = None

    def add(self, target: Target) -> None:
        if target in self.data:
            return
        case, ctx = self.case, self.ctx
        null = block_of(case, self.golden_arrays[target.tensor], target, ctx.spans)  # gen's golden (float32 or 64)
        if not np.isfinite(null).all():
            null = recompute(ctx, NULL, target)
        dev = block_of(case, self.device_arrays[target.tensor], target, ctx.spans)
        bad = ~np.isfinite(dev)
        if bad.any():
            self.nonfinite[target] = bad
            dev = np.where(bad, null, dev)  # non-finite values have their own kind (and a hypothesis may predict them)
        bench = block_of(case, self.bench_arrays[target.tensor], target, ctx.spans) if self.bench_arrays else None
        floor = noise_floor(case, float((null * null).sum()))
        energy = float(((bench - null) ** 2).sum()) if bench is not None else floor
        self.data[target] = (dev, bench, null, max(energy, floor))

    @property
    def noise(self) -> dict[str, float]:
        """Each tensor's benchmark error energy over the targets (kept while the targets stay the same)."""
        if self._noise is None or self._noise[0] != len(self.targets):
            self._noise = (len(self.targets), self.noise_of(self.targets))
        return self._noise[1]

    def overflows_in_row(self, value: np.ndarray) -> np.ndarray:
        """Where a value lies in a row (of D) that overflows or reaches half the dtype's range: an Inf in a
        row's accumulation turns the whole row NaN/Inf (Inf - Inf), so such a row predicts all of them."""
        with np.errstate(invalid="ignore"):
            near = ~(np.abs(value) < 0.5 * float(np.finfo(numpy_dtype(self.case.dtype)).max))
        return np.broadcast_to(near.any(axis=-1, keepdims=True), value.shape)

    def predicts_nonfinite(
        self, values: Sequence[np.ndarray], targets: Sequence[Target] | None = None, rows: Rows | None = None
    ) -> bool:
        """Whether values of the targets (or of `targets`; of their `rows`) overflow (or are NaN/Inf) where
        the device's are NaN/Inf: 90% of the elements where either is."""
        if not self.nonfinite:
            return False
        both = either = 0
        for target, value in zip(self.targets if targets is None else targets, values, strict=True):
            bad = self.nonfinite.get(target, np.zeros(value.shape, dtype=bool))
            if rows and target in rows and target in self.nonfinite:
                bad = bad[rows[target]]
            with np.errstate(invalid="ignore"):  # non-finite, or beyond the case dtype's range (an Inf once cast)
                over = ~(np.abs(value) <= float(np.finfo(numpy_dtype(self.case.dtype)).max))
            both += int((bad & self.overflows_in_row(value)).sum())
            either += int((bad | over).sum())
        return either > 0 and both >= 0.9 * either

    def noise_of(self, targets: Sequence[Target]) -> dict[str, float]:
        out: dict[str, float] = {}
        for t in targets:
            out[t.tensor] = out.get(t.tensor, 0.0) + self.data[t][3]
        return out

    def energies(
        self, targets: Sequence[Target], values: Sequence[np.ndarray], rows: Rows | None = None
    ) -> dict[str, float]:
        """Each tensor's error energy of values of the targets (of their `rows`: estimated, `weights_of`)."""
        out: dict[str, float] = dict.fromkeys({t.tensor for t in targets}, 0.0)
        for target, value in zip(targets, values, strict=True):
            dev = self.data[target][0]
            some = rows.get(target) if rows else None
            if some is not None:
                dev = dev[some]
            bad = self.nonfinite.get(target)
            if bad is not None:  # a hypothesis predicting the device's NaN/Inf (or an overflow) explains them
                bad = bad if some is None else bad[some]
                value = np.where(bad & self.overflows_in_row(value), dev, value)
            diff = dev - value
            if some is None:
                energy = float((diff * diff).sum()) if diff.size else 0.0
            else:
                energy = float(((diff * diff).sum(axis=1) * self.weights_of(target)).sum())
            out[target.tensor] += energy if math.isfinite(energy) else math.inf
        return out

    @staticmethod
    def excess(energies: Mapping[str, float], noise: Mapping[str, float]) -> float:
        return sum(max(e / noise[t] - 1.0, 0.0) for t, e in energies.items())

    def explained(
        self, values: Sequence[np.ndarray], targets: Sequence[Target] | None = None, rows: Rows | None = None
    ) -> tuple[float, dict[str, float]]:
        """Return (share of the excess error removed, each failing tensor's error in benchmark units) of a
        hypothesis's values on the targets (or on `targets`: some of them, the `screen`, or all and the blocks
        it changes); of their `rows`, estimated."""
        targets = self.targets if targets is None else targets
        noise = self.noise_of(targets)
        null_excess = self.excess(self.energies(targets, self.null_of(targets, rows), rows), noise)
        energies = self.energies(targets, values, rows)
        if null_excess <= 0:
            return 0.0, {}
        return share_of(self.excess(energies, noise), null_excess), {
            t: math.sqrt(e / noise[t]) for t, e in energies.items()
        }

    def null_of(self, targets: Sequence[Target], rows: Rows | None = None) -> list[np.ndarray]:
        """The golden of the targets (of their `rows`)."""
        some = rows or {}
        return [self.data[t][2] if some.get(t) is None else self.data[t][2][some[t]] for t in targets]

    def sample_of(self, target: Target) -> np.ndarray | None:
        """The rows of a block a hypothesis is tried on first (`SAMPLE_ROWS`), or None: the block is short,
        or holds NaN/Inf (the whole block then)."""
        if target in self.samples:
            return self.samples[target]
        dev, bench, null, _ = self.data[target]
        rows = None
        if dev.shape[0] > 2 * SAMPLE_ROWS and target not in self.nonfinite:
            err = ((dev - null) ** 2).sum(axis=1)
            err = err - ((bench - null) ** 2).sum(axis=1) if bench is not None else err
            rows, worst, spread = sample_rows(err)
            # a worst row stands for itself, an evenly spread one for its share of the others
            weights = np.full(rows.size, (dev.shape[0] - worst.size) / spread.size)
            weights[np.isin(rows, worst)] = 1.0
            self.weights[target] = weights
        self.samples[target] = rows
        return rows

    def weights_of(self, target: Target) -> np.ndarray:
        """The weight of each row of a block's sample (`sample_of`) in an estimated score: 1 for the worst
        rows, taken all, and (rows - worst) / spread for each evenly spread one, a stratified sample of the
        others: the estimate of the block's error energy is then unbiased."""
        return self.weights[target]

    def sampled_rows(self, targets: Sequence[Target], whole: Sequence[Target] = ()) -> dict[Target, np.ndarray]:
        """The sampled rows of the targets (`sample_of`), but for those in `whole` or too short to sample."""
        some = {target: self.sample_of(target) for target in targets if target not in whole}
        return {target: rows for target, rows in some.items() if rows is not None}

    def explained_rows(self, target: Target, rows: np.ndarray, value: np.ndarray) -> tuple[float, bool]:
        """`explained` on one block's `rows` (value: the hypothesis's values of those rows): (share, whether
        those rows have an excess error to explain)."""
        dev, bench, null = (a[rows] if a is not None else None for a in self.data[target][:3])
        assert dev is not None and null is not None
        floor = noise_floor(self.case, float((null * null).sum()))
        noise = max(float(((bench - null) ** 2).sum()) if bench is not None else floor, floor)
        null_excess = max(float(((dev - null) ** 2).sum()) / noise - 1.0, 0.0)
        if null_excess <= 0:
            return 0.0, False
        with np.errstate(over="ignore", invalid="ignore"):
            energy = float(((dev - value) ** 2).sum())
        hyp_excess = max(energy / noise - 1.0, 0.0) if math.isfinite(energy) else math.inf
        return share_of(hyp_excess, null_excess), True

    def at_most(self, values: Mapping[Target, np.ndarray], rows: Rows | None = None) -> float:
        """A bound on `explained`'s share (no extra blocks) from a hypothesis's values of some targets (of
        their `rows`): the error it leaves in those alone is a part of what it leaves in all."""
        noise = self.noise
        null_excess = self.excess(self.energies(self.targets, self.null_of(self.targets, rows), rows), noise)
        if null_excess <= 0:
            return 1.0
        left = self.excess(self.energies(list(values), list(values.values()), rows), noise)
        return share_of(left, null_excess)

    @property
    def failing_targets(self) -> list[Target]:
        """The target blocks of the failing tensors, in order."""
        return [t for t in self.targets if t.tensor in self.failing]

    @property
    def screen(self) -> list[Target]:
        """The worst target block of each failing tensor: a hypothesis must explain them to be tried on all."""
        first: dict[str, Target] = {}
        for target in self.failing_targets:
            first.setdefault(target.tensor, target)
        return list(first.values())

    def screen_for(self, variant: Variant) -> list[Target]:
        """The one block a variant must explain half of to be tried on all: the worst failing dq block
        (the cheapest to recompute), or the worst dk/dv block for a variant that leaves dq as it is."""
        screen = self.screen
        if variant.group:
            screen = [t for t in screen if t.tensor != "dq"]
        return screen[:1] if screen else self.screen

    def falls(self, ratios: Mapping[str, float], rows: Rows | None = None) -> str:
        targets = self.targets
        noise = self.noise_of(targets)
        energies = self.energies(targets, self.null_of(targets, rows), rows)
        failing = [t for t in GRAD_NAMES if t in self.failing and t in ratios]
        return falls({t: (ratios[t], math.sqrt(energies[t] / noise[t])) for t in failing}, failing, empty="")


def worst_targets(tensors: Sequence[TensorResult], per_tensor: int = MAX_TARGETS) -> list[Target]:
    """The worst blocks of each failing tensor (and the 2 worst of each passing one), by block map score."""
    targets: list[Target] = []
    for result in tensors:
        if result.block_map is None:
            continue
        score = np.where(np.isnan(result.block_map.score), -np.inf, result.block_map.score)
        count = per_tensor if not result.passed else 1
        for flat in np.argsort(score, axis=None)[::-1][:count]:
            if score.flat[flat] == -np.inf:
                break
            b, n, j = (int(i) for i in np.unravel_index(flat, score.shape))
            targets.append(Target(result.name, b, n, j))
    return targets


def gather_blocks(
    case: Case,
    ctx: Context,
    tensors: Sequence[TensorResult],
    device: Arrays,
    golden: Arrays,
    benchmark: Arrays | None,
    per_tensor: int = MAX_TARGETS,
) -> Blocks:
    blocks = Blocks(case, ctx, device, benchmark, golden, tuple(t.name for t in tensors if not t.passed))
    for target in worst_targets(tensors, per_tensor):
        blocks.add(target)
        blocks.targets.append(target)
    return blocks
