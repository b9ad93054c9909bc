"""The hypotheses a diagnosis recomputes, and the float64 golden of a few blocks under each.

A `Variant` says how a faulty kernel differs from the operator's semantics (the mask read transposed or
shifted, tail blocks dropped, heads mapped to other kv heads, part of a GQA group summed, lse in base 2 or
ignored, Dsum missing, the scale held in the case dtype). The gradients are block-local given lse and out
(dS_ij = P_ij (dP_ij - Dsum_i)), so a block's golden needs only the block pairs that touch it: `recompute`
computes one target block, and `Context` keeps the float64 views it reads, shared by every hypothesis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from ...core.case import Case, SequenceSpan, numpy_dtype
from ...core.layout import kv_view, mask_view, q_view
from ...core.rounding import to_dtype
from .views import Arrays, Held, InputRows, Some, Spans

LOG2E = math.log2(math.e)

#: How a kernel reads the block mask ("": as the operator says; `read_mask`).
MaskReading = Literal["", "transposed", "kv+1", "kv-1", "q+1", "drop-tail"]


@dataclass(frozen=True)
class Variant:
    """A hypothesis to recompute: how the faulty kernel differs from the operator's semantics. One type for
    every op: an op's hypotheses are a table of these (`VARIANTS`, `forward_hypotheses.FORWARD_VARIANTS`)."""

    kind: str  # a cause's kind (`findings.Kind`), "" for the operator's semantics (`NULL`)
    supposes: str
    mask: MaskReading = ""
    heads: Literal["", "interleaved", "next"] = ""
    group: Literal["", "first", "not-last"] = ""
    # ignored, row-max (each row's largest score in lse's place): the backward's readings; no-max: the forward's
    lse: Literal["", "base2", "ignored", "row-max", "no-max"] = ""
    dsum: Literal["", "none", "negated"] = ""
    scale: Literal["", "rounded", "missing", "twice"] = ""
    stacks: Literal["", "no-rescale", "off-by-one"] = ""  # the forward's online softmax
    lse_factor: float = 1.0  # fitted (`fitted_variants`): P = exp(S - (lse_factor lse + lse_offset))
    lse_offset: float = 0.0
    dsum_factor: float = 1.0  # fitted: dS = P (dP - dsum_factor Dsum)
    head_map: tuple[int, ...] = ()  # fitted: the kv head each query head reads (and whose dK/dV it adds into)


#: The operator's semantics.
NULL = Variant("", "")
#: Columns of one online-softmax step of the forward (its 512-column stacks).
STACK = 512


SHIFTED = "reads the selection of block {} (mask shifted by one block)"
#: The misreadings of the mask every op's diagnosis recomputes (after its tail-block).
MASK_READINGS = (
    Variant("block-selection", "the block mask read transposed ([.., j, i])", mask="transposed"),
    Variant("block-selection", "kv block j " + SHIFTED.format("j - 1"), mask="kv+1"),
    Variant("block-selection", "kv block j " + SHIFTED.format("j + 1"), mask="kv-1"),
    Variant("block-selection", "query block i reads the selection of block i - 1", mask="q+1"),
)
#: The misreadings of the GQA head mapping every op's diagnosis recomputes.
HEAD_READINGS = (
    Variant("gqa-head-mapping", "query head n reads kv head n % N2 (interleaved, not n // G)", heads="interleaved"),
    Variant("gqa-head-mapping", "query head n reads kv head n // G + 1 (one kv head off)", heads="next"),
)

VARIANTS = (
    Variant("tail-block", "the partial last blocks (Skv % Y, else Sq % X) are skipped", mask="drop-tail"),
    *MASK_READINGS,
    *HEAD_READINGS,
    Variant("gqa-group-sum", "dK/dV take only the first query head of each GQA group", group="first"),
    Variant("gqa-group-sum", "dK/dV leave out the last query head of each GQA group", group="not-last"),
    Variant("softmax-lse", "P recomputed as exp2(S log2(e) - lse): lse read as a base-2 log", lse="base2"),
    Variant("softmax-lse", "P recomputed as exp(S): lse ignored", lse="ignored"),
    Variant(
        "softmax-lse",
        "P recomputed as exp(S - max S): lse read as each row's largest score (the log-sum term never added)",
        lse="row-max",
    ),
    Variant("softmax-grad", "Dsum omitted: dS = P dP", dsum="none"),
    Variant("softmax-grad", "Dsum added instead of subtracted: dS = P (dP + Dsum)", dsum="negated"),
    Variant("scale", "scaleValue held in the case dtype (scores, dQ and dK)", scale="rounded"),
)


# ---- the recomputed golden of a few blocks ----------------------------------------------------------


@dataclass
class Reading:
    """A case's inputs and spans, and how a variant reads them: the mask (kept by reading and batch entry),
    the kv head of a query head, the scale; the inputs as float64 rows (`InputRows`, converted by blocks on
    first read). The backward's `Context` and the forward's share it."""

    case: Case
    inputs: Arrays
    spans: dict[int, SequenceSpan]
    masks: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    # rows of an input (query, dout, attention_out, lse, dsum of a query head; key, value of a kv head),
    # float64: input_rows(name, batch, head, rows)
    input_rows: InputRows = field(init=False)

    def __post_init__(self) -> None:
        self.input_rows = InputRows(self.case, self.inputs, self.spans)

    def mask(self, how: MaskReading, batch: int) -> np.ndarray:
        """The [N1, nQ, nKV] selection of a batch entry as a kernel reading the mask `how` would."""
        key = (how, batch)
        if key not in self.masks:
            block_mask = np.asarray(self.inputs["block_sparse_mask"])
            self.masks[key] = read_mask(self.case, block_mask, self.spans[batch], how)
        return self.masks[key]

    def kv_head(self, variant: Variant, head: int) -> int:
        if variant.head_map:
            return variant.head_map[head]
        n2, group = self.case.num_kv_heads, self.case.group_size
        return {"interleaved": head % n2, "next": (head // group + 1) % n2}.get(variant.heads, head // group)

    def scale(self, variant: Variant) -> float:
        scale = float(self.case.kernel_scale)
        if variant.scale == "missing":
            return 1.0
        if variant.scale == "twice":
            return scale * scale
        if variant.scale == "rounded":
            held = to_dtype(np.array([scale], dtype=np.float32), numpy_dtype(self.case.dtype))
            return float(np.asarray(held, dtype=np.float64).reshape(-1)[0])
        return scale


@dataclass
class Context(Reading):
    """The backward's `Reading`, and the products and recomputed blocks shared by the hypotheses (`Held`)."""

    shared: Held = field(default_factory=Held)  # Q K^T and dout V^T of some rows and columns
    values: Held = field(default_factory=Held)  # `recompute`'s blocks, by variant, target and rows

    def block_rows(self, name: str, batch: int, head: int, block: int, some: Some) -> np.ndarray:
        """One block's rows of an input (query, dout, lse, dsum: a query block; key, value: a kv block), or
        its rows `some`, float64."""
        rows = self.input_rows.block(name, batch, head, block)
        return rows if some is None else rows[some]

    def products(self, pair: Pair, kv_head: int, q_some: Some, kv_some: Some) -> tuple[np.ndarray, ...]:
        """Q K^T (unscaled) and dout V^T of one (query block, kv block) pair, or of its rows `q_some` and
        columns `kv_some`: shared by every hypothesis that reads the pair (the lse, Dsum and scale ones, and
        a misread mask where it selects the same pair), computed once."""
        key = (pair, kv_head, *(None if some is None else some.tobytes() for some in (q_some, kv_some)))
        held = self.shared.get(key)
        if held is None:
            batch, head = pair.batch, pair.head
            query = self.block_rows("query", batch, head, pair.q_block, q_some)
            dout = self.block_rows("dout", batch, head, pair.q_block, q_some)
            key_rows = self.block_rows("key", batch, kv_head, pair.kv_block, kv_some)
            value_rows = self.block_rows("value", batch, kv_head, pair.kv_block, kv_some)
            held = self.shared.put(key, query @ key_rows.T, dout @ value_rows.T)
        return held

    def row_max(self, v: Variant, pair: Pair, kv_head: int, q_some: Some) -> np.ndarray:
        """Each row's largest scaled score over the kv blocks the variant selects for its query block (rows
        `q_some`), [rows, 1]: the lse-row-max reading's lse (the row's own lse where it selects nothing)."""
        rows = None if q_some is None else q_some.tobytes()
        key = ("row-max", v.mask, self.scale(v), pair.batch, pair.head, pair.q_block, kv_head, rows)
        held = self.shared.get(key)
        if held is None:
            found = self.block_rows("lse", pair.batch, pair.head, pair.q_block, q_some).copy()
            best = np.full(found.shape, -np.inf)
            for j in np.flatnonzero(self.mask(v.mask, pair.batch)[pair.head, pair.q_block]):
                product, _ = self.products(replace(pair, kv_block=int(j)), kv_head, q_some, None)
                best = np.maximum(best, self.scale(v) * product.max(axis=1))
            held = self.shared.put(key, np.where(np.isfinite(best), best, found)[:, None])
        return held[0]

    def in_sum(self, variant: Variant, head: int) -> bool:
        member = head % self.case.group_size
        return {"first": member == 0, "not-last": member != self.case.group_size - 1}.get(variant.group, True)


def read_mask(case: Case, block_mask: np.ndarray, span: SequenceSpan, how: MaskReading) -> np.ndarray:
    """Return the [N1, nQ, nKV] selection of a batch entry as a kernel reading the mask `how` would."""
    mask = mask_view(case, block_mask, span)
    n_q, n_kv = mask.shape[1:]
    read = mask.copy()
    if how == "transposed":
        full = block_mask[span.batch] != 0
        read[:] = False
        rows, cols = min(n_q, full.shape[2]), min(n_kv, full.shape[1])
        read[:, :rows, :cols] = full[:, :cols, :rows].transpose(0, 2, 1)
    elif how == "kv+1":
        read[:, :, 1:] = mask[:, :, :-1]
    elif how == "kv-1":
        read[:, :, :-1] = mask[:, :, 1:]
        read[:, :, -1:] = False
    elif how == "q+1":
        read[:, 1:] = mask[:, :-1]
    elif how == "drop-tail":
        x, y = case.block_shape
        if span.kv_len % y and n_kv:
            read[:, :, -1] = False
        elif span.q_len % x and n_q:
            read[:, -1, :] = False
    return read


@dataclass(frozen=True)
class Pair:
    """A (query head, query block, kv block) pair of one batch entry: a selected block's share of the
    gradients (its kv head is the variant's reading of the query head)."""

    batch: int
    head: int
    q_block: int
    kv_block: int


@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def score_grads(
    ctx: Context, v: Variant, pair: Pair, kv_head: int, q_some: Some = None, kv_some: Some = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return (dS, P) of a pair (its rows `q_some`, columns `kv_some`) against kv head `kv_head` under the
    variant."""
    product, dprobs = ctx.products(pair, kv_head, q_some, kv_some)
    scores = ctx.scale(v) * product
    lse = ctx.block_rows("lse", pair.batch, pair.head, pair.q_block, q_some)[:, None]
    if v.lse == "base2":
        probs = np.exp2(scores * LOG2E - lse)
    elif v.lse == "ignored":
        probs = np.exp(scores)
    elif v.lse == "row-max":
        probs = np.exp(scores - ctx.row_max(v, pair, kv_head, q_some))
    else:  # fitted: lse_factor lse + lse_offset (1 lse + 0 exactly lse)
        probs = np.exp(scores - (v.lse_factor * lse + v.lse_offset))
    dsum = ctx.block_rows("dsum", pair.batch, pair.head, pair.q_block, q_some)[:, None]
    if v.dsum == "none":
        return probs * dprobs, probs
    return probs * (dprobs - (-1.0 if v.dsum == "negated" else v.dsum_factor) * dsum), probs


def partial(ctx: Context, pair: Pair, tensor: str, some: Some = None) -> np.ndarray:
    """One pair's partial (the operator's semantics) of a dq block (its rows) or of a dk/dv block (its
    columns), float64 [rows, D]; with `some`, of those rows (columns) of the block only."""
    q_some, kv_some = (some, None) if tensor == "dq" else (None, some)
    kv_head = ctx.kv_head(NULL, pair.head)
    dscores, probs = score_grads(ctx, NULL, pair, kv_head, q_some, kv_some)
    scale = ctx.scale(NULL)
    if tensor == "dq":
        return scale * (dscores @ ctx.block_rows("key", pair.batch, kv_head, pair.kv_block, None))
    if tensor == "dk":
        return scale * (dscores.T @ ctx.block_rows("query", pair.batch, pair.head, pair.q_block, None))
    return probs.T @ ctx.block_rows("dout", pair.batch, pair.head, pair.q_block, None)


def positions(blocks: np.ndarray, size: int, length: int) -> np.ndarray:
    parts = [np.arange(int(b) * size, min((int(b) + 1) * size, length)) for b in blocks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Target:
    """A block of one gradient: dq (batch, query head, query block) or dk/dv (batch, kv head, kv block)."""

    tensor: str
    batch: int
    head: int
    block: int

    def words(self) -> str:
        axis = "q" if self.tensor == "dq" else "kv"
        return f"{self.tensor} batch {self.batch} head {self.head} {axis} block {self.block}"


@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def recompute(ctx: Context, v: Variant, target: Target, some: Some = None) -> np.ndarray:
    """Return the float64 golden of one target block under the variant ([rows, D]); with `some`, of those
    rows of the block only (the rows of a block are independent: a dq row sums over its kv columns, a dk/dv
    row over its query rows). Kept (`Context.values`): the hypotheses ask for the same block again."""
    key = (v, target, None if some is None else some.tobytes())
    held = ctx.values.get(key)
    if held is None:
        if target.tensor == "dq":
            held = ctx.values.put(key, _dq_block(ctx, v, target, some))
        else:  # dK and dV of a kv block come from the same P: both computed, both kept
            dk, dv = _kv_block(ctx, v, target, some)
            other = replace(target, tensor="dv" if target.tensor == "dk" else "dk")
            ctx.values.put((v, other, key[2]), dv if target.tensor == "dk" else dk)
            held = ctx.values.put(key, dk if target.tensor == "dk" else dv)
    return held[0]


def _dq_block(ctx: Context, v: Variant, target: Target, some: Some) -> np.ndarray:
    """dq of one query block (its rows `some`): a sum over the kv blocks the variant selects for it."""
    case, span = ctx.case, ctx.spans[target.batch]
    x = case.block_shape[0]
    rows = min((target.block + 1) * x, span.q_len) - target.block * x
    dq = np.zeros((rows if some is None else some.size, case.head_dim))
    kv_head = ctx.kv_head(v, target.head)
    for j in np.flatnonzero(ctx.mask(v.mask, target.batch)[target.head, target.block]):
        pair = Pair(target.batch, target.head, target.block, int(j))
        dscores, _ = score_grads(ctx, v, pair, kv_head, some)
        dq += dscores @ ctx.block_rows("key", target.batch, kv_head, int(j), None)
    return ctx.scale(v) * dq


def _kv_block(ctx: Context, v: Variant, target: Target, some: Some) -> tuple[np.ndarray, np.ndarray]:
    """dK and dV of one kv block (its rows `some`): sums over the (query head, query block) pairs the
    variant selects it for, in the heads that read its kv head and add into it."""
    case, span = ctx.case, ctx.spans[target.batch]
    y = case.block_shape[1]
    cols = min((target.block + 1) * y, span.kv_len) - target.block * y
    dk, dv = (np.zeros((cols if some is None else some.size, case.head_dim)) for _ in range(2))
    mask = ctx.mask(v.mask, target.batch)
    for head in range(case.num_heads):
        if ctx.kv_head(v, head) != target.head or not ctx.in_sum(v, head):
            continue
        for i in np.flatnonzero(mask[head, :, target.block]):
            pair = Pair(target.batch, head, int(i), target.block)
            dscores, probs = score_grads(ctx, v, pair, target.head, None, some)
            dk += dscores.T @ ctx.block_rows("query", target.batch, head, int(i), None)
            dv += probs.T @ ctx.block_rows("dout", target.batch, head, int(i), None)
    return ctx.scale(v) * dk, dv


def block_of(case: Case, array: np.ndarray, target: Target, spans: Spans) -> np.ndarray:
    """Return one target block of a gradient array as float64 [rows, D]."""
    span = spans[target.batch]
    x, y = case.block_shape
    read, size, length = (q_view, x, span.q_len) if target.tensor == "dq" else (kv_view, y, span.kv_len)
    view = read(case, array, span)[target.head]
    return np.asarray(view[target.block * size : min((target.block + 1) * size, length)], dtype=np.float64)


#: Rows of the worst failing dq block with a golden that the lse fit needs at least.
FIT_ROWS = 8


@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def fitted_variants(ctx: Context, target: Target, dev: np.ndarray, null: np.ndarray) -> list[Variant]:
    """Variants fitted to one failing dq block, for a softmax term wrong in a way no fixed variant supposes.

    * Dsum: dq = A - c B is linear in Dsum's factor c (A the dq without Dsum, B = A - golden), so c is
      fitted by least squares: 0 omitted, -1 added instead of subtracted, 2 doubled, ... .
    * lse: given lse and out (Dsum is out's), P recomputed from a wrong lse scales each query row's dS,
      so dq's rows by f_i = exp(lse_i - lse'_i). Reading lse' = a lse + b makes log f_i linear in lse_i:
      a fitted line through the rows' factors gives a and b (base 2: a = ln 2; lse ignored: a = 0; lse off
      by a constant: a = 1; P scaled by a constant factor likewise).
    Each fitted variant is then scored as the fixed ones (recomputed on every target block): a fit is only
    a candidate. None when the block's values do not support one (a factor within 1% of the golden's)."""
    out: list[Variant] = []
    without = recompute(ctx, Variant("softmax-grad", "", dsum="none"), target)
    term = without - null
    den = float((term * term).sum())
    if den > 0 and np.isfinite(den):
        c = float(((without - dev) * term).sum()) / den
        if np.isfinite(c) and abs(c - 1.0) > 0.01 and abs(c) < 1e3:
            c = float(f"{c:.3g}")
            out.append(Variant("softmax-grad", f"Dsum taken {c:g} times: dS = P (dP - {c:g} Dsum)", dsum_factor=c))
    norms = (null * null).sum(axis=1)
    good = np.isfinite(norms) & (norms > 1e-6 * float(norms.max(initial=0.0)))
    if int(good.sum()) >= FIT_ROWS:
        factors = (dev[good] * null[good]).sum(axis=1) / norms[good]
        if (factors > 0).all() and np.isfinite(factors).all():
            x = ctx.case.block_shape[0]
            span = ctx.spans[target.batch]
            rows = np.arange(target.block * x, min((target.block + 1) * x, span.q_len))[good]
            lse = ctx.input_rows("lse", target.batch, target.head, rows)
            if np.isfinite(lse).all():
                slope, intercept = _line(lse, np.log(factors), norms[good])
                a, named = _named_lse_factor(1.0 - slope)
                b = float(f"{-intercept:.3g}") if abs(intercept) > 0.01 else 0.0
                if a != 1.0 or b != 0.0:
                    if a == 1.0:
                        words = f"P recomputed from lse {b:+g}: lse off by a constant (P times {math.exp(-b):.3g})"
                    else:
                        offset = f" {b:+g}" if b else ""
                        words = f"P recomputed from {a:.4g} lse{offset}: lse read {named or 'scaled'}"
                    out.append(Variant("softmax-lse", words, lse_factor=a, lse_offset=b))
    return out


#: Query head x kv head recomputations the head-map fit makes at most (one dq block each).
MAX_HEAD_FITS = 64


def fitted_head_map(
    ctx: Context, targets: Sequence[Target], device_block: Callable[[Target], np.ndarray]
) -> list[Variant]:
    """The kv head each query head reads, fitted: one dq block per query head (its worst failing target,
    else its first selected block) recomputed against every kv head, the closest to the device's taken.
    A variant when some query head reads another kv head than n // G (any mapping, not only the fixed
    variants' interleaved and one-off ones), else none. Only the heads of failing targets are fitted when
    N1 x N2 exceeds `MAX_HEAD_FITS`; the others keep n // G."""
    case = ctx.case
    n1, n2 = case.num_heads, case.num_kv_heads
    if n2 < 2:
        return []
    picked = {t.head: t for t in reversed(targets) if t.tensor == "dq"}  # reversed: a head's first target stays
    if n1 * n2 <= MAX_HEAD_FITS:
        for head in range(n1):
            if head in picked:
                continue
            for batch in ctx.spans:
                selected = np.flatnonzero(ctx.mask("", batch)[head].any(axis=1))
                if selected.size:
                    picked[head] = Target("dq", batch, head, int(selected[0]))
                    break
    default = [ctx.kv_head(NULL, h) for h in range(n1)]
    mapping = list(default)
    for head, target in sorted(picked.items()):
        dev = device_block(target)
        if not np.isfinite(dev).all():
            continue
        maps = (tuple(kv_head if h == head else 0 for h in range(n1)) for kv_head in range(n2))
        errors = [float(((dev - recompute(ctx, Variant("", "", head_map=m), target)) ** 2).sum()) for m in maps]
        best = int(np.argmin(errors))
        if errors[best] < 0.25 * errors[mapping[head]]:  # clearly closer than the mapping's own
            mapping[head] = best
    if mapping == default:
        return []
    words = ", ".join(f"{h} -> {k}" for h, k in enumerate(mapping) if k != default[h])
    supposes = f"query heads read other kv heads than n // G (query head -> kv head: {words}), and dK/dV add into those"
    return [Variant("gqa-head-mapping", supposes, head_map=tuple(mapping))]


_LSE_READINGS = {
    1.0: "",
    math.log(2): "as a base-2 log",
    math.log10(math.e): "as a base-10 log",
    0.5: "halved",
    2.0: "doubled",
}


def _named_lse_factor(factor: float) -> tuple[float, str]:
    """A fitted lse factor snapped to a named reading within 1% (base 2, base 10, halved, doubled, none),
    else rounded to 3 digits."""
    for value, words in _LSE_READINGS.items():
        if abs(factor - value) <= 0.01 * value:
            return value, words
    return float(f"{factor:.3g}"), ""


def _line(x: np.ndarray, y: np.ndarray, weight: np.ndarray) -> tuple[float, float]:
    """Weighted least-squares slope and intercept of y over x (a row's factor is the better known the
    larger its golden: weight its energy); slope 0 when x does not vary."""
    w = weight / weight.sum()
    mx, my = float((w * x).sum()), float((w * y).sum())
    spread = float((w * (x - mx) ** 2).sum())
    if spread <= 1e-12 * max(float((w * x * x).sum()), 1e-300):
        return 0.0, my
    slope = float((w * (x - mx) * (y - my)).sum()) / spread
    return slope, my - slope * mx


def changed_blocks(ctx: Reading, v: Variant, tensors: Sequence[str], count: int = 2) -> list[Target]:
    """Up to `count` blocks per tensor whose computation a mask variant changes (dq rows, dk/dv columns)."""
    if not v.mask:
        return []
    found: list[Target] = []
    for name in tensors:
        picked = 0
        for batch in ctx.spans:
            diff = ctx.mask(v.mask, batch) != ctx.mask("", batch)
            if name == "dq":
                heads, blocks = np.nonzero(diff.any(axis=2))
            else:
                kv = diff.any(axis=1).reshape(ctx.case.num_kv_heads, ctx.case.group_size, -1).any(axis=1)
                heads, blocks = np.nonzero(kv)
            step = max(1, heads.size // count)
            for h, j in list(zip(heads, blocks, strict=True))[::step][: count - picked]:
                found.append(Target(name, batch, int(h), int(j)))
                picked += 1
            if picked >= count:
                break
    return found


def applies(ctx: Reading, v: Variant) -> str | None:
    """Return why a variant cannot be told from the operator's semantics in this case, else None."""
    case = ctx.case
    if v.group and case.group_size <= 1:
        return "not tried: N1 == N2, no GQA group"
    if v.heads == "interleaved" and (case.group_size <= 1 or case.num_kv_heads <= 1):
        return "not tried: the interleaved mapping is the same here (one kv head, or N1 == N2)"
    if v.heads == "next" and case.num_kv_heads <= 1:
        return "not tried: one kv head"
    if v.group == "not-last" and case.group_size == 2:
        return "not tried: with groups of 2 it is the same as taking only the first head"
    if v.mask and all(np.array_equal(ctx.mask(v.mask, b), ctx.mask("", b)) for b in ctx.spans):
        return "not tried: the mask reads the same under it in this case"
    if v.scale and ctx.scale(v) == ctx.scale(NULL):
        return f"not tried: {'the scale is exact in the case dtype' if v.scale == 'rounded' else 'the scale is 1'}"
    if v.stacks and _longest_row(ctx) <= STACK:
        return f"not tried: no row selects more than {STACK} columns (one online-softmax stack)"
    return None


def _longest_row(ctx: Reading) -> int:
    """The most columns a query row selects."""
    y = ctx.case.block_shape[1]
    longest = 0
    for span in ctx.spans.values():
        mask = ctx.mask("", span.batch)
        widths = np.full(mask.shape[2], y)
        widths[-1] = span.kv_len - y * (mask.shape[2] - 1)
        longest = max(longest, int((mask @ widths).max(initial=0)))
    return longest
