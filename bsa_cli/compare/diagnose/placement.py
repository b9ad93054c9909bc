"""Causes read from where the device's values sit: another layout or dtype reading, rows at the wrong offset.

* **layout**: a failing tensor read under another layout (BNSD's bytes in [B, S, N, D] or [N, B, S, D]
  order, TND's in [N, T, D] order) or dtype (fp16 bits read as bf16, or the reverse) equals the golden.
* **length-boundary**: the excess error lies in rows past the actual sequence lengths (padding rows
  written), or a batch entry's golden rows sit at another offset of the device's (an entry shifted, a
  sequence offset read wrongly).

Both work on whole tensors in the global row order (TND: tokens; BNSD: batch x S), which is cheap: no
product is recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...case import Case, SequenceSpan, numpy_dtype
from ..results import Cause, Hypothesis, TensorResult

PLACED = 0.9
"""A layout or length-boundary cause explaining this share of the excess error ends the search."""


@dataclass(frozen=True)
class _Rows:
    """A tensor as global rows [rows, N * D] (float64): device (non-finite values replaced by the golden's),
    golden, and each row's error energy beyond the benchmark's (`excess`) and the benchmark's own (`noise`)."""

    device: np.ndarray
    golden: np.ndarray
    noise: np.ndarray
    excess: np.ndarray


def _global_rows(case: Case, array: np.ndarray) -> np.ndarray:
    values = np.asarray(array, dtype=np.float64)
    if case.layout == "TND":
        return values.reshape(values.shape[0], -1)
    return values.transpose(0, 2, 1, 3).reshape(values.shape[0] * values.shape[2], -1)


def _floor(case: Case, golden: np.ndarray) -> float:
    eps = 2.0 ** -(11 if case.dtype == "float16" else 8)
    return float((golden * golden).mean()) * (eps / 4) ** 2 + 1e-30


@np.errstate(over="ignore", invalid="ignore")
def _rows(case: Case, name: str, device: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray],
          benchmark: Mapping[str, np.ndarray] | None) -> _Rows:  # fmt: skip
    gold = _global_rows(case, golden[name])
    dev = _global_rows(case, device[name])
    dev = np.where(np.isfinite(dev), dev, np.nan_to_num(gold))
    gold = np.nan_to_num(gold)
    width = gold.shape[1]
    if benchmark is not None:
        noise = ((_global_rows(case, benchmark[name]) - gold) ** 2).sum(axis=1)
        noise = np.nan_to_num(noise, nan=0.0, posinf=0.0)
    else:
        noise = np.zeros(gold.shape[0])
    noise = np.maximum(noise, _floor(case, gold) * width)
    err = ((dev - gold) ** 2).sum(axis=1)
    return _Rows(dev, gold, noise, np.maximum(err - noise, 0.0))


def _entries(case: Case, name: str, spans: Mapping[int, SequenceSpan]) -> list[tuple[int, int, int]]:
    """Each batch entry's (batch, first global row, length) in a tensor's global rows."""
    size = case.q_shape[2] if name == "dq" else case.kv_shape[2]
    out = []
    for span in spans.values():
        start, length = (span.q_start, span.q_len) if name == "dq" else (span.kv_start, span.kv_len)
        if case.layout != "TND":
            start = span.batch * size
        out.append((span.batch, start, length))
    return out


def _shift_candidates(case: Case, rows: _Rows, entries: Sequence[tuple[int, int, int]], start: int,
                      length: int) -> list[int]:  # fmt: skip
    """Offsets to try for an entry: small ones, the other entries' starts, and those at which the golden
    holds the entry's worst device rows (any offset a misplaced write gives)."""
    x, y = case.block_shape
    small = [1, 2, 3, 4, 8, 16, x, y]
    found = {d for s in small for d in (s, -s)} | {other - start for _, other, _ in entries}
    excess = rows.excess[start : start + length]
    worst = np.argsort(excess)[::-1][:8]
    worst = worst[excess[worst] > 0] + start
    if worst.size:
        dev = rows.device[worst]
        dist = (dev**2).sum(axis=1)[:, None] - 2 * dev @ rows.golden.T + (rows.golden**2).sum(axis=1)[None, :]
        found |= {int(t) - int(g) for t, g in zip(worst, dist.argmin(axis=1), strict=True)}
    return sorted(d for d in found if d)


def _shifted_entries(case: Case, name: str, rows: _Rows, spans: Mapping[int, SequenceSpan]) -> tuple[np.ndarray,
        list[str]]:  # fmt: skip
    """Device rows that hold a batch entry's golden rows at a constant offset (at least half the entry)."""
    count = rows.golden.shape[0]
    explained = np.zeros(count, dtype=bool)
    words = []
    entries = _entries(case, name, spans)
    total = float(rows.excess.sum())
    for batch, start, length in entries:
        if length < 2:
            continue
        best: tuple[float, int, np.ndarray] | None = None
        for shift in _shift_candidates(case, rows, entries, start, length):
            lo, hi = max(start + shift, 0), min(start + shift + length, count)
            if hi - lo < 2:
                continue
            dev, gold = rows.device[lo:hi], rows.golden[lo - shift : hi - shift]
            own = (gold * gold).sum(axis=1)
            dist = ((dev - gold) ** 2).sum(axis=1)
            err = rows.excess[lo:hi] + rows.noise[lo:hi]
            ok = (dist <= np.maximum(4 * rows.noise[lo - shift : hi - shift], 0.05 * np.minimum(err, own))) & (own > 0)
            ok &= rows.excess[lo:hi] > 0
            if ok.sum() < max(2, length // 2):
                continue
            gain = float(rows.excess[lo:hi][ok].sum())
            if best is None or gain > best[0]:
                best = (gain, shift, np.flatnonzero(ok) + lo)
        if best is not None and best[0] > 0.05 * total:
            explained[best[2]] = True
            words.append(f"{name} batch {batch}'s rows sit {best[1]:+d} rows off ({best[2].size} of {length} rows)")
    return explained, words


def length_boundary(case: Case, failing: Sequence[TensorResult], device: Mapping[str, np.ndarray],
                    golden: Mapping[str, np.ndarray], benchmark: Mapping[str, np.ndarray] | None,
                    spans: Mapping[int, SequenceSpan], causes: list[Cause],
                    tried: list[Hypothesis]) -> float:  # fmt: skip
    """Errors past the actual lengths (padding rows written) or a batch entry's rows at another offset.

    Returns the share of the failing tensors' excess error it explains (the smallest of theirs)."""
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
            words.append(f"{result.name}: {int(padding.sum())} rows past the actual lengths written "
                         f"({float(rows.excess[padding].sum()) / total:.0%} of its excess error)")  # fmt: skip
        words.extend(shift_words)
    share = min(shares) if shares else 0.0
    if share >= 0.8 and words:
        text = f"{share:.0%} of the excess error at or past the sequence lengths: {'; '.join(words[:3])}"
        causes.append(Cause("length-boundary", 0.97 * share, text, tuple(t.name for t in failing), tuple(words[:3])))
        tried.append(Hypothesis("length-boundary", supposes, 0.97 * share, "fits: " + text))
        return share
    tried.append(Hypothesis("length-boundary", supposes, 0.0,
            f"ruled out: {share:.0%} of the excess error past the lengths or in shifted batch entries"))
    return 0.0


def _readings(case: Case) -> list[tuple[str, Callable[[np.ndarray], np.ndarray]]]:
    """The other readings of a tensor's bytes: (what it supposes, the golden-shaped array it gives)."""
    out: list[tuple[str, Callable[[np.ndarray], np.ndarray]]] = []
    other = "bfloat16" if case.dtype == "float16" else "float16"
    other_type = numpy_dtype(other)
    out.append((f"{case.dtype} written as {other} bits (read as {other}, it equals the golden)",
                lambda a: np.ascontiguousarray(a).view(np.uint16).view(other_type)))  # fmt: skip
    if case.layout == "TND":
        out.append(("written in [N, T, D] order, read as TND",
                    lambda a: a.reshape(a.shape[1], a.shape[0], a.shape[2]).transpose(1, 0, 2)))
        out.append(("written in TND order with T and N read transposed",
                    lambda a: a.transpose(1, 0, 2).reshape(a.shape)))
        out.append(("written in [T, D, N] order, read as TND",
                    lambda a: a.reshape(a.shape[0], a.shape[2], a.shape[1]).transpose(0, 2, 1)))
    else:
        out.append(("written as BSND ([B, S, N, D]), read as BNSD",
                    lambda a: a.reshape(a.shape[0], a.shape[2], a.shape[1], a.shape[3]).transpose(0, 2, 1, 3)))
        out.append(("S and N read transposed (BNSD bytes taken as BSND)",
                    lambda a: a.transpose(0, 2, 1, 3).reshape(a.shape)))
        out.append(("written as BNDS ([B, N, D, S]), read as BNSD",
                    lambda a: a.reshape(a.shape[0], a.shape[1], a.shape[3], a.shape[2]).transpose(0, 1, 3, 2)))
        out.append(("written as NBSD ([N, B, S, D]), read as BNSD",
                    lambda a: a.reshape(a.shape[1], a.shape[0], a.shape[2], a.shape[3]).transpose(1, 0, 2, 3)))
    return out


@np.errstate(over="ignore", invalid="ignore")
def _excess(case: Case, values: np.ndarray, golden: np.ndarray, noise: float) -> float:
    diff = np.asarray(values, dtype=np.float64) - golden
    energy = float((diff * diff).sum())
    return max(energy / noise - 1.0, 0.0) if np.isfinite(energy) else np.inf


def layout(case: Case, failing: Sequence[TensorResult], device: Mapping[str, np.ndarray],
           golden: Mapping[str, np.ndarray], benchmark: Mapping[str, np.ndarray] | None,
           causes: list[Cause], tried: list[Hypothesis]) -> float:  # fmt: skip
    """A failing tensor that equals the golden under another layout or dtype reading of its bytes.

    Returns the share of the excess error the best reading explains."""
    best = 0.0
    prepared = {}
    for result in failing:
        gold = np.nan_to_num(np.asarray(golden[result.name], dtype=np.float64))
        if benchmark is not None:
            noise = float(np.nan_to_num((np.asarray(benchmark[result.name], dtype=np.float64) - gold) ** 2).sum())
        else:
            noise = 0.0
        noise = max(noise, _floor(case, gold) * gold.size)
        prepared[result.name] = (gold, noise, _excess(case, device[result.name], gold, noise))
    shape = np.asarray(device[failing[0].name]).shape
    index = np.arange(int(np.prod(shape))).reshape(shape)
    for supposes, read in _readings(case):
        if "bits" in supposes:
            if np.asarray(device[failing[0].name]).dtype.itemsize != 2:
                continue
        elif np.array_equal(read(index), index):
            tried.append(Hypothesis("layout", supposes, 0.0, "not tried: the same reading in this case"))
            continue
        null = hyp = 0.0
        parts = []
        for name, (gold, noise, null_excess) in prepared.items():
            value = _excess(case, read(np.asarray(device[name])), gold, noise)
            null += null_excess if np.isfinite(null_excess) else 1e30
            hyp += value
            parts.append(f"{name}'s error falls to {np.sqrt(value + 1):.3g}x the benchmark's")
        share = max(0.0, 1.0 - hyp / null) if null > 0 and np.isfinite(hyp) else 0.0
        if share >= 0.9:
            text = f"{supposes}: under that reading, {', '.join(parts)}"
            causes.append(Cause("layout", 0.97 * share, text, tuple(prepared), ()))
            outcome = f"explains {share:.0%} of the excess error: {text}"
            tried.append(Hypothesis("layout", supposes, 0.97 * share, outcome))
        else:
            tried.append(Hypothesis("layout", supposes, share, f"ruled out: explains {share:.0%} of the excess error"))
        best = max(best, share)
    return best
