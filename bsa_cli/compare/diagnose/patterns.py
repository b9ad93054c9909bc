"""Causes scored from the error's pattern, where they cannot be recomputed.

Non-finite values, blocks left zero, errors only in tail blocks, only in kv blocks two pairs add into, in
one or a few 16x16 tiles or 128-row pieces, a bias alone, error that grows with the blocks a row or
column accumulates, a constant factor. (Rows that equal golden rows elsewhere: `placement.rows_permuted`.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...core.case import Case
from ...core.layout import kv_view, mask_view, q_view
from ..geometry import TILE
from ..results import TensorResult
from .findings import Findings, named, scored, tried
from .hypotheses import NULL, VARIANTS, Context, Pair, Target, Variant, applies, partial, recompute
from .scoring import MAX_TARGETS, Blocks
from .views import Arrays, Spans, dtype_eps


def _index_words(case: Case, name: str, index: tuple[int, ...], spans: Spans) -> str:
    """Name an element's row in the operator's terms: batch, head, position and block."""
    x, y = case.block_shape
    size = x if name == "dq" else y
    if case.layout == "TND":
        t, n = index[0], index[1]
        for span in spans.values():
            start, length = (span.q_start, span.q_len) if name == "dq" else (span.kv_start, span.kv_len)
            if start <= t < start + length:
                s = t - start
                return f"batch {span.batch} head {n} row {s} (block {s // size})"
        return f"token {t} head {n}"
    b, n, s = index[0], index[1], index[2]
    return f"batch {b} head {n} row {s} (block {s // size})"


def nonfinite_cause(
    case: Case, failing: Sequence[TensorResult], device: Arrays, golden: Arrays, spans: Spans
) -> Findings:
    """non-finite: NaN/Inf written where the golden is finite."""
    parts, where, names = [], [], []
    for result in failing:
        if not any(c.name == "nonfinite" and not c.passed for c in result.checks):
            continue
        dev = np.asarray(device[result.name])
        bad = ~np.isfinite(dev) & np.isfinite(np.asarray(golden[result.name]))
        count = int(bad.sum())
        rows = np.unique(np.argwhere(bad)[:, :-1], axis=0)
        first = _index_words(case, result.name, tuple(int(i) for i in rows[0]), spans) if rows.size else "-"
        parts.append(
            f"{result.name}: {count} NaN/Inf ({result.device.nan_count} NaN, {result.device.inf_count} Inf) "
            f"in {len(rows)} rows where the golden is finite, first at {first}"
        )
        where.append(f"{result.name} {first}")
        names.append(result.name)
    if not parts:
        return Findings()
    return named("non-finite", "NaN/Inf written where the golden is finite", 1.0, "; ".join(parts), names, where)


def never_written(failing: Sequence[TensorResult]) -> Findings:
    """not-written: failing tensors all zero where the golden is not."""
    zero = [t.name for t in failing if any(c.name == "all_zero" and not c.passed for c in t.checks)]
    if not zero:
        return Findings()
    text = f"{', '.join(zero)} all zero where the golden is not, as if never written"
    return named("not-written", "an output never written", 1.0, text, zero)


#: Per dtype: the smallest normal magnitude and the largest finite one (values below the first are
#: subnormal; a tensor all at the second is saturated).
_RANGE = {
    "float16": (2.0**-14, 65504.0),
    "bfloat16": (2.0**-126, 3.3895313892515355e38),
    "float32": (2.0**-126, 3.4028234663852886e38),
}
#: Elements a tensor needs for its correlation with the golden to say anything.
UNCORRELATED_MIN = 256
#: A tensor whose values correlate with the golden's less than this (in magnitude) carries no information
#: about it: random values of any size give about 1/sqrt(n), a wrong kernel's values a real share.
UNCORRELATED = 0.05

NO_INFORMATION = "the outputs carry no information about the golden (constant, degenerate or random values)"


def no_information(values: Mapping[str, tuple[np.ndarray, np.ndarray]], correlation: bool = False) -> Findings:
    """no-information: failing tensors whose values say nothing about the golden, so that no cause is fitted
    to them: one value everywhere (not zero: `never_written`'s), every value subnormal or at the dtype's
    largest finite magnitude, or (with `correlation`, once placements are ruled out: a transposed tensor is
    uncorrelated too) values uncorrelated with the golden. `values`: per tensor (device, golden), the
    judged elements. Named (score 1) when every tensor of `values` is so."""
    words = []
    for name, (device, golden) in values.items():
        why = _uninformative(np.asarray(device), np.asarray(golden), correlation)
        if why is None:
            return Findings()
        words.append(f"{name} {why}")
    if not words:
        return Findings()
    text = f"{'; '.join(words)}: nothing about the golden to fit a cause to"
    return named("no-information", NO_INFORMATION, 1.0, text, list(values), verb="fits")


#: Evenly spread elements a tensor is first read on (the whole tensor only when they look degenerate), and
#: its correlation with the golden measured on (about 0.004 of noise).
NO_INFORMATION_SAMPLE = 1 << 16


def _uninformative(device: np.ndarray, golden: np.ndarray, correlation: bool) -> str | None:
    """Why a tensor's values carry no information about its golden, or None. Read on `NO_INFORMATION_SAMPLE`
    evenly spread elements first: values of several magnitudes there end the degenerate checks."""
    tiny, big = _RANGE.get(device.dtype.name, (0.0, math.inf))
    step = max(1, device.size // NO_INFORMATION_SAMPLE)
    some = np.asarray(device.reshape(-1)[::step], dtype=np.float64)
    magnitude = np.abs(some[np.isfinite(some)])
    if (
        magnitude.size >= 2
        and magnitude.max() >= tiny
        and magnitude.min() < big / 2
        and np.ptp(some[np.isfinite(some)]) > 0
    ):
        return _uncorrelated(device.reshape(-1)[::step], golden.reshape(-1)[::step]) if correlation else None
    dev, gold = device.reshape(-1), golden.reshape(-1)
    usable = np.isfinite(dev) & np.isfinite(gold)
    if not usable.all():
        dev, gold = dev[usable], gold[usable]
    if dev.size < 2:
        return None
    g_lo, g_hi = float(gold.min()), float(gold.max())
    if g_lo == g_hi or not np.any((gold > g_lo) & (gold < g_hi)):  # a golden of two values or fewer
        return None
    lo, hi = float(dev.min()), float(dev.max())
    if lo == hi:
        if lo == 0:
            return None  # all zero: never_written's
        what = ", subnormal" if abs(lo) < tiny else ", the dtype's largest finite magnitude" if abs(lo) >= big else ""
        return f"holds one value everywhere ({lo:.4g}{what})"
    if max(abs(lo), abs(hi)) < tiny and max(abs(g_lo), abs(g_hi)) >= tiny:
        return f"holds only subnormal values and zeros (at most {max(abs(lo), abs(hi)):.3g})"
    if (lo >= big / 2 or hi <= -big / 2 or float(np.abs(dev).min()) >= big / 2) and math.isfinite(big):
        return f"holds only values at the dtype's largest magnitude ({max(abs(lo), abs(hi)):.4g})"
    return _uncorrelated(dev[::step], gold[::step]) if correlation else None


def _uncorrelated(device: np.ndarray, golden: np.ndarray) -> str | None:
    """Why values are unrelated to the golden (their correlation under `UNCORRELATED`), or None."""
    usable = np.isfinite(device) & np.isfinite(golden)
    d, g = np.asarray(device[usable], dtype=np.float64), np.asarray(golden[usable], dtype=np.float64)
    if d.size < UNCORRELATED_MIN:
        return None
    d, g = d - d.mean(), g - g.mean()
    norm = math.sqrt(float(d @ d) * float(g @ g))
    r = float(d @ g) / norm if norm > 0 else 0.0
    if abs(r) >= UNCORRELATED:
        return None
    words = f"is uncorrelated with the golden (correlation {r:.3f} over {d.size} elements)"
    return words + ": random, or dominated by terms unrelated to it"


def diagnose_bias(case: Case, ctx: Context, failing: Sequence[TensorResult], blocks: Blocks) -> Findings:
    """A failure of the bias check alone: a precision bias, or the scale held in the case dtype."""
    words = [f"{result.name} {result.bias.describe()}" for result in failing if result.bias is not None]
    text = "a systematic relative error below the ratio standards' resolution: " + "; ".join(words)
    names = tuple(t.name for t in failing)
    factor = _factor_bias(case, blocks, names)
    if factor.causes:  # a constant factor below the dtype's resolution biases as a rounding path does
        text += f" (not told apart from a constant factor: {factor.causes[0].evidence})"
    found = named("precision-bias", "a systematic bias of the precision path", 0.7, text, names, verb="fits")
    found += factor
    for v in (v for v in VARIANTS if v.kind == "scale"):  # the scale held in the case dtype
        why = applies(ctx, v)
        found += tried(v.kind, v.supposes, 0.0, why) if why is not None else _scale_bias(case, ctx, blocks, v, names)
    return found


def _factor_bias(case: Case, blocks: Blocks, names: Sequence[str]) -> Findings:
    """A constant factor per biased tensor (least squares), scored by the share of each one's relative bias it
    removes (the least): named beside precision-bias, at its score, when it removes 90%: the outputs cannot
    tell a gradient scaled by 1 + 2^-8 from a precision path rounding the same way."""
    thd = dtype_eps(case)
    supposes = "a gradient off by a constant factor below the dtype's resolution"
    share, parts = 1.0, []
    for name in names:
        data = [blocks.data[t] for t in blocks.targets if t.tensor == name]
        dev, bench, null = [d[0] for d in data], [d[1] for d in data], [d[2] for d in data]
        den = sum(float((g * g).sum()) for g in null)
        if den <= 0:
            continue
        factor = sum(float((d * g).sum()) for d, g in zip(dev, null, strict=True)) / den
        own = _relative_bias(bench, null, thd) if all(b is not None for b in bench) else 0.0
        null_bias = _relative_bias(dev, null, thd) - own
        hyp_bias = _relative_bias(dev, [factor * g for g in null], thd) - own
        if null_bias == 0:
            continue
        share = min(share, max(0.0, 1.0 - abs(hyp_bias) / abs(null_bias)))
        parts.append(f"{name} = {_scale_factor_words(factor, case.kernel_scale)} x golden")
    text = f"{', '.join(parts)} removes {share:.0%} of the bias"
    if not parts or share < 0.9:
        return tried("scale", supposes, share if parts else 0.0, f"ruled out: {text if parts else 'no bias'}")
    return named("scale", supposes, 0.7, f"{text}; a rounding bias of the precision path would give the same", names)


def _scale_bias(case: Case, ctx: Context, blocks: Blocks, v: Variant, names: Sequence[str]) -> Findings:
    """A scale hypothesis scored by the share of each failing tensor's relative bias it removes (the least)."""
    thd = dtype_eps(case)
    values = [recompute(ctx, v, t) for t in blocks.targets]
    share, parts = 1.0, []
    for name in names:
        picks = [i for i, t in enumerate(blocks.targets) if t.tensor == name]
        data = [blocks.data[blocks.targets[i]] for i in picks]
        dev, bench, null = [d[0] for d in data], [d[1] for d in data], [d[2] for d in data]
        own = _relative_bias(bench, null, thd) if all(b is not None for b in bench) else 0.0
        null_bias = _relative_bias(dev, null, thd) - own
        hyp_bias = _relative_bias(dev, [values[i] for i in picks], thd) - own
        if null_bias == 0:
            continue
        share = min(share, max(0.0, 1.0 - abs(hyp_bias) / abs(null_bias)))
        parts.append(f"{name}'s bias falls from {null_bias:.3g} to {hyp_bias:.3g} relative")
    text = f"{v.supposes}: under the hypothesis, {', '.join(parts)}"
    if share < 0.5:
        return tried(v.kind, v.supposes, share, f"ruled out: explains {share:.0%}: {text}")
    return named("scale", v.supposes, share, text, names, verb=f"explains {share:.0%} of the bias")


def _relative_bias(device: Sequence[Any], golden: Sequence[np.ndarray], thd: float) -> float:
    num, count = 0.0, 0
    for dev, gold in zip(device, golden, strict=True):
        large = np.abs(gold) > thd
        num += float(((dev[large] - gold[large]) / gold[large]).sum())
        count += int(large.sum())
    return num / count if count else 0.0


def _scale_factor_words(factor: float, scale: float) -> str:
    named = {
        "1/scale: the scale not applied": 1 / scale,
        "scale: the scale applied twice": scale,
        "scale^2": scale * scale,
        "1/2": 0.5,
        "2": 2.0,
        "-1: the sign flipped": -1.0,
    }
    for words, value in named.items():
        if value != 1 and abs(factor / value - 1) < 0.01:
            return f"{factor:.4g} (= {words})"
    if 0 < abs(factor - 1) < 0.01:  # near 1: its distance as a power of two (1 + 2^-8: a few ULPs of fp16)
        return f"{factor:.6g} (1 {'+' if factor > 1 else '-'} 2^{math.log2(abs(factor - 1)):.3g})"
    return f"{factor:.4g}"


#: A fitted factor this close to 1 is rounding, not a factor (fp16's epsilon is 2^-10; 1 + 2^-8 is a factor).
FACTOR_RESOLUTION = 2.0**-9


def scale_fit(case: Case, blocks: Blocks) -> tuple[float, Findings]:
    """A constant factor per failing tensor, fitted by least squares: the scale missing or doubled.

    Returns the share of the excess error explained when every factor off 1 is a named one (1/scale,
    scale, scale^2, 1/2, 2, -1), else 0; and the findings."""
    factors: dict[str, float] = {}
    for name in blocks.failing:
        data = [blocks.data[t] for t in blocks.targets if t.tensor == name]
        num = sum(float((dev * null).sum()) for dev, _, null, _ in data)
        den = sum(float((null**2).sum()) for _, _, null, _ in data)
        if den > 0:
            factors[name] = num / den
    values = [blocks.data[t][2] * factors.get(t.tensor, 1.0) for t in blocks.targets]
    share, ratios = blocks.explained(values)
    off = {n: f for n, f in factors.items() if abs(f - 1) > FACTOR_RESOLUTION}
    supposes = "a gradient off by a constant factor"
    if not off:
        why = "ruled out: the least-squares factor of every failing tensor is within 2^-9 of 1"
        return 0.0, tried("scale", supposes, 0.0, why)
    fits = ", ".join(f"{n} = {_scale_factor_words(f, case.kernel_scale)} x golden" for n, f in off.items())
    text = f"{fits}; under the hypothesis, {blocks.falls(ratios)}"
    is_named = all(" (= " in _scale_factor_words(f, case.kernel_scale) for f in off.values())
    # A factor of no name must leave no more than rounding noise (the benchmark's, scaled by the factor,
    # within 4x): values unrelated to the golden, or a few blocks wrong, are fitted by a factor near 0,
    # which removes the golden's part of the error and explains nothing.
    noise = all(ratios.get(n, math.inf) <= 4 * max(1.0, abs(f)) for n, f in off.items())
    # ... and explain the device's values themselves: tiny values unrelated to the golden leave tiny errors too
    # (a factor near 0 then "leaves noise" while fitting nothing of the values).
    noise = noise and all(_fits_values(blocks, n, f) for n, f in off.items())
    # Blocks the device left all zero fit a factor 0, with no error left: not-written's, not a scale.
    zero = [n for n in off if not any(blocks.data[t][0].any() for t in blocks.targets if t.tensor == n)]
    if share >= 0.5 and (is_named or noise) and not zero:
        found = scored("scale", supposes, share, text, tuple(off), (), evidence=text)
    else:
        why = ", and a factor of no name must leave only rounding noise (4x the benchmark's), of blocks not all zero"
        found = tried("scale", supposes, share, f"ruled out: explains {share:.0%}{why if share >= 0.5 else ''}: {text}")
    return share if is_named else 0.0, found


#: Share of a tensor's own energy (in its target blocks) a fitted factor of no name may leave unexplained.
FACTOR_RESIDUAL = 0.25


def _fits_values(blocks: Blocks, name: str, factor: float) -> bool:
    """Whether `factor` x golden accounts for a failing tensor's values in its target blocks (the residual
    energy at most `FACTOR_RESIDUAL` of theirs)."""
    data = [blocks.data[t] for t in blocks.targets if t.tensor == name]
    own = sum(float((np.nan_to_num(dev) ** 2).sum()) for dev, _, _, _ in data)
    left = sum(float((np.nan_to_num(dev - factor * null) ** 2).sum()) for dev, _, null, _ in data)
    return own > 0 and left <= FACTOR_RESIDUAL * own


def zero_blocks(blocks: Blocks) -> Findings:
    """Failing blocks left all zero where the golden is not."""
    total, zero, where = 0.0, 0.0, []
    for target in blocks.failing_targets:
        dev, _, null, _ = blocks.data[target]
        energy = float(((dev - null) ** 2).sum()) / blocks.noise[target.tensor]
        total += energy
        if dev.size and not dev.any() and null.any():
            zero += energy
            where.append(target.words())
    share = zero / total if total else 0.0
    supposes = "blocks left zero (never written)"
    if where and share >= 0.5:
        text = f"{len(where)} of the failing blocks are all zero where the golden is not: {', '.join(where[:3])}"
        names = sorted({w.split()[0] for w in where})
        return named("not-written", supposes, 0.8 * share, text, names, where[:3], f"fits {share:.0%} of the error")
    zeros = zero_share(blocks)
    if zeros >= 0.9:
        text = f"{zeros:.0%} of the failing blocks' excess error lies in elements left zero where the golden is not"
        return named("not-written", supposes, 0.8 * zeros, text, blocks.failing, verb="fits")
    why = f"no failing block is all zero ({len(where)} found), {zeros:.0%} of the error in zeros"
    return tried("not-written", supposes, 0.0, f"ruled out: {why}")


def zero_share(blocks: Blocks) -> float:
    """The share of the failing target blocks' excess error in elements the device left zero (golden not)."""
    total = zero = 0.0
    for target in blocks.failing_targets:
        dev, bench, null, _ = blocks.data[target]
        err = np.maximum((dev - null) ** 2 - ((bench - null) ** 2 if bench is not None else 0.0), 0.0)
        err = err / blocks.noise[target.tensor]
        total += float(err.sum())
        zero += float(err[(dev == 0) & (null != 0)].sum())
    return zero / total if total else 0.0


def _local_cause(
    blocks: Blocks, share: float, energies: Sequence[float], total: float, top: Sequence[str], unit: str, supposes: str
) -> Findings:
    """Name errors confined to a few tiles or pieces (`energies`: each one's, `top`: the words for the worst):
    not-written where the device left them zero."""
    many = sum(1 for e in energies if e >= 0.05 * total)
    text = f"{share:.0%} of the excess error of the failing blocks lies in {many} {unit}{'s' if many != 1 else ''}: "
    text += top[0]
    where = tuple(top[:many])
    if zero_share(blocks) >= 0.9:
        text = f"{text}, left zero where the golden is not"
        return named(
            "not-written", "a region left zero (never written)", 0.9 * share, text, blocks.failing, where, "fits"
        )
    return named("tile-local", supposes, 0.85 * share, text, blocks.failing, where, "fits")


def _block_excess(result: TensorResult) -> np.ndarray | None:
    """Each block's error energy beyond the benchmark's, from the block map ([B, heads, blocks])."""
    block_map = result.block_map
    if block_map is None or block_map.rmse_benchmark is None:
        return None
    dev = np.nan_to_num(block_map.rmse, nan=0.0) ** 2
    bench = np.nan_to_num(block_map.rmse_benchmark, nan=0.0) ** 2
    return np.maximum(dev - 2.0 * bench, 0.0)


def tail_pattern(case: Case, failing: Sequence[TensorResult], spans: Spans, zeros: float = 0.0) -> Findings:
    """Errors confined to partial last blocks (Sq % X for dq, Skv % Y for dk/dv).

    `zeros`: the share of the failing blocks' excess error in elements left zero (`zero_share`); when 90%,
    the tail blocks were not written, which `not-written` names (0.8), and the pattern ranks below it."""
    x, y = case.block_shape
    shares, where = [], []
    for result in failing:
        excess = _block_excess(result)
        if excess is None or excess.sum() <= 0:
            continue
        tail = np.zeros(excess.shape, dtype=bool)
        for span in spans.values():
            size, length = (x, span.q_len) if result.name == "dq" else (y, span.kv_len)
            if length % size:
                tail[span.batch, :, length // size] = True
        if not tail.any():
            continue
        shares.append(float(excess[tail].sum() / excess.sum()))
        where.append(result.name)
    supposes = "errors confined to the partial last blocks"
    share = min(shares) if shares else 0.0
    if share >= 0.8:
        names, weight = ", ".join(where), 0.85
        text = f"{share:.0%} of the excess error of {names} lies in the partial last blocks (Sq % X, Skv % Y)"
        if zeros >= 0.9:
            text += f", {zeros:.0%} of it in elements left zero (not written)"
            weight = 0.75
        return named("tail-block", supposes, weight * share, text, where, verb="fits")
    return tried("tail-block", supposes, 0.85 * share, f"ruled out: {share:.0%} of the excess error in tail blocks")


def race_pattern(case: Case, ctx: Context, tensors: Sequence[TensorResult], blocks: Blocks) -> Findings:
    """dK/dV wrong only in a few kv blocks that two or more pairs add into, dq right: a lost update."""
    supposes = "a race in the dK/dV accumulation (an update lost in a shared kv block)"
    by_name = {t.name: t for t in tensors}
    if "dq" not in by_name or not by_name["dq"].passed or not {"dk", "dv"} & set(blocks.failing):
        return tried("accumulation-race", supposes, 0.0, "ruled out: dq fails too, or dk and dv pass")
    kv_targets = [t for t in blocks.failing_targets if t.tensor in ("dk", "dv")]
    bad = [
        t
        for t in kv_targets
        if float(((blocks.data[t][0] - blocks.data[t][2]) ** 2).sum()) > 9 * blocks.noise[t.tensor] / MAX_TARGETS
    ]
    bad_blocks = sorted({(t.batch, t.head, t.block) for t in bad})
    if not bad_blocks or len(bad_blocks) > 2:
        why = f"ruled out: {len(bad_blocks)} failing kv blocks, not one or two"
        return tried("accumulation-race", supposes, 0.0, why)
    explained = []
    for batch, kv_head, block in bad_blocks:
        mask = ctx.mask("", batch)
        heads = [h for h in range(case.num_heads) if ctx.kv_head(NULL, h) == kv_head]
        pairs = [(h, int(i)) for h in heads for i in np.flatnonzero(mask[h, :, block])]
        if len(pairs) < 2:
            return tried("accumulation-race", supposes, 0.0, "ruled out: a failing kv block only one pair selects")
        # a lost update loses the pair's dK and dV partials both: scored on the kv block of both tensors
        # (each in its own benchmark units), so a dv block wrong while dk's is right is no lost update
        both = [Target(name, batch, kv_head, block) for name in ("dk", "dv")]
        for target in both:
            blocks.add(target)
        best = 0.0
        for head, q_block in pairs[:64]:
            pair = Pair(batch, head, q_block, block)
            lost = {name: partial(ctx, pair, name) for name in ("dk", "dv")}
            err_null = err_hyp = 0.0
            for target in both:
                dev, _, gold, noise = blocks.data[target]
                err_null += float(((dev - gold) ** 2).sum()) / noise
                err_hyp += float(((dev - gold + lost[target.tensor]) ** 2).sum()) / noise
            best = max(best, 1.0 - err_hyp / err_null if err_null else 0.0)
        explained.append(best)
    share = min(explained)
    names = ", ".join(f"batch {b} kv head {n} kv block {j}" for b, n, j in bad_blocks)
    text = f"dq right, dK/dV wrong only in {names}, selected by two or more pairs"
    if share >= 0.8:
        text += f"; one pair's partial missing explains {share:.0%} of it"
    score = 0.95 * share if share >= 0.8 else 0.6
    failing = tuple(n for n in ("dk", "dv") if n in blocks.failing)
    return named("accumulation-race", supposes, score, text, failing, (names,), "fits")


def tile_local(case: Case, blocks: Blocks) -> Findings:
    """Excess error confined to one or a few 16x16 tiles of the failing blocks."""
    supposes = "errors confined to one or a few 16x16 tiles"
    energies: list[tuple[float, Target, int, int]] = []  # (energy in benchmark units, block, row, column)
    wrong: set[tuple[Target, int, int]] = set()  # tiles wrong in their own terms (9x their benchmark's error)
    for target in blocks.failing_targets:
        dev, bench, null, noise = blocks.data[target]
        bench_err = (bench - null) ** 2 if bench is not None else np.zeros(null.shape)
        err = (dev - null) ** 2 - bench_err
        size = case.block_shape[0] if target.tensor == "dq" else case.block_shape[1]
        starts_r, starts_c = np.arange(0, err.shape[0], TILE), np.arange(0, err.shape[1], TILE)
        if not err.size:
            continue
        tiles = np.add.reduceat(np.add.reduceat(err, starts_r, axis=0), starts_c, axis=1)
        own = np.add.reduceat(np.add.reduceat(bench_err, starts_r, axis=0), starts_c, axis=1)
        own = np.maximum(own, noise * TILE * TILE / err.size)
        at_r, at_c = np.nonzero(tiles > 0)  # the words only for the few tiles named (thousands of tiles)
        values = (tiles[at_r, at_c] / blocks.noise[target.tensor]).tolist()
        rows, cols = (target.block * size + starts_r[at_r]).tolist(), starts_c[at_c].tolist()
        energies.extend((e, target, r, c) for e, r, c in zip(values, rows, cols, strict=True))
        bad_r, bad_c = np.nonzero(tiles > 8 * own)
        wrong.update(
            (target, int(target.block * size + starts_r[r]), int(starts_c[c]))
            for r, c in zip(bad_r, bad_c, strict=True)
        )
    total = sum(e[0] for e in energies)
    energies.sort(key=lambda e: -e[0])
    top = [(e, f"{t.words()} tile at row {r}, column {c}") for e, t, r, c in energies[:4]]
    share = sum(e for e, _ in top) / total if total else 0.0
    # the other tiles must be right: a tensor wrong everywhere in blocks of one row also has its error in
    # 4 tiles (those rows), but is not tile-local
    others = len(wrong - {(t, r, c) for _, t, r, c in energies[:4]})
    if share >= 0.9 and others > max(2, len(wrong) // 10):
        outcome = f"ruled out: the 4 worst tiles hold {share:.0%} of the excess error, but {others} other tiles are"
        return tried("tile-local", supposes, 0.0, outcome + " wrong too (9x their benchmark's error)")
    if share >= 0.9:
        return _local_cause(blocks, share, [e[0] for e in energies], total, [w for _, w in top], "16x16 tile", supposes)
    return tried("tile-local", supposes, 0.0, f"ruled out: the 4 worst tiles hold {share:.0%} of the excess error")


#: The kernel cuts a block's rows (X for dq, Y for dk/dv) into pieces of this many rows.
PIECE = 128


def piece_local(case: Case, blocks: Blocks) -> Findings:
    """Excess error confined to one or two 128-row pieces of blocks longer than a piece."""
    supposes = "errors confined to one or a few 128-row pieces of a block"
    energies: list[tuple[float, str]] = []
    for target in blocks.failing_targets:
        dev, bench, null, _ = blocks.data[target]
        if dev.shape[0] <= PIECE:
            continue
        err = ((dev - null) ** 2 - ((bench - null) ** 2 if bench is not None else 0.0)).sum(axis=1)
        size = case.block_shape[0] if target.tensor == "dq" else case.block_shape[1]
        for start in range(0, err.size, PIECE):
            row = target.block * size + start
            words = f"{target.words()} rows {row}-{row + min(PIECE, err.size - start) - 1}"
            energies.append((max(float(err[start : start + PIECE].sum()), 0.0) / blocks.noise[target.tensor], words))
    total = sum(e for e, _ in energies)
    energies.sort(key=lambda e: -e[0])
    top = energies[:2]
    share = sum(e for e, _ in top) / total if total and len(energies) >= 4 else 0.0
    if share >= 0.9:
        pieces = [e for e, _ in energies]
        return _local_cause(blocks, share, pieces, total, [w for _, w in top], f"{PIECE}-row piece", supposes)
    why = f"the 2 worst hold {share:.0%} of the excess error" if len(energies) >= 4 else "no block over 128 rows"
    return tried("tile-local", supposes, 0.0, f"ruled out: {why}")


def _accumulated(case: Case, block_mask: np.ndarray, name: str, spans: Spans, shape: tuple[int, ...]) -> np.ndarray:
    """Blocks each block of a gradient accumulates ([B, heads, blocks], as the block map): a dq block its
    selected kv blocks, a dk/dv block the (query head, query block) pairs that select it."""
    counts = np.zeros(shape)
    for span in spans.values():
        mask = mask_view(case, block_mask, span) != 0  # [N1, nQ, nKV]
        if name == "dq":
            per = mask.sum(axis=2)
        else:
            per = mask.sum(axis=1).reshape(case.num_kv_heads, case.group_size, -1).sum(axis=1)
        counts[span.batch, : per.shape[0], : per.shape[1]] = per
    return counts


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(values.size)
    ranks[order] = np.arange(values.size)
    for value in np.unique(values):  # ties share their mean rank
        same = values == value
        ranks[same] = ranks[same].mean()
    return ranks


def accumulation_precision(
    case: Case, failing: Sequence[TensorResult], golden: Arrays, block_mask: np.ndarray, spans: Spans
) -> Findings:
    """A relative error (beyond the benchmark's) that grows with the blocks each row or column accumulates."""
    supposes = "error growing with the number of blocks accumulated per row (dq) or column (dk/dv)"
    fits, words = [], []
    for result in failing:
        block_map = result.block_map
        if block_map is None or block_map.rmse_benchmark is None:
            continue
        counts = _accumulated(case, block_mask, result.name, spans, block_map.rmse.shape)
        view = q_view if result.name == "dq" else kv_view
        size = block_map.block_size
        gold_rms = np.zeros(block_map.rmse.shape)
        for span in spans.values():
            gold = np.asarray(view(case, golden[result.name], span), dtype=np.float64)  # [heads, rows, D]
            for j in range(-(-gold.shape[1] // size)):
                piece = gold[:, j * size : (j + 1) * size]
                gold_rms[span.batch, :, j] = np.sqrt((piece**2).mean(axis=(1, 2)))
        excess = np.sqrt(
            np.maximum(np.nan_to_num(block_map.rmse) ** 2 - np.nan_to_num(block_map.rmse_benchmark) ** 2, 0.0)
        )
        use = (counts > 0) & (gold_rms > 0) & np.isfinite(block_map.rmse)
        if len(np.unique(counts[use])) < 3:
            continue
        relative, count = excess[use] / gold_rms[use], counts[use]
        if not (relative > 0).any():
            continue
        corr = float(np.corrcoef(_ranks(count), _ranks(relative))[0, 1]) if relative.std() > 0 else 0.0
        low, high = count <= np.quantile(count, 1 / 3), count >= np.quantile(count, 2 / 3)
        growth = float(relative[high].mean() / max(relative[low].mean(), 1e-30))
        fits.append((corr, growth))
        words.append(
            f"{result.name}: rank correlation {corr:.2f} between a block's relative excess error and the "
            f"{int(count.min())}-{int(count.max())} blocks it accumulates, {growth:.3g}x from the fewest "
            "to the most"
        )
    if fits and all(corr >= 0.6 and growth >= 1.5 for corr, growth in fits):
        score = 0.8 * min(corr for corr, _ in fits)
        names = [t.name for t in failing]
        return named("accumulation-precision", supposes, score, "; ".join(words), names, verb="fits")
    why = "; ".join(words) if words else "too few distinct accumulation counts"
    return tried("accumulation-precision", supposes, 0.0, "ruled out: " + why)


def block_local(failing: Sequence[TensorResult]) -> Findings:
    """Excess error confined to one or two 128-row pieces of blocks no longer than a piece (the block map's)."""
    supposes = "errors confined to one or two 128-row pieces (blocks of at most 128 rows)"
    shares, words = [], []
    for result in failing:
        excess = _block_excess(result)
        if excess is None or result.block_map is None or result.block_map.block_size > PIECE:
            continue
        per_piece = PIECE // result.block_map.block_size
        pieces: dict[tuple[int, int, int], float] = {}
        for b, n, j in zip(*np.nonzero(np.isfinite(result.block_map.rmse)), strict=True):
            key = (int(b), int(n), int(j) // per_piece)
            pieces[key] = pieces.get(key, 0.0) + float(excess[b, n, j])
        total = sum(pieces.values())
        if len(pieces) < 4 or total <= 0:
            shares.append(0.0)
            continue
        ranked = sorted(pieces.items(), key=lambda item: -item[1])
        shares.append(sum(e for _, e in ranked[:2]) / total)
        (b, n, piece), _ = ranked[0]
        words.append(f"{result.name} batch {b} head {n} rows {piece * PIECE}-{piece * PIECE + PIECE - 1}")
    share = min(shares) if shares else 0.0
    if share >= 0.9:
        text = f"{share:.0%} of the excess error lies in one or two 128-row pieces: {', '.join(words)}"
        return named("tile-local", supposes, 0.55 * share, text, [t.name for t in failing], words, "fits")
    return tried("tile-local", supposes, 0.0, f"ruled out: the 2 worst pieces hold {share:.0%}")
