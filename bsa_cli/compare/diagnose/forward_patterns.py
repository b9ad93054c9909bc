"""The forward's patterns: where a failing forward's errors are, when no recomputed hypothesis explains them.

Rows left at the prefill or zero and NaN/Inf (`unwritten_rows`), rows written that the forward must leave
alone (`written_alone`), out's rows equal to golden rows elsewhere (`rows_permuted`), errors in a tile or
piece (`tile_local`), other readings of out's bytes (`layout`), error growing with the selected blocks
(`accumulation`), a constant factor or affine map (`fits`). Each returns its `Findings`.
Pure: arrays in, causes out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...core.case import Case
from ...core.layout import lse_view
from ..forward import PREFILL_BITS
from ..results import Cause, Check, Hypothesis, TensorResult
from . import placement
from .findings import Findings, Kind, named, tried
from .forward_hypotheses import ForwardContext, QBlock, Scorer, Side
from .hypotheses import Variant
from .views import Arrays, Spans, dtype_eps, falls, noise_floor

#: Share of out's excess error one or two tiles (or one piece) must hold to be `tile-local`.
LOCAL = 0.9
#: Written rows of out (evenly spread) the layout readings are scored on.
LAYOUT_ROWS = 4096
#: Rows of out looked up among the golden's rows for `rows-permuted`.
WORST_ROWS = 32
TILE = 16
#: Blocks of out (the worst by excess error) whose tiles and pieces `tile-local` looks at: two tiles or a
#: piece holding 90% of the error lie in them.
TILE_BLOCKS = 8


def row_words(case: Case, written: np.ndarray, flat: int) -> str:
    index = np.unravel_index(flat, written.shape)
    x = case.block_shape[0]
    if case.layout == "TND":
        t, n = (int(i) for i in index)
        return f"token {t} head {n} (T index)"
    b, n, s = (int(i) for i in index)
    return f"batch {b} head {n} row {s} (q block {s // x})"


#: The forward's patterns on out's values, tried after the recomputed hypotheses (for `--explain`).
FORWARD_PATTERNS = (
    ("rows-permuted", "out rows written at other rows' places (device rows equal golden rows elsewhere)"),
    ("tile-local", "errors confined to one or two 16x16 tiles (or one 128-row piece) of out"),
    ("layout", "another layout or dtype reading of out"),
    ("accumulation-precision", "error growing with the number of kv blocks a query block row accumulates"),
)


def fits(
    scorer: Scorer, targets: Sequence[QBlock], controls: Sequence[QBlock], names: Sequence[str], where: tuple[str, ...]
) -> tuple[float, Findings]:
    """Fitted on the target blocks, scored on them and the control: out off by a constant factor (`scale`:
    a factor in the normalisation, 1/l or the scale's place), lse off by an affine map (`softmax-lse`: lse
    in another base, shifted, without a term). Returns the best share, and the findings."""
    best, found = 0.0, Findings()
    for index, side in enumerate(scorer.sides):
        if side.name not in names:
            continue
        blocks = [scorer.block(side, t)[:3] for t in targets]  # device, golden, usable
        dev, gold, usable = (np.concatenate([b[i].reshape(-1) for b in blocks]) for i in range(3))
        dev, gold = dev[usable], gold[usable]
        if gold.size < 2 or not float(gold @ gold) > 0:
            continue
        kind: Kind
        if side.name == "out":
            factor, offset = float(dev @ gold) / float(gold @ gold), 0.0
            kind, supposes = "scale", "out off by a constant factor"
            words = f"out = {factor:.4g} x golden"
        else:
            factor, offset = (float(c) for c in np.polyfit(gold, dev, 1))
            kind, supposes = "softmax-lse", "lse off by an affine map (another base, a shift, a term left out)"
            words = f"lse = {factor:.4g} x golden {'+' if offset >= 0 else '-'} {abs(offset):.4g}"
        values = {}
        scored = [*targets, *controls]
        for target in scored:  # the fitted side's golden under the fit, the other's as it is
            golds = [scorer.block(other, target)[1] for other in scorer.sides]
            golds[index] = factor * golds[index] + offset
            values[target] = tuple(g[:, 0] if o.name == "lse" else g for o, g in zip(scorer.sides, golds, strict=True))
        share, ratios = scorer.explained(scored, values, each=names)
        text = f"{words}: {falls(ratios, names)}"
        if share >= 0.9:
            found += named(
                kind, supposes, 0.95 * share, text, (side.name,), where, f"explains {share:.0%} of the excess error"
            )
            best = max(best, 0.95 * share)
        else:
            found += tried(kind, supposes, share, f"ruled out: explains {share:.0%}: {text}")
    return best, found


def predicts_unwritten(ctx: ForwardContext, v: Variant, written: np.ndarray, left: Arrays) -> bool:
    """Whether a mask reading leaves unwritten exactly the rows the device left unwritten (of those it must
    write), in every output: a kernel skipping a block row writes neither its out nor its lse."""
    x = ctx.case.block_shape[0]
    for batch, span in ctx.spans.items():
        empty = np.repeat(~ctx.mask(v.mask, batch).any(axis=2), x, axis=1)[:, : span.q_len]
        empty &= lse_view(ctx.case, written, span)
        if not all(np.array_equal(empty, lse_view(ctx.case, rows, span)) for rows in left.values()):
            return False
    return True


def unwritten_rows(
    case: Case, judged: Sequence[str], arrays: Arrays, gold: Arrays, written: np.ndarray, prefilled: bool
) -> tuple[dict[str, np.ndarray], Findings]:
    """not-written: written rows left at the NaN prefill (the device says it pre-filled) or all zero;
    non-finite: other NaN/Inf in written rows where the golden is finite. Returns the rows left unwritten
    of each output, and the findings."""
    every: dict[str, np.ndarray] = {}
    found = Findings()
    for name in judged:
        dev, ref = arrays[name], gold[name]
        finite_gold = np.isfinite(ref).all(axis=-1) & written
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(dev.astype(np.float32))
        at_prefill = _at_prefill(case, name, dev) if prefilled else np.zeros_like(written)
        zero = (dev.astype(np.float32) == 0).all(axis=-1) & (np.abs(ref) > 0).any(axis=-1)
        every[name] = left = finite_gold & (at_prefill | zero)
        bad = finite_gold[..., None] & ~finite & ~left[..., None]
        if left.any():
            how = "the NaN prefill" if at_prefill[left].all() else "zero" if zero[left].all() else "the prefill or zero"
            first = row_words(case, written, int(np.flatnonzero(left)[0]))
            text = f"{name}: {int(left.sum())} of {int(finite_gold.sum())} rows the forward must write hold {how}, "
            text += f"as if never written, first at {first}"
            found += named("not-written", f"{name} rows never written", 1.0, text, (name,), (f"{name} {first}",))
        if bad.any():
            rows = np.flatnonzero(bad.any(axis=-1))
            first = row_words(case, written, int(rows[0]))
            text = f"{name}: {int(bad.sum())} NaN/Inf in {rows.size} written rows where the golden is finite, "
            text += f"first at {first}"
            supposes = "NaN/Inf written where the golden is finite"
            found += named("non-finite", supposes, 1.0, text, (name,), (f"{name} {first}",))
    return every, found


def written_alone(
    case: Case, tensors: Sequence[TensorResult], checks: Sequence[Check], arrays: Arrays, written: np.ndarray
) -> Findings:
    """Rows the forward must leave alone that were written: past the actual lengths (`length-boundary`), or
    of a block row that selects nothing (`block-selection`); lse written with softmax_lse_flag 0 (`layout`
    would be wrong: it is the flag ignored, `not-written`'s converse, named as block-selection of rows)."""
    found = Findings()
    for check in [*checks, *(c for t in tensors for c in t.checks)]:
        if check.name != "rows-written" or check.passed or "must leave alone were written" not in check.detail:
            continue
        name = check.tensor or "out"
        if name not in arrays:
            continue
        touched = ~written & ~_at_prefill(case, name, arrays[name])
        if "softmax_lse_flag 0" in check.detail:
            text = f"{check.detail}: the forward wrote lse although softmax_lse_flag is 0"
            found += named("layout", "lse written with softmax_lse_flag 0", 0.5, text, (name,))
            continue
        past = np.zeros_like(written)
        if case.layout != "TND":
            for span in case.spans():
                past[span.batch, :, span.q_len :] = True
        total = int(touched.sum())
        for (kind, supposes, what), rows in zip(_WRITTEN_ALONE, (touched & past, touched & ~past), strict=True):
            if rows.any():
                first = row_words(case, written, int(np.flatnonzero(rows)[0]))
                text = f"{name}: {int(rows.sum())} {what}, first at {first}"
                found += named(kind, supposes, int(rows.sum()) / total, text, (name,), (f"{name} {first}",))
    return found


#: Rows written that the forward must leave alone: past the actual lengths, or of a block row selecting none.
_WRITTEN_ALONE: tuple[tuple[Kind, str, str], ...] = (
    (
        "length-boundary",
        "rows past the actual lengths written",
        "rows past the actual query lengths written (the forward must leave them alone)",
    ),
    (
        "block-selection",
        "rows that select no block written",
        "rows of query blocks that select no kv block written (computed although the mask selects nothing there)",
    ),
)


def _at_prefill(case: Case, name: str, dev: np.ndarray) -> np.ndarray:
    """The rows of an output (out or lse) that hold the NaN prefill's bits."""
    unsigned = np.uint16 if dev.dtype.itemsize == 2 else np.uint32
    return (dev.view(unsigned) == unsigned(PREFILL_BITS["float32" if name == "lse" else case.dtype])).all(axis=-1)


def rows_permuted(case: Case, spans: Spans, side: Side, written: np.ndarray, targets: Sequence[QBlock]) -> Findings:
    """rows-permuted: out's worst rows equal golden rows at other positions of the same head (any entry);
    length-boundary when an entry's worst rows all sit one shift from their place (the entry written late)."""
    supposes = "out rows written at other rows' places (device rows equal golden rows elsewhere)"
    eps = dtype_eps(case)
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
            row = dev_rows[index]
            dist = np.where(ok, norms - 2.0 * (safe_golden @ row) + float(row @ row), np.inf)
            dist[index] = np.inf
            match = int(np.argmin(dist))
            (b, s), (mb, ms) = (int(i) for i in where[index]), (int(i) for i in where[match])
            shift = ms - s if mb == b else None
            found.append(_Moved(b, head, s, shift, float(err[index]), float(min(dist[match], err[index]))))
    if not found:
        return tried("rows-permuted", supposes, 0.0, "ruled out: no row of out has an error to place")
    total = sum(f.error for f in found)
    share = sum(f.error - f.left for f in found) / total if total > 0 else 0.0
    close = [f for f in found if f.left <= 0.05 * f.error]
    shifts = [f.shift for f in close if f.shift]
    common = max(set(shifts), key=shifts.count) if shifts else None
    if share >= 0.5 and common is not None and len(found) >= 4 and shifts.count(common) >= 0.8 * len(found):
        b = next(f.batch for f in close if f.shift == common)
        text = f"out rows of batch entry {b} equal the golden's rows {common:+d} places away "
        text += f"({shifts.count(common)} of the {len(found)} worst rows): the entry written shifted, explaining "
        text += f"{share:.0%} of their error"
        return named("length-boundary", "an entry's rows written shifted", share, text, ("out",), (f"out batch {b}",))
    first = f" (first: {close[0].words()})" if close else ""
    text = f"{len(close)} of out's {len(found)} worst rows equal golden rows at other positions{first}, explaining "
    text += f"{share:.0%} of their error"
    if share >= 0.5:
        return named("rows-permuted", supposes, share, text, ("out",), [f"out {f.words()}" for f in close[:3]])
    return tried("rows-permuted", supposes, share, "ruled out: " + text)


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


def tile_local(
    case: Case, scorer: Scorer, side: Side, blocks: Sequence[QBlock], excess: Mapping[QBlock, float]
) -> Findings:
    """tile-local: out's excess error (`excess`: per block, beyond the benchmark's) held by one or two 16x16
    tiles, or one 128-row piece."""
    supposes = "errors confined to one or two 16x16 tiles (or one 128-row piece) of out"
    tiles: list[tuple[float, str]] = []  # (excess error energy, words)
    pieces: list[tuple[float, str]] = []
    total = sum(excess.values())  # out's excess error energy, every block
    count_tiles = 0
    for target in sorted((b for b in blocks if excess[b] > 0), key=lambda b: -excess[b])[:TILE_BLOCKS]:
        dev, gold, usable, noise = scorer.block(side, target)
        err = (dev - gold) ** 2
        rows, cols = err.shape
        x0, words = target.block * case.block_shape[0], f"out {target.words()} rows"
        per_row = noise / max(int(usable.any(axis=1).sum()), 1)
        padded = np.zeros((-(-rows // TILE) * TILE, -(-cols // TILE) * TILE))
        padded[:rows, :cols] = err
        sums = padded.reshape(padded.shape[0] // TILE, TILE, -1, TILE).sum(axis=(1, 3))  # [row tiles, col tiles]
        heights = np.minimum(TILE, rows - TILE * np.arange(sums.shape[0]))[:, None]
        widths = np.minimum(TILE, cols - TILE * np.arange(sums.shape[1]))[None, :]
        excess_tiles = np.maximum(sums - per_row * heights * widths / cols, 0.0)
        for flat in np.argsort(-excess_tiles, axis=None)[:2]:  # the block's two worst: the worst two overall among them
            r, c = (int(i) * TILE for i in np.unravel_index(flat, excess_tiles.shape))
            where = f"{words} {x0 + r}..{x0 + min(r + TILE, rows) - 1} cols {c}..{c + TILE - 1}"
            tiles.append((float(excess_tiles.flat[flat]), where))
        count_tiles += excess_tiles.size
        for r in range(0, rows, 128):
            e = max(float(err[r : r + 128].sum()) - per_row * min(128, rows - r), 0.0)
            pieces.append((e, f"{words} {x0 + r}..{x0 + min(r + 128, rows) - 1}"))
    if total <= 0 or not tiles:
        return tried("tile-local", supposes, 0.0, "ruled out: no excess error in out")
    tiles.sort(key=lambda t: -t[0])
    pieces.sort(key=lambda t: -t[0])
    tile_share = sum(t[0] for t in tiles[:2]) / total
    piece_share = pieces[0][0] / total
    several = sum(-(-len(scorer.ctx.rows(b)) // 128) for b in blocks) > 1  # one piece of all says nothing
    if tile_share >= LOCAL and count_tiles > 2:
        count = "one 16x16 tile" if len(tiles) < 2 or tiles[1][0] < 0.05 * total else "two 16x16 tiles"
        text = f"{tile_share:.0%} of out's excess error lies in {count}: {tiles[0][1]}"
        return _local(supposes, tile_share, text, tuple(t[1] for t in tiles[:2]))
    if piece_share >= LOCAL and several:
        text = f"{piece_share:.0%} of out's excess error lies in one 128-row piece: {pieces[0][1]}"
        return _local(supposes, piece_share, text, (pieces[0][1],))
    share = max(tile_share, piece_share if several else 0.0)
    text = f"the two worst tiles hold {tile_share:.0%} of out's excess error, the worst piece {piece_share:.0%}"
    return tried("tile-local", supposes, share, "ruled out: " + text)


def _local(supposes: str, share: float, text: str, where: tuple[str, ...]) -> Findings:
    """tile-local named (its cause's score at most 1)."""
    cause = Cause("tile-local", min(share, 1.0), text, ("out",), where)
    return Findings((cause,), (Hypothesis("tile-local", supposes, share, "explains: " + text),))


def layout(case: Case, dev: np.ndarray, gold: np.ndarray, benchmark: Arrays | None, written: np.ndarray) -> Findings:
    """layout: out's bytes read as the backward's gradients are (`placement.readings`): as the other 16-bit
    dtype's bits, or in another axis order (BNSD: written BSND, S and N read transposed, BNDS, NBSD; TND:
    written NTD, T and N read transposed, TDN)."""
    dev = np.ascontiguousarray(dev.reshape(case.q_shape))
    d = case.head_dim
    index = np.arange(dev.size).reshape(dev.shape)
    readings: list[tuple[str, np.ndarray]] = []
    found = Findings()
    for supposes, read in placement.readings(case):
        if "bits" in supposes:
            if dev.dtype.itemsize != 2:
                continue
        elif np.array_equal(read(index), index):
            found += tried("layout", f"out {supposes}", 0.0, "not tried: the same reading in this case")
            continue
        readings.append((f"out {supposes}", read(dev)))
    picked = np.flatnonzero(written.reshape(-1))  # the written rows, at most LAYOUT_ROWS evenly spread
    if picked.size > LAYOUT_ROWS:
        picked = picked[np.linspace(0, picked.size - 1, LAYOUT_ROWS).astype(np.int64)]

    def rows_of(array: np.ndarray) -> np.ndarray:
        return np.asarray(array.reshape(-1, d)[picked], dtype=np.float64)

    gold64 = rows_of(np.asarray(gold).reshape(case.q_shape))
    rows = np.isfinite(gold64)
    noise = 0.0
    if benchmark is not None and "out" in benchmark:
        bench = rows_of(np.asarray(benchmark["out"]).reshape(case.q_shape))
        noise = float(np.where(rows, (bench - gold64) ** 2, 0.0).sum())
    noise = max(noise, noise_floor(case, float(np.where(rows, gold64 * gold64, 0.0).sum())))
    with np.errstate(invalid="ignore", over="ignore"):
        base = rows_of(dev)
        null = float(np.where(rows & np.isfinite(base), (base - gold64) ** 2, 0.0).sum())
        null_excess = max(null / noise - 1.0, 0.0)
        for supposes, reading in readings:
            value = rows_of(np.ascontiguousarray(reading))
            usable = rows & np.isfinite(value)
            energy = float(np.where(usable, (value - gold64) ** 2, 0.0).sum())
            coverage = usable.sum() / max(int(rows.sum()), 1)
            share = 0.0 if null_excess <= 0 else max(0.0, 1.0 - max(energy / noise - 1.0, 0.0) / null_excess)
            share = float(share * coverage)
            text = f"read so, out's error is {math.sqrt(energy / noise):.3g}x the benchmark's "
            text += f"(from {math.sqrt(null / noise):.3g}x)"
            if share >= 0.5:
                cause = Cause("layout", share, f"{supposes}: {text}", ("out",), ())
                found += Findings((cause,), (Hypothesis("layout", supposes, share, f"explains {share:.0%}: {text}"),))
            else:
                found += tried("layout", supposes, share, f"ruled out: explains {share:.0%}: {text}")
    return found


def accumulation(ctx: ForwardContext, blocks: Sequence[QBlock], excess: Mapping[QBlock, float]) -> Findings:
    """accumulation-precision: the blocks' excess error grows with the kv blocks their row selects."""
    supposes = "error growing with the number of kv blocks a query block row accumulates"
    counts = np.array([float(ctx.mask("", b.batch)[b.head, b.block].sum()) for b in blocks])
    values = np.array([excess[b] for b in blocks])
    if counts.size < 4 or np.ptp(counts) == 0 or (values > 0).sum() < 0.5 * values.size:
        why = "not tried: the rows accumulate alike, or few blocks fail"
        return tried("accumulation-precision", supposes, 0.0, why)
    rank_c, rank_v = (np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(float) for a in (counts, values))
    corr = float(np.corrcoef(rank_c, rank_v)[0, 1])
    text = f"the blocks' excess error and their selected kv blocks have rank correlation {corr:.2f}"
    if corr >= 0.6:
        return named("accumulation-precision", supposes, corr, text, ("out",))
    return tried("accumulation-precision", supposes, max(corr, 0.0), "ruled out: " + text)


# ---- the pair: the forward step's causes, and gradients carried from the forward ---------------------
