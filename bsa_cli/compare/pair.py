"""The pair (ops chain and autograd): the causes a failing chain is named by, and its expected verdict.

A chain runs the forward, then the backward on the forward's OWN out and lse. Two of its pitfalls
(docs/interface.md, "The forward") make the backward read what the forward never wrote, and are named here when the
chain's gradients fail:

* `lse-unwritten`: softmax_lse_flag 0, so the forward leaves softmaxLse unwritten and the backward reads
  the buffer as it is (the NaN prefill, or uninitialised memory on a real NPU); or a forward that left
  lse rows unwritten although the flag is 1 (its `rows-written` check says so);
* `padding-rows-read`: BNSD actual lengths below S with `bnsd_lengths: ignored`: the backward computes over
  the full S and reads the padding rows' out and lse, which the forward leaves unwritten;
* `scale-mismatch`: the chain's two calls are given two scales (`step_scales`: a forward from
  cann_ops_transformer left at its default 1.0, a backward given D^-0.5): the gradients are of another function.

A case of cases/chain.yaml may expect the pair to fail for a cause (`expect.verdict: FAIL`, `expect.cause`):
it then passes when it fails naming that cause, and fails when it passes or fails for another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ..core.case import Case, Expect
from ..store.manifest import GRAD_NAMES
from .forward import NOT_WRITTEN
from .results import EXPECTED_VERDICT, Cause, Check, TensorResult

#: The causes a failing chain is named by (docs/compare.md, "The forward and the pair"), each with whether its
#: pitfall may fail the forward step's out and lse too (a forward called at another scale than the case means).
PAIR_CAUSES = {"lse-unwritten": False, "padding-rows-read": False, "scale-mismatch": True}


def pair_causes(
    case: Case,
    forward_params: Mapping[str, int],
    tensors: Sequence[TensorResult],
    step_scales: Mapping[str, float] | None = None,
) -> list[Cause]:
    """Return the pair's causes that explain failing gradients of a chain (none when dq, dk, dv pass);
    `step_scales`: the scaleValue each step was called with (`Manifest.step_scales`; None: the case's)."""
    failing = tuple(t.name for t in tensors if t.name in GRAD_NAMES and not t.passed)
    if not failing:
        return []
    names = ", ".join(failing)
    causes = []
    # out's rows skipped as well: the forward skipped rows (its diagnosis says why)
    unwritten = [] if _rows_unwritten(tensors, "out") else _rows_unwritten(tensors, "lse")
    if forward_params.get("softmax_lse_flag", 1) == 0:
        why = (
            "never wrote (softmax_lse_flag 0: torch_npu's default leaves lse unwritten, and the backward reads the "
            "buffer as it is)"
        )
    else:
        why = f"did not write although softmax_lse_flag is 1 ({unwritten[0].detail})" if unwritten else ""
    if why:
        evidence = f"the backward read softmaxLse that the forward {why}: {names} fail"
        causes.append(Cause("lse-unwritten", 1.0, evidence, failing, ()))
    sides = (
        ("query rows", case.actual_seq_lengths, case.q_seq_len),
        ("kv positions", case.actual_seq_lengths_kv, case.kv_seq_len),
    )
    q_padding, kv_padding = (_padding(case, lengths, size) for _, lengths, size in sides)
    if q_padding or kv_padding:
        read = []
        if q_padding:
            read.append(
                f"{q_padding} query padding rows past the actual lengths {list(case.actual_seq_lengths or ())} of "
                f"S {case.q_seq_len}, whose out and lse the forward leaves unwritten"
            )
        if kv_padding:
            read.append(
                f"{kv_padding} key/value padding positions past the actual kv lengths "
                f"{list(case.actual_seq_lengths_kv or ())} of S {case.kv_seq_len}, which the forward never attended to"
            )
        evidence = (
            f"the backward computes over the full S (bnsd_lengths: ignored) and read {' and '.join(read)}: {names} fail"
        )
        where = tuple(
            f"batch {b}: {what} {n} to {size}"
            for what, lengths, size in sides
            for b, n in enumerate(lengths or ())
            if n < size
        )
        causes.append(Cause("padding-rows-read", 1.0, evidence, failing, where))
    mismatch = _scale_mismatch(case, step_scales or {}, names)
    if mismatch:
        causes.append(Cause("scale-mismatch", 1.0, mismatch, failing, ()))
    return causes


#: Share of each failing gradient's excess error the backward at its own scale, recomputed from the device's out
#: and lse, must explain for `scale-mismatch` to be named (a backward wrong in another way is not laid to it).
#: The share is of squared error: 0.99 leaves a tenth of the error; a backward also off by a factor 2 leaves more.
SCALE_MISMATCH_EXPLAINS = 0.99


def _scale_mismatch(case: Case, step_scales: Mapping[str, float], names: str) -> str:
    """Return the evidence of `scale-mismatch` (the steps called with scales the kernel holds apart), or ""."""
    forward, backward = (step_scales.get(step, case.scale) for step in ("forward", "backward"))
    if float(np.float32(forward)) == float(np.float32(backward)):  # the kernels compute with float(scaleValue)
        return ""
    meant = f"; the case means {case.scale:.4g}" if case.scale not in (forward, backward) else ""
    return (
        f"the forward ran at scale {forward:.4g}, the backward at {backward:.4g} (the scaleValue each call was "
        f"given{meant}): the gradients are of another function: {names} fail"
    )


def _rows_unwritten(tensors: Sequence[TensorResult], name: str) -> list[Check]:
    """Return a forward output's failed `rows-written` checks that say rows it must write were not."""
    return [
        c
        for t in tensors
        if t.name == name
        for c in t.checks
        if c.name == "rows-written" and not c.passed and NOT_WRITTEN in c.detail
    ]


def _padding(case: Case, lengths: tuple[int, ...] | None, size: int) -> int:
    """Return the BNSD positions past the actual lengths that a backward over the full S reads (per head)."""
    if case.layout == "TND" or case.bnsd_lengths != "ignored" or lengths is None:
        return 0
    return sum(max(size - n, 0) for n in lengths)


def cause_checks(causes: Sequence[Cause]) -> list[Check]:
    """Return the case-level checks that name the pair's causes in a failing chain's message (first)."""
    return [
        Check(c.kind, None, float(len(c.tensors)), None, False, f"{c.kind}: {c.evidence}", math.inf) for c in causes
    ]


#: Score the expected cause must have for a pitfall case to fail as it must (below it, another error is there too).
EXPECTED_EXPLAINS = 0.9


def expected_verdict(
    expect: Expect, failed: bool, causes: Sequence[Cause], message: str, forward_failed: bool = False
) -> tuple[Check | None, str | None]:
    """Apply a chain's expected verdict (`expect.verdict`, `expect.cause`) to how it was judged.

    The expectation is met when the chain fails, its forward step's out and lse pass (a pitfall is the
    backward misreading a right forward; `PAIR_CAUSES` says which pitfalls may fail the forward too) and the
    expected cause is named with a score of at least
    `EXPECTED_EXPLAINS` (below it, something else is wrong too).

    Returns:
        (a failing check to add, or None) and the text of a met expectation ("fails as it must: ..."),
        which makes the verdict PASS.
    """
    if expect.verdict != "FAIL":
        return None, None
    wanted = expect.cause
    named = [c.kind for c in causes]
    must = f"must fail naming {wanted}" if wanted else "must fail"
    weak = [c for c in causes if c.kind == wanted and c.score < EXPECTED_EXPLAINS]
    # a pitfall is the backward misreading a right forward, not a wrong forward (but a forward at another scale)
    if failed and forward_failed and not PAIR_CAUSES.get(wanted or "", False):
        text = f"fails, but the forward's out or lse fail too, which the pitfall is not ({must}): {message}"
    elif failed and (wanted is None or wanted in named) and not weak:
        return None, f"fails as it must: {message}"
    elif failed and weak:
        text = (
            f"fails, but {wanted} explains only {weak[0].score:.0%} of the gradients' error (expect.cause): "
            f"something else is wrong too: {message}"
        )
    elif not failed:
        text = f"passes, but {must} (expect.verdict FAIL)"
    else:
        found = ", ".join(named) if named else "no pair cause"
        text = f"fails, but for {found}, not {wanted} (expect.cause): {message}"
    return Check(EXPECTED_VERDICT, None, 1.0, None, False, text, math.inf), None
