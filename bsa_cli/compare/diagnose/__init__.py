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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from ...core.case import Case
from ...core.layout import kv_view, q_view
from ...store.manifest import GRAD_NAMES
from ..results import DIAGNOSIS_KINDS, Cause, Check, TensorResult
from . import hypotheses, patterns
from .contributions import contributions_fit
from .findings import Diagnosis, Findings, Search, Trial, named, not_tried, scored, screened_out, tried
from .hypotheses import VARIANTS, Context, Target, Variant, applies, recompute
from .placement import PLACED, layout, length_boundary, rows_permuted
from .scoring import MAX_TARGETS, SAMPLED, Blocks, Rows, gather_blocks
from .views import Arrays, Spans

#: Kinds of the vocabulary this module never names yet.
UNTESTED_KINDS: tuple[str, ...] = ()

#: The kinds of `results.DIAGNOSIS_KINDS` this module tests.
TESTED_KINDS = tuple(kind for kind in DIAGNOSIS_KINDS if kind not in UNTESTED_KINDS)

#: A rows-permuted or tile-local pattern scoring this much skips the recomputed hypotheses.
LOCAL = 0.8
#: A recomputed hypothesis explaining this share of the error ends the search: the later ones are not
#: tried (`--explain` says so).
EXPLAINED = 0.98


@dataclass(frozen=True)
class _Failure:
    """A failing backward as the diagnosis reads it: the judged tensors, the arrays, the target blocks."""

    case: Case
    ctx: Context
    tensors: Sequence[TensorResult]
    failing: list[TensorResult]
    device: Arrays
    golden: Arrays
    benchmark: Arrays | None
    blocks: Blocks
    nonfinite: bool  # NaN/Inf where the golden is finite


# ---- the diagnosis --------------------------------------------------------------------------------


def diagnose(
    case: Case,
    tensors: Sequence[TensorResult],
    checks: Sequence[Check],
    device: Arrays,
    golden: Arrays,
    benchmark: Arrays | None,
    inputs: Arrays,
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
    failing = [t for t in tensors if not t.passed]
    found = _raced(checks)
    if not failing:
        return found.ranked()
    spans = {s.batch: s for s in case.spans() if s.q_len and s.kv_len}
    ctx = Context(case, inputs, spans)
    nonfinite = patterns.nonfinite_cause(case, failing, device, golden, spans)
    found += nonfinite
    unwritten = patterns.never_written(failing)
    found += unwritten
    if unwritten.causes and all(_structural_only(t) for t in failing):
        return found.ranked()
    blank = patterns.no_information(_judged(case, failing, device, golden, spans))
    if blank.causes:  # nothing to fit a cause to
        return (found + blank).ranked()
    bias_only = all(all(c.passed or c.name == "bias" for c in t.checks) for t in failing)
    blocks = gather_blocks(case, ctx, tensors, device, golden, benchmark, 4 * MAX_TARGETS if bias_only else MAX_TARGETS)
    if bias_only:
        return (found + patterns.diagnose_bias(case, ctx, failing, blocks)).ranked()
    failure = _Failure(case, ctx, tensors, failing, device, golden, benchmark, blocks, bool(nonfinite.causes))
    return _explained(failure, found).ranked()


def _raced(checks: Sequence[Check]) -> Findings:
    """accumulation-race, when repeated runs of the same inputs differ."""
    if not any(c.name == "deterministic" and not c.passed for c in checks):
        return Findings()
    text = "dK/dV differ between repeated runs of the same inputs: the order of the atomic adds changes the result"
    return named("accumulation-race", "a run-dependent accumulation order", 1.0, text, ("dk", "dv"))


def _explained(f: _Failure, found: Findings) -> Findings:
    """The error's values: local patterns, then recomputed hypotheses, then places, then patterns."""
    # A few rows or tiles first (cheap): a misreading of whole blocks, heads or rows does not produce them.
    local_found = rows_permuted(f.case, f.blocks, f.golden, f.ctx.spans)
    local_found += patterns.tile_local(f.case, f.blocks) + patterns.piece_local(f.case, f.blocks)
    local = next((c for c in local_found.causes if c.score >= LOCAL), None)

    def unrelated() -> Findings:  # values unrelated to the golden (whole tensors: asked only where it matters)
        return patterns.no_information(_judged(f.case, f.failing, f.device, f.golden, f.ctx.spans), correlation=True)

    if local is not None and unrelated().causes:  # values unrelated to the golden everywhere are no local error
        local, local_found = None, Findings((), local_found.tried)
    found += local_found
    # A named constant factor (the scale missing, doubled; the sign flipped): cheap, fitted first. Its cause
    # is kept for after the recomputed hypotheses (lse in base 2 or ignored, with lse the same in every row,
    # is a factor too, and ends the search there); while it explains the error, only hypotheses that can
    # also give a constant factor are recomputed.
    permuted = local is not None and local.kind == "rows-permuted"
    factor, fit = patterns.scale_fit(f.case, f.blocks) if local is None or permuted else (0.0, Findings())
    search = Search(symptom="non-finite", done_at=EXPLAINED)
    found = search.run(found, _variants(f, search, local, factor), _why_not(f, search, local, factor), _test(f))
    # The constant factor explaining the error (fitted above): values wrong everywhere by that factor, not
    # misplaced; not when a recomputed hypothesis explains it. (After a rows-permuted pattern too: rows of
    # one direction, an attention sink's, halved equal other rows.)
    if search.done is not None:
        factor, fit = 0.0, Findings()
    if permuted:  # a named factor explaining the error outranks the row matches
        found += Findings(fit.causes if factor >= EXPLAINED else (), fit.tried)
    explained = search.done.supposes if search.done is not None else local.kind if local is not None else ""
    if search.done is None and factor < EXPLAINED and (local is None or permuted):  # misplaced?
        laid, placing = layout(f.case, f.failing, f.device, f.golden, f.benchmark)
        bounded, more = length_boundary(f.case, f.failing, f.device, f.golden, f.benchmark, f.ctx.spans)
        found += placing + more
        if max(laid, bounded) >= PLACED:  # the values are right, at the wrong place: NaN/Inf follow from it
            best = max((c for c in found.causes if c.kind in ("layout", "length-boundary")), key=lambda c: c.score)
            found = found.follows("non-finite", best.kind, 0.9, exact=True)
            why = f"not tried: '{best.kind}' already explains {max(laid, bounded):.0%} of the error"
            return found + not_tried(_PATTERNS, why)
    else:
        reason = f"not tried: '{explained or 'a gradient off by a constant factor'}' explains values, not places"
        found += not_tried(_PLACEMENTS, reason)
    if explained:  # the patterns below would only rank lower (the scale fit may have run: rows-permuted)
        left = [(k, s) for k, s in _PATTERNS if not any(h.supposes == s for h in found.tried)]
        return found + not_tried(left, f"not tried: '{explained}' already explains the error")
    found += fit
    # values unrelated to the golden (placements ruled out above: a transposed tensor is unrelated too)
    blank = unrelated()
    if blank.causes:  # nothing fitted or placed explains them: their causes so far fit noise
        found = Findings(tuple(c for c in found.causes if c.kind == "non-finite"), found.tried)
        return found + blank + not_tried(_PATTERNS, f"not tried: {patterns.NO_INFORMATION}")
    share, fitted = contributions_fit(f.ctx, f.blocks) if factor < EXPLAINED else (0.0, Findings())
    found += fitted
    if share >= EXPLAINED:
        return found + not_tried(_PATTERNS, "not tried: the fitted block pairs already explain the error")
    return _not_told_apart(found + _patterns(f))


def _not_told_apart(found: Findings) -> Findings:
    """Blocks left zero whose only pair the other gradients take (`contributions._empty_sum`): not-written and
    partial-missing read the same, so not-written (first, as the pattern that needs no fit) says so too."""
    missing = next((c for c in found.causes if c.kind == "partial-missing" and "not-written" in c.evidence), None)
    unwritten = max((c for c in found.causes if c.kind == "not-written"), key=lambda c: c.score, default=None)
    if missing is None or unwritten is None:
        return found
    note = " (not told apart from partial-missing: a sum skipping those blocks' only pair reads the same)"
    tied = (replace(unwritten, evidence=unwritten.evidence + note), replace(missing, score=unwritten.score))
    return Findings((*tied, *(c for c in found.causes if c not in (unwritten, missing))), found.tried)


def _variants(f: _Failure, search: Search, local: Cause | None, factor: float) -> Iterator[Variant]:
    """The recomputed hypotheses: the fixed ones, then (while nothing explains the error) those fitted."""
    yield from VARIANTS
    if search.done is None and local is None:  # a softmax term wrong in another way: fitted to the worst dq block
        blocks = f.blocks
        worst = next((t for t in blocks.targets if t.tensor == "dq" and t.tensor in blocks.failing), None)
        if worst is not None and worst not in blocks.nonfinite:
            dev, _, null, _ = blocks.data[worst]
            yield from hypotheses.fitted_variants(f.ctx, worst, dev, null)
        if "dq" in blocks.failing and factor < EXPLAINED:  # query heads reading other kv heads
            device_block = partial(hypotheses.block_of, f.case, f.device["dq"], spans=f.ctx.spans)
            yield from hypotheses.fitted_head_map(f.ctx, blocks.targets, device_block)


def _why_not(f: _Failure, search: Search, local: Cause | None, factor: float) -> Callable[[Variant], str | None]:
    """Why a hypothesis is not recomputed (or None): in this order, as the search stands when it is asked."""
    whole = "which a misreading of whole blocks does not produce"
    blocks_only = None if local is None else f"not tried: the error is {local.kind} ({local.score:.2f}), {whole}"
    factored = (
        f"not tried: a named constant factor explains {factor:.0%} of the error (the scale fit), which a "
        "misreading of blocks, heads, Dsum or the scale's precision does not give"
    )

    return lambda v: Search.first(
        (
            lambda: applies(f.ctx, v),
            lambda: blocks_only,
            search.ended,
            lambda: factored if factor >= EXPLAINED and not _gives_a_factor(v) else None,
            lambda: search.same_mask(f.ctx, v),
        )
    )


def _test(f: _Failure) -> Callable[[Variant], Trial]:
    """A hypothesis recomputed and scored, cheapest screens first: a few rows of the worst failing block, the
    passing tensors' blocks, the worst block whole, then every target (`_scored`)."""
    blocks = f.blocks

    def test(v: Variant) -> Trial:
        def ruled_out(score: float, why: str) -> Trial:
            return Trial(tried(v.kind, v.supposes, score, why))

        def value(target: Target, some: np.ndarray | None = None) -> np.ndarray:
            if v.group and target.tensor == "dq":  # dK/dV's group sum leaves dq as it is
                null = blocks.data[target][2]
                return null if some is None else null[some]
            return recompute(f.ctx, v, target, some)

        screen = blocks.screen_for(v)
        rows = blocks.sample_of(screen[0]) if len(screen) == 1 else None
        if rows is not None:  # a few rows of the worst block first (cheap): most hypotheses end here
            part, sampled = blocks.explained_rows(screen[0], rows, value(screen[0], some=rows))
            if sampled and part < SAMPLED:
                return Trial(screened_out(v.kind, v.supposes, part, rows.size))
        # scored on the screen block whole and on the sampled rows of the others (an estimate: `weights_of`)
        some = blocks.sampled_rows(blocks.targets, whole=screen)
        # it must leave passing tensors right: their blocks first, dq's first (the cheapest)
        passing = sorted((t for t in blocks.targets if t.tensor not in blocks.failing), key=lambda t: t.tensor != "dq")
        bound = 1.0 if v.mask else _bounded(blocks, value, some, passing)[0]
        if bound < 0.5:
            return ruled_out(bound, f"ruled out: explains at most {bound:.0%} (the passing tensors' blocks show it)")
        screened = [value(t) for t in screen]
        first, measured = blocks.explained(screened, screen)
        if first < 0.5 and measured:
            return ruled_out(first, f"ruled out: explains {first:.0%} of the error of the worst failing block")
        if not measured and not blocks.predicts_nonfinite(screened, screen):  # the worst block's error: NaN/Inf
            return ruled_out(0.0, "ruled out: it does not put NaN/Inf where the worst failing block has them")
        bound, values = _values(blocks, v, value, some)
        if bound < 0.5:
            return ruled_out(bound, f"ruled out: explains at most {bound:.0%} (the blocks recomputed so far show it)")
        return _scored(f, v, values, some)

    return test


def _scored(f: _Failure, v: Variant, values: list[np.ndarray], some: dict[Target, np.ndarray]) -> Trial:
    """A hypothesis scored on every target block and on the blocks a mask reading changes."""
    blocks = f.blocks
    extra = [t for t in hypotheses.changed_blocks(f.ctx, v, GRAD_NAMES) if t not in blocks.targets]
    for target in extra:
        blocks.add(target)
    some = {**some, **blocks.sampled_rows(extra)}
    extra_values = [recompute(f.ctx, v, t, some.get(t)) for t in extra]
    share, ratios = blocks.explained([*values, *extra_values], [*blocks.targets, *extra], some)
    text = f"under the hypothesis, {blocks.falls(ratios, some)}" if ratios else "nothing to explain"
    where = tuple(t.words() for t in blocks.failing_targets)[:3]
    symptom = f.nonfinite and share >= 0.9  # NaN/Inf are then the symptom (an overflow), not the cause
    if symptom and blocks.predicts_nonfinite(values, rows=some):
        text += "; it puts NaN/Inf where the device has them"
    return Trial(scored(v.kind, v.supposes, share, text, blocks.failing, where), share, symptom)


def _patterns(f: _Failure) -> Findings:
    """The pattern hypotheses, when nothing recomputed or fitted explains the error."""
    zeros = patterns.zero_share(f.blocks)
    mask = np.asarray(f.ctx.inputs["block_sparse_mask"])
    return (
        patterns.zero_blocks(f.blocks)
        + patterns.tail_pattern(f.case, f.failing, f.ctx.spans, zeros=zeros)
        + patterns.race_pattern(f.case, f.ctx, f.tensors, f.blocks)
        + patterns.accumulation_precision(f.case, f.failing, f.golden, mask, f.ctx.spans)
        + patterns.block_local(f.failing)
    )


#: The pattern hypotheses tried after the recomputed ones (their `supposes`, for `--explain`).
_PATTERNS = (
    ("scale", "a gradient off by a constant factor"),
    ("not-written", "blocks left zero (never written)"),
    ("tail-block", "errors confined to the partial last blocks"),
    ("accumulation-race", "a race in the dK/dV accumulation (an update lost in a shared kv block)"),
    ("accumulation-precision", "error growing with the number of blocks accumulated per row (dq) or column (dk/dv)"),
    ("tile-local", "errors confined to one or two 128-row pieces (blocks of at most 128 rows)"),
)

#: The placement hypotheses, tried when no recomputed hypothesis explains the error and it is not local.
_PLACEMENTS = (
    ("layout", "another layout or dtype reading of the outputs"),
    ("length-boundary", "errors at or past the actual sequence lengths (padding rows written, a batch entry shifted)"),
)


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
    # lse read as the row's max scales each row by its own softmax sum: no one factor
    return bool(v.lse not in ("", "row-max") or v.lse_factor != 1.0 or v.lse_offset != 0.0 or v.group)


def _judged(
    case: Case, failing: Sequence[TensorResult], device: Arrays, golden: Arrays, spans: Spans
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each failing tensor's (device, golden) values at the positions its batch entries hold (no padding)."""
    values = {}
    for result in failing:
        view = q_view if result.name == "dq" else kv_view
        dev, gold = (
            [view(case, np.asarray(a[result.name]), s).reshape(-1) for s in spans.values()] for a in (device, golden)
        )
        values[result.name] = (
            np.concatenate(dev) if dev else np.zeros(0),
            np.concatenate(gold) if gold else np.zeros(0),
        )
    return values


def _structural_only(result: TensorResult) -> bool:
    """Whether a tensor fails its structural checks (NaN/Inf, all zero) and nothing else, or only those
    whose ratios such values make meaningless."""
    return any(c.name in ("nonfinite", "all_zero") and not c.passed for c in result.checks) or result.passed
