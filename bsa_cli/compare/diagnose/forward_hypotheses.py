"""The forward's recomputed hypotheses and their scoring: out and lse of a few query blocks, float64.

A forward is row-local: a query row's out and lse depend only on its own selected kv columns. So a
hypothesis (a `hypotheses.Variant` of `FORWARD_VARIANTS`: the mask read otherwise, heads mapped otherwise,
the scale, the lse, the online softmax's stacks) is recomputed on a few query blocks (`recompute_forward`),
and `Scorer` scores it by the share of the device's excess error (beyond the benchmark's) it removes, out
and lse together. Pure: arrays in, arrays out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...core.case import Case
from ...core.layout import lse_view, q_view
from .hypotheses import HEAD_READINGS, MASK_READINGS, STACK, MaskReading, Reading, Variant, positions
from .views import SAMPLE_ROWS, Some, Spans, noise_floor, sample_rows, share_of

#: The forward's recomputed hypotheses, tried in this order.
FORWARD_VARIANTS = (
    Variant("tail-block", "the partial last kv block (Skv % Y) is skipped", mask="drop-tail"),
    *MASK_READINGS,
    Variant(
        "block-selection",
        "every 512-column stack after the first starts one column late (columns 512, 1024, ... not read)",
        stacks="off-by-one",
    ),
    *HEAD_READINGS,
    Variant("scale", "scaleValue not applied to the scores", scale="missing"),
    Variant("scale", "scaleValue applied to the scores twice", scale="twice"),
    Variant("scale", "scaleValue held in the case dtype", scale="rounded"),
    Variant("softmax-lse", "lse written as a base-2 log (log2 of the row sum of exp)", lse="base2"),
    Variant("softmax-lse", "lse written without the running max (ln l only)", lse="no-max"),
    Variant(
        "softmax-lse",
        "the online softmax's rescale by exp(m_old - m_new) skipped between 512-column stacks",
        stacks="no-rescale",
    ),
)


@dataclass(frozen=True)
class QBlock:
    """One query block of the forward's outputs: (batch entry, query head, query block)."""

    batch: int
    head: int
    block: int

    def words(self) -> str:
        return f"batch {self.batch} head {self.head} q block {self.block}"


# ---- the recomputed forward of a few query blocks ---------------------------------------------------


@dataclass
class ForwardContext(Reading):
    """The forward's `Reading` (its case with BNSD lengths honoured), and its products and softmax results,
    kept."""

    products: dict[tuple[QBlock, int, bytes, bytes], np.ndarray] = field(default_factory=dict)
    softmax: dict[tuple[str, str, str, str, QBlock, bytes], tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict
    )

    def rows(self, target: QBlock) -> np.ndarray:
        x = self.case.block_shape[0]
        return np.arange(target.block * x, min((target.block + 1) * x, self.spans[target.batch].q_len))

    def columns(self, how: MaskReading, target: QBlock) -> np.ndarray:
        selected = np.flatnonzero(self.mask(how, target.batch)[target.head, target.block])
        return positions(selected, self.case.block_shape[1], self.spans[target.batch].kv_len)


@np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")
def recompute_forward(
    ctx: ForwardContext, v: Variant, target: QBlock, some: Some = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return the float64 out [rows, D] and lse [rows] of one query block under the variant; with `some`, of
    those rows of the block only (a row's out and lse depend on that row alone).

    A block the variant selects nothing for is not written: out and lse NaN (as the device's prefill).
    """
    part = b"" if some is None else some.tobytes()
    key = (v.mask, v.heads, v.scale, v.stacks, target, part)  # the lse variants share the softmax of the others
    if key not in ctx.softmax:
        ctx.softmax[key] = _softmax(ctx, v, target, some)
    out, log_sum, row_max = ctx.softmax[key]
    lse = log_sum if v.lse == "no-max" else log_sum + row_max
    return out, (lse / math.log(2.0) if v.lse == "base2" else lse)


@np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")
def _softmax(ctx: ForwardContext, v: Variant, target: QBlock, some: Some) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, ln l, m) of one query block (or its rows `some`) under the variant's reading of the mask, heads,
    scale and stacks."""
    rows = ctx.rows(target) if some is None else ctx.rows(target)[some]
    cols = ctx.columns(v.mask, target)
    if v.stacks == "off-by-one":
        cols = np.delete(cols, np.arange(STACK, cols.size, STACK))
    if not cols.size:
        empty = np.full(rows.size, np.nan)
        return np.full((rows.size, ctx.case.head_dim), np.nan), empty, empty
    kv_head = ctx.kv_head(v, target.head)
    value = ctx.input_rows("value", target.batch, kv_head, cols)
    shared = (target, kv_head, cols.tobytes(), b"" if some is None else some.tobytes())  # shared by the scale variants
    if shared not in ctx.products:
        if len(ctx.products) >= 64:  # a bound on the memory held
            ctx.products.clear()
        query = ctx.input_rows("query", target.batch, target.head, rows)
        ctx.products[shared] = query @ ctx.input_rows("key", target.batch, kv_head, cols).T
    scores = ctx.scale(v) * ctx.products[shared]
    if v.stacks == "no-rescale":  # each stack's exponentials against the running max of its time, never rescaled
        row_max = np.full(rows.size, -np.inf)
        row_sum = np.zeros(rows.size)
        accumulator = np.zeros((rows.size, ctx.case.head_dim))
        for first in range(0, cols.size, STACK):
            part = scores[:, first : first + STACK]
            row_max = np.maximum(row_max, part.max(axis=1))
            probs = np.exp(part - row_max[:, None])
            row_sum += probs.sum(axis=1)
            accumulator += probs @ value[first : first + STACK]
    else:
        row_max = scores.max(axis=1)
        probs = np.exp(scores - row_max[:, None])
        row_sum = probs.sum(axis=1)
        accumulator = probs @ value
    return accumulator / row_sum[:, None], np.log(row_sum), row_max


#: A hypothesis's values of query blocks: each side's (out, lse) as the sides are ordered.
Values = Mapping[QBlock, tuple[np.ndarray, ...]]


# ---- the device's, benchmark's and golden's blocks, and the scoring ------------------------------------


@dataclass
class Side:
    """One output (out [N1, q_len, D] per entry, or lse [N1, q_len, 1]) of device, benchmark and golden."""

    name: str
    device: dict[int, np.ndarray]
    bench: dict[int, np.ndarray] | None
    golden: dict[int, np.ndarray]
    floor: float  # per element, an absolute error this small is noise (lse) or None for out's relative floor


@dataclass
class Scorer:
    """Scores a hypothesis's out and lse of query blocks: the share of the excess error it removes."""

    ctx: ForwardContext
    sides: list[Side]
    written: np.ndarray  # bool, case.q_shape[:-1]
    data: dict[tuple[str, QBlock], tuple[np.ndarray, np.ndarray, np.ndarray, float]] = field(default_factory=dict)
    row_noise: dict[tuple[str, QBlock], np.ndarray] = field(default_factory=dict)  # benchmark error per row

    def block(self, side: Side, target: QBlock) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """(device, golden, usable mask, noise energy) of one side's block; usable: written rows, both finite."""
        key = (side.name, target)
        if key not in self.data:
            rows = self.ctx.rows(target)
            dev = side.device[target.batch][target.head, rows]
            gold = side.golden[target.batch][target.head, rows]
            written = lse_view(self.ctx.case, self.written, self.ctx.spans[target.batch])[target.head, rows]
            usable = written[:, None] & np.isfinite(dev) & np.isfinite(gold)
            dev, gold = np.where(usable, dev, 0.0), np.where(usable, gold, 0.0)
            bench = gold if side.bench is None else side.bench[target.batch][target.head, rows]  # no benchmark: 0
            bench = np.where(usable & np.isfinite(bench), bench, gold)
            self.row_noise[key] = ((bench - gold) ** 2).sum(axis=1)
            energy = float(self.row_noise[key].sum())
            self.data[key] = (dev, gold, usable, max(energy, self._floor(side, usable, gold)))
        return self.data[key]

    def _floor(self, side: Side, usable: np.ndarray, gold: np.ndarray) -> float:
        """The noise floor of a block's (rows') error energy: lse's absolute, out's relative to the golden."""
        if side.name == "lse":
            return int(usable.sum()) * (side.floor / 4) ** 2 + 1e-30
        return noise_floor(self.ctx.case, float((gold * gold).sum()))

    def sample(self, target: QBlock) -> np.ndarray | None:
        """The rows of a block a hypothesis is screened on (`SAMPLE_ROWS`: half the worst by excess error, half
        spread over the rest), or None for a block of at most twice as many rows."""
        rows = self.ctx.rows(target).size
        if rows <= 2 * SAMPLE_ROWS:
            return None
        excess = np.zeros(rows)
        for side in self.sides:
            dev, gold, _, _ = self.block(side, target)
            excess += ((dev - gold) ** 2).sum(axis=1) - self.row_noise[(side.name, target)]
        return sample_rows(excess)[0]

    def _energies(
        self, targets: Sequence[QBlock], values: Values | None, some: Some = None
    ) -> dict[str, tuple[float, float]]:
        """Each side's error energy of values of the targets (None: the golden's) and its noise; of their rows
        `some` (then their own benchmark error, at least the floor)."""
        out: dict[str, tuple[float, float]] = {}
        for index, side in enumerate(self.sides):
            total = noise = 0.0
            for target in targets:
                dev, gold, usable, energy = self.block(side, target)
                if some is not None:
                    dev, gold, usable = dev[some], gold[some], usable[some]
                    energy = max(
                        float(self.row_noise[(side.name, target)][some].sum()), self._floor(side, usable, gold)
                    )
                value = gold if values is None else values[target][index]  # (gold is 0 where not usable)
                value = np.where(usable, value[:, None] if value.ndim == 1 else value, 0.0)
                with np.errstate(over="ignore", invalid="ignore"):
                    diff = dev - value
                    e = float((diff * diff).sum())
                total += e if math.isfinite(e) else math.inf
                noise += energy
            out[side.name] = (total, noise)
        return out

    @staticmethod
    def _excess(energies: Mapping[str, tuple[float, float]]) -> float:
        return sum(max(e / n - 1.0, 0.0) for e, n in energies.values())

    def explained(
        self, targets: Sequence[QBlock], values: Values, some: Some = None, each: Sequence[str] = ()
    ) -> tuple[float, dict[str, tuple[float, float]]]:
        """(share of the excess error removed, each side's error in benchmark units under the hypothesis and
        without it); of the targets' rows `some` (a block's: the values are of those rows). With `each` (the
        failing sides), the share is at most each of theirs: a hypothesis explains the error only when it
        explains every failing side's (lse fitted while out's error stays as it was explains nothing)."""
        null = self._energies(targets, None, some)
        hyp = self._energies(targets, values, some)
        null_excess = self._excess(null)
        if null_excess <= 0:
            return 0.0, {}
        ratios = {n: (math.sqrt(hyp[n][0] / hyp[n][1]), math.sqrt(null[n][0] / null[n][1])) for n in hyp}
        share = share_of(self._excess(hyp), null_excess)
        for name in each:
            side_null = self._excess({name: null[name]}) if name in null else 0.0
            if side_null > 0:
                share = min(share, share_of(self._excess({name: hyp[name]}), side_null))
        return share, ratios


def per_entry(case: Case, array: np.ndarray, spans: Spans, lse: bool) -> dict[int, np.ndarray]:
    if lse:
        return {b: np.asarray(lse_view(case, array, s), dtype=np.float64)[..., None] for b, s in spans.items()}
    return {b: np.asarray(q_view(case, array, s), dtype=np.float64) for b, s in spans.items()}


def block_sums(rows: np.ndarray, n_q: int, x: int) -> np.ndarray:
    """Sum per-row values [N1, q_len] over query blocks of X rows: [N1, nQ]."""
    padded = np.zeros((rows.shape[0], n_q * x))
    padded[:, : rows.shape[1]] = rows
    return padded.reshape(rows.shape[0], n_q, x).sum(axis=2)


def block_excess(scorer: Scorer, targets: Sequence[QBlock]) -> tuple[dict[QBlock, float], dict[QBlock, float]]:
    """Each query block's excess error (out and lse, in benchmark units of the block), from per-row sums, and
    out's excess error energy per block (beyond the benchmark's)."""
    case, ctx = scorer.ctx.case, scorer.ctx
    x = case.block_shape[0]
    per_block: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}  # (batch, side) -> (error, noise) [N1, nQ]
    with np.errstate(invalid="ignore", over="ignore"):
        for batch, span in ctx.spans.items():
            written = lse_view(case, scorer.written, span)[..., None]  # [N1, q_len, 1]
            n_q = -(-span.q_len // x)
            for side in scorer.sides:
                gold = side.golden[batch]
                error = _block_errors(side.device[batch], gold, written, n_q, x)
                bench = side.bench
                energy = np.zeros_like(error) if bench is None else _block_errors(bench[batch], gold, written, n_q, x)
                if side.name == "lse":
                    floor = block_sums(written[..., 0].astype(np.float64), n_q, x) * (side.floor / 4) ** 2 + 1e-30
                else:
                    gold0 = np.where(np.isfinite(gold), gold, 0.0) * written
                    floor = noise_floor(case, block_sums(np.einsum("nsd,nsd->ns", gold0, gold0), n_q, x))
                per_block[(batch, side.name)] = (error, np.maximum(energy, floor))
    found, out_energy = {}, {}
    for target in targets:
        excess = 0.0
        for side in scorer.sides:
            error, noise = per_block[(target.batch, side.name)]
            e, n = float(error[target.head, target.block]), float(noise[target.head, target.block])
            excess += max(e / n - 1.0, 0.0) if math.isfinite(e) else 0.0
            if side.name == "out":
                out_energy[target] = max(e - n, 0.0) if math.isfinite(e) else 0.0
        found[target] = excess
    return found, out_energy


def _block_errors(values: np.ndarray, gold: np.ndarray, written: np.ndarray, n_q: int, x: int) -> np.ndarray:
    """The error energy of values against the golden per query block [N1, nQ], of the written rows; NaN/Inf
    rows left out (they are not-written's or non-finite's)."""
    diff = values - gold
    diff[~np.isfinite(diff)] = 0.0
    diff *= written
    return block_sums(np.einsum("nsd,nsd->ns", diff, diff), n_q, x)


def query_blocks(ctx: ForwardContext, written: np.ndarray) -> list[QBlock]:
    """Every written query block (at least one row the forward writes)."""
    x = ctx.case.block_shape[0]
    found = []
    for batch, span in ctx.spans.items():
        rows = lse_view(ctx.case, written, span).astype(np.float64)  # [N1, q_len]
        written_blocks = np.argwhere(block_sums(rows, -(-span.q_len // x), x) > 0)  # (head, block), in order
        found += [QBlock(batch, int(head), int(block)) for head, block in written_blocks]
    return found


# ---- the diagnosis -----------------------------------------------------------------------------------
