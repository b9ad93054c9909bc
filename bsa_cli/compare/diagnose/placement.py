"""Causes read from where the device's values sit: another layout or dtype reading, rows at the wrong offset.

* **layout**: a failing tensor read under another layout (BNSD's bytes in [B, S, N, D] or [N, B, S, D]
  order, TND's in [N, T, D] order) or dtype (fp16 bits read as bf16, or the reverse) equals the golden.
* **length-boundary**: the excess error lies in rows past the actual sequence lengths (padding rows
  written), or a batch entry's golden rows sit at another offset of the device's (an entry shifted, a
  sequence offset read wrongly).
* **rows-permuted**: wrong rows of the failing blocks hold golden rows of other positions or heads (rows
  swapped, a row written to another's place); checked early, on the target blocks, as a local pattern.

The first two work on whole tensors in the global row order (TND: tokens; BNSD: batch x S), which is
cheap: no product is recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ...core.case import Case, numpy_dtype
from ...core.layout import kv_view, q_view
from ..results import TensorResult
from .findings import Findings, named, tried
from .scoring import Blocks
from .views import Arrays, Spans
from .views import noise_floor as _floor

#: A layout or length-boundary cause explaining this share of the excess error ends the search.
PLACED = 0.9


@dataclass(frozen=True)
class _Rows:
    """A tensor as global rows [rows, N * D] (float32, `_global_rows`): device (non-finite values replaced
    by the golden's), golden, and each row's error energy beyond the benchmark's (`excess`) and the
    benchmark's own (`noise`), float64."""

    device: np.ndarray
    golden: np.ndarray
    noise: np.ndarray
    excess: np.ndarray
    energy: np.ndarray  # each golden row's


def _global_rows(case: Case, array: np.ndarray) -> np.ndarray:
    """A tensor as global rows [rows, N * D], float32: it holds fp16, bf16 and float32 values exactly, and
    the energies compared here (a row's error against the benchmark's) need no more (half the memory
    passes of float64 over whole tensors)."""
    values = np.asarray(array, dtype=np.float32)
    if case.layout == "TND":
        return values.reshape(values.shape[0], -1)
    return values.transpose(0, 2, 1, 3).reshape(values.shape[0] * values.shape[2], -1)


@np.errstate(over="ignore", invalid="ignore")
def _rows(case: Case, name: str, device: Arrays, golden: Arrays, benchmark: Arrays | None) -> _Rows:
    gold = _global_rows(case, golden[name])
    dev = _global_rows(case, device[name])
    if not np.isfinite(gold).all():  # (whole-tensor passes: each skipped where it changes nothing)
        gold = np.nan_to_num(gold)
    if not np.isfinite(dev).all():
        dev = np.where(np.isfinite(dev), dev, gold)
    width = gold.shape[1]
    noise = np.zeros(gold.shape[0])
    if benchmark is not None:
        diff = _global_rows(case, benchmark[name]) - gold  # (not in place: a float32 input's rows are a view)
        noise = np.nan_to_num(_row_squares(diff), nan=0.0, posinf=0.0)
    energy = _row_squares(gold)
    noise = np.maximum(noise, _floor(case, float(energy.mean()) / width) * width)
    err = _row_squares(np.subtract(dev, gold, dtype=np.float64))  # a device's huge values: no float32 overflow
    return _Rows(dev, gold, noise, np.maximum(err - noise, 0.0), energy)


def _row_squares(rows: np.ndarray) -> np.ndarray:
    """Each row's sum of squares (float64: no overflow)."""
    return np.einsum("ij,ij->i", rows, rows, dtype=np.float64)


def _entries(case: Case, name: str, spans: Spans) -> list[tuple[int, int, int]]:
    """Each batch entry's (batch, first global row, length) in a tensor's global rows."""
    size = case.q_shape[2] if name == "dq" else case.kv_shape[2]
    out = []
    for span in spans.values():
        start, length = (span.q_start, span.q_len) if name == "dq" else (span.kv_start, span.kv_len)
        if case.layout != "TND":
            start = span.batch * size
        out.append((span.batch, start, length))
    return out


def _shift_candidates(
    case: Case, rows: _Rows, entries: Sequence[tuple[int, int, int]], start: int, worst: np.ndarray
) -> list[int]:
    """Offsets to try for an entry: small ones, the other entries' starts, and those at which the golden
    holds the entry's worst device rows (any offset a misplaced write gives)."""
    x, y = case.block_shape
    small = [1, 2, 3, 4, 8, 16, x, y]
    found = {d for s in small for d in (s, -s)} | {other - start for _, other, _ in entries}
    dev = rows.device[worst]
    dist = (dev**2).sum(axis=1)[:, None] - 2 * dev @ rows.golden.T + rows.energy[None, :]
    found |= {int(t) - int(g) for t, g in zip(worst, dist.argmin(axis=1), strict=True)}
    return sorted(d for d in found if d)


def _matches(rows: _Rows, at: np.ndarray, shift: int) -> np.ndarray:
    """Whether device rows `at` hold the golden rows `at - shift` (as closely as the benchmark, or 95% of
    the row's error explained); rows without a golden row there do not."""
    source = at - shift
    valid = (source >= 0) & (source < rows.golden.shape[0])
    ok = np.zeros(at.size, dtype=bool)
    at, source = at[valid], source[valid]
    dist = ((rows.device[at] - rows.golden[source]) ** 2).sum(axis=1)
    err = rows.excess[at] + rows.noise[at]
    own = rows.energy[source]
    ok[valid] = (dist <= np.maximum(4 * rows.noise[source], 0.05 * np.minimum(err, own))) & (own > 0)
    ok[valid] &= rows.excess[at] > 0
    return ok


def _shifted_entries(case: Case, name: str, rows: _Rows, spans: Spans) -> tuple[np.ndarray, list[str]]:
    """Device rows that hold a batch entry's golden rows at a constant offset (at least half the entry's
    rows that hold values), and the rows the shift leaves behind zero."""
    count = rows.golden.shape[0]
    explained = np.zeros(count, dtype=bool)
    words = []
    entries = _entries(case, name, spans)
    total = float(rows.excess.sum())
    for batch, start, length in entries:
        excess = rows.excess[start : start + length]
        if length < 2 or float(excess.sum()) < 0.05 * total:
            continue
        worst = np.argsort(excess)[::-1][:8]
        worst = worst[excess[worst] > 0] + start
        if worst.size < 2:
            continue
        # half the entry's rows that hold values must match: rows zero in the golden and on the device (a
        # causal entry's unattended kv rows) carry no evidence either way
        live = int(((rows.energy[start : start + length] > 0) | rows.device[start : start + length].any(axis=1)).sum())
        best: tuple[float, int, np.ndarray] | None = None
        for shift in _shift_candidates(case, rows, entries, start, worst):
            if _matches(rows, worst, shift).sum() < 2:  # cheap: the worst rows first
                continue
            at = np.arange(max(start + shift, 0), min(start + shift + length, count))
            ok = _matches(rows, at, shift)
            if ok.sum() < max(2, live // 2):
                continue
            gain = float(rows.excess[at[ok]].sum())
            if best is None or gain > best[0]:
                best = (gain, shift, at[ok])
        if best is not None and best[0] > 0.05 * total:
            explained[best[2]] = True
            # the rows the shift leaves behind (the first `shift` rows of a late entry, the last of an early
            # one), when the device left them zero: never written, as a shifted write leaves them
            shift = best[1]
            if shift > 0:
                behind = np.arange(start, start + min(shift, length))
            else:
                behind = np.arange(start + length + max(shift, -length), start + length)
            behind = behind[~rows.device[behind].any(axis=1)]
            explained[behind] = True
            words.append(f"{name} batch {batch}'s rows sit {best[1]:+d} rows off ({best[2].size} of {length} rows)")
    return explained, words


def length_boundary(
    case: Case, failing: Sequence[TensorResult], device: Arrays, golden: Arrays, benchmark: Arrays | None, spans: Spans
) -> tuple[float, Findings]:
    """Errors past the actual lengths (padding rows written) or a batch entry's rows at another offset.

    Returns the share of the failing tensors' excess error it explains (the smallest of theirs), and the
    findings."""
    supposes = "errors at or past the actual sequence lengths (padding rows written, a batch entry shifted)"
    shares, words = [], []
    for result in failing:
        rows = _rows(case, result.name, device, golden, benchmark)
        total = float(rows.excess.sum())
        if total <= 0:
            continue
        covered = np.zeros(rows.golden.shape[0], dtype=bool)
        for _, start, length in _entries(case, result.name, spans):
            covered[start : start + length] = True
        padding = ~covered & (rows.excess > 0)
        shifted, shift_words = _shifted_entries(case, result.name, rows, spans)
        share = float(rows.excess[padding | shifted].sum()) / total
        shares.append(share)
        if padding.any() and float(rows.excess[padding].sum()) > 0.05 * total:
            words.append(
                f"{result.name}: {int(padding.sum())} rows past the actual lengths written "
                f"({float(rows.excess[padding].sum()) / total:.0%} of its excess error)"
            )
        words.extend(shift_words)
    share = min(shares) if shares else 0.0
    if share >= 0.8 and words:
        text = f"{share:.0%} of the excess error at or past the sequence lengths: {'; '.join(words[:3])}"
        names = [t.name for t in failing]
        return share, named("length-boundary", supposes, 0.97 * share, text, names, words[:3], "fits")
    why = f"ruled out: {share:.0%} of the excess error past the lengths or in shifted batch entries"
    return 0.0, tried("length-boundary", supposes, 0.0, why)


#: The other layouts a tensor's bytes may have been written in: (what it supposes, the axes' order, whether
#: the bytes were written in that order (read back by it), or read with those axes transposed).
_LAYOUTS = {
    "TND": (
        ("written in [N, T, D] order, read as TND", (1, 0, 2), True),
        ("written in TND order with T and N read transposed", (1, 0, 2), False),
        ("written in [T, D, N] order, read as TND", (0, 2, 1), True),
    ),
    "BNSD": (
        ("written as BSND ([B, S, N, D]), read as BNSD", (0, 2, 1, 3), True),
        ("S and N read transposed (BNSD bytes taken as BSND)", (0, 2, 1, 3), False),
        ("written as BNDS ([B, N, D, S]), read as BNSD", (0, 1, 3, 2), True),
        ("written as NBSD ([N, B, S, D]), read as BNSD", (1, 0, 2, 3), True),
    ),
}


def readings(case: Case) -> list[tuple[str, Callable[[np.ndarray], np.ndarray]]]:
    """The other readings of a tensor's bytes: (what it supposes, the golden-shaped array it gives)."""
    other = "bfloat16" if case.dtype == "float16" else "float16"
    other_type = numpy_dtype(other)
    bits = f"{case.dtype} written as {other} bits (read as {other}, it equals the golden)"
    out: list[tuple[str, Callable[[np.ndarray], np.ndarray]]] = [
        (bits, lambda a: np.ascontiguousarray(a).view(np.uint16).view(other_type))
    ]
    layouts = _LAYOUTS["TND" if case.layout == "TND" else "BNSD"]
    return out + [(supposes, partial(_read, order=order, written=written)) for supposes, order, written in layouts]


def _read(a: np.ndarray, order: tuple[int, ...], written: bool) -> np.ndarray:
    """A tensor's bytes written with its axes in `order` and read back in its own, or read with its axes in
    `order` (not `written`)."""
    if written:
        return a.reshape([a.shape[i] for i in order]).transpose(np.argsort(order))
    return a.transpose(order).reshape(a.shape)


#: Elements a layout reading is first tried on (evenly spread): a wrong reading misses nearly all of them.
SAMPLE = 2048


def _reading_share(
    readings: Arrays, refs: Mapping[str, tuple[np.ndarray, float, float]]
) -> tuple[float, dict[str, float]]:
    """The share of the excess error a reading removes (`refs`: each tensor's `_reference`), and each
    tensor's error in benchmark units."""
    hyp, ratios = 0.0, {}
    for name, values in readings.items():
        golden, noise, _ = refs[name]
        energy = _energy(values, golden)  # another dtype's bits: NaN/Inf among them
        excess = max(energy / noise - 1.0, 0.0) if np.isfinite(energy) else np.inf
        hyp += excess
        ratios[name] = float(np.sqrt(excess + 1))
    total = sum(min(ref[2], 1e30) for ref in refs.values())
    return (max(0.0, 1.0 - hyp / total) if total > 0 and np.isfinite(hyp) else 0.0), ratios


def _reference(
    case: Case, dev: np.ndarray, golden: np.ndarray, bench: np.ndarray | None
) -> tuple[np.ndarray, float, float]:
    """A tensor's (or its picked elements') golden as float64, the benchmark's error energy (at least the
    noise floor) and the device's excess error in its units."""
    gold = np.nan_to_num(np.asarray(golden, dtype=np.float64))
    noise = 0.0
    if bench is not None:
        noise = float(np.nan_to_num((np.asarray(bench, dtype=np.float64) - gold) ** 2).sum())
    noise = max(noise, _floor(case, float((gold * gold).mean())) * gold.size)
    energy = _energy(dev, gold)
    return gold, noise, max(energy / noise - 1.0, 0.0) if np.isfinite(energy) else 1e30


@np.errstate(over="ignore", invalid="ignore")
def _energy(values: np.ndarray, golden: np.ndarray) -> float:
    """The error energy of values (as float64) against a golden, NaN/Inf left out: they are the non-finite
    kind's, here as in the null reading (a reading is scored on the rest)."""
    diff = np.asarray(values, dtype=np.float64) - golden
    diff[~np.isfinite(diff)] = 0.0
    return float((diff * diff).sum())


def layout(
    case: Case, failing: Sequence[TensorResult], device: Arrays, golden: Arrays, benchmark: Arrays | None
) -> tuple[float, Findings]:
    """A failing tensor that equals the golden under another layout or dtype reading of its bytes.

    Each reading is tried on `SAMPLE` elements first, then on the whole tensors. Returns the share of the
    excess error the best reading explains, and the findings."""
    best, found = 0.0, Findings()
    names = [t.name for t in failing]
    arrays = {n: np.asarray(device[n]) for n in names}
    picks, sample = {}, {}
    for name in names:
        flat = np.unique(np.linspace(0, arrays[name].size - 1, min(SAMPLE, arrays[name].size)).astype(np.int64))
        picks[name] = at = np.unravel_index(flat, arrays[name].shape)
        bench = benchmark[name][at] if benchmark is not None else None
        sample[name] = _reference(case, arrays[name][at], golden[name][at], bench)
    index = np.arange(arrays[names[0]].size).reshape(arrays[names[0]].shape)
    whole: dict[str, tuple[np.ndarray, float, float]] = {}
    for supposes, read in readings(case):
        if "bits" in supposes:
            if any(a.dtype.itemsize != 2 for a in arrays.values()):
                continue
        elif np.array_equal(read(index)[picks[names[0]]], index[picks[names[0]]]):
            found += tried("layout", supposes, 0.0, "not tried: the same reading in this case")
            continue
        share, ratios = _reading_share({n: read(arrays[n])[picks[n]] for n in names}, sample)
        if share < 0.8:
            why = f"ruled out: explains {share:.0%} of the excess error of {len(picks[names[0]][0])} elements"
            found += tried("layout", supposes, share, why)
            continue
        benches = {n: benchmark[n] if benchmark is not None else None for n in names}  # then on the whole tensors
        whole = whole or {n: _reference(case, arrays[n], golden[n], benches[n]) for n in names}
        share, ratios = _reading_share({n: read(arrays[n]) for n in names}, whole)
        parts = [f"{n}'s error falls to {r:.3g}x the benchmark's" for n, r in ratios.items()]
        # the values must then be right: as close as the benchmark, or as bf16's rounding is to an fp16 golden
        bound = 32.0 if "as bfloat16" in supposes else 4.0
        if share >= 0.9 and max(ratios.values(), default=0.0) > bound:
            why = f"ruled out: explains {share:.0%} of the excess error, but {', '.join(parts)} (more than {bound:g}x)"
            found += tried("layout", supposes, 0.0, why)
            continue
        if share >= 0.9:
            text = f"{supposes}: under that reading, {', '.join(parts)}"
            found += named(
                "layout", supposes, 0.97 * share, text, names, verb=f"explains {share:.0%} of the excess error"
            )
        else:
            found += tried("layout", supposes, share, f"ruled out: explains {share:.0%} of the excess error")
        best = max(best, share)
    return best, found


#: Wrong rows per failing block `rows_permuted` tries first.
SCREEN_ROWS = 8
#: Wrong rows per failing block `rows_permuted` matches at most.
WRONG_ROWS = 32


@dataclass
class _RowMatches:
    """Wrong rows of the failing blocks matched to golden rows elsewhere (`rows_permuted`)."""

    matched: int = 0
    bad_total: int = 0
    energy_all: float = 0.0
    energy_matched: float = 0.0
    where: list[str] = field(default_factory=list)
    # the golden rows matched: (tensor, batch, head, row)
    sources: set[tuple[str, int, int, int]] = field(default_factory=set)
    # wrong rows the device left zero, and their error
    emptied: list[tuple[tuple[str, int, int, int], float]] = field(default_factory=list)


def _row_matches(case: Case, blocks: Blocks, golden: Arrays, spans: Spans, limit: int) -> _RowMatches:
    """Match the first `limit` wrong rows of each failing target block to the golden rows of its head (and
    to the same block's rows in the other heads of its batch entry)."""
    found = _RowMatches()
    x, y = case.block_shape
    heads: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = {}
    for target in blocks.failing_targets:
        dev, bench, null, _ = blocks.data[target]
        scale = float((null**2).sum(axis=1).mean())
        row_noise = ((bench - null) ** 2).sum(axis=1) if bench is not None else np.zeros(null.shape[0])
        floor = max(float(row_noise.mean()), scale * 1e-6, 1e-30)
        row_err = ((dev - null) ** 2).sum(axis=1)
        # a wrong row: 25x its own benchmark error (rows of mixed magnitude) and above a floor of the block's,
        # or wrong by 10% of its own size (RMS) (a small row among large ones: attention sinks, mixed dout rows)
        size = np.maximum((null**2).sum(axis=1), (dev**2).sum(axis=1))
        large = (row_err > scale * 1e-6) | (row_err > 0.01 * size)
        bad = np.flatnonzero((row_err > 25 * np.maximum(row_noise, scale * 1e-9)) & large)[:limit]
        if not bad.size:
            continue
        span = spans[target.batch]
        view = q_view if target.tensor == "dq" else kv_view
        key = (target.tensor, target.batch, target.head)  # the worst blocks often share a head: upcast once
        if key not in heads:
            head = np.asarray(view(case, golden[target.tensor], span)[target.head], dtype=np.float64)
            heads[key] = (head, (head**2).sum(axis=1))
        gold, gold_energy = heads[key]
        size = x if target.tensor == "dq" else y
        first = target.block * size
        # the candidates: every golden row of the same head, and the rows of the same block in the other
        # heads of the batch entry (a row written to another head's place)
        label_head = np.full(gold.shape[0], target.head)
        label_row = np.arange(gold.shape[0])
        entry = view(case, golden[target.tensor], span)
        others = [h for h in range(entry.shape[0]) if h != target.head]
        if others:
            block_rows = np.arange(first, first + dev.shape[0])
            across = np.asarray(entry[:, first : first + dev.shape[0]][others], dtype=np.float64)
            gold = np.concatenate([gold, across.reshape(-1, gold.shape[1])])
            gold_energy = np.concatenate([gold_energy, (across**2).sum(axis=2).reshape(-1)])
            label_head = np.concatenate([label_head, np.repeat(others, block_rows.size)])
            label_row = np.concatenate([label_row, np.tile(block_rows, len(others))])
        rows = dev[bad]
        dist = (rows**2).sum(axis=1)[:, None] - 2 * rows @ gold.T + gold_energy[None, :]
        dist[np.arange(bad.size), first + bad] = np.inf
        best = dist.argmin(axis=1)
        closest = dist[np.arange(bad.size), best]
        # a match: the other golden row explains 95% of the row's error and is within 5% of the row's own
        # energy (or within 4x the benchmark's row error); neither row is all zero (empty rows abound)
        own = (rows**2).sum(axis=1)  # the row's own size: a match must be close relative to it too
        # (a small row, wrong only relative to itself, is held to its own benchmark error, not the block's)
        near = np.where(row_err[bad] > scale * 1e-6, 4 * floor, 4 * row_noise[bad])
        ok = (closest <= np.maximum(near, 0.05 * np.minimum(row_err[bad], own))) & own.astype(bool)
        ok &= gold_energy[best] > 0
        found.bad_total += bad.size
        found.matched += int(ok.sum())
        found.energy_all += float(row_err[bad].sum())
        found.energy_matched += float(row_err[bad][ok].sum())
        found.sources.update((target.tensor, target.batch, int(label_head[s]), int(label_row[s])) for s in best[ok])
        found.emptied.extend(
            ((target.tensor, target.batch, target.head, first + int(r)), float(row_err[r]))
            for r in bad[~ok & ~own.astype(bool)]
        )
        for r, s in zip(bad[ok][:2], best[ok][:2], strict=True):
            other = f"head {int(label_head[s])} " if label_head[s] != target.head else ""
            found.where.append(
                f"{target.tensor} batch {target.batch} head {target.head} row {first + int(r)} "
                f"holds golden {other}row {int(label_row[s])}"
            )
    return found


def rows_permuted(case: Case, blocks: Blocks, golden: Arrays, spans: Spans) -> Findings:
    """Device rows that equal golden rows at other positions of the same head, or of the same block in
    another head of the batch entry.

    Tried on the first `SCREEN_ROWS` wrong rows of each failing block first (most failing cases end here:
    none of them equals another golden row), then on up to `WRONG_ROWS`."""
    supposes = "device rows that hold the golden rows of other positions"
    screen = _row_matches(case, blocks, golden, spans, SCREEN_ROWS)
    if screen.matched == 0 and screen.bad_total:
        why = f"ruled out: none of the first {SCREEN_ROWS} wrong rows of each failing block equals another golden row"
        return tried("rows-permuted", supposes, 0.0, why)
    found = _row_matches(case, blocks, golden, spans, WRONG_ROWS)
    # a row left zero whose golden row another device row holds: moved away (a swap with an empty row)
    moved = [err for at, err in found.emptied if at in found.sources]
    matched = found.matched + len(moved)
    energy_matched = found.energy_matched + sum(moved)
    share = energy_matched / found.energy_all if found.energy_all else 0.0  # the share of the wrong rows' error
    if matched >= 1 and share >= 0.5:
        text = f"{matched} of {found.bad_total} wrong rows of the failing blocks equal golden rows at other positions: "
        text += "; ".join(found.where[:2])
        return named("rows-permuted", supposes, 0.95 * share, text, blocks.failing, found.where[:4], "fits")
    why = f"ruled out: {matched} of {found.bad_total} wrong rows equal another golden row"
    return tried("rows-permuted", supposes, 0.0, why)
