"""The diagnosis of a failing case: candidate causes tested against the device's outputs, ranked.

A failing case's judgement says which check failed and where the errors are; the diagnosis names the
likely cause. Two ways of testing a cause:

* **recompute**: the golden of the failing blocks is computed again (float64, dense on those blocks)
  under the hypothesis (mask transposed or shifted, tail blocks dropped, heads mapped to other kv
  heads, part of a GQA group summed, lse in base 2 or ignored, Dsum missing, the scale held in the
  case dtype, a constant factor) and scored by the share of the device's excess error (beyond the
  benchmark's) it removes: 1 when the device equals the hypothesis as closely as the benchmark equals
  the golden. The gradients are block-local given lse and out (dS_ij = P_ij (dP_ij - Dsum_i)), so a
  block's golden needs only the block pairs that touch it.
* **pattern**: where a cause cannot be recomputed, the errors' pattern over tensors, blocks, tiles and
  rows is scored (non-finite values, blocks left zero, errors only in tail blocks, only in kv blocks
  two pairs add into, in one or a few 16x16 tiles, rows that equal golden rows elsewhere, a bias alone).

Only failing cases are diagnosed, and only on their failing blocks (`MAX_TARGETS` per tensor). Pure: no
files, no printing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ...core.case import Case
from ...store.manifest import GRAD_NAMES
from ..results import DIAGNOSIS_KINDS, Cause, Check, Hypothesis, TensorResult
from .contributions import contributions_fit
from .hypotheses import (
    VARIANTS,
    Context,
    Target,
    Variant,
    applies,
    block_of,
    changed_blocks,
    fitted_head_map,
    fitted_variants,
    recompute,
)
from .patterns import (
    accumulation_precision,
    block_local,
    diagnose_bias,
    nonfinite_cause,
    piece_local,
    race_pattern,
    scale_fit,
    tail_pattern,
    tile_local,
    zero_blocks,
    zero_share,
)
from .placement import PLACED, layout, length_boundary, rows_permuted
from .scoring import MAX_TARGETS, SAMPLED, Blocks, Rows, gather_blocks

__all__ = ["MAX_TARGETS", "TESTED_KINDS", "Diagnosis", "diagnose"]

UNTESTED_KINDS: tuple[str, ...] = ()
"""Kinds of the vocabulary this module never names yet."""

TESTED_KINDS = tuple(kind for kind in DIAGNOSIS_KINDS if kind not in UNTESTED_KINDS)
"""The kinds of `results.DIAGNOSIS_KINDS` this module tests."""

LOCAL = 0.8
"""A rows-permuted or tile-local pattern scoring this much skips the recomputed hypotheses."""
EXPLAINED = 0.98
"""A recomputed hypothesis explaining this share of the error ends the search: the later ones are not
tried (`--explain` says so)."""
MIN_SCORE = 0.2
"""Causes scoring less are not listed in the diagnosis (`--explain` still shows them)."""
MAX_CAUSES = 3
"""Causes listed in a diagnosis, best first."""


@dataclass(frozen=True)
class Diagnosis:
    """The causes (best first, at most `MAX_CAUSES`, none below `MIN_SCORE`) and every hypothesis tried."""

    causes: tuple[Cause, ...]
    hypotheses: tuple[Hypothesis, ...]


# ---- the diagnosis --------------------------------------------------------------------------------


def diagnose(
    case: Case,
    tensors: Sequence[TensorResult],
    checks: Sequence[Check],
    device: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    benchmark: Mapping[str, np.ndarray] | None,
    inputs: Mapping[str, np.ndarray],
) -> Diagnosis:
    """Diagnose a failing case: test candidate causes against the device's outputs and rank them.

    Args:
        case: the case geometry.
        tensors: the judged tensors (`judge_tensors`), at least one failing, or a failing case check.
        checks: the case-level checks (status, run record: `deterministic`).
        device, golden, benchmark: {"dq", "dk", "dv"} arrays, as judged (benchmark may be None).
        inputs: the case's inputs keyed by manifest name (query, key, value, dout, attention_out,
            softmax_lse, block_sparse_mask).

    Returns:
        The causes, best first, and every hypothesis tried. A case with nothing failing gets none.
    """
    causes: list[Cause] = []
    tried: list[Hypothesis] = []
    failing = [t for t in tensors if not t.passed]
    if any(c.name == "deterministic" and not c.passed for c in checks):
        text = "dK/dV differ between repeated runs of the same inputs: the order of the atomic adds changes the result"
        causes.append(Cause("accumulation-race", 1.0, text, ("dk", "dv"), ()))
        tried.append(Hypothesis("accumulation-race", "a run-dependent accumulation order", 1.0, "explains: " + text))
    if not failing:
        return _ranked(causes, tried)
    spans = {s.batch: s for s in case.spans() if s.q_len and s.kv_len}
    ctx = Context(case, inputs, spans)
    nonfinite = nonfinite_cause(case, failing, device, golden, spans)
    if nonfinite is not None:
        causes.append(nonfinite)
        tried.append(
            Hypothesis(
                "non-finite", "NaN/Inf written where the golden is finite", 1.0, "explains: " + nonfinite.evidence
            )
        )
    zero = [t.name for t in failing if any(c.name == "all_zero" and not c.passed for c in t.checks)]
    if zero:
        text = f"{', '.join(zero)} all zero where the golden is not, as if never written"
        causes.append(Cause("not-written", 1.0, text, tuple(zero), ()))
        tried.append(Hypothesis("not-written", "an output never written", 1.0, "explains: " + text))
    if zero and all(_structural_only(t) for t in failing):
        return _ranked(causes, tried)
    bias_only = all(all(c.passed or c.name == "bias" for c in t.checks) for t in failing)
    blocks = gather_blocks(case, ctx, tensors, device, golden, benchmark, 4 * MAX_TARGETS if bias_only else MAX_TARGETS)
    if bias_only:
        diagnose_bias(case, ctx, failing, blocks, causes, tried)
        return _ranked(causes, tried)
    # A few rows or tiles first (cheap): a misreading of whole blocks, heads or rows does not produce them.
    before = len(causes)
    rows_permuted(case, failing, blocks, device, golden, spans, causes, tried)
    tile_local(case, blocks, causes, tried)
    piece_local(case, blocks, causes, tried)
    local = next((c for c in causes[before:] if c.score >= LOCAL), None)
    # A named constant factor (the scale missing, doubled; the sign flipped): cheap, fitted first. Its cause
    # is kept for after the recomputed hypotheses (lse in base 2 or ignored, with lse the same in every row,
    # is a factor too, and ends the search there); while it explains the error, only hypotheses that can
    # also give a constant factor are recomputed.
    fit_causes: list[Cause] = []
    fit_tried: list[Hypothesis] = []
    permuted = local is not None and local.kind == "rows-permuted"
    factor = scale_fit(case, blocks, fit_causes, fit_tried) if local is None or permuted else 0.0
    masks_seen: dict[bytes, Variant] = {}
    done: Hypothesis | None = None

    def variants() -> Iterator[Variant]:
        yield from VARIANTS
        if done is None and local is None:  # a softmax term wrong in another way: fitted to the worst dq block
            worst = next((t for t in blocks.targets if t.tensor == "dq" and t.tensor in blocks.failing), None)
            if worst is not None and worst not in blocks.nonfinite:
                dev, _, null, _ = blocks.data[worst]
                yield from fitted_variants(ctx, worst, dev, null)
            if "dq" in blocks.failing and factor < EXPLAINED:  # query heads reading other kv heads
                mapped = fitted_head_map(ctx, blocks.targets, lambda t: block_of(case, device["dq"], t, spans))
                if mapped is not None:
                    yield mapped

    for v in variants():
        why = applies(case, ctx, v)
        if why is None and local is not None:
            why = (
                f"not tried: the error is {local.kind} ({local.score:.2f}), which a misreading of whole blocks "
                "does not produce"
            )
        if why is None and done is not None:
            why = f"not tried: '{done.supposes}' already explains {done.score:.0%} of the error"
        if why is None and factor >= EXPLAINED and not _gives_a_factor(v):
            why = (
                f"not tried: a named constant factor explains {factor:.0%} of the error (the scale fit), which a "
                "misreading of blocks, heads, Dsum or the scale's precision does not give"
            )
        if why is None and v.mask:  # two misreadings of the mask that read the same here are one hypothesis
            read = b"".join(ctx.mask(v, b).tobytes() for b in sorted(spans))
            if read in masks_seen:
                why = f"not told apart from '{masks_seen[read].supposes}' in this case: the mask reads the same"
            masks_seen.setdefault(read, v)
        if why is not None:
            tried.append(Hypothesis(v.kind, v.supposes, 0.0, why))
            continue

        def value(target: Target, v: Variant = v, some: np.ndarray | None = None) -> np.ndarray:
            if v.group and target.tensor == "dq":  # dK/dV's group sum leaves dq as it is
                null = blocks.data[target][2]
                return null if some is None else null[some]
            return recompute(ctx, v, target, some)

        screen = blocks.screen_for(v)
        rows = blocks.sample_of(screen[0]) if len(screen) == 1 else None
        if rows is not None:  # a few rows of the worst block first (cheap): most hypotheses end here
            part, sampled = blocks.explained_rows(screen[0], rows, value(screen[0], some=rows))
            if sampled and part < SAMPLED:
                outcome = f"ruled out: explains {part:.0%} of the error of {rows.size} rows of the worst failing block"
                tried.append(Hypothesis(v.kind, v.supposes, part, outcome))
                continue
        # scored on the screen block whole and on the sampled rows of the others (an estimate: `weights_of`)
        some = blocks.sampled_rows(blocks.targets, whole=screen)
        bound = 1.0 if v.mask else _passing_bound(blocks, value, some)  # it must leave passing tensors right
        if bound < 0.5:
            outcome = f"ruled out: explains at most {bound:.0%} (the passing tensors' blocks show it)"
            tried.append(Hypothesis(v.kind, v.supposes, bound, outcome))
            continue
        screened = [value(t) for t in screen]
        first, measured = blocks.explained_on(screen, screened)
        if first < 0.5 and measured:
            tried.append(
                Hypothesis(
                    v.kind,
                    v.supposes,
                    first,
                    f"ruled out: explains {first:.0%} of the error of the worst failing block",
                )
            )
            continue
        if not measured and not blocks.predicts_nonfinite(screened, screen):  # the worst block's error: NaN/Inf
            tried.append(
                Hypothesis(
                    v.kind, v.supposes, 0.0, "ruled out: it does not put NaN/Inf where the worst failing block has them"
                )
            )
            continue
        bound, values = _values(blocks, v, value, some)
        if bound < 0.5:
            outcome = f"ruled out: explains at most {bound:.0%} (the blocks recomputed so far show it)"
            tried.append(Hypothesis(v.kind, v.supposes, bound, outcome))
            continue
        extra = [t for t in changed_blocks(ctx, v, GRAD_NAMES) if t not in blocks.targets]
        for target in extra:
            blocks.add(target)
        some.update(blocks.sampled_rows(extra))
        extra_values = [recompute(ctx, v, t, some.get(t)) for t in extra]
        share, ratios = blocks.explained(values, extra, extra_values, some)
        text = f"under the hypothesis, {blocks.falls(ratios, some)}" if ratios else "nothing to explain"
        where = tuple(t.words() for t in blocks.targets if t.tensor in blocks.failing)[:3]
        if nonfinite is not None and share >= 0.9:  # NaN/Inf are then the symptom (an overflow), not the cause
            if blocks.predicts_nonfinite(values, rows=some):
                text += "; it puts NaN/Inf where the device has them"
            follows = f" (follows from: {v.supposes})"
            causes[:] = [
                replace(c, score=min(c.score, 0.9 * share), evidence=c.evidence + follows)
                if c.kind == "non-finite" and follows not in c.evidence
                else c
                for c in causes
            ]
        if share >= 0.5:
            causes.append(Cause(v.kind, share, f"{v.supposes}: {text}", blocks.failing, where))
            tried.append(Hypothesis(v.kind, v.supposes, share, f"explains {share:.0%} of the excess error: {text}"))
            if share >= EXPLAINED:
                done = tried[-1]
        else:
            tried.append(Hypothesis(v.kind, v.supposes, share, f"ruled out: explains {share:.0%}: {text}"))
    # The constant factor explaining the error (fitted above): values wrong everywhere by that factor, not
    # misplaced; not when a recomputed hypothesis explains it. (After a rows-permuted pattern too: rows of
    # one direction, an attention sink's, halved equal other rows.)
    if done is not None:
        factor, fit_causes, fit_tried = 0.0, [], []
    if permuted:  # a named factor explaining the error outranks the row matches
        causes.extend(fit_causes if factor >= EXPLAINED else [])
        tried.extend(fit_tried)
    if done is None and factor < EXPLAINED and (local is None or local.kind == "rows-permuted"):  # misplaced?
        placed = max(
            layout(case, failing, device, golden, benchmark, causes, tried),
            length_boundary(case, failing, device, golden, benchmark, spans, causes, tried),
        )
        if placed >= PLACED:  # the values are right, at the wrong place
            best = max((c for c in causes if c.kind in ("layout", "length-boundary")), key=lambda c: c.score)
            causes[:] = [
                replace(c, score=0.9, evidence=c.evidence + f" (follows from: {best.kind})")
                if c.kind == "non-finite"
                else c
                for c in causes
            ]
            reason = f"not tried: '{best.kind}' already explains {placed:.0%} of the error"
            for kind, supposes in _PATTERNS:
                tried.append(Hypothesis(kind, supposes, 0.0, reason))
            return _ranked(causes, tried)
    else:
        explained = done.supposes if done is not None else local.kind if local is not None else ""
        explained = explained or "a gradient off by a constant factor"
        for kind, supposes in _PLACEMENTS:
            tried.append(Hypothesis(kind, supposes, 0.0, f"not tried: '{explained}' explains values, not places"))
    if done is not None or local is not None:  # the patterns below would only rank lower
        explained = done.supposes if done is not None else local.kind if local is not None else ""
        reason = f"not tried: '{explained}' already explains the error"
        for kind, supposes in _PATTERNS:
            if not any(h.supposes == supposes for h in tried):  # the scale fit may have run (rows-permuted)
                tried.append(Hypothesis(kind, supposes, 0.0, reason))
        return _ranked(causes, tried)
    causes.extend(fit_causes)
    tried.extend(fit_tried)
    if factor < EXPLAINED and contributions_fit(ctx, blocks, causes, tried) >= EXPLAINED:
        reason = "not tried: the fitted block pairs already explain the error"
        for kind, supposes in _PATTERNS:
            tried.append(Hypothesis(kind, supposes, 0.0, reason))
        return _ranked(causes, tried)
    zero_blocks(blocks, causes, tried)
    tail_pattern(case, failing, spans, causes, tried, zeros=zero_share(blocks))
    race_pattern(case, ctx, tensors, blocks, causes, tried)
    accumulation_precision(case, failing, golden, np.asarray(inputs["block_sparse_mask"]), spans, causes, tried)
    block_local(case, failing, causes, tried)
    return _ranked(causes, tried)


_PATTERNS = (
    ("scale", "a gradient off by a constant factor"),
    ("not-written", "blocks left zero (never written)"),
    ("tail-block", "errors confined to the partial last blocks"),
    ("accumulation-race", "a race in the dK/dV accumulation (an update lost in a shared kv block)"),
    ("accumulation-precision", "error growing with the number of blocks accumulated per row (dq) or column (dk/dv)"),
    ("tile-local", "errors confined to one or two 128-row pieces (blocks of at most 128 rows)"),
)
"""The pattern hypotheses tried after the recomputed ones (their `supposes`, for `--explain`)."""

_PLACEMENTS = (
    ("layout", "another layout or dtype reading of the outputs"),
    ("length-boundary", "errors at or past the actual sequence lengths (padding rows written, a batch entry shifted)"),
)
"""The placement hypotheses, tried when no recomputed hypothesis explains the error and it is not local."""


def _values(blocks: Blocks, v: Variant, value: Callable[..., np.ndarray], some: Rows) -> tuple[float, list[np.ndarray]]:
    """A hypothesis's values of the targets (of their rows `some`), and a bound on its share
    (`Blocks.at_most`): the passing tensors' blocks first, each block's error added, stopping once it cannot
    explain half (then the values are partial). A mask hypothesis is also scored on blocks it changes: all
    its targets then."""
    if v.mask:
        return 1.0, [value(t, some=some.get(t)) for t in blocks.targets]
    order = sorted(blocks.targets, key=lambda t: t.tensor in blocks.failing)  # passing first, cheap to break
    bound, done = _bounded(blocks, value, some, order)
    return (bound, []) if bound < 0.5 else (1.0, [done[t] for t in blocks.targets])


def _passing_bound(blocks: Blocks, value: Callable[..., np.ndarray], some: Rows) -> float:
    """`_bounded` over the passing tensors' blocks, dq's first (the cheapest)."""
    passing = sorted((t for t in blocks.targets if t.tensor not in blocks.failing), key=lambda t: t.tensor != "dq")
    return _bounded(blocks, value, some, passing)[0]


def _bounded(
    blocks: Blocks, value: Callable[..., np.ndarray], some: Rows, targets: Sequence[Target]
) -> tuple[float, dict[Target, np.ndarray]]:
    """A hypothesis's values of `targets` in turn (of their rows `some`) and the bound on its share they
    give (`Blocks.at_most`), stopping once it falls below half: (the bound, 1 if never below; the values)."""
    done: dict[Target, np.ndarray] = {}
    for target in targets:
        done[target] = value(target, some=some.get(target))
        bound = blocks.at_most(done, some)
        if bound < 0.5:
            return bound, done
    return 1.0, done


def _gives_a_factor(v: Variant) -> bool:
    """Whether a hypothesis can make a gradient a constant factor off: lse misread (P scaled row by row, by
    one factor where lse is the same in every row), or part of a GQA group summed (heads alike)."""
    return bool(v.lse or v.lse_factor != 1.0 or v.lse_offset != 0.0 or v.group)


def _structural_only(result: TensorResult) -> bool:
    """Whether a tensor fails its structural checks (NaN/Inf, all zero) and nothing else, or only those
    whose ratios such values make meaningless."""
    return any(c.name in ("nonfinite", "all_zero") and not c.passed for c in result.checks) or result.passed


def _ranked(causes: list[Cause], tried: list[Hypothesis]) -> Diagnosis:
    best: dict[str, Cause] = {}
    for cause in causes:
        if cause.kind not in best or cause.score > best[cause.kind].score:
            best[cause.kind] = cause
    ranked = sorted(best.values(), key=lambda c: -c.score)
    kept = tuple(replace(c, score=round(c.score, 4)) for c in ranked if c.score >= MIN_SCORE)[:MAX_CAUSES]
    hypotheses = tuple(replace(h, score=round(h.score, 4)) for h in sorted(tried, key=lambda h: -h.score))
    return Diagnosis(kept, hypotheses)
