"""The diagnosis of a failing forward (aclnnBlockSparseAttention): its out and lse, tested as the backward's.

Two ways of testing a cause, as `diagnose` does for the backward:

* **recompute**: out and lse of the worst failing query blocks (batch entry, query head, query block) are
  computed again, float64, dense over the kv blocks the block row selects, under a hypothesis: the mask
  read transposed, a kv block shifted by one, query block i reading block i - 1's selection
  (`block-selection`); the partial last kv block skipped (`tail-block`); heads interleaved or one kv head
  off (`gqa-head-mapping`); the scale missing, applied twice, held in the case dtype (`scale`); lse written
  in base 2 or without the running max, the online softmax's rescale skipped between 512-column stacks
  (`softmax-lse`: the softmax's normaliser, running max and sum, is what goes wrong); every stack after the
  first starting one column late (`block-selection`: selected columns not read). A hypothesis is scored by
  the share of the device's excess error (beyond the benchmark's) it removes over the target blocks, out
  and lse together, and over a block the device gets right and the blocks a mask reading changes (so that
  a hypothesis breaking them is scored down).
* **pattern**: NaN/Inf in written rows (`non-finite`); rows left at the NaN prefill or zero (`not-written`);
  rows the forward must leave alone written (past the actual lengths: `length-boundary`; a block row that
  selects nothing: `block-selection`); out rows equal to golden rows elsewhere (`rows-permuted`; an entry's
  rows shifted as one: `length-boundary`); errors in one or two 16x16 tiles or one 128-row piece
  (`tile-local`); out read as another dtype's bits or with S and N swapped (`layout`); only the bias check
  failing (`precision-bias`); error growing with the selected kv blocks of a row (`accumulation-precision`).

Pure: arrays in, a `Diagnosis` out; no files, no printing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ...case import Case, SequenceSpan, numpy_dtype
from ...golden import forward_case, written_rows
from ...layout import kv_view, lse_view, q_view
from ...rounding import to_dtype
from ..forward import PREFILL_BITS, lse_floor
from ..results import Cause, Check, Hypothesis, TensorResult
from . import Diagnosis, _ranked
from .hypotheses import positions, read_mask

__all__ = ["FORWARD_KINDS", "FORWARD_VARIANTS", "ForwardVariant", "diagnose_forward"]

STACK = 512
"""Columns of one online-softmax step of the forward (its 512-column stacks)."""
MAX_TARGETS = 3
"""Failing query blocks recomputed (the worst by excess error, out and lse together)."""
EXPLAINED = 0.9
"""A recomputed hypothesis explaining this share ranks the local patterns below it (it explains values)."""
LOCAL = 0.9
"""Share of out's excess error one or two tiles (or one piece) must hold to be `tile-local`."""
LAYOUT_ROWS = 4096
"""Written rows of out (evenly spread) the layout readings are scored on."""
DONE = 0.98
"""A recomputed hypothesis explaining this share ends the search (the later ones read "not tried")."""
SAMPLE_ROWS = 32
"""Rows of the worst failing block a hypothesis is tried on first, when the block has more than twice as many."""
SCREENED = 0.3
"""Share of the worst failing block's excess error a hypothesis must explain to be tried on every target."""
WORST_ROWS = 32
"""Rows of out looked up among the golden's rows for `rows-permuted`."""
TILE = 16
TILE_BLOCKS = 8
"""Blocks of out (the worst by excess error) whose tiles and pieces `tile-local` looks at: two tiles or a
piece holding 90% of the error lie in them."""


@dataclass(frozen=True)
class ForwardVariant:
    """A hypothesis of the forward to recompute: how a faulty kernel differs from the operator's semantics."""

    kind: str
    supposes: str
    mask: str = ""  # transposed | kv+1 | kv-1 | q+1 | drop-tail (hypotheses.read_mask)
    heads: str = ""  # interleaved | next
    scale: str = ""  # missing | twice | rounded
    lse: str = ""  # base2 | no-max
    stacks: str = ""  # no-rescale | off-by-one


FORWARD_VARIANTS = (
    ForwardVariant("tail-block", "the partial last kv block (Skv % Y) is skipped", mask="drop-tail"),
    ForwardVariant("block-selection", "the block mask read transposed ([.., j, i])", mask="transposed"),
    ForwardVariant(
        "block-selection", "kv block j reads the selection of block j - 1 (mask shifted by one block)", mask="kv+1"
    ),
    ForwardVariant(
        "block-selection", "kv block j reads the selection of block j + 1 (mask shifted by one block)", mask="kv-1"
    ),
    ForwardVariant("block-selection", "query block i reads the selection of block i - 1", mask="q+1"),
    ForwardVariant(
        "block-selection",
        "every 512-column stack after the first starts one column late (columns 512, 1024, ... not read)",
        stacks="off-by-one",
    ),
    ForwardVariant(
        "gqa-head-mapping", "query head n reads kv head n % N2 (interleaved, not n // G)", heads="interleaved"
    ),
    ForwardVariant("gqa-head-mapping", "query head n reads kv head n // G + 1 (one kv head off)", heads="next"),
    ForwardVariant("scale", "scaleValue not applied to the scores", scale="missing"),
    ForwardVariant("scale", "scaleValue applied to the scores twice", scale="twice"),
    ForwardVariant("scale", "scaleValue held in the case dtype", scale="rounded"),
    ForwardVariant("softmax-lse", "lse written as a base-2 log (log2 of the row sum of exp)", lse="base2"),
    ForwardVariant("softmax-lse", "lse written without the running max (ln l only)", lse="no-max"),
    ForwardVariant(
        "softmax-lse",
        "the online softmax's rescale by exp(m_old - m_new) skipped between 512-column stacks",
        stacks="no-rescale",
    ),
)
"""The forward's recomputed hypotheses, tried in this order."""

FORWARD_KINDS = (
    "non-finite",
    "not-written",
    "block-selection",
    "tail-block",
    "length-boundary",
    "gqa-head-mapping",
    "scale",
    "softmax-lse",
    "precision-bias",
    "accumulation-precision",
    "rows-permuted",
    "tile-local",
    "layout",
)
"""The kinds of the vocabulary the forward's diagnosis can name (the backward's others concern gradients)."""

NULL = ForwardVariant("", "")


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
class ForwardContext:
    """The forward's case (BNSD lengths honoured), its inputs as float64 views, and masks, kept."""

    case: Case
    inputs: Mapping[str, np.ndarray]
    spans: dict[int, SequenceSpan]
    cache: dict[tuple[str, int, int], np.ndarray] = field(default_factory=dict)
    masks: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    products: dict[tuple[QBlock, int, bytes, bytes], np.ndarray] = field(default_factory=dict)
    softmax: dict[tuple[str, str, str, str, QBlock, bytes], tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict
    )

    def view(self, name: str, batch: int, head: int) -> np.ndarray:
        key = (name, batch, head)
        if key not in self.cache:
            span = self.spans[batch]
            array = self.inputs[name]
            view = q_view(self.case, array, span)[head] if name == "query" else kv_view(self.case, array, span)[head]
            self.cache[key] = np.asarray(view, dtype=np.float64)
        return self.cache[key]

    def mask(self, how: str, batch: int) -> np.ndarray:
        key = (how, batch)
        if key not in self.masks:
            block_mask = np.asarray(self.inputs["block_sparse_mask"])
            self.masks[key] = read_mask(self.case, block_mask, self.spans[batch], how)
        return self.masks[key]

    def kv_head(self, variant: ForwardVariant, head: int) -> int:
        case = self.case
        if variant.heads == "interleaved":
            return head % case.num_kv_heads
        if variant.heads == "next":
            return (head // case.group_size + 1) % case.num_kv_heads
        return head // case.group_size

    def scale(self, variant: ForwardVariant) -> float:
        scale = float(self.case.kernel_scale)
        if variant.scale == "missing":
            return 1.0
        if variant.scale == "twice":
            return scale * scale
        if variant.scale == "rounded":
            held = to_dtype(np.array([scale], dtype=np.float32), numpy_dtype(self.case.dtype))
            return float(np.asarray(held, dtype=np.float64).reshape(-1)[0])
        return scale

    def rows(self, target: QBlock) -> np.ndarray:
        x = self.case.block_shape[0]
        return np.arange(target.block * x, min((target.block + 1) * x, self.spans[target.batch].q_len))

    def columns(self, how: str, target: QBlock) -> np.ndarray:
        selected = np.flatnonzero(self.mask(how, target.batch)[target.head, target.block])
        return positions(selected, self.case.block_shape[1], self.spans[target.batch].kv_len)


@np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")
def recompute_forward(
    ctx: ForwardContext, v: ForwardVariant, target: QBlock, some: np.ndarray | None = None
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
    if v.lse == "no-max":
        lse = log_sum
    elif v.lse == "base2":
        lse = (log_sum + row_max) / math.log(2.0)
    else:
        lse = log_sum + row_max
    return out, lse


@np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")
def _softmax(
    ctx: ForwardContext, v: ForwardVariant, target: QBlock, some: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    value = ctx.view("value", target.batch, kv_head)[cols]
    shared = (target, kv_head, cols.tobytes(), b"" if some is None else some.tobytes())  # shared by the scale variants
    if shared not in ctx.products:
        if len(ctx.products) >= 64:  # a bound on the memory held
            ctx.products.clear()
        query = ctx.view("query", target.batch, target.head)[rows]
        ctx.products[shared] = query @ ctx.view("key", target.batch, kv_head)[cols].T
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


def applies(ctx: ForwardContext, v: ForwardVariant) -> str | None:
    """Return why a variant cannot be told from the operator's semantics in this case, else None."""
    case = ctx.case
    if v.heads == "interleaved" and (case.group_size <= 1 or case.num_kv_heads <= 1):
        return "not tried: the interleaved mapping is the same here (one kv head, or N1 == N2)"
    if v.heads == "next" and case.num_kv_heads <= 1:
        return "not tried: one kv head"
    if v.mask and all(np.array_equal(ctx.mask(v.mask, b), ctx.mask("", b)) for b in ctx.spans):
        return "not tried: the mask reads the same under it in this case"
    if v.scale in ("missing", "twice") and ctx.scale(v) == ctx.scale(NULL):
        return "not tried: the scale is 1"
    if v.scale == "rounded" and ctx.scale(v) == ctx.scale(NULL):
        return "not tried: the scale is exact in the case dtype"
    if v.stacks:
        y = case.block_shape[1]
        longest = 0
        for span in ctx.spans.values():
            mask = ctx.mask("", span.batch)
            widths = np.full(mask.shape[2], y)
            widths[-1] = span.kv_len - y * (mask.shape[2] - 1)
            longest = max(longest, int((mask @ widths).max(initial=0)))
        if longest <= STACK:
            return f"not tried: no row selects more than {STACK} columns (one online-softmax stack)"
    return None


def changed_blocks(ctx: ForwardContext, v: ForwardVariant, count: int = 2) -> list[QBlock]:
    """Up to `count` query blocks whose selection a mask variant changes."""
    if not v.mask:
        return []
    found: list[QBlock] = []
    for batch in ctx.spans:
        heads, blocks = np.nonzero((ctx.mask(v.mask, batch) != ctx.mask("", batch)).any(axis=2))
        step = max(1, heads.size // count)
        for h, i in list(zip(heads, blocks, strict=True))[::step][: count - len(found)]:
            found.append(QBlock(batch, int(h), int(i)))
        if len(found) >= count:
            break
    return found


# ---- the device's, benchmark's and golden's blocks, and the scoring ------------------------------------


def _eps(case: Case) -> float:
    return 2.0 ** -(11 if case.dtype == "float16" else 8)


@dataclass
class _Side:
    """One output (out [N1, q_len, D] per entry, or lse [N1, q_len, 1]) of device, benchmark and golden."""

    name: str
    device: dict[int, np.ndarray]
    bench: dict[int, np.ndarray] | None
    golden: dict[int, np.ndarray]
    floor: float  # per element, an absolute error this small is noise (lse) or None for out's relative floor


@dataclass
class _Scorer:
    """Scores a hypothesis's out and lse of query blocks: the share of the excess error it removes."""

    ctx: ForwardContext
    sides: list[_Side]
    written: np.ndarray  # bool, case.q_shape[:-1]
    data: dict[tuple[str, QBlock], tuple[np.ndarray, np.ndarray, np.ndarray, float]] = field(default_factory=dict)
    row_noise: dict[tuple[str, QBlock], np.ndarray] = field(default_factory=dict)  # benchmark error per row

    def block(self, side: _Side, target: QBlock) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """(device, golden, usable mask, noise energy) of one side's block; usable: written rows, both finite."""
        key = (side.name, target)
        if key not in self.data:
            rows = self.ctx.rows(target)
            dev = side.device[target.batch][target.head, rows]
            gold = side.golden[target.batch][target.head, rows]
            written = lse_view(self.ctx.case, self.written, self.ctx.spans[target.batch])[target.head, rows]
            usable = written[:, None] & np.isfinite(dev) & np.isfinite(gold)
            dev, gold = np.where(usable, dev, 0.0), np.where(usable, gold, 0.0)
            if side.bench is not None:
                bench = side.bench[target.batch][target.head, rows]
                bench = np.where(usable & np.isfinite(bench), bench, gold)
                self.row_noise[key] = ((bench - gold) ** 2).sum(axis=1)
                energy = float(self.row_noise[key].sum())
            else:
                self.row_noise[key] = np.zeros(rows.size)
                energy = 0.0
            if side.name == "lse":
                floor = int(usable.sum()) * (side.floor / 4) ** 2 + 1e-30
            else:
                floor = float((gold * gold).sum()) * (_eps(self.ctx.case) / 4) ** 2 + 1e-30
            self.data[key] = (dev, gold, usable, max(energy, floor))
        return self.data[key]

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
        worst = np.argsort(-excess, kind="stable")[: SAMPLE_ROWS // 2]
        rest = np.setdiff1d(np.arange(rows), worst)
        spread = rest[np.linspace(0, rest.size - 1, SAMPLE_ROWS // 2).astype(np.int64)]
        return np.unique(np.concatenate([worst, spread]))

    def explained_rows(self, target: QBlock, some: np.ndarray, values: Sequence[np.ndarray]) -> float:
        """The share of the excess error of a block's rows `some` a hypothesis's values of them remove."""
        null_excess = hyp_excess = 0.0
        for side, value in zip(self.sides, values, strict=True):
            dev, gold, usable, _ = self.block(side, target)
            dev, gold, usable = dev[some], gold[some], usable[some]
            value = value[:, None] if value.ndim == 1 else value
            if side.name == "lse":
                floor = int(usable.sum()) * (side.floor / 4) ** 2 + 1e-30
            else:
                floor = float((gold * gold).sum()) * (_eps(self.ctx.case) / 4) ** 2 + 1e-30
            noise = max(float(self.row_noise[(side.name, target)][some].sum()), floor)
            with np.errstate(over="ignore", invalid="ignore"):
                diff = dev - np.where(usable, value, 0.0)
                energy = float((diff * diff).sum())
            null_excess += max(float(((dev - gold) ** 2).sum()) / noise - 1.0, 0.0)
            hyp_excess += max(energy / noise - 1.0, 0.0) if math.isfinite(energy) else math.inf
        if null_excess <= 0:
            return 0.0
        return max(0.0, min(1.0, 1.0 - hyp_excess / null_excess))

    def _energies(
        self, targets: Sequence[QBlock], values: Mapping[QBlock, tuple[np.ndarray, ...]] | None
    ) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for index, side in enumerate(self.sides):
            total = noise = 0.0
            for target in targets:
                dev, gold, usable, energy = self.block(side, target)
                if values is None:
                    value = gold
                else:
                    value = values[target][index]
                    value = value[:, None] if value.ndim == 1 else value
                    value = np.where(usable, value, 0.0)
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
        self, targets: Sequence[QBlock], values: Mapping[QBlock, tuple[np.ndarray, ...]]
    ) -> tuple[float, dict[str, tuple[float, float]]]:
        """(share of the excess error removed, each side's error in benchmark units under the hypothesis and
        without it)."""
        null = self._energies(targets, None)
        hyp = self._energies(targets, values)
        null_excess = self._excess(null)
        if null_excess <= 0:
            return 0.0, {}
        share = 1.0 - self._excess(hyp) / null_excess
        ratios = {n: (math.sqrt(hyp[n][0] / hyp[n][1]), math.sqrt(null[n][0] / null[n][1])) for n in hyp}
        return max(0.0, min(1.0, share)), ratios


def _falls(ratios: Mapping[str, tuple[float, float]], failing: Sequence[str]) -> str:
    parts = [
        f"{n}'s error {'falls' if h <= z else 'rises'} to {h:.3g}x the benchmark's (from {z:.3g}x)"
        for n, (h, z) in ratios.items()
        if n in failing
    ]
    return ", ".join(parts) or "nothing to explain"


def _per_entry(case: Case, array: np.ndarray, spans: Mapping[int, SequenceSpan], lse: bool) -> dict[int, np.ndarray]:
    if lse:
        return {b: np.asarray(lse_view(case, array, s), dtype=np.float64)[..., None] for b, s in spans.items()}
    return {b: np.asarray(q_view(case, array, s), dtype=np.float64) for b, s in spans.items()}


def _per_block(rows: np.ndarray, n_q: int, x: int) -> np.ndarray:
    """Sum per-row values [N1, q_len] over query blocks of X rows: [N1, nQ]."""
    padded = np.zeros((rows.shape[0], n_q * x))
    padded[:, : rows.shape[1]] = rows
    return padded.reshape(rows.shape[0], n_q, x).sum(axis=2)


def _block_excess(scorer: _Scorer, targets: Sequence[QBlock]) -> tuple[dict[QBlock, float], dict[QBlock, float]]:
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
                diff = side.device[batch] - gold
                diff[~np.isfinite(diff)] = 0.0  # NaN/Inf rows are not-written's or non-finite's
                diff *= written
                error = _per_block(np.einsum("nsd,nsd->ns", diff, diff), n_q, x)
                if side.bench is not None:
                    bench = side.bench[batch] - gold
                    bench[~np.isfinite(bench)] = 0.0
                    bench *= written
                    energy = _per_block(np.einsum("nsd,nsd->ns", bench, bench), n_q, x)
                else:
                    energy = np.zeros_like(error)
                if side.name == "lse":
                    floor = _per_block(written[..., 0].astype(np.float64), n_q, x) * (side.floor / 4) ** 2 + 1e-30
                else:
                    gold0 = np.where(np.isfinite(gold), gold, 0.0) * written
                    floor = _per_block(np.einsum("nsd,nsd->ns", gold0, gold0), n_q, x) * (_eps(case) / 4) ** 2 + 1e-30
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


def _query_blocks(ctx: ForwardContext, written: np.ndarray) -> list[QBlock]:
    """Every written query block (at least one row the forward writes)."""
    x = ctx.case.block_shape[0]
    found = []
    for batch, span in ctx.spans.items():
        rows = lse_view(ctx.case, written, span)  # [N1, q_len]
        for head in range(ctx.case.num_heads):
            for block in range(-(-span.q_len // x)):
                if rows[head, block * x : (block + 1) * x].any():
                    found.append(QBlock(batch, head, block))
    return found


# ---- the diagnosis -----------------------------------------------------------------------------------


def diagnose_forward(
    case: Case,
    tensors: Sequence[TensorResult],
    checks: Sequence[Check],
    device: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    benchmark: Mapping[str, np.ndarray] | None,
    inputs: Mapping[str, np.ndarray],
    inner_precise: int = 0,
    prefilled: bool = False,
) -> Diagnosis:
    """Diagnose a failing forward: test candidate causes against the device's out and lse and rank them.

    Args:
        case: the case (its forward's view, BNSD lengths honoured, is taken here).
        tensors: the judged out (and lse, unless softmax_lse_flag 0), at least one failing.
        checks: the case-level checks (lse's rows-written when lse is not judged).
        device, golden, benchmark: {"out", "lse"} arrays as judged (benchmark may be None).
        inputs: query, key, value, block_sparse_mask keyed by manifest name.
        inner_precise: the forward's innerPrecise (the floor of lse's noise).
        prefilled: the device pre-filled its output buffers with NaN (rows left alone are checked).

    Returns:
        The causes, best first, and every hypothesis tried. A forward with nothing failing gets none.
    """
    failing = [t for t in tensors if not t.passed]
    if not failing and all(c.passed for c in checks):
        return _ranked([], [])
    fcase = forward_case(case)
    spans = {s.batch: s for s in fcase.spans() if s.q_len and s.kv_len}
    ctx = ForwardContext(fcase, inputs, spans)
    block_mask = np.asarray(inputs["block_sparse_mask"])
    written = written_rows(fcase, block_mask)
    judged = [t.name for t in tensors]
    names = [t.name for t in failing]
    causes: list[Cause] = []
    tried: list[Hypothesis] = []
    arrays = {n: np.asarray(device[n]).reshape((*fcase.q_shape[:-1], -1)) for n in judged}
    gold = {n: np.asarray(golden[n]).reshape((*fcase.q_shape[:-1], -1)) for n in judged}

    # Rows left at the NaN prefill (or zero), NaN/Inf computed, rows written that must be left alone.
    left = _unwritten(fcase, judged, arrays, gold, written, prefilled, PREFILL_BITS, causes, tried)
    any_left = any(rows.any() for rows in left.values())
    _written_alone(fcase, tensors, checks, arrays, written, block_mask, prefilled, PREFILL_BITS, causes, tried)
    if any(c.name == "all_zero" and not c.passed for t in failing for c in t.checks):
        zero = [t.name for t in failing if any(c.name == "all_zero" and not c.passed for c in t.checks)]
        text = f"{', '.join(zero)} all zero where the golden is not, as if never written"
        causes.append(Cause("not-written", 1.0, text, tuple(zero), ()))
        tried.append(Hypothesis("not-written", "an output never written", 1.0, "explains: " + text))
    bias_only = bool(failing) and all(all(c.passed or c.name == "bias" for c in t.checks) for t in failing)
    if bias_only:
        detail = "; ".join(c.detail for t in failing for c in t.checks if not c.passed)
        causes.append(Cause("precision-bias", 1.0, detail, tuple(names), ()))
        tried.append(Hypothesis("precision-bias", "a systematic relative bias alone", 1.0, "explains: " + detail))
        return _ranked(causes, tried)

    floor, _ = lse_floor(inner_precise)
    sides = []
    for name in judged:
        is_lse = name == "lse"
        bench = None
        if benchmark is not None and name in benchmark:
            bench = _per_entry(fcase, np.asarray(benchmark[name]), spans, is_lse)
        sides.append(
            _Side(
                name,
                _per_entry(fcase, np.asarray(device[name]), spans, is_lse),
                bench,
                _per_entry(fcase, np.asarray(golden[name]), spans, is_lse),
                floor,
            )
        )
    scorer = _Scorer(ctx, sides, written)
    blocks = _query_blocks(ctx, written)
    excess, out_excess = _block_excess(scorer, blocks)
    worst = sorted((b for b in blocks if excess[b] > 0), key=lambda b: -excess[b])
    targets = worst[:MAX_TARGETS]
    if not targets:
        reason = "not tried: no written row has an error beyond the benchmark's (only NaN/Inf or unwritten rows)"
        for v in FORWARD_VARIANTS:
            if v.mask and any_left and applies(ctx, v) is None and _predicts_unwritten(ctx, v, written, left):
                text = f"{v.supposes}: it leaves unwritten exactly the rows the device left unwritten"
                causes.append(Cause(v.kind, 1.0, text, tuple(names), ()))
                tried.append(Hypothesis(v.kind, v.supposes, 1.0, "explains: " + text))
                causes[:] = _follows(causes, v, 1.0)
            else:
                tried.append(Hypothesis(v.kind, v.supposes, 0.0, reason))
        return _ranked(causes, tried)
    controls = [min(blocks, key=lambda b: excess[b])] if len(blocks) > len(targets) else []
    controls = [b for b in controls if b not in targets]
    where = tuple(f"{', '.join(names)} {t.words()}" for t in targets)

    best = 0.0
    done: ForwardVariant | None = None
    seen: dict[bytes, ForwardVariant] = {}
    for v in FORWARD_VARIANTS:
        why = applies(ctx, v)
        if why is None and v.mask:  # two misreadings of the mask that read the same here are one hypothesis
            read = b"".join(ctx.mask(v.mask, b).tobytes() for b in sorted(spans))
            if read in seen:
                why = f"not told apart from '{seen[read].supposes}' in this case: the mask reads the same"
            seen.setdefault(read, v)
        if why is None and done is not None:
            why = f"not tried: '{done.supposes}' already explains {best:.0%} of the error"
        if why is not None:
            tried.append(Hypothesis(v.kind, v.supposes, 0.0, why))
            continue
        values: dict[QBlock, tuple[np.ndarray, ...]] = {}
        screen = targets[0]  # the worst failing block first (cheap): most hypotheses end here
        some = scorer.sample(screen)
        if some is not None:  # and a few of its rows before it
            out, lse = recompute_forward(ctx, v, screen, some)
            part = scorer.explained_rows(screen, some, [out if s.name == "out" else lse for s in sides])
            if part < SCREENED:
                outcome = f"ruled out: explains {part:.0%} of the error of {some.size} rows of the worst failing block"
                tried.append(Hypothesis(v.kind, v.supposes, part, outcome))
                continue
        out, lse = recompute_forward(ctx, v, screen)
        values[screen] = tuple(out if s.name == "out" else lse for s in sides)
        first, _ = scorer.explained([screen], values)
        if first < SCREENED and len(targets) > 1:
            outcome = f"ruled out: explains {first:.0%} of the error of the worst failing block ({screen.words()})"
            tried.append(Hypothesis(v.kind, v.supposes, first, outcome))
            continue
        scored = [*targets, *controls, *(b for b in changed_blocks(ctx, v) if b not in targets and b not in controls)]
        for target in scored[1:]:
            out, lse = recompute_forward(ctx, v, target)
            values[target] = tuple(out if s.name == "out" else lse for s in sides)
        share, ratios = scorer.explained(scored, values)
        text = f"under the hypothesis, {_falls(ratios, names)}"
        if share >= 0.5:
            changed = tuple(n for n in names if n in ratios) or tuple(names)
            causes.append(Cause(v.kind, share, f"{v.supposes}: {text}", changed, where))
            tried.append(Hypothesis(v.kind, v.supposes, share, f"explains {share:.0%} of the excess error: {text}"))
            best = max(best, share)
            done = v if share >= DONE and done is None else done
            if share >= EXPLAINED and v.mask and any_left and _predicts_unwritten(ctx, v, written, left):
                causes[:] = _follows(causes, v, share)
        else:
            tried.append(Hypothesis(v.kind, v.supposes, share, f"ruled out: explains {share:.0%}: {text}"))

    if done is None:
        best = max(best, _fits(scorer, targets, controls, names, where, causes, tried))
    out_index = judged.index("out") if "out" in judged else None
    local: list[Cause] = []
    if done is not None:  # the patterns would only rank below it
        for kind, supposes in _FORWARD_PATTERNS:
            tried.append(Hypothesis(kind, supposes, 0.0, f"not tried: '{done.supposes}' already explains the error"))
    elif out_index is not None:
        _rows_permuted(fcase, spans, sides[out_index], written, targets, local, tried)
        _tile_local(fcase, scorer, sides[out_index], blocks, out_excess, local, tried)
        if best < EXPLAINED:
            _layout(fcase, arrays["out"], gold["out"], benchmark, written, local, tried)
            _accumulation(fcase, ctx, blocks, excess, local, tried)
    moved = max((c.score for c in local if c.kind in ("rows-permuted", "length-boundary")), default=0.0)
    if moved >= LOCAL:  # rows at other rows' places are local too: the rows say more than the tile or piece
        local = [replace(c, score=min(c.score, 0.9 * moved)) if c.kind == "tile-local" else c for c in local]
    if best >= EXPLAINED:  # a hypothesis that explains the values outranks where the errors are
        local = [replace(c, score=min(c.score, 0.8 * best)) for c in local]
    causes.extend(local)
    return _ranked(causes, tried)


# ---- patterns ----------------------------------------------------------------------------------------


def _row_words(case: Case, written: np.ndarray, flat: int) -> str:
    index = np.unravel_index(flat, written.shape)
    x = case.block_shape[0]
    if case.layout == "TND":
        t, n = (int(i) for i in index)
        return f"token {t} head {n} (T index)"
    b, n, s = (int(i) for i in index)
    return f"batch {b} head {n} row {s} (q block {s // x})"


_FORWARD_PATTERNS = (
    ("rows-permuted", "out rows written at other rows' places (device rows equal golden rows elsewhere)"),
    ("tile-local", "errors confined to one or two 16x16 tiles (or one 128-row piece) of out"),
    ("layout", "another layout or dtype reading of out"),
    ("accumulation-precision", "error growing with the number of kv blocks a query block row accumulates"),
)
"""The forward's patterns on out's values, tried after the recomputed hypotheses (for `--explain`)."""


def _fits(
    scorer: _Scorer,
    targets: Sequence[QBlock],
    controls: Sequence[QBlock],
    names: Sequence[str],
    where: tuple[str, ...],
    causes: list[Cause],
    tried: list[Hypothesis],
) -> float:
    """Fitted on the target blocks, scored on them and the control: out off by a constant factor (`scale`:
    a factor in the normalisation, 1/l or the scale's place), lse off by an affine map (`softmax-lse`: lse
    in another base, shifted, without a term). Returns the best share."""
    best = 0.0
    for index, side in enumerate(scorer.sides):
        if side.name not in names:
            continue
        blocks = [scorer.block(side, t) for t in targets]
        dev = np.concatenate([b[0].reshape(-1) for b in blocks])
        gold = np.concatenate([b[1].reshape(-1) for b in blocks])
        usable = np.concatenate([b[2].reshape(-1) for b in blocks])
        dev, gold = dev[usable], gold[usable]
        if gold.size < 2 or not float(gold @ gold) > 0:
            continue
        if side.name == "out":
            factor = float(dev @ gold) / float(gold @ gold)
            offset = 0.0
            supposes = "out off by a constant factor"
            words = f"out = {factor:.4g} x golden"
            kind = "scale"
        else:
            factor, offset = (float(c) for c in np.polyfit(gold, dev, 1))
            supposes = "lse off by an affine map (another base, a shift, a term left out)"
            words = f"lse = {factor:.4g} x golden {'+' if offset >= 0 else '-'} {abs(offset):.4g}"
            kind = "softmax-lse"
        values = {}
        scored = [*targets, *controls]
        for target in scored:
            parts = []
            for other_index, other in enumerate(scorer.sides):
                gold_block = scorer.block(other, target)[1]
                fitted = factor * gold_block + offset if other_index == index else gold_block
                parts.append(fitted[:, 0] if other.name == "lse" else fitted)
            values[target] = tuple(parts)
        share, ratios = scorer.explained(scored, values)
        text = f"{words}: {_falls(ratios, names)}"
        if share >= 0.9:
            causes.append(Cause(kind, 0.95 * share, text, (side.name,), where))
            tried.append(Hypothesis(kind, supposes, 0.95 * share, f"explains {share:.0%} of the excess error: {text}"))
            best = max(best, 0.95 * share)
        else:
            tried.append(Hypothesis(kind, supposes, share, f"ruled out: explains {share:.0%}: {text}"))
    return best


def _predicts_unwritten(
    ctx: ForwardContext, v: ForwardVariant, written: np.ndarray, left: Mapping[str, np.ndarray]
) -> bool:
    """Whether a mask reading leaves unwritten exactly the rows the device left unwritten (of those it must
    write), in every output: a kernel skipping a block row writes neither its out nor its lse."""
    x = ctx.case.block_shape[0]
    for batch, span in ctx.spans.items():
        empty = np.repeat(~ctx.mask(v.mask, batch).any(axis=2), x, axis=1)[:, : span.q_len]
        empty &= lse_view(ctx.case, written, span)
        if not all(np.array_equal(empty, lse_view(ctx.case, rows, span)) for rows in left.values()):
            return False
    return True


def _follows(causes: Sequence[Cause], v: ForwardVariant, share: float) -> list[Cause]:
    """not-written ranked below a mask reading that leaves exactly those rows unwritten (its symptom)."""
    follows = f" (follows from: {v.supposes})"
    return [
        replace(c, score=min(c.score, 0.9 * share), evidence=c.evidence + follows)
        if c.kind == "not-written" and follows not in c.evidence
        else c
        for c in causes
    ]


def _unwritten(
    case: Case,
    judged: Sequence[str],
    arrays: Mapping[str, np.ndarray],
    gold: Mapping[str, np.ndarray],
    written: np.ndarray,
    prefilled: bool,
    bits: Mapping[str, int],
    causes: list[Cause],
    tried: list[Hypothesis],
) -> dict[str, np.ndarray]:
    """not-written: written rows left at the NaN prefill (the device says it pre-filled) or all zero;
    non-finite: other NaN/Inf in written rows where the golden is finite. Returns the rows left unwritten
    of each output."""
    every: dict[str, np.ndarray] = {}
    for name in judged:
        dev, ref = arrays[name], gold[name]
        dtype = "float32" if name == "lse" else case.dtype
        unsigned = np.uint16 if dev.dtype.itemsize == 2 else np.uint32
        finite_gold = np.isfinite(ref).all(axis=-1) & written
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(dev.astype(np.float32))
        at_prefill = (dev.view(unsigned) == unsigned(bits[dtype])).all(axis=-1) if prefilled else np.zeros_like(written)
        zero = (dev.astype(np.float32) == 0).all(axis=-1) & (np.abs(ref) > 0).any(axis=-1)
        left = finite_gold & (at_prefill | zero)
        every[name] = left
        bad = finite_gold[..., None] & ~finite & ~left[..., None]
        total = int(finite_gold.sum())
        if left.any():
            count = int(left.sum())
            how = "the NaN prefill" if at_prefill[left].all() else "zero" if zero[left].all() else "the prefill or zero"
            first = _row_words(case, written, int(np.flatnonzero(left)[0]))
            text = f"{name}: {count} of {total} rows the forward must write hold {how}, as if never written, "
            text += f"first at {first}"
            causes.append(Cause("not-written", 1.0, text, (name,), (f"{name} {first}",)))
            tried.append(Hypothesis("not-written", f"{name} rows never written", 1.0, "explains: " + text))
        if bad.any():
            rows = np.flatnonzero(bad.any(axis=-1))
            first = _row_words(case, written, int(rows[0]))
            text = (
                f"{name}: {int(bad.sum())} NaN/Inf in {rows.size} written rows where the golden is finite, "
                f"first at {first}"
            )
            causes.append(Cause("non-finite", 1.0, text, (name,), (f"{name} {first}",)))
            tried.append(
                Hypothesis("non-finite", "NaN/Inf written where the golden is finite", 1.0, "explains: " + text)
            )

    return every


def _written_alone(
    case: Case,
    tensors: Sequence[TensorResult],
    checks: Sequence[Check],
    arrays: Mapping[str, np.ndarray],
    written: np.ndarray,
    block_mask: np.ndarray,
    prefilled: bool,
    bits: Mapping[str, int],
    causes: list[Cause],
    tried: list[Hypothesis],
) -> None:
    """Rows the forward must leave alone that were written: past the actual lengths (`length-boundary`), or
    of a block row that selects nothing (`block-selection`); lse written with softmax_lse_flag 0 (`layout`
    would be wrong: it is the flag ignored, `not-written`'s converse, named as block-selection of rows)."""
    if not prefilled:
        return
    every = [*checks, *(c for t in tensors for c in t.checks)]
    for check in every:
        if check.name != "rows-written" or check.passed or "must leave alone were written" not in check.detail:
            continue
        name = check.tensor or "out"
        if name not in arrays:
            continue
        dev = arrays[name]
        dtype = "float32" if name == "lse" else case.dtype
        unsigned = np.uint16 if dev.dtype.itemsize == 2 else np.uint32
        touched = ~written & ~(dev.view(unsigned) == unsigned(bits[dtype])).all(axis=-1)
        if "softmax_lse_flag 0" in check.detail:
            text = f"{check.detail}: the forward wrote lse although softmax_lse_flag is 0"
            causes.append(Cause("layout", 0.5, text, (name,), ()))
            tried.append(Hypothesis("layout", "lse written with softmax_lse_flag 0", 0.5, "explains: " + text))
            continue
        past = np.zeros_like(written)
        if case.layout != "TND":
            for span in case.spans():
                past[span.batch, :, span.q_len :] = True
        beyond, empty = touched & past, touched & ~past
        total = int(touched.sum())
        if beyond.any():
            first = _row_words(case, written, int(np.flatnonzero(beyond)[0]))
            text = (
                f"{name}: {int(beyond.sum())} rows past the actual query lengths written (the forward must leave "
                f"them alone), first at {first}"
            )
            score = int(beyond.sum()) / total
            causes.append(Cause("length-boundary", score, text, (name,), (f"{name} {first}",)))
            tried.append(
                Hypothesis("length-boundary", "rows past the actual lengths written", score, "explains: " + text)
            )
        if empty.any():
            first = _row_words(case, written, int(np.flatnonzero(empty)[0]))
            text = (
                f"{name}: {int(empty.sum())} rows of query blocks that select no kv block written (computed "
                f"although the mask selects nothing there), first at {first}"
            )
            score = int(empty.sum()) / total
            causes.append(Cause("block-selection", score, text, (name,), (f"{name} {first}",)))
            tried.append(Hypothesis("block-selection", "rows that select no block written", score, "explains: " + text))


def _rows_permuted(
    case: Case,
    spans: Mapping[int, SequenceSpan],
    side: _Side,
    written: np.ndarray,
    targets: Sequence[QBlock],
    causes: list[Cause],
    tried: list[Hypothesis],
) -> None:
    """rows-permuted: out's worst rows equal golden rows at other positions of the same head (any entry);
    length-boundary when an entry's worst rows all sit one shift from their place (the entry written late)."""
    supposes = "out rows written at other rows' places (device rows equal golden rows elsewhere)"
    eps = _eps(case)
    found: list[_Moved] = []
    for head in sorted({t.head for t in targets}):
        pool = sorted(spans.items())
        golden_rows = np.concatenate([side.golden[b][head] for b, _ in pool])
        where = np.concatenate([np.stack([np.full(s.q_len, b), np.arange(s.q_len)], axis=1) for b, s in pool])
        ok = np.concatenate([lse_view(case, written, s)[head] for _, s in pool]) & np.isfinite(golden_rows).all(axis=1)
        dev_rows = np.concatenate([side.device[b][head] for b, _ in pool])
        usable = ok & np.isfinite(dev_rows).all(axis=1)
        err = np.where(usable, ((np.where(usable[:, None], dev_rows, 0.0) - golden_rows) ** 2).sum(axis=1), 0.0)
        safe_golden = np.where(ok[:, None], golden_rows, 0.0)
        norms = (safe_golden * safe_golden).sum(axis=1)
        for index in np.argsort(-err, kind="stable")[:WORST_ROWS]:
            noise = float((golden_rows[index] ** 2).sum()) * (2 * eps) ** 2 + 1e-30
            if err[index] <= 4 * noise:
                break
            dist = np.where(
                ok, norms - 2.0 * (safe_golden @ dev_rows[index]) + float(dev_rows[index] @ dev_rows[index]), np.inf
            )
            dist[index] = np.inf
            match = int(np.argmin(dist))
            (b, s), (mb, ms) = (int(i) for i in where[index]), (int(i) for i in where[match])
            shift = ms - s if mb == b else None
            found.append(_Moved(b, head, s, shift, float(err[index]), float(min(dist[match], err[index]))))
    if not found:
        tried.append(Hypothesis("rows-permuted", supposes, 0.0, "ruled out: no row of out has an error to place"))
        return
    total = sum(f.error for f in found)
    share = sum(f.error - f.left for f in found) / total if total > 0 else 0.0
    close = [f for f in found if f.left <= 0.05 * f.error]
    shifts = [f.shift for f in close if f.shift]
    common = max(set(shifts), key=shifts.count) if shifts else None
    if share >= 0.5 and common is not None and len(found) >= 4 and shifts.count(common) >= 0.8 * len(found):
        b = next(f.batch for f in close if f.shift == common)
        text = (
            f"out rows of batch entry {b} equal the golden's rows {common:+d} places away ({shifts.count(common)} of "
            f"the {len(found)} worst rows): the entry written shifted, explaining {share:.0%} of their error"
        )
        causes.append(Cause("length-boundary", share, text, ("out",), (f"out batch {b}",)))
        tried.append(Hypothesis("length-boundary", "an entry's rows written shifted", share, "explains: " + text))
        return
    first = f" (first: {close[0].words()})" if close else ""
    text = (
        f"{len(close)} of out's {len(found)} worst rows equal golden rows at other positions{first}, explaining "
        f"{share:.0%} of their error"
    )
    if share >= 0.5:
        where_rows = tuple(f"out {f.words()}" for f in close[:3])
        causes.append(Cause("rows-permuted", share, text, ("out",), where_rows))
        tried.append(Hypothesis("rows-permuted", supposes, share, "explains: " + text))
    else:
        tried.append(Hypothesis("rows-permuted", supposes, share, "ruled out: " + text))


@dataclass(frozen=True)
class _Moved:
    """One of out's worst rows and the golden row it is closest to (elsewhere): the shift within its entry
    (None: another entry) and its error before and after."""

    batch: int
    head: int
    row: int
    shift: int | None
    error: float
    left: float

    def words(self) -> str:
        return f"batch {self.batch} head {self.head} row {self.row}"


def _tile_local(
    case: Case,
    scorer: _Scorer,
    side: _Side,
    blocks: Sequence[QBlock],
    excess: Mapping[QBlock, float],
    causes: list[Cause],
    tried: list[Hypothesis],
) -> None:
    """tile-local: out's excess error (`excess`: per block, beyond the benchmark's) held by one or two 16x16
    tiles, or one 128-row piece."""
    supposes = "errors confined to one or two 16x16 tiles (or one 128-row piece) of out"
    tiles: list[tuple[float, tuple[QBlock, int, int, int]]] = []
    pieces: list[tuple[float, tuple[QBlock, int, int, int]]] = []
    total = sum(excess.values())  # out's excess error energy, every block
    count_tiles = 0
    for target in sorted((b for b in blocks if excess[b] > 0), key=lambda b: -excess[b])[:TILE_BLOCKS]:
        dev, gold, usable, noise = scorer.block(side, target)
        err = (dev - gold) ** 2
        rows, cols = err.shape
        x0 = target.block * case.block_shape[0]
        per_row = noise / max(int(usable.any(axis=1).sum()), 1)
        padded = np.zeros((-(-rows // TILE) * TILE, -(-cols // TILE) * TILE))
        padded[:rows, :cols] = err
        sums = padded.reshape(padded.shape[0] // TILE, TILE, -1, TILE).sum(axis=(1, 3))  # [row tiles, col tiles]
        heights = np.minimum(TILE, rows - TILE * np.arange(sums.shape[0]))[:, None]
        widths = np.minimum(TILE, cols - TILE * np.arange(sums.shape[1]))[None, :]
        excess_tiles = np.maximum(sums - per_row * heights * widths / cols, 0.0)
        for flat in np.argsort(-excess_tiles, axis=None)[:2]:  # the block's two worst: the worst two overall among them
            r, c = (int(i) * TILE for i in np.unravel_index(flat, excess_tiles.shape))
            tiles.append((float(excess_tiles.flat[flat]), (target, x0 + r, x0 + min(r + TILE, rows) - 1, c)))
        count_tiles += excess_tiles.size
        for r in range(0, rows, 128):
            e = float(err[r : r + 128].sum())
            pieces.append(
                (max(e - per_row * min(128, rows - r), 0.0), (target, x0 + r, x0 + min(r + 128, rows) - 1, -1))
            )
    if total <= 0 or not tiles:
        tried.append(Hypothesis("tile-local", supposes, 0.0, "ruled out: no excess error in out"))
        return
    tiles.sort(key=lambda t: -t[0])
    pieces.sort(key=lambda t: -t[0])
    tile_share = sum(t[0] for t in tiles[:2]) / total
    piece_share = pieces[0][0] / total
    several = sum(-(-len(scorer.ctx.rows(b)) // 128) for b in blocks) > 1  # one piece of all says nothing
    if tile_share >= LOCAL and count_tiles > 2:
        count = "one 16x16 tile" if len(tiles) < 2 or tiles[1][0] < 0.05 * total else "two 16x16 tiles"
        text = f"{tile_share:.0%} of out's excess error lies in {count}: {_region(tiles[0][1])}"
        where = tuple(_region(t[1]) for t in tiles[:2])
        causes.append(Cause("tile-local", min(tile_share, 1.0), text, ("out",), where))
        tried.append(Hypothesis("tile-local", supposes, tile_share, "explains: " + text))
    elif piece_share >= LOCAL and several:
        text = f"{piece_share:.0%} of out's excess error lies in one 128-row piece: {_region(pieces[0][1])}"
        causes.append(Cause("tile-local", min(piece_share, 1.0), text, ("out",), (_region(pieces[0][1]),)))
        tried.append(Hypothesis("tile-local", supposes, piece_share, "explains: " + text))
    else:
        share = max(tile_share, piece_share if several else 0.0)
        text = f"the two worst tiles hold {tile_share:.0%} of out's excess error, the worst piece {piece_share:.0%}"
        tried.append(Hypothesis("tile-local", supposes, share, "ruled out: " + text))


def _region(region: tuple[QBlock, int, int, int]) -> str:
    """Words for a tile (its first column) or a piece (column -1) of out."""
    target, first, last, column = region
    cols = "" if column < 0 else f" cols {column}..{column + TILE - 1}"
    return f"out {target.words()} rows {first}..{last}{cols}"


def _layout(
    case: Case,
    dev: np.ndarray,
    gold: np.ndarray,
    benchmark: Mapping[str, np.ndarray] | None,
    written: np.ndarray,
    causes: list[Cause],
    tried: list[Hypothesis],
) -> None:
    """layout: out read as another 16-bit dtype's bits, or with S and N (BNSD) / T and N (TND) swapped."""
    dev = dev.reshape(case.q_shape)
    d = case.head_dim
    readings: list[tuple[str, np.ndarray]] = []
    if dev.dtype.itemsize == 2:
        other = numpy_dtype("float16" if case.dtype == "bfloat16" else "bfloat16")
        readings.append(
            (f"out's bits read as {'float16' if case.dtype == 'bfloat16' else 'bfloat16'}", dev.view(other))
        )
    flat = np.ascontiguousarray(dev).reshape(-1)
    if case.layout == "TND":
        t, n, _ = case.q_shape
        readings.append(("out written [N, T, D] (T and N swapped)", flat.reshape(n, t, d).transpose(1, 0, 2)))
    else:
        b, n, s, _ = case.q_shape
        readings.append(("out written [B, S, N, D] (BSND, not BNSD)", flat.reshape(b, s, n, d).transpose(0, 2, 1, 3)))
    picked = np.flatnonzero(written.reshape(-1))  # the written rows, at most LAYOUT_ROWS evenly spread
    if picked.size > LAYOUT_ROWS:
        picked = picked[np.linspace(0, picked.size - 1, LAYOUT_ROWS).astype(np.int64)]

    def rows_of(array: np.ndarray) -> np.ndarray:
        return np.asarray(array.reshape(-1, d)[picked], dtype=np.float64)

    gold64 = rows_of(np.asarray(gold).reshape(case.q_shape))
    rows = np.isfinite(gold64)
    eps = _eps(case)
    if benchmark is not None and "out" in benchmark:
        bench = rows_of(np.asarray(benchmark["out"]).reshape(case.q_shape))
        noise = float(np.where(rows, (bench - gold64) ** 2, 0.0).sum())
    else:
        noise = 0.0
    noise = max(noise, float(np.where(rows, gold64 * gold64, 0.0).sum()) * (eps / 4) ** 2 + 1e-30)
    with np.errstate(invalid="ignore", over="ignore"):
        base = rows_of(dev)
        null = float(np.where(rows & np.isfinite(base), (base - gold64) ** 2, 0.0).sum())
        null_excess = max(null / noise - 1.0, 0.0)
        for supposes, reading in readings:
            value = rows_of(np.ascontiguousarray(reading))
            usable = rows & np.isfinite(value)
            energy = float(np.where(usable, (value - gold64) ** 2, 0.0).sum())
            coverage = usable.sum() / max(int(rows.sum()), 1)
            share = 0.0 if null_excess <= 0 else max(0.0, 1.0 - max(energy / noise - 1.0, 0.0) / null_excess) * coverage
            text = (
                f"read so, out's error is {math.sqrt(energy / noise):.3g}x the benchmark's "
                f"(from {math.sqrt(null / noise):.3g}x)"
            )
            if share >= 0.5:
                causes.append(Cause("layout", share, f"{supposes}: {text}", ("out",), ()))
                tried.append(Hypothesis("layout", supposes, share, f"explains {share:.0%}: {text}"))
            else:
                tried.append(Hypothesis("layout", supposes, share, f"ruled out: explains {share:.0%}: {text}"))


def _accumulation(
    case: Case,
    ctx: ForwardContext,
    blocks: Sequence[QBlock],
    excess: Mapping[QBlock, float],
    causes: list[Cause],
    tried: list[Hypothesis],
) -> None:
    """accumulation-precision: the blocks' excess error grows with the kv blocks their row selects."""
    supposes = "error growing with the number of kv blocks a query block row accumulates"
    counts = np.array([float(ctx.mask("", b.batch)[b.head, b.block].sum()) for b in blocks])
    values = np.array([excess[b] for b in blocks])
    if counts.size < 4 or np.ptp(counts) == 0 or (values > 0).sum() < 0.5 * values.size:
        tried.append(
            Hypothesis(
                "accumulation-precision", supposes, 0.0, "not tried: the rows accumulate alike, or few blocks fail"
            )
        )
        return
    rank_c = np.argsort(np.argsort(counts, kind="stable"), kind="stable").astype(float)
    rank_v = np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(float)
    corr = float(np.corrcoef(rank_c, rank_v)[0, 1])
    text = f"the blocks' excess error and their selected kv blocks have rank correlation {corr:.2f}"
    if corr >= 0.6:
        causes.append(Cause("accumulation-precision", corr, text, ("out",), ()))
        tried.append(Hypothesis("accumulation-precision", supposes, corr, "explains: " + text))
    else:
        tried.append(Hypothesis("accumulation-precision", supposes, max(corr, 0.0), "ruled out: " + text))


# ---- the pair: the forward step's causes, and gradients carried from the forward ---------------------

CARRIED = 0.9
"""Share of the gradients' excess error the backward recomputed from the device's out and lse must explain
for the error to be the forward's (the backward then is not diagnosed)."""

CARRIED_SUPPOSES = "the backward is right given the forward's out and lse as written (dq, dk, dv recomputed from them)"


def as_forward_step(cause: Cause) -> Cause:
    """Return a forward cause as a pair's: its evidence says it is the forward step's ("the forward's out: ...")."""
    text = cause.evidence
    for name in cause.tensors:
        if text.startswith(f"{name}: "):
            text = text[len(name) + 2 :]
    label = " and ".join(cause.tensors) or "out and lse"
    return replace(cause, evidence=f"the forward's {label}: {text}")


@dataclass(frozen=True)
class Carried:
    """Whether a pair's gradient error is carried from its forward: the share the backward recomputed from
    the device's out and lse explains, and the words."""

    share: float
    text: str
    tensors: tuple[str, ...]

    @property
    def explains(self) -> bool:
        return self.share >= CARRIED

    @property
    def hypothesis(self) -> Hypothesis:
        verdict = "explains" if self.explains else "ruled out: explains"
        return Hypothesis("-", CARRIED_SUPPOSES, self.share, f"{verdict} {self.share:.0%}: {self.text}")

    def attribute(self, causes: Sequence[Cause]) -> list[Cause]:
        """The forward's causes with the gradients' error laid to the first (the backward not blamed)."""
        if not causes:
            return list(causes)
        first = causes[0]
        follows = f"; {', '.join(self.tensors)} follow from it ({CARRIED_SUPPOSES}: {self.text})"
        tensors = (*first.tensors, *(t for t in self.tensors if t not in first.tensors))
        return [replace(first, evidence=first.evidence + follows, tensors=tensors), *causes[1:]]


def carried_from_forward(
    case: Case,
    grads: Sequence[TensorResult],
    device: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    benchmark: Mapping[str, np.ndarray] | None,
    read: Mapping[str, np.ndarray],
) -> Carried:
    """Test whether a pair's failing dq, dk, dv are the backward's right answer to the forward's out and lse
    as the device wrote them: the worst failing blocks recomputed (float64) from `read` (the backward's
    inputs with attention_out and softmax_lse the device's), scored as a backward hypothesis."""
    from .hypotheses import NULL, Context, recompute
    from .scoring import gather_blocks

    spans = {s.batch: s for s in case.spans() if s.q_len and s.kv_len}
    ctx = Context(case, read, spans)
    blocks = gather_blocks(case, ctx, grads, device, golden, benchmark)
    failing = tuple(t.name for t in grads if not t.passed)
    if not blocks.targets:
        return Carried(0.0, "no failing block to recompute", failing)
    values = [recompute(ctx, NULL, t) for t in blocks.targets]
    share, ratios = blocks.explained(values)
    if blocks.nonfinite and blocks.predicts_nonfinite(values):
        text = (
            f"{blocks.falls(ratios)}; it puts NaN/Inf where the device has them"
            if ratios
            else "it puts NaN/Inf where the device has them"
        )
        share = max(share, 1.0 if not ratios else share)
    else:
        text = f"under it, {blocks.falls(ratios)}" if ratios else "nothing to explain"
    return Carried(share, text, failing)
