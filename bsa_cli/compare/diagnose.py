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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..case import Case, SequenceSpan, numpy_dtype
from ..layout import kv_view, lse_view, mask_view, q_view
from ..manifest import GRAD_NAMES
from ..rounding import to_dtype
from .geometry import TILE
from .results import DIAGNOSIS_KINDS, Cause, Check, Hypothesis, TensorResult

__all__ = ["MAX_TARGETS", "TESTED_KINDS", "Diagnosis", "diagnose"]

UNTESTED_KINDS = ("length-boundary", "accumulation-precision", "layout")
"""Kinds of the vocabulary this module never names yet."""

TESTED_KINDS = tuple(kind for kind in DIAGNOSIS_KINDS if kind not in UNTESTED_KINDS)
"""The kinds of `results.DIAGNOSIS_KINDS` this module tests."""

MAX_TARGETS = 3
"""Failing blocks recomputed per failing tensor (the worst by the block map's score); a passing tensor
adds its worst, so that a hypothesis that would break it is scored down."""
LOCAL = 0.8
"""A rows-permuted or tile-local pattern scoring this much skips the recomputed hypotheses."""
EXPLAINED = 0.98
"""A recomputed hypothesis explaining this share of the error ends the search: the later ones are not
tried (`--explain` says so)."""
MIN_SCORE = 0.2
"""Causes scoring less are not listed in the diagnosis (`--explain` still shows them)."""
MAX_CAUSES = 3
"""Causes listed in a diagnosis, best first."""
_LOG2E = math.log2(math.e)


@dataclass(frozen=True)
class Diagnosis:
    """The causes (best first, at most `MAX_CAUSES`, none below `MIN_SCORE`) and every hypothesis tried."""

    causes: tuple[Cause, ...]
    hypotheses: tuple[Hypothesis, ...]


@dataclass(frozen=True)
class _Variant:
    """A hypothesis to recompute: how the faulty kernel differs from the operator's semantics."""

    kind: str
    supposes: str
    mask: str = ""  # transposed | kv+1 | kv-1 | q+1 | drop-tail
    heads: str = ""  # interleaved | next
    group: str = ""  # first | not-last
    lse: str = ""  # base2 | ignored
    dsum: str = ""  # none | negated
    scale: str = ""  # rounded


_VARIANTS = (
    _Variant("tail-block", "the partial last blocks (Skv % Y, else Sq % X) are skipped", mask="drop-tail"),
    _Variant("block-selection", "the block mask read transposed ([.., j, i])", mask="transposed"),
    _Variant("block-selection", "kv block j reads the selection of block j - 1 (mask shifted by one block)",
            mask="kv+1"),
    _Variant("block-selection", "kv block j reads the selection of block j + 1 (mask shifted by one block)",
            mask="kv-1"),
    _Variant("block-selection", "query block i reads the selection of block i - 1", mask="q+1"),
    _Variant("gqa-head-mapping", "query head n reads kv head n % N2 (interleaved, not n // G)", heads="interleaved"),
    _Variant("gqa-head-mapping", "query head n reads kv head n // G + 1 (one kv head off)", heads="next"),
    _Variant("gqa-group-sum", "dK/dV take only the first query head of each GQA group", group="first"),
    _Variant("gqa-group-sum", "dK/dV leave out the last query head of each GQA group", group="not-last"),
    _Variant("softmax-lse", "P recomputed as exp2(S log2(e) - lse): lse read as a base-2 log", lse="base2"),
    _Variant("softmax-lse", "P recomputed as exp(S): lse ignored", lse="ignored"),
    _Variant("softmax-grad", "Dsum omitted: dS = P dP", dsum="none"),
    _Variant("softmax-grad", "Dsum added instead of subtracted: dS = P (dP + Dsum)", dsum="negated"),
    _Variant("scale", "scaleValue held in the case dtype (scores, dQ and dK)", scale="rounded"),
)


# ---- the recomputed golden of a few blocks ----------------------------------------------------------


@dataclass
class _Context:
    """A case's inputs as float64 views per batch entry and head, computed on demand and kept."""

    case: Case
    inputs: Mapping[str, np.ndarray]
    spans: dict[int, SequenceSpan]
    cache: dict[tuple[str, int, int], np.ndarray] = field(default_factory=dict)
    masks: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    kv_blocks: dict[tuple[Any, int, int, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def q_side(self, name: str, batch: int, head: int) -> np.ndarray:
        key = (name, batch, head)
        if key not in self.cache:
            span = self.spans[batch]
            if name == "lse":
                view = lse_view(self.case, np.asarray(self.inputs["softmax_lse"]), span)[head]
            elif name == "dsum":
                out, dout = self.q_side("attention_out", batch, head), self.q_side("dout", batch, head)
                view = (out * dout).sum(axis=1)
            else:
                view = q_view(self.case, self.inputs[name], span)[head]
            self.cache[key] = np.asarray(view, dtype=np.float64)
        return self.cache[key]

    def kv_side(self, name: str, batch: int, head: int) -> np.ndarray:
        key = (name, batch, -1 - head)
        if key not in self.cache:
            view = kv_view(self.case, self.inputs[name], self.spans[batch])[head]
            self.cache[key] = np.asarray(view, dtype=np.float64)
        return self.cache[key]

    def mask(self, variant: _Variant, batch: int) -> np.ndarray:
        key = (variant.mask, batch)
        if key not in self.masks:
            self.masks[key] = _read_mask(self.case, np.asarray(self.inputs["block_sparse_mask"]),
                    self.spans[batch], variant.mask)
        return self.masks[key]

    def kv_head(self, variant: _Variant, head: int) -> int:
        case = self.case
        if variant.heads == "interleaved":
            return head % case.num_kv_heads
        if variant.heads == "next":
            return (head // case.group_size + 1) % case.num_kv_heads
        return head // case.group_size

    def in_sum(self, variant: _Variant, head: int) -> bool:
        member = head % self.case.group_size
        if variant.group == "first":
            return member == 0
        if variant.group == "not-last":
            return member != self.case.group_size - 1
        return True

    def scale(self, variant: _Variant) -> float:
        if variant.scale == "rounded":
            held = to_dtype(np.array([self.case.kernel_scale], dtype=np.float32), numpy_dtype(self.case.dtype))
            return float(np.asarray(held, dtype=np.float64).reshape(-1)[0])
        return float(self.case.kernel_scale)


def _read_mask(case: Case, block_mask: np.ndarray, span: SequenceSpan, how: str) -> np.ndarray:
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


@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def _dscores(ctx: _Context, v: _Variant, batch: int, head: int, rows: np.ndarray, cols: np.ndarray,
             kv_head: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Return (dS, P) [rows, cols] of query head `head` against kv head `kv_head` under the variant."""
    query = ctx.q_side("query", batch, head)[rows]
    scores = ctx.scale(v) * (query @ ctx.kv_side("key", batch, kv_head)[cols].T)
    lse = ctx.q_side("lse", batch, head)[rows, None]
    if v.lse == "base2":
        probs = np.exp2(scores * _LOG2E - lse)
    elif v.lse == "ignored":
        probs = np.exp(scores)
    else:
        probs = np.exp(scores - lse)
    dprobs = ctx.q_side("dout", batch, head)[rows] @ ctx.kv_side("value", batch, kv_head)[cols].T
    dsum = ctx.q_side("dsum", batch, head)[rows, None]
    if v.dsum == "none":
        return probs * dprobs, probs
    if v.dsum == "negated":
        return probs * (dprobs + dsum), probs
    return probs * (dprobs - dsum), probs


def _positions(blocks: np.ndarray, size: int, length: int) -> np.ndarray:
    parts = [np.arange(int(b) * size, min((int(b) + 1) * size, length)) for b in blocks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class _Target:
    """A block of one gradient: dq (batch, query head, query block) or dk/dv (batch, kv head, kv block)."""

    tensor: str
    batch: int
    head: int
    block: int

    def words(self) -> str:
        axis = "q" if self.tensor == "dq" else "kv"
        return f"{self.tensor} batch {self.batch} head {self.head} {axis} block {self.block}"


@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def _recompute(ctx: _Context, v: _Variant, target: _Target) -> np.ndarray:
    """Return the float64 golden of one target block under the variant ([rows, D])."""
    case, span = ctx.case, ctx.spans[target.batch]
    x, y = case.block_shape
    mask = ctx.mask(v, target.batch)
    scale = ctx.scale(v)
    if target.tensor == "dq":
        rows = np.arange(target.block * x, min((target.block + 1) * x, span.q_len))
        cols = _positions(np.flatnonzero(mask[target.head, target.block]), y, span.kv_len)
        if not cols.size:
            return np.zeros((rows.size, case.head_dim))
        kv_head = ctx.kv_head(v, target.head)
        dscores, _ = _dscores(ctx, v, target.batch, target.head, rows, cols, kv_head)
        return scale * (dscores @ ctx.kv_side("key", target.batch, kv_head)[cols])
    key = (v, target.batch, target.head, target.block)
    if key not in ctx.kv_blocks:  # dk and dv of one kv block come from the same products: computed once
        cols = np.arange(target.block * y, min((target.block + 1) * y, span.kv_len))
        dk, dv = np.zeros((cols.size, case.head_dim)), np.zeros((cols.size, case.head_dim))
        for head in range(case.num_heads):
            if ctx.kv_head(v, head) != target.head or not ctx.in_sum(v, head):
                continue
            rows = _positions(np.flatnonzero(mask[head, :, target.block]), x, span.q_len)
            if not rows.size:
                continue
            dscores, probs = _dscores(ctx, v, target.batch, head, rows, cols, target.head)
            dk += scale * (dscores.T @ ctx.q_side("query", target.batch, head)[rows])
            dv += probs.T @ ctx.q_side("dout", target.batch, head)[rows]
        ctx.kv_blocks[key] = (dk, dv)
    dk, dv = ctx.kv_blocks[key]
    return dk if target.tensor == "dk" else dv


def _block_of(case: Case, array: np.ndarray, target: _Target, spans: Mapping[int, SequenceSpan]) -> np.ndarray:
    """Return one target block of a gradient array as float64 [rows, D]."""
    span = spans[target.batch]
    x, y = case.block_shape
    if target.tensor == "dq":
        view = q_view(case, array, span)[target.head]
        size, length = x, span.q_len
    else:
        view = kv_view(case, array, span)[target.head]
        size, length = y, span.kv_len
    return np.asarray(view[target.block * size : min((target.block + 1) * size, length)], dtype=np.float64)


# ---- scoring ------------------------------------------------------------------------------------------


@dataclass
class _Blocks:
    """Device, benchmark and recomputed golden of the target blocks, and the benchmark's error energy.

    `targets` are the failing blocks (and a passing tensor's worst); `add` brings in more blocks (those
    a hypothesis changes), scored with them so that a hypothesis predicting errors where there are none
    is scored down."""

    case: Case
    ctx: _Context
    device_arrays: Mapping[str, np.ndarray]
    bench_arrays: Mapping[str, np.ndarray] | None
    golden_arrays: Mapping[str, np.ndarray]
    failing: tuple[str, ...]
    targets: list[_Target] = field(default_factory=list)
    data: dict[_Target, tuple[np.ndarray, np.ndarray | None, np.ndarray, float]] = field(default_factory=dict)
    nonfinite: dict[_Target, np.ndarray] = field(default_factory=dict)  # where the device has NaN/Inf

    def add(self, target: _Target) -> None:
        if target in self.data:
            return
        case, ctx = self.case, self.ctx
        null = _block_of(case, self.golden_arrays[target.tensor], target, ctx.spans)  # gen's golden (float32 or 64)
        if not np.isfinite(null).all():
            null = _recompute(ctx, _NULL, target)
        dev = _block_of(case, self.device_arrays[target.tensor], target, ctx.spans)
        bad = ~np.isfinite(dev)
        if bad.any():
            self.nonfinite[target] = bad
            dev = np.where(bad, null, dev)  # non-finite values have their own kind (and a hypothesis may predict them)
        bench = _block_of(case, self.bench_arrays[target.tensor], target, ctx.spans) if self.bench_arrays else None
        eps = 2.0 ** -(11 if case.dtype == "float16" else 8)
        floor = float((null * null).sum()) * (eps / 4) ** 2 + 1e-30
        energy = float(((bench - null) ** 2).sum()) if bench is not None else floor
        self.data[target] = (dev, bench, null, max(energy, floor))

    @property
    def device(self) -> list[np.ndarray]:
        return [self.data[t][0] for t in self.targets]

    @property
    def bench(self) -> list[np.ndarray | None]:
        return [self.data[t][1] for t in self.targets]

    @property
    def null(self) -> list[np.ndarray]:
        return [self.data[t][2] for t in self.targets]

    @property
    def noise(self) -> dict[str, float]:
        return self.noise_of(self.targets)

    def overflows(self, value: np.ndarray) -> np.ndarray:
        """Where a value is non-finite, or finite but beyond the case dtype's range (an Inf once cast)."""
        with np.errstate(invalid="ignore"):
            return ~(np.abs(value) <= float(np.finfo(numpy_dtype(self.case.dtype)).max))

    def predicts_nonfinite(self, values: Sequence[np.ndarray]) -> bool:
        """Whether values of the targets overflow (or are NaN/Inf) where the device's are NaN/Inf: 90% of
        the elements where either is."""
        if not self.nonfinite:
            return False
        both = either = 0
        for target, value in zip(self.targets, values, strict=True):
            bad = self.nonfinite.get(target, np.zeros(value.shape, dtype=bool))
            over = self.overflows(value)
            both += int((bad & over).sum())
            either += int((bad | over).sum())
        return either > 0 and both >= 0.9 * either

    def noise_of(self, targets: Sequence[_Target]) -> dict[str, float]:
        out: dict[str, float] = {}
        for t in targets:
            out[t.tensor] = out.get(t.tensor, 0.0) + self.data[t][3]
        return out

    def energies(self, targets: Sequence[_Target], values: Sequence[np.ndarray]) -> dict[str, float]:
        out: dict[str, float] = dict.fromkeys({t.tensor for t in targets}, 0.0)
        for target, value in zip(targets, values, strict=True):
            bad = self.nonfinite.get(target)
            if bad is not None:  # a hypothesis predicting the device's NaN/Inf (or an overflow) explains them
                value = np.where(bad & self.overflows(value), self.data[target][0], value)
            diff = self.data[target][0] - value
            energy = float((diff * diff).sum()) if diff.size else 0.0
            out[target.tensor] += energy if math.isfinite(energy) else math.inf
        return out

    @staticmethod
    def excess(energies: Mapping[str, float], noise: Mapping[str, float]) -> float:
        return sum(max(e / noise[t] - 1.0, 0.0) for t, e in energies.items())

    def explained(self, values: Sequence[np.ndarray], extra: Sequence[_Target] = (),
                  extra_values: Sequence[np.ndarray] = ()) -> tuple[float, dict[str, float]]:  # fmt: skip
        """Return (share of the excess error removed, each failing tensor's error in benchmark units) of a
        hypothesis's values on the targets (and on `extra` blocks it changes)."""
        return self.explained_on([*self.targets, *extra], [*values, *extra_values])

    def explained_on(self, targets: Sequence[_Target], values: Sequence[np.ndarray]) -> tuple[float, dict[str, float]]:
        """`explained` over some of the blocks (`screen`: the worst of each failing tensor)."""
        noise = self.noise_of(targets)
        null_excess = self.excess(self.energies(targets, [self.data[t][2] for t in targets]), noise)
        energies = self.energies(targets, values)
        if null_excess <= 0:
            return 0.0, {}
        share = 1.0 - self.excess(energies, noise) / null_excess
        return max(0.0, min(1.0, share)), {t: math.sqrt(e / noise[t]) for t, e in energies.items()}

    @property
    def screen(self) -> list[_Target]:
        """The worst target block of each failing tensor: a hypothesis must explain them to be tried on all."""
        first: dict[str, _Target] = {}
        for target in self.targets:
            if target.tensor in self.failing:
                first.setdefault(target.tensor, target)
        return list(first.values())

    def falls(self, ratios: Mapping[str, float]) -> str:
        targets = self.targets
        noise = self.noise_of(targets)
        null = {t: math.sqrt(e / noise[t]) for t, e in self.energies(targets, self.null).items()}
        parts = [f"{t}'s error {'falls' if ratios[t] <= null[t] else 'rises'} to {ratios[t]:.3g}x the benchmark's "
                 f"(from {null[t]:.3g}x)" for t in GRAD_NAMES if t in self.failing and t in ratios]  # fmt: skip
        return ", ".join(parts)


_NULL = _Variant("", "")


def _changed_blocks(ctx: _Context, v: _Variant, tensors: Sequence[str], count: int = 2) -> list[_Target]:
    """Up to `count` blocks per tensor whose computation a mask variant changes (dq rows, dk/dv columns)."""
    if not v.mask:
        return []
    found: list[_Target] = []
    for name in tensors:
        picked = 0
        for batch in ctx.spans:
            read, mask = ctx.mask(v, batch), ctx.mask(_NULL, batch)
            if name == "dq":
                heads, blocks = np.nonzero((read != mask).any(axis=2))
            else:
                diff = (read != mask).any(axis=1)  # [N1, nKV]
                kv = diff.reshape(ctx.case.num_kv_heads, ctx.case.group_size, -1).any(axis=1)
                heads, blocks = np.nonzero(kv)
            step = max(1, heads.size // count)
            for h, j in list(zip(heads, blocks, strict=True))[::step][: count - picked]:
                found.append(_Target(name, batch, int(h), int(j)))
                picked += 1
            if picked >= count:
                break
    return found


def _targets(case: Case, tensors: Sequence[TensorResult], per_tensor: int = MAX_TARGETS) -> list[_Target]:
    """The worst blocks of each failing tensor (and the 2 worst of each passing one), by block map score."""
    targets: list[_Target] = []
    for result in tensors:
        if result.block_map is None:
            continue
        score = np.where(np.isnan(result.block_map.score), -np.inf, result.block_map.score)
        count = per_tensor if not result.passed else 1
        for flat in np.argsort(score, axis=None)[::-1][:count]:
            if score.flat[flat] == -np.inf:
                break
            b, n, j = (int(i) for i in np.unravel_index(flat, score.shape))
            targets.append(_Target(result.name, b, n, j))
    return targets


def _blocks(case: Case, ctx: _Context, tensors: Sequence[TensorResult], device: Mapping[str, np.ndarray],
            golden: Mapping[str, np.ndarray], benchmark: Mapping[str, np.ndarray] | None,
            per_tensor: int = MAX_TARGETS) -> _Blocks:  # fmt: skip
    failing = tuple(t.name for t in tensors if not t.passed)
    blocks = _Blocks(case, ctx, device, benchmark, golden, failing)
    for target in _targets(case, tensors, per_tensor):
        blocks.add(target)
        blocks.targets.append(target)
    return blocks


def _applies(case: Case, ctx: _Context, v: _Variant) -> str | None:
    """Return why a variant cannot be told from the operator's semantics in this case, else None."""
    if v.heads or v.group:
        if case.group_size <= 1 and v.group:
            return "not tried: N1 == N2, no GQA group"
        if v.heads == "interleaved" and (case.group_size <= 1 or case.num_kv_heads <= 1):
            return "not tried: the interleaved mapping is the same here (one kv head, or N1 == N2)"
        if v.heads == "next" and case.num_kv_heads <= 1:
            return "not tried: one kv head"
        if v.group == "not-last" and case.group_size == 2:
            return "not tried: with groups of 2 it is the same as taking only the first head"
    if v.mask:
        if all(np.array_equal(ctx.mask(v, b), ctx.mask(_NULL, b)) for b in ctx.spans):
            return "not tried: the mask reads the same under it in this case"
    if v.scale == "rounded" and ctx.scale(v) == ctx.scale(_NULL):
        return "not tried: the scale is exact in the case dtype"
    return None


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
    ctx = _Context(case, inputs, spans)
    nonfinite = _nonfinite(case, failing, device, golden, spans)
    if nonfinite is not None:
        causes.append(nonfinite)
        tried.append(Hypothesis("non-finite", "NaN/Inf written where the golden is finite", 1.0,
                "explains: " + nonfinite.evidence))
    zero = [t.name for t in failing if any(c.name == "all_zero" and not c.passed for c in t.checks)]
    if zero:
        text = f"{', '.join(zero)} all zero where the golden is not, as if never written"
        causes.append(Cause("not-written", 1.0, text, tuple(zero), ()))
        tried.append(Hypothesis("not-written", "an output never written", 1.0, "explains: " + text))
    if zero and all(_structural_only(t) for t in failing):
        return _ranked(causes, tried)
    bias_only = all(all(c.passed or c.name == "bias" for c in t.checks) for t in failing)
    blocks = _blocks(case, ctx, tensors, device, golden, benchmark, 4 * MAX_TARGETS if bias_only else MAX_TARGETS)
    if bias_only:
        _diagnose_bias(case, ctx, failing, blocks, causes, tried)
        return _ranked(causes, tried)
    # A few rows or tiles first (cheap): a misreading of whole blocks, heads or rows does not produce them.
    _rows_permuted(case, failing, blocks, device, golden, spans, causes, tried)
    _tile_local(case, blocks, causes, tried)
    local = next((c for c in causes if c.kind in ("rows-permuted", "tile-local") and c.score >= LOCAL), None)
    masks_seen: dict[bytes, _Variant] = {}
    done: Hypothesis | None = None
    for v in _VARIANTS:
        why = _applies(case, ctx, v)
        if why is None and local is not None:
            why = (f"not tried: the error is {local.kind} ({local.score:.2f}), which a misreading of whole blocks "
                   "does not produce")
        if why is None and done is not None:
            why = f"not tried: '{done.supposes}' already explains {done.score:.0%} of the error"
        if why is None and v.mask:  # two misreadings of the mask that read the same here are one hypothesis
            read = b"".join(ctx.mask(v, b).tobytes() for b in sorted(spans))
            if read in masks_seen:
                why = f"not told apart from '{masks_seen[read].supposes}' in this case: the mask reads the same"
            masks_seen.setdefault(read, v)
        if why is not None:
            tried.append(Hypothesis(v.kind, v.supposes, 0.0, why))
            continue
        def value(target: _Target, v: _Variant = v) -> np.ndarray:
            if v.group and target.tensor == "dq":  # dK/dV's group sum leaves dq as it is
                return blocks.data[target][2]
            return _recompute(ctx, v, target)

        screen = blocks.screen
        first, measured = blocks.explained_on(screen, [value(t) for t in screen])
        if first < 0.5 and measured:  # (nothing measured: the worst blocks' error is all NaN/Inf)
            tried.append(Hypothesis(v.kind, v.supposes, first,
                                    f"ruled out: explains {first:.0%} of the error of the worst failing blocks"))
            continue
        values = [value(t) for t in blocks.targets]
        extra = [t for t in _changed_blocks(ctx, v, GRAD_NAMES) if t not in blocks.targets]
        for target in extra:
            blocks.add(target)
        share, ratios = blocks.explained(values, extra, [_recompute(ctx, v, t) for t in extra])
        text = f"under the hypothesis, {blocks.falls(ratios)}" if ratios else "nothing to explain"
        where = tuple(t.words() for t in blocks.targets if t.tensor in blocks.failing)[:3]
        if nonfinite is not None and share >= 0.9 and blocks.predicts_nonfinite(values):
            text += "; it puts NaN/Inf where the device has them"
            causes[:] = [replace(c, score=0.9, evidence=c.evidence + f" (follows from: {v.supposes})")
                         if c.kind == "non-finite" else c for c in causes]  # fmt: skip
        if share >= 0.5:
            causes.append(Cause(v.kind, share, f"{v.supposes}: {text}", blocks.failing, where))
            tried.append(Hypothesis(v.kind, v.supposes, share, f"explains {share:.0%} of the excess error: {text}"))
            if share >= EXPLAINED:
                done = tried[-1]
        else:
            tried.append(Hypothesis(v.kind, v.supposes, share, f"ruled out: explains {share:.0%}: {text}"))
    if done is not None or local is not None:  # the patterns below would only rank lower
        explained = done.supposes if done is not None else local.kind if local is not None else ""
        reason = f"not tried: '{explained}' already explains the error"
        for kind, supposes in _PATTERNS:
            tried.append(Hypothesis(kind, supposes, 0.0, reason))
        return _ranked(causes, tried)
    _scale_fit(case, blocks, causes, tried)
    _zero_blocks(blocks, causes, tried)
    _tail_pattern(case, failing, spans, causes, tried)
    _race_pattern(case, ctx, tensors, blocks, causes, tried)
    return _ranked(causes, tried)


_PATTERNS = (
    ("scale", "a gradient off by a constant factor"),
    ("not-written", "blocks left zero (never written)"),
    ("tail-block", "errors confined to the partial last blocks"),
    ("accumulation-race", "a race in the dK/dV accumulation (an update lost in a shared kv block)"),
)
"""The pattern hypotheses tried after the recomputed ones (their `supposes`, for `--explain`)."""


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


def _index_words(case: Case, name: str, index: tuple[int, ...], spans: Mapping[int, SequenceSpan]) -> str:
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


def _nonfinite(case: Case, failing: Sequence[TensorResult], device: Mapping[str, np.ndarray],
               golden: Mapping[str, np.ndarray], spans: Mapping[int, SequenceSpan]) -> Cause | None:  # fmt: skip
    parts, where, names = [], [], []
    for result in failing:
        if not any(c.name == "nonfinite" and not c.passed for c in result.checks):
            continue
        dev = np.asarray(device[result.name])
        bad = ~np.isfinite(dev) & np.isfinite(np.asarray(golden[result.name]))
        count = int(bad.sum())
        rows = np.unique(np.argwhere(bad)[:, :-1], axis=0)
        first = _index_words(case, result.name, tuple(int(i) for i in rows[0]), spans) if rows.size else "-"
        parts.append(f"{result.name}: {count} NaN/Inf ({result.device.nan_count} NaN, {result.device.inf_count} Inf) "
                     f"in {len(rows)} rows where the golden is finite, first at {first}")  # fmt: skip
        where.append(f"{result.name} {first}")
        names.append(result.name)
    if not parts:
        return None
    return Cause("non-finite", 1.0, "; ".join(parts), tuple(names), tuple(where))


def _diagnose_bias(case: Case, ctx: _Context, failing: Sequence[TensorResult], blocks: _Blocks,
                   causes: list[Cause], tried: list[Hypothesis]) -> None:  # fmt: skip
    """A failure of the bias check alone: a precision bias, or the scale held in the case dtype."""
    words = []
    for result in failing:
        if result.bias is not None:
            words.append(f"{result.name} {result.bias.describe()}")
    text = "a systematic relative error below the ratio standards' resolution: " + "; ".join(words)
    names = tuple(t.name for t in failing)
    causes.append(Cause("precision-bias", 0.7, text, names, ()))
    tried.append(Hypothesis("precision-bias", "a systematic bias of the precision path", 0.7, "fits: " + text))
    thd = 2.0 ** -(11 if case.dtype == "float16" else 8)
    for v in _VARIANTS:
        if v.kind != "scale":
            continue
        why = _applies(case, ctx, v)
        if why is not None:
            tried.append(Hypothesis(v.kind, v.supposes, 0.0, why))
            continue
        values = [_recompute(ctx, v, t) for t in blocks.targets]
        share, parts = 1.0, []
        for name in names:
            picks = [i for i, t in enumerate(blocks.targets) if t.tensor == name]
            bench = [blocks.bench[i] for i in picks]
            own = _relative_bias(bench, [blocks.null[i] for i in picks],
                    thd) if all(b is not None for b in bench) else 0.0
            null_bias = _relative_bias([blocks.device[i] for i in picks], [blocks.null[i] for i in picks], thd) - own
            hyp_bias = _relative_bias([blocks.device[i] for i in picks], [values[i] for i in picks], thd) - own
            if null_bias == 0:
                continue
            share = min(share, max(0.0, 1.0 - abs(hyp_bias) / abs(null_bias)))
            parts.append(f"{name}'s bias falls from {null_bias:.3g} to {hyp_bias:.3g} relative")
        text = f"{v.supposes}: under the hypothesis, {', '.join(parts)}"
        if share >= 0.5:
            causes.append(Cause("scale", share, text, names, ()))
            tried.append(Hypothesis(v.kind, v.supposes, share, f"explains {share:.0%} of the bias: {text}"))
        else:
            tried.append(Hypothesis(v.kind, v.supposes, share, f"ruled out: explains {share:.0%}: {text}"))


def _relative_bias(device: Sequence[Any], golden: Sequence[np.ndarray], thd: float) -> float:
    num, count = 0.0, 0
    for dev, gold in zip(device, golden, strict=True):
        large = np.abs(gold) > thd
        num += float(((dev[large] - gold[large]) / gold[large]).sum())
        count += int(large.sum())
    return num / count if count else 0.0


def _scale_factor_words(factor: float, scale: float) -> str:
    named = {"1/scale: the scale not applied": 1 / scale, "scale: the scale applied twice": scale,
             "scale^2": scale * scale, "1/2": 0.5, "2": 2.0, "-1: the sign flipped": -1.0}  # fmt: skip
    for words, value in named.items():
        if value != 1 and abs(factor / value - 1) < 0.01:
            return f"{factor:.4g} (= {words})"
    return f"{factor:.4g}"


def _scale_fit(case: Case, blocks: _Blocks, causes: list[Cause], tried: list[Hypothesis]) -> None:
    """A constant factor per failing tensor, fitted by least squares: the scale missing or doubled."""
    factors: dict[str, float] = {}
    for name in blocks.failing:
        picks = [i for i, t in enumerate(blocks.targets) if t.tensor == name]
        num = sum(float((blocks.device[i] * blocks.null[i]).sum()) for i in picks)
        den = sum(float((blocks.null[i] ** 2).sum()) for i in picks)
        if den > 0:
            factors[name] = num / den
    values = [blocks.null[i] * factors.get(t.tensor, 1.0) for i, t in enumerate(blocks.targets)]
    share, ratios = blocks.explained(values)
    off = {n: f for n, f in factors.items() if abs(f - 1) > 0.01}
    supposes = "a gradient off by a constant factor"
    if not off:
        tried.append(Hypothesis("scale", supposes, 0.0,
                "ruled out: the least-squares factor of every failing tensor is within 1% of 1"))
        return
    fits = ", ".join(f"{n} = {_scale_factor_words(f, case.kernel_scale)} x golden" for n, f in off.items())
    text = f"{fits}; under the hypothesis, {blocks.falls(ratios)}"
    if share >= 0.5:
        causes.append(Cause("scale", share, text, tuple(off), ()))
        tried.append(Hypothesis("scale", supposes, share, f"explains {share:.0%} of the excess error: {text}"))
    else:
        tried.append(Hypothesis("scale", supposes, share, f"ruled out: explains {share:.0%}: {text}"))


def _zero_blocks(blocks: _Blocks, causes: list[Cause], tried: list[Hypothesis]) -> None:
    """Failing blocks left all zero where the golden is not."""
    total, zero, where = 0.0, 0.0, []
    for target, dev, null, in zip(blocks.targets, blocks.device, blocks.null, strict=True):
        if target.tensor not in blocks.failing:
            continue
        energy = float(((dev - null) ** 2).sum()) / blocks.noise[target.tensor]
        total += energy
        if dev.size and not dev.any() and null.any():
            zero += energy
            where.append(target.words())
    share = zero / total if total else 0.0
    supposes = "blocks left zero (never written)"
    if where and share >= 0.5:
        text = f"{len(where)} of the failing blocks are all zero where the golden is not: {', '.join(where[:3])}"
        causes.append(Cause("not-written", 0.8 * share, text, tuple(sorted({w.split()[0] for w in where})),
                tuple(where[:3])))
        tried.append(Hypothesis("not-written", supposes, 0.8 * share, f"fits {share:.0%} of the error: {text}"))
    else:
        tried.append(Hypothesis("not-written", supposes, 0.0,
                f"ruled out: no failing block is all zero ({len(where)} found)"))


def _block_excess(result: TensorResult) -> np.ndarray | None:
    """Each block's error energy beyond the benchmark's, from the block map ([B, heads, blocks])."""
    block_map = result.block_map
    if block_map is None or block_map.rmse_benchmark is None:
        return None
    dev = np.nan_to_num(block_map.rmse, nan=0.0) ** 2
    bench = np.nan_to_num(block_map.rmse_benchmark, nan=0.0) ** 2
    return np.maximum(dev - 2.0 * bench, 0.0)


def _tail_pattern(case: Case, failing: Sequence[TensorResult], spans: Mapping[int, SequenceSpan],
                  causes: list[Cause], tried: list[Hypothesis]) -> None:  # fmt: skip
    """Errors confined to partial last blocks (Sq % X for dq, Skv % Y for dk/dv)."""
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
        text = (f"{share:.0%} of the excess error of {', '.join(where)} lies in the partial last blocks "
                "(Sq % X, Skv % Y)")
        causes.append(Cause("tail-block", 0.85 * share, text, tuple(where), ()))
        tried.append(Hypothesis("tail-block", supposes, 0.85 * share, "fits: " + text))
    else:
        tried.append(Hypothesis("tail-block", supposes, 0.85 * share,
                f"ruled out: {share:.0%} of the excess error in tail blocks"))


def _race_pattern(case: Case, ctx: _Context, tensors: Sequence[TensorResult], blocks: _Blocks,
                  causes: list[Cause], tried: list[Hypothesis]) -> None:  # fmt: skip
    """dK/dV wrong only in a few kv blocks that two or more pairs add into, dq right: a lost update."""
    supposes = "a race in the dK/dV accumulation (an update lost in a shared kv block)"
    by_name = {t.name: t for t in tensors}
    if "dq" not in by_name or not by_name["dq"].passed or not {"dk", "dv"} & set(blocks.failing):
        tried.append(Hypothesis("accumulation-race", supposes, 0.0, "ruled out: dq fails too, or dk and dv pass"))
        return
    null = _NULL
    kv_targets = [(i, t) for i, t in enumerate(blocks.targets) if t.tensor in ("dk",
            "dv") and t.tensor in blocks.failing]
    bad = [(i, t) for i, t in kv_targets
           if float(((blocks.device[i] - blocks.null[i]) ** 2).sum()) > 9 * blocks.noise[t.tensor] / MAX_TARGETS]
    bad_blocks = sorted({(t.batch, t.head, t.block) for _, t in bad})
    if not bad_blocks or len(bad_blocks) > 2:
        tried.append(Hypothesis("accumulation-race", supposes, 0.0,
                                f"ruled out: {len(bad_blocks)} failing kv blocks, not one or two"))
        return
    explained = []
    for batch, kv_head, block in bad_blocks:
        mask = ctx.mask(null, batch)
        pairs = [(h, int(i)) for h in range(case.num_heads) if ctx.kv_head(null, h) == kv_head
                 for i in np.flatnonzero(mask[h, :, block])]  # fmt: skip
        if len(pairs) < 2:
            tried.append(Hypothesis("accumulation-race", supposes, 0.0,
                    "ruled out: a failing kv block only one pair selects"))
            return
        picks = [i for i, t in kv_targets if (t.batch, t.head, t.block) == (batch, kv_head, block)]
        best = 0.0
        for head, q_block in pairs[:64]:
            lost = _pair_partial(ctx, batch, head, q_block, kv_head, block)
            err_null = sum(float(((blocks.device[i] - blocks.null[i]) ** 2).sum()) for i in picks)
            err_hyp = sum(float(((blocks.device[i] - blocks.null[i] + lost[blocks.targets[i].tensor]) ** 2).sum())
                          for i in picks)  # fmt: skip
            best = max(best, 1.0 - err_hyp / err_null if err_null else 0.0)
        explained.append(best)
    share = min(explained)
    names = ", ".join(f"batch {b} kv head {n} kv block {j}" for b, n, j in bad_blocks)
    if share >= 0.8:
        text = (f"dq right, dK/dV wrong only in {names}, selected by two or more pairs; one pair's partial "
                f"missing explains {share:.0%} of it")
        score = 0.95 * share
    else:
        text = f"dq right, dK/dV wrong only in {names}, selected by two or more pairs"
        score = 0.6
    causes.append(Cause("accumulation-race", score, text, tuple(n for n in ("dk", "dv") if n in blocks.failing),
            (names,)))
    tried.append(Hypothesis("accumulation-race", supposes, score, "fits: " + text))


def _pair_partial(ctx: _Context, batch: int, head: int, q_block: int, kv_head: int, block: int) -> dict[str,
        np.ndarray]:
    """One (query head, query block) pair's share of a kv block's dK and dV."""
    case, span = ctx.case, ctx.spans[batch]
    x, y = case.block_shape
    null = _NULL
    rows = np.arange(q_block * x, min((q_block + 1) * x, span.q_len))
    cols = np.arange(block * y, min((block + 1) * y, span.kv_len))
    dscores, probs = _dscores(ctx, null, batch, head, rows, cols, kv_head)
    return {"dk": ctx.scale(null) * (dscores.T @ ctx.q_side("query", batch, head)[rows]),
            "dv": probs.T @ ctx.q_side("dout", batch, head)[rows]}  # fmt: skip


def _rows_permuted(case: Case, failing: Sequence[TensorResult], blocks: _Blocks, device: Mapping[str, np.ndarray],
                   golden: Mapping[str, np.ndarray], spans: Mapping[int, SequenceSpan],
                   causes: list[Cause], tried: list[Hypothesis]) -> None:  # fmt: skip
    """Device rows that equal golden rows at other positions of the same head."""
    supposes = "device rows that hold the golden rows of other positions"
    matched, bad_total, where = 0, 0, []
    energy_all = energy_matched = 0.0
    x, y = case.block_shape
    for i, target in enumerate(blocks.targets):
        if target.tensor not in blocks.failing:
            continue
        dev, null = blocks.device[i], blocks.null[i]
        bench = blocks.bench[i]
        scale = float((null**2).sum(axis=1).mean())
        row_noise = ((bench - null) ** 2).sum(axis=1) if bench is not None else np.zeros(null.shape[0])
        floor = max(float(row_noise.mean()), scale * 1e-6, 1e-30)
        row_err = ((dev - null) ** 2).sum(axis=1)
        # a wrong row: 25x its own benchmark error (rows of mixed magnitude) and above a floor of the block's
        bad = np.flatnonzero((row_err > 25 * np.maximum(row_noise, scale * 1e-9)) & (row_err > scale * 1e-6))[:32]
        if not bad.size:
            continue
        span = spans[target.batch]
        view = q_view if target.tensor == "dq" else kv_view
        gold = np.asarray(view(case, golden[target.tensor], span)[target.head], dtype=np.float64)
        size = x if target.tensor == "dq" else y
        first = target.block * size
        rows = dev[bad]
        dist = (rows**2).sum(axis=1)[:, None] - 2 * rows @ gold.T + (gold**2).sum(axis=1)[None, :]
        dist[np.arange(bad.size), first + bad] = np.inf
        best = dist.argmin(axis=1)
        closest = dist[np.arange(bad.size), best]
        # a match: the other golden row explains 95% of the row's error and is within 5% of the row's own
        # energy (or within 4x the benchmark's row error); neither row is all zero (empty rows abound)
        own = (rows**2).sum(axis=1)  # the row's own size: a match must be close relative to it too
        ok = (closest <= np.maximum(4 * floor, 0.05 * np.minimum(row_err[bad], own))) & own.astype(bool)
        ok &= (gold[best] ** 2).sum(axis=1) > 0
        bad_total += bad.size
        matched += int(ok.sum())
        energy_all += float(row_err[bad].sum())
        energy_matched += float(row_err[bad][ok].sum())
        for r, s in zip(bad[ok][:2], best[ok][:2], strict=True):
            where.append(f"{target.tensor} batch {target.batch} head {target.head} row {first + int(r)} "
                         f"holds golden row {int(s)}")
    share = energy_matched / energy_all if energy_all else 0.0  # the share of the wrong rows' error
    if matched >= 1 and share >= 0.5:
        text = (f"{matched} of {bad_total} wrong rows of the failing blocks equal golden rows at other positions: "
                f"{'; '.join(where[:2])}")
        causes.append(Cause("rows-permuted", 0.95 * share, text, blocks.failing, tuple(where[:4])))
        tried.append(Hypothesis("rows-permuted", supposes, 0.95 * share, "fits: " + text))
    else:
        tried.append(Hypothesis("rows-permuted", supposes, 0.0,
                f"ruled out: {matched} of {bad_total} wrong rows equal another golden row"))


def _tile_local(case: Case, blocks: _Blocks, causes: list[Cause], tried: list[Hypothesis]) -> None:
    """Excess error confined to one or a few 16x16 tiles of the failing blocks."""
    supposes = "errors confined to one or a few 16x16 tiles"
    energies: list[tuple[float, str]] = []
    for target in blocks.targets:
        if target.tensor not in blocks.failing:
            continue
        dev, bench, null, _ = blocks.data[target]
        err = (dev - null) ** 2 - ((bench - null) ** 2 if bench is not None else 0.0)
        size = case.block_shape[0] if target.tensor == "dq" else case.block_shape[1]
        starts_r, starts_c = np.arange(0, err.shape[0], TILE), np.arange(0, err.shape[1], TILE)
        if not err.size:
            continue
        tiles = np.add.reduceat(np.add.reduceat(err, starts_r, axis=0), starts_c, axis=1)
        for r, c in zip(*np.nonzero(tiles > 0), strict=True):
            row = target.block * size + int(starts_r[r])
            energies.append((float(tiles[r, c]) / blocks.noise[target.tensor],
                             f"{target.words()} tile at row {row}, column {int(starts_c[c])}"))  # fmt: skip
    total = sum(e for e, _ in energies)
    energies.sort(key=lambda e: -e[0])
    top = energies[:4]
    share = sum(e for e, _ in top) / total if total else 0.0
    if share >= 0.9:
        many = sum(1 for e, _ in energies if e >= 0.05 * total)
        text = (f"{share:.0%} of the excess error of the failing blocks lies in {many} 16x16 "
                f"tile{'s' if many != 1 else ''}: {top[0][1]}")
        causes.append(Cause("tile-local", 0.85 * share, text, blocks.failing, tuple(w for _, w in top[:many])))
        tried.append(Hypothesis("tile-local", supposes, 0.85 * share, "fits: " + text))
    else:
        tried.append(Hypothesis("tile-local", supposes, 0.0,
                f"ruled out: the 4 worst tiles hold {share:.0%} of the excess error"))
