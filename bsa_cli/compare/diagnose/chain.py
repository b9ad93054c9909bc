"""The pair's gradients: carried from the device's forward, or read from the forward's padding rows.

A chain's backward reads the DEVICE's out and lse. `carried_from_forward` tests whether a failing dq, dk,
dv is the backward's right answer to them (the error is the forward's); `score_padding` whether the
backward read the padding rows a BNSD forward leaves unwritten (`padding-rows-read`). Both recompute the
worst failing gradient blocks (float64, `hypotheses.recompute`) from the inputs as the backward read them.
Pure: arrays in, causes out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...core.case import Case
from ...store.manifest import GRAD_NAMES
from ..results import Cause, Hypothesis, TensorResult
from .hypotheses import NULL, Context, recompute
from .scoring import Blocks, gather_blocks
from .views import Arrays

#: Share of the gradients' excess error the backward recomputed from the device's out and lse must explain
#: for the error to be the forward's (the backward then is not diagnosed).
CARRIED = 0.9

CARRIED_SUPPOSES = "the backward is right given the forward's out and lse as written (dq, dk, dv recomputed from them)"


def as_forward_step(cause: Cause) -> Cause:
    """Return a forward cause as a pair's: its evidence says it is the forward step's ("the forward's out: ...")."""
    text = cause.evidence
    for name in cause.tensors:
        if text.startswith(f"{name}: "):
            text = text[len(name) + 2 :]
    label = " and ".join(cause.tensors) or "out and lse"
    return replace(cause, evidence=f"the forward's {label}: {text}")


@dataclass(frozen=True)
class Carried:
    """Whether a pair's gradient error is carried from its forward: the share the backward recomputed from
    the device's out and lse explains, and the words."""

    share: float
    text: str
    tensors: tuple[str, ...]

    @property
    def explains(self) -> bool:
        return self.share >= CARRIED

    @property
    def hypothesis(self) -> Hypothesis:
        verdict = "explains" if self.explains else "ruled out: explains"
        return Hypothesis("-", CARRIED_SUPPOSES, self.share, f"{verdict} {self.share:.0%}: {self.text}")

    def attribute(self, causes: Sequence[Cause]) -> list[Cause]:
        """The forward's causes with the gradients' error laid to the first (the backward not blamed)."""
        if not causes:
            return []
        first = causes[0]
        follows = f"; {', '.join(self.tensors)} follow from it ({CARRIED_SUPPOSES}: {self.text})"
        tensors = (*first.tensors, *(t for t in self.tensors if t not in first.tensors))
        return [replace(first, evidence=first.evidence + follows, tensors=tensors), *causes[1:]]


def carried_from_forward(
    case: Case, grads: Sequence[TensorResult], device: Arrays, golden: Arrays, benchmark: Arrays | None, read: Arrays
) -> Carried:
    """Test whether a pair's failing dq, dk, dv are the backward's right answer to the forward's out and lse
    as the device wrote them: the worst failing blocks recomputed (float64) from `read` (the backward's
    inputs with attention_out and softmax_lse the device's), scored as a backward hypothesis."""
    failing = tuple(t.name for t in grads if not t.passed)
    blocks, values, share, ratios = _recomputed(case, grads, device, golden, benchmark, read)
    if not blocks.targets:
        return Carried(0.0, "no failing block to recompute", failing)
    if blocks.nonfinite and blocks.predicts_nonfinite(values):
        nonfinite = "it puts NaN/Inf where the device has them"
        text = f"{blocks.falls(ratios)}; {nonfinite}" if ratios else nonfinite
        share = max(share, 1.0 if not ratios else share)
    else:
        text = f"under it, {blocks.falls(ratios)}" if ratios else "nothing to explain"
    return Carried(share, text, failing)


def _recomputed(
    case: Case, grads: Sequence[TensorResult], device: Arrays, golden: Arrays, benchmark: Arrays | None, read: Arrays
) -> tuple[Blocks, list[np.ndarray], float, dict[str, float]]:
    """The worst failing gradient blocks (over the full S: what the backward reads), recomputed (float64) from
    `read`, and the share of their excess error that explains (and each gradient's error in benchmark units)."""
    ctx = Context(case, read, {s.batch: s for s in case.spans() if s.q_len and s.kv_len})
    blocks = gather_blocks(case, ctx, grads, device, golden, benchmark)
    values = [recompute(ctx, NULL, t) for t in blocks.targets]
    share, ratios = blocks.explained(values) if blocks.targets else (0.0, {})
    return blocks, values, share, ratios


#: Share of the failing gradients' excess error the backward recomputed with the padding rows read must
#: explain for `padding-rows-read` to be named.
PADDING_EXPLAINS = 0.5


def score_padding(
    case: Case,
    causes: Sequence[Cause],
    tensors: Sequence[TensorResult],
    device: Arrays,
    golden: Arrays,
    benchmark: Arrays | None,
    read: Arrays,
) -> tuple[list[Cause], list[str]]:
    """Score `padding-rows-read` by where the gradients' error is: the failing blocks recomputed (float64) as a
    backward over the full S computes them, reading the padding rows' out and lse as the device's forward left
    them (`read`: the backward's inputs, attention_out and softmax_lse the device's). The parameter condition
    names the cause; this says whether it explains the error.

    Returns:
        The causes, `padding-rows-read` scored by the share it explains (dropped below `PADDING_EXPLAINS`), and
        notes (why it was dropped).
    """
    grads = [t for t in tensors if t.name in GRAD_NAMES]
    blocks, values, share, ratios = _recomputed(case, grads, device, golden, benchmark, read)
    if not blocks.targets:
        return list(causes), []
    text = f"under it, {blocks.falls(ratios)}" if ratios else ""
    if blocks.nonfinite and blocks.predicts_nonfinite(values):  # the NaN/Inf explained: half the score at least
        text = (text + "; " if text else "") + "it puts NaN/Inf where the device has them"
        share = 0.5 + 0.5 * share if ratios else 1.0
    padded = [t.words() for t in blocks.targets if _touches_padding(case, t)]
    count = f"{len(padded)} of the {len(blocks.targets)} worst blocks hold or read padding positions"
    where = f"; {count}" if padded else ""
    words = f"recomputed over the full S with the padding rows' out and lse as the forward left them: {text}{where}"
    kept, notes = [], []
    for cause in causes:
        if cause.kind != "padding-rows-read":
            kept.append(cause)
        elif share >= PADDING_EXPLAINS:
            kept.append(replace(cause, score=round(share, 4), evidence=f"{cause.evidence} ({words})"))
        else:
            notes.append(f"padding-rows-read not named: it explains {share:.0%} of the gradients' error ({words})")
    return kept, notes


def _touches_padding(case: Case, target: Any) -> bool:
    """Whether a gradient block holds rows past the actual lengths (dq: query rows; dk/dv: kv positions)."""
    x, y = case.block_shape
    lengths, size = (case.actual_seq_lengths, x) if target.tensor == "dq" else (case.actual_seq_lengths_kv, y)
    return lengths is not None and target.batch < len(lengths) and (target.block + 1) * size > lengths[target.batch]


def pick_tensors(arrays: Arrays, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The arrays of `names` that `arrays` holds."""
    return {n: arrays[n] for n in names if n in arrays}


#: The inputs a pair's backward reads from its forward: the forward's output of each.
_FROM_FORWARD = {"attention_out": "out", "softmax_lse": "lse"}


class PairInputs(Arrays):
    """A pair's inputs as the diagnosis reads a backward's: attention_out and softmax_lse from `forward`
    (the device's out and lse as the backward read them, or the golden's: the exact forward's), the others
    the case's inputs."""

    def __init__(self, inputs: Arrays, forward: Arrays) -> None:
        self.inputs, self.forward = inputs, forward

    def __getitem__(self, name: str) -> np.ndarray:
        return self.forward[_FROM_FORWARD[name]] if name in _FROM_FORWARD else self.inputs[name]

    def __iter__(self) -> Any:
        return iter((*self.inputs, "attention_out", "softmax_lse"))

    def __len__(self) -> int:
        return len(self.inputs) + 2
