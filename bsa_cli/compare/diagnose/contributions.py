"""Which block pairs the device added into its failing blocks: the contributions fit.

A gradient block is a sum over block pairs. A dq block (query head h, query block i) is the sum over the
kv blocks j its row of the mask selects of scale dS_ij K_j; a dk or dv block (kv head n, kv block j) the
sum over the (query head h of n's group, query block i) pairs that select j of scale dS_ij^T Q_i and
P_ij^T dO_i. Given lse and out, every pair's partial is known whatever the mask says (the backward
recomputes P from the given lse), so a device block can be fitted as a sum of candidate pairs' partials,
one coefficient each, by least squares. A kernel that reads the selection wrongly, in any way and not
only in the ways `hypotheses.VARIANTS` recompute (a mask shifted by two blocks, one block dropped, the
diagonal skipped, a query head left out of its group's sum), adds the pairs it takes for selected,
coefficient 1, and leaves out the others, 0. When every well-determined coefficient is 0 or 1 and some
differ from the mask, the fit names the pairs added or left out, and the values it predicts are scored
like a recomputed hypothesis's (`Blocks.explained`).

Candidates of a dq block: the kv blocks its row selects, then the diagonal, the neighbouring rows'
selections and the blocks next to the selected ones, the transposed mask's, those two blocks off, then
every other kv block of the row, up to `MAX_CANDIDATES`; of a dk/dv block: the same over the query blocks
of every query head of its group, level by level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .findings import Findings, named, scored, tried
from .hypotheses import NULL, Context, Pair, Target, partial
from .scoring import Blocks

#: Pairs a block is fitted on at most; a block selected by more is not fitted (its fit says so).
MAX_CANDIDATES = 128
#: A candidate's coefficient is well determined when its partial's energy is this many times the block's
#: benchmark error energy (its error is then about 0.01); the others keep the mask's value. A real pair's
#: partial is some 1e5 to 1e7 times the rounding noise of an fp16/bf16 block.
STRONG = 1e4
#: A well-determined coefficient within this of 0 or 1 reads as a pair left out or added. Tight, so that a
#: gradient off by a constant factor (dq times scale: coefficients 0.09 for D 128) is not read as pairs left out.
INTEGRAL = 0.05


@dataclass(frozen=True)
class Fit:
    """A block's fit: the values it predicts and the pairs it finds added (not selected) or left out."""

    target: Target
    values: np.ndarray
    added: tuple[Pair, ...]
    left_out: tuple[Pair, ...]
    kept: tuple[Pair, ...]  # selected pairs the fit finds added, well determined


def _near(selected: np.ndarray, d: int) -> np.ndarray:
    return np.concatenate([selected + d, selected - d])


def candidates(ctx: Context, target: Target) -> list[Pair] | None:
    """A target block's candidate pairs (the selected ones first), or None when more than `MAX_CANDIDATES`
    are selected. Past the selected ones, in the order a misreading most likely
    reaches them: the diagonal, the neighbouring rows' (columns') selections and the blocks next to the
    selected ones, the transposed mask's, then two blocks off; every block when they all fit."""
    mask = ctx.mask("", target.batch)  # [N1, nQ, nKV]
    b, k = target.batch, target.block
    if target.tensor == "dq":  # a query block's row of the mask, in its query head
        heads, own = [target.head], mask
    else:  # a kv block's column, in every query head of its group (level by level over the heads)
        heads = [h for h in range(ctx.case.num_heads) if ctx.kv_head(NULL, h) == target.head]
        own = mask.transpose(0, 2, 1)
    n_own, n_other = own.shape[1:]
    empty = np.zeros(0, dtype=np.int64)
    per_head: list[list[np.ndarray]] = []
    for h in heads:
        selected = np.flatnonzero(own[h, k])

        def line(i: int, h: int = h) -> np.ndarray:
            return np.flatnonzero(own[h, i]) if 0 <= i < n_own else empty

        transposed = np.flatnonzero(own[h, :, k]) if k < n_other else empty
        per_head.append(
            [selected, np.array([k]), line(k - 1), line(k + 1), _near(selected, 1), transposed]
            + [line(k - 2), line(k + 2), _near(selected, 2), np.arange(n_other)]
        )
    if sum(groups[0].size for groups in per_head) > MAX_CANDIDATES:
        return None
    found: dict[Pair, None] = {}
    for level in range(len(per_head[0]) if per_head else 0):
        for h, groups in zip(heads, per_head, strict=True):
            for i in (int(j) for j in groups[level] if 0 <= int(j) < n_other):  # (each pair once: setdefault)
                found.setdefault(Pair(b, h, k, i) if target.tensor == "dq" else Pair(b, h, i, k), None)
    return list(found)[:MAX_CANDIDATES]


def fit_block(ctx: Context, blocks: Blocks, target: Target) -> Fit | str:
    """Fit one failing block as a sum of its candidate pairs' partials: the Fit, or why there is none.

    In a block of more than 64 rows the coefficients are fitted on its 32 sampled rows (`Blocks.sample_of`:
    the rows of a block are independent, and each pair's coefficient is the same in all of them), and the
    pairs read as added are then summed over the whole block."""
    pairs = candidates(ctx, target)
    if pairs is None:
        return f"{target.words()}: more than {MAX_CANDIDATES} pairs selected, not fitted"
    dev, _, _, noise = blocks.data[target]
    if target in blocks.nonfinite:
        return f"{target.words()}: holds NaN/Inf, not fitted"
    some = blocks.sample_of(target)
    if some is not None:
        dev, noise = dev[some], noise * some.size / dev.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        parts = np.stack([partial(ctx, p, target.tensor, some) for p in pairs])  # [n, rows, D]
    mask = ctx.mask("", target.batch)
    selected = np.array([bool(mask[p.head, p.q_block, p.kv_block]) for p in pairs])
    finite = np.isfinite(parts).reshape(len(pairs), -1).all(axis=1)
    if not finite[selected].all():
        return f"{target.words()}: a selected pair's partial overflows, not fitted"
    # a pair the mask does not select that overflows (a row selecting nothing, its lse -inf) is no candidate:
    # a device adding it would hold NaN/Inf, and this block holds none
    pairs, parts, selected = [p for p, f in zip(pairs, finite, strict=True) if f], parts[finite], selected[finite]
    flat = parts.reshape(len(pairs), -1)
    coef, *_ = np.linalg.lstsq(flat.T, dev.reshape(-1), rcond=None)
    strong = (flat * flat).sum(axis=1) >= STRONG * noise
    read = np.round(coef)
    if np.any(strong & ((np.abs(coef - read) > INTEGRAL) | (read < 0) | (read > 1))):
        worst = int(np.argmax(np.where(strong, np.abs(coef - np.clip(read, 0, 1)), -1.0)))
        return f"{target.words()}: not a sum of whole pairs (a coefficient {coef[worst]:.2f})"
    taken = np.where(strong, read > 0.5, selected)
    added = tuple(p for p, t, s in zip(pairs, taken, selected, strict=True) if t and not s)
    left_out = tuple(p for p, t, s in zip(pairs, taken, selected, strict=True) if s and not t)
    kept = tuple(p for p, t, s, k in zip(pairs, taken, selected, strong, strict=True) if t and s and k)
    if some is None:
        values = np.tensordot(taken.astype(np.float64), parts, axes=1)
    else:
        values = np.zeros(blocks.data[target][0].shape)
        for pair in (p for p, t in zip(pairs, taken, strict=True) if t):
            values += partial(ctx, pair, target.tensor)
    return Fit(target, values, added, left_out, kept)


def _tail(ctx: Context, pair: Pair) -> bool:
    """Whether a pair lies in its batch entry's partial last block: the kv block when Skv % Y != 0, else the
    query block when Sq % X != 0 (the tail-block variant's reading: a kernel skipping its tail)."""
    span, (x, y) = ctx.spans[pair.batch], ctx.case.block_shape
    if span.kv_len % y:
        return pair.kv_block == (span.kv_len - 1) // y
    return bool(span.q_len % x) and pair.q_block == (span.q_len - 1) // x


def _shift(ctx: Context, added: tuple[Pair, ...], left_out: tuple[Pair, ...]) -> str:
    """The words for a mask read shifted by d blocks along kv (or query) blocks, when the pairs fit it: nine
    in ten of the pairs added select their block d before, and of those left out do not; else ""."""
    if not added or not left_out:
        return ""

    def selects(pair: Pair, axis: int, d: int) -> bool:
        mask = ctx.mask("", pair.batch)
        i, j = pair.q_block - d * (axis == 2), pair.kv_block - d * (axis == 3)
        return 0 <= i < mask.shape[1] and 0 <= j < mask.shape[2] and bool(mask[pair.head, i, j])

    for axis, name in ((3, "kv"), (2, "query")):
        for d in (1, -1, 2, -2, 3, -3, 4, -4):
            fits_added = sum(selects(p, axis, d) for p in added)
            fits_left = sum(not selects(p, axis, d) for p in left_out)
            if fits_added >= 0.9 * len(added) and fits_left >= 0.9 * len(left_out):
                sign = "-" if d > 0 else "+"
                return f"{name} block j reads the selection of block j {sign} {abs(d)} (the mask shifted by {abs(d)})"
    return ""


#: A device block holding less than this share of its golden's energy is left (nearly) empty.
EMPTY = 1e-6


def _left_empty(blocks: Blocks, target: Target) -> bool:
    dev, _, null, _ = blocks.data[target]
    return float((dev * dev).sum()) <= EMPTY * float((null * null).sum())


def _words(pairs: tuple[Pair, ...], limit: int = 2) -> str:
    text = ", ".join(f"(head {p.head}, q block {p.q_block}, kv block {p.kv_block})" for p in pairs[:limit])
    return text + (f" and {len(pairs) - limit} more" if len(pairs) > limit else "")


def contributions_fit(ctx: Context, blocks: Blocks) -> tuple[float, Findings]:
    """Fit the failing target blocks as sums of whole block pairs; name the pairs a misread selection adds
    or leaves out (block-selection; tail-block when only partial last blocks are left out; gqa-group-sum
    when dq is right and whole query heads are left out of their group's dK/dV; partial-missing when only dK or
    only dV leaves pairs out, the other gradients right). Returns the share of the
    excess error explained (0 when ruled out), and the findings."""
    supposes = "the selection read wrongly in some other way: pairs added or left out (fitted per block)"
    fits: list[Fit] = []
    why: list[str] = []
    for target in blocks.failing_targets:
        fitted = fit_block(ctx, blocks, target)
        if isinstance(fitted, str):
            why.append(fitted)
        elif fitted.added or fitted.left_out:
            fits.append(fitted)
    if fits and all(_left_empty(blocks, f.target) for f in fits):  # nothing written: not a misreading
        tensors = {f.target.tensor for f in fits}
        sources = {(p.batch, p.head, p.q_block) for f in fits for p in f.left_out}
        alone = all(len(f.left_out) == 1 for f in fits) and len(sources) == 1  # each block's one pair, one source
        if alone and "dq" not in blocks.failing and len(tensors) == 1 and not set(blocks.failing) - tensors:
            return 0.0, _empty_sum(blocks, fits, next(iter(tensors)))
        reason = "every block the fit reads differently is left zero, or near (not-written's, or a factor's)"
        return 0.0, tried("block-selection", supposes, 0.0, f"ruled out: {reason}")
    if not fits:
        reason = why[0] if why else "every failing block is the sum of the pairs its mask selects"
        return 0.0, tried("block-selection", supposes, 0.0, f"ruled out: {reason}")
    by_target = {f.target: f.values for f in fits}
    values = [by_target.get(t, blocks.data[t][2]) for t in blocks.targets]
    share, ratios = blocks.explained(values)
    added = tuple(dict.fromkeys(p for f in fits for p in f.added))
    left_out = tuple(dict.fromkeys(p for f in fits for p in f.left_out))
    kind, what = _kind(ctx, blocks, fits, added, left_out)
    shift = _shift(ctx, added, left_out) if kind == "block-selection" else ""
    what = shift or what
    parts = [f"leaves out selected pairs {_words(left_out)}"] if left_out else []
    parts += [f"adds pairs the mask does not select {_words(added)}"] if added else []
    text = f"{what}: the device {' and '.join(parts)}; under the fit, {blocks.falls(ratios)}"
    where = tuple(f.target.words() for f in fits)[:3]
    if kind is None:
        return 0.0, tried("block-selection", supposes, 0.0, f"left to the race pattern: {text}")
    return (share if share >= 0.5 else 0.0), scored(kind, supposes, share, text, blocks.failing, where, evidence=text)


def _empty_sum(blocks: Blocks, fits: list[Fit], tensor: str) -> Findings:
    """One gradient's blocks left zero whose only pair (the same query block in each) the other gradients
    take: never written there, or its sum skipping that query block's partials; the outputs cannot tell
    which (`not-written`'s score, 0.8; `diagnose` says so in not-written's words too)."""
    left_out = tuple(dict.fromkeys(p for f in fits for p in f.left_out))
    name = {"dk": "dK", "dv": "dV"}[tensor]
    where = tuple(f.target.words() for f in fits)[:3]
    text = (
        f"{name} leaves out selected pairs {_words(left_out)} (dQ and {'dV' if tensor == 'dk' else 'dK'} take them), "
        f"the only ones of the blocks it leaves zero ({where[0]}): not told apart from not-written (the blocks "
        f"never written), which reads the same"
    )
    supposes = "one gradient's sum leaving out pairs the others take"
    return named("partial-missing", supposes, 0.8, text, (tensor,), where, verb="fits")


def _one_sum(tensor: str, left_out: tuple[Pair, ...]) -> str:
    """How to say that one gradient's sum (dK or dV) leaves out pairs the others take: as one (query head,
    query block) skipped, or, for one pair in one kv block, not told apart from a lost update of its add."""
    name = {"dk": "dK", "dv": "dV"}[tensor]
    other = "dV" if tensor == "dk" else "dK"
    sources = {(p.batch, p.head, p.q_block) for p in left_out}
    if len(left_out) == 1:
        return (
            f"{name} alone leaves out one pair's partial ({other} and dQ take it): not told apart from a lost update "
            f"of {name}'s add (accumulation-race), which repeated runs (--repeat) would show"
        )
    if len(sources) == 1:
        batch, head, block = next(iter(sources))
        return (
            f"{name} leaves out the partials of batch {batch} query head {head} query block {block} in every kv block "
            f"it selects ({other} and dQ take them: the selection is read right, {name}'s sum skips them)"
        )
    return f"{name} alone leaves out the partials of selected pairs ({other} and dQ take them)"


def _kind(
    ctx: Context, blocks: Blocks, fits: list[Fit], added: tuple[Pair, ...], left_out: tuple[Pair, ...]
) -> tuple[str | None, str]:
    """The kind the fitted pairs point to and how to say it (None: a lost update, the race pattern's)."""
    kv_only = "dq" not in blocks.failing
    blocks_hit = {(f.target.batch, f.target.head, f.target.block) for f in fits}
    tensors = {f.target.tensor for f in fits}
    if kv_only and not added and len(tensors) == 1 and not set(blocks.failing) - tensors:
        return "partial-missing", _one_sum(next(iter(tensors)), left_out)
    if kv_only and not added and len(blocks_hit) <= 2 and all(len(f.left_out) <= 1 for f in fits):
        return None, "one pair's partial missing in a shared kv block"
    if not added and all(_tail(ctx, p) for p in left_out):
        return "tail-block", "the partial last blocks (Skv % Y, else Sq % X) are skipped"
    if kv_only and not added and ctx.case.group_size > 1 and len(blocks_hit) >= 2:
        heads = {p.head for p in left_out}
        # Whole query heads left out: no fitted block keeps a pair of theirs.
        if not any(p.head in heads for f in fits for p in f.kept):
            names = ", ".join(str(h) for h in sorted(heads))
            return "gqa-group-sum", f"dK/dV leave query heads {names} out of their GQA group's sum"
    return "block-selection", "the block mask read wrongly"
