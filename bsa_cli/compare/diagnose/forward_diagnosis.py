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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from ...core.case import Case
from ...golden import forward_case, written_rows
from ..forward import lse_floor
from ..pair import PAIR_CAUSES
from ..results import DIAGNOSIS_KINDS, Check, TensorResult
from . import forward_hypotheses, forward_patterns
from .findings import Diagnosis, Findings, Kind, Search, Trial, named, not_tried, scored, screened_out, tried
from .forward_hypotheses import FORWARD_VARIANTS, ForwardContext, QBlock, Scorer, Side, per_entry, recompute_forward
from .forward_patterns import FORWARD_PATTERNS, LOCAL, predicts_unwritten
from .hypotheses import Variant, applies, changed_blocks
from .patterns import NO_INFORMATION, never_written, no_information
from .views import Arrays, falls

#: Failing query blocks recomputed (the worst by excess error, out and lse together).
MAX_TARGETS = 3
#: A recomputed hypothesis explaining this share ranks the local patterns below it (it explains values).
EXPLAINED = 0.9
#: A recomputed hypothesis explaining this share ends the search (the later ones read "not tried").
DONE = 0.98
#: Share of the worst failing block's excess error a hypothesis must explain to be tried on every target.
SCREENED = 0.3


#: Kinds only a backward's gradients can show (dK/dV's group sum, Dsum, the atomic adds).
GRADIENT_KINDS = ("gqa-group-sum", "softmax-grad", "accumulation-race", "partial-missing")

#: The kinds of the vocabulary the forward's diagnosis can name: all but the gradients' and the pair's.
FORWARD_KINDS = tuple(k for k in DIAGNOSIS_KINDS if k not in (*GRADIENT_KINDS, *PAIR_CAUSES))


@dataclass(frozen=True)
class _Failure:
    """A failing forward as the diagnosis reads it: its outputs as device, benchmark and golden (`sides`), the
    rows it writes and those the device left unwritten, its query blocks by excess error."""

    ctx: ForwardContext
    names: list[str]  # the failing outputs
    scorer: Scorer  # its sides: the outputs as device, benchmark and golden
    written: np.ndarray
    left: dict[str, np.ndarray]
    blocks: list[QBlock]
    excess: dict[QBlock, float]
    out_excess: dict[QBlock, float]
    targets: list[QBlock]
    values: dict[str, tuple[np.ndarray, np.ndarray]]  # the failing outputs' written rows: (device, golden)

    @property
    def any_left(self) -> bool:
        return any(rows.any() for rows in self.left.values())

    @property
    def controls(self) -> list[QBlock]:
        """The block with the least excess error, scored with the targets (a hypothesis must leave it right)."""
        controls = [min(self.blocks, key=lambda b: self.excess[b])] if len(self.blocks) > len(self.targets) else []
        return [b for b in controls if b not in self.targets]

    @property
    def where(self) -> tuple[str, ...]:
        return tuple(f"{', '.join(self.names)} {t.words()}" for t in self.targets)

    def pick(self, out: np.ndarray, lse: np.ndarray) -> tuple[np.ndarray, ...]:
        """A recomputed out and lse as the sides judged."""
        return tuple(out if s.name == "out" else lse for s in self.scorer.sides)


def diagnose_forward(
    case: Case,
    tensors: Sequence[TensorResult],
    checks: Sequence[Check],
    device: Arrays,
    golden: Arrays,
    benchmark: Arrays | None,
    inputs: Arrays,
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
        return Findings().ranked()
    fcase = forward_case(case)
    spans = {s.batch: s for s in fcase.spans() if s.q_len and s.kv_len}
    ctx = ForwardContext(fcase, inputs, spans)
    block_mask = np.asarray(inputs["block_sparse_mask"])
    written = written_rows(fcase, block_mask)
    judged, names = [t.name for t in tensors], [t.name for t in failing]
    arrays, gold = ({n: np.asarray(a[n]).reshape((*fcase.q_shape[:-1], -1)) for n in judged} for a in (device, golden))
    # Rows left at the NaN prefill (or zero), NaN/Inf computed, rows written that must be left alone.
    left, found = forward_patterns.unwritten_rows(fcase, judged, arrays, gold, written, prefilled)
    if prefilled:
        found += forward_patterns.written_alone(fcase, tensors, checks, arrays, written)
    found += never_written(failing)
    values = {n: (arrays[n][written], gold[n][written]) for n in names}  # the rows the forward writes
    blank = no_information(values)
    if blank.causes:  # nothing to fit a cause to
        return (found + blank).ranked()
    if failing and all(all(c.passed or c.name == "bias" for c in t.checks) for t in failing):
        detail = "; ".join(c.detail for t in failing for c in t.checks if not c.passed)
        return (found + named("precision-bias", "a systematic relative bias alone", 1.0, detail, names)).ranked()

    def entries(arrays: Arrays, name: str) -> dict[int, np.ndarray]:  # out [N1, q_len, D], lse [N1, q_len, 1]
        return per_entry(fcase, np.asarray(arrays[name]), spans, name == "lse")

    bench, floor = benchmark or {}, lse_floor(inner_precise)[0]
    sides = [
        Side(n, entries(device, n), entries(bench, n) if n in bench else None, entries(golden, n), floor)
        for n in judged
    ]
    scorer = Scorer(ctx, sides, written)
    blocks = forward_hypotheses.query_blocks(ctx, written)
    excess, out_excess = forward_hypotheses.block_excess(scorer, blocks)
    targets = sorted((b for b in blocks if excess[b] > 0), key=lambda b: -excess[b])[:MAX_TARGETS]
    f = _Failure(ctx, names, scorer, written, left, blocks, excess, out_excess, targets, values)
    if not targets:
        return _unwritten_only(f, found).ranked()
    return _explained(f, found, arrays["out"] if "out" in arrays else None, gold.get("out"), benchmark).ranked()


def _unwritten_only(f: _Failure, found: Findings) -> Findings:
    """No written row wrong beyond the benchmark: a mask reading that leaves exactly the rows the device left
    unwritten explains them; nothing else is tried."""
    reason = "not tried: no written row has an error beyond the benchmark's (only NaN/Inf or unwritten rows)"
    for v in FORWARD_VARIANTS:
        if v.mask and f.any_left and applies(f.ctx, v) is None and predicts_unwritten(f.ctx, v, f.written, f.left):
            text = f"{v.supposes}: it leaves unwritten exactly the rows the device left unwritten"
            found += named(cast(Kind, v.kind), v.supposes, 1.0, text, f.names)
            found = found.follows("not-written", v.supposes, 0.9)
        else:
            found += tried(v.kind, v.supposes, 0.0, reason)
    return found


def _explained(
    f: _Failure, found: Findings, out: np.ndarray | None, gold: np.ndarray | None, benchmark: Arrays | None
) -> Findings:
    """The recomputed hypotheses, then (while none explains the error) the fits and out's forward_patterns."""
    search = Search(symptom="not-written", done_at=DONE)
    found = search.run(found, FORWARD_VARIANTS, _why_not(f, search), _test(f))
    best = search.best
    if search.done is not None:  # the patterns would only rank below it
        reason = f"not tried: '{search.done.supposes}' already explains the error"
        return found + not_tried(FORWARD_PATTERNS, reason)
    fitted, fit_found = forward_patterns.fits(f.scorer, f.targets, f.controls, f.names, f.where)
    best = max(best, fitted)
    found += fit_found
    if out is None or gold is None:
        return found
    side = next(s for s in f.scorer.sides if s.name == "out")
    local = forward_patterns.rows_permuted(f.ctx.case, f.ctx.spans, side, f.written, f.targets)
    local += forward_patterns.tile_local(f.ctx.case, f.scorer, side, f.blocks, f.out_excess)
    if best < EXPLAINED:
        local += forward_patterns.layout(f.ctx.case, out, gold, benchmark, f.written)
        # values unrelated to the golden everywhere (placements ruled out: a transposed out is unrelated too):
        # no fit or local pattern (rows matched by chance among tiny values) is a cause of them
        if not any(c.score >= EXPLAINED for c in local.causes if c.kind == "layout"):
            blank = no_information(f.values, correlation=True)
            if blank.causes:
                found = Findings(tuple(c for c in found.causes if c.kind in ("non-finite", "not-written")), found.tried)
                reason = f"not tried: {NO_INFORMATION}"
                return found + Findings((), local.tried) + blank + not_tried(FORWARD_PATTERNS, reason)
        local += forward_patterns.accumulation(f.ctx, f.blocks, f.excess)
    causes = local.causes
    moved = max((c.score for c in causes if c.kind in ("rows-permuted", "length-boundary")), default=0.0)
    if moved >= LOCAL:  # rows at other rows' places are local too: the rows say more than the tile or piece
        causes = tuple(replace(c, score=min(c.score, 0.9 * moved)) if c.kind == "tile-local" else c for c in causes)
    if best >= EXPLAINED:  # a hypothesis that explains the values outranks where the errors are
        causes = tuple(replace(c, score=min(c.score, 0.8 * best)) for c in causes)
    found += Findings(causes, local.tried)
    laid = max((c for c in causes if c.kind == "layout"), key=lambda c: c.score, default=None)
    if laid is not None and laid.score >= EXPLAINED:  # the values are right, at the wrong place: NaN/Inf follow
        found = found.follows("non-finite", "layout", 0.9, exact=True)
    return found


def _why_not(f: _Failure, search: Search) -> Callable[[Variant], str | None]:
    """Why a hypothesis is not recomputed (or None), asked in this order."""

    return lambda v: Search.first((lambda: applies(f.ctx, v), lambda: search.same_mask(f.ctx, v), search.ended))


def _test(f: _Failure) -> Callable[[Variant], Trial]:
    """A hypothesis recomputed and scored: a few rows of the worst failing block first, then that block, then
    every target, the control and the blocks a mask reading changes."""
    ctx, scorer, targets, controls = f.ctx, f.scorer, f.targets, f.controls

    def test(v: Variant) -> Trial:
        screen = targets[0]  # the worst failing block first (cheap): most hypotheses end here
        some = scorer.sample(screen)
        if some is not None:  # and a few of its rows before it
            part, _ = scorer.explained([screen], {screen: f.pick(*recompute_forward(ctx, v, screen, some))}, some)
            if part < SCREENED:
                return Trial(screened_out(v.kind, v.supposes, part, some.size))
        values = {screen: f.pick(*recompute_forward(ctx, v, screen))}
        first, _ = scorer.explained([screen], values)
        if first < SCREENED and len(targets) > 1:
            why = f"ruled out: explains {first:.0%} of the error of the worst failing block ({screen.words()})"
            return Trial(tried(v.kind, v.supposes, first, why))
        # up to two query blocks whose selection a mask variant changes
        changed = [QBlock(t.batch, t.head, t.block) for t in changed_blocks(ctx, v, ("dq",))]
        changed = [b for b in changed if b not in targets and b not in controls]
        blocks = [*targets, *controls, *changed]
        values.update({target: f.pick(*recompute_forward(ctx, v, target)) for target in blocks[1:]})
        share, ratios = scorer.explained(blocks, values, each=f.names)
        text = f"under the hypothesis, {falls(ratios, f.names)}"
        tensors = tuple(n for n in f.names if n in ratios) or tuple(f.names)
        symptom = share >= EXPLAINED and bool(v.mask) and f.any_left
        symptom = symptom and predicts_unwritten(ctx, v, f.written, f.left)
        return Trial(scored(v.kind, v.supposes, share, text, tensors, f.where), share, symptom)

    return test
