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

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from ...core.case import Case
from ...golden import forward_case, written_rows
from ..forward import PREFILL_BITS, lse_floor
from ..pair import PAIR_CAUSES
from ..results import DIAGNOSIS_KINDS, Cause, Check, Hypothesis, TensorResult
from . import Diagnosis, _ranked
from .forward_hypotheses import (
    FORWARD_VARIANTS,
    ForwardContext,
    ForwardVariant,
    QBlock,
    Scorer,
    Side,
    applies,
    block_excess,
    changed_blocks,
    falls,
    per_entry,
    query_blocks,
    recompute_forward,
)
from .forward_patterns import (
    FORWARD_PATTERNS,
    LOCAL,
    accumulation,
    fits,
    follows,
    layout,
    predicts_unwritten,
    rows_permuted,
    tile_local,
    unwritten_rows,
    written_alone,
)

__all__ = ["FORWARD_KINDS", "diagnose_forward"]

MAX_TARGETS = 3
"""Failing query blocks recomputed (the worst by excess error, out and lse together)."""
EXPLAINED = 0.9
"""A recomputed hypothesis explaining this share ranks the local patterns below it (it explains values)."""
DONE = 0.98
"""A recomputed hypothesis explaining this share ends the search (the later ones read "not tried")."""
SCREENED = 0.3
"""Share of the worst failing block's excess error a hypothesis must explain to be tried on every target."""


GRADIENT_KINDS = ("gqa-group-sum", "softmax-grad", "accumulation-race")
"""Kinds only a backward's gradients can show (dK/dV's group sum, Dsum, the atomic adds)."""

FORWARD_KINDS = tuple(k for k in DIAGNOSIS_KINDS if k not in (*GRADIENT_KINDS, *PAIR_CAUSES))
"""The kinds of the vocabulary the forward's diagnosis can name: all but the gradients' and the pair's."""


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
    left = unwritten_rows(fcase, judged, arrays, gold, written, prefilled, PREFILL_BITS, causes, tried)
    any_left = any(rows.any() for rows in left.values())
    written_alone(fcase, tensors, checks, arrays, written, block_mask, prefilled, PREFILL_BITS, causes, tried)
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
            bench = per_entry(fcase, np.asarray(benchmark[name]), spans, is_lse)
        sides.append(
            Side(
                name,
                per_entry(fcase, np.asarray(device[name]), spans, is_lse),
                bench,
                per_entry(fcase, np.asarray(golden[name]), spans, is_lse),
                floor,
            )
        )
    scorer = Scorer(ctx, sides, written)
    blocks = query_blocks(ctx, written)
    excess, out_excess = block_excess(scorer, blocks)
    worst = sorted((b for b in blocks if excess[b] > 0), key=lambda b: -excess[b])
    targets = worst[:MAX_TARGETS]
    if not targets:
        reason = "not tried: no written row has an error beyond the benchmark's (only NaN/Inf or unwritten rows)"
        for v in FORWARD_VARIANTS:
            if v.mask and any_left and applies(ctx, v) is None and predicts_unwritten(ctx, v, written, left):
                text = f"{v.supposes}: it leaves unwritten exactly the rows the device left unwritten"
                causes.append(Cause(v.kind, 1.0, text, tuple(names), ()))
                tried.append(Hypothesis(v.kind, v.supposes, 1.0, "explains: " + text))
                causes[:] = follows(causes, v, 1.0)
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
        text = f"under the hypothesis, {falls(ratios, names)}"
        if share >= 0.5:
            changed = tuple(n for n in names if n in ratios) or tuple(names)
            causes.append(Cause(v.kind, share, f"{v.supposes}: {text}", changed, where))
            tried.append(Hypothesis(v.kind, v.supposes, share, f"explains {share:.0%} of the excess error: {text}"))
            best = max(best, share)
            done = v if share >= DONE and done is None else done
            if share >= EXPLAINED and v.mask and any_left and predicts_unwritten(ctx, v, written, left):
                causes[:] = follows(causes, v, share)
        else:
            tried.append(Hypothesis(v.kind, v.supposes, share, f"ruled out: explains {share:.0%}: {text}"))

    if done is None:
        best = max(best, fits(scorer, targets, controls, names, where, causes, tried))
    out_index = judged.index("out") if "out" in judged else None
    local: list[Cause] = []
    if done is not None:  # the patterns would only rank below it
        for kind, supposes in FORWARD_PATTERNS:
            tried.append(Hypothesis(kind, supposes, 0.0, f"not tried: '{done.supposes}' already explains the error"))
    elif out_index is not None:
        rows_permuted(fcase, spans, sides[out_index], written, targets, local, tried)
        tile_local(fcase, scorer, sides[out_index], blocks, out_excess, local, tried)
        if best < EXPLAINED:
            layout(fcase, arrays["out"], gold["out"], benchmark, written, local, tried)
            accumulation(fcase, ctx, blocks, excess, local, tried)
    moved = max((c.score for c in local if c.kind in ("rows-permuted", "length-boundary")), default=0.0)
    if moved >= LOCAL:  # rows at other rows' places are local too: the rows say more than the tile or piece
        local = [replace(c, score=min(c.score, 0.9 * moved)) if c.kind == "tile-local" else c for c in local]
    if best >= EXPLAINED:  # a hypothesis that explains the values outranks where the errors are
        local = [replace(c, score=min(c.score, 0.8 * best)) for c in local]
    causes.extend(local)
    return _ranked(causes, tried)


# ---- patterns ----------------------------------------------------------------------------------------
