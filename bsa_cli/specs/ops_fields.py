"""The keys of a case that say which operator calls it tests, and the forward's own parameters.

- `ops`: a list of `forward`, `backward`, `chain`, `autograd` (any order in YAML; stored in `ops.OPS` order,
  each once; default `[backward]`). Allowed in `defaults:` and matrices like any case key; `--ops`
  (`load_specs(..., ops=...)`) replaces it.
- `inner_precise`: the forward's innerPrecise, 0, 1 or 4 as the aclnn takes them (default 0, bsa's; torch_npu's
  binding defaults to 1); another integer only in a negative case (`expect:` a status).
- `softmax_lse_flag`: the forward's softmaxLseFlag, 0 or 1 (default 1, bsa's; torch_npu's binding defaults to
  0, which leaves lse unwritten); another integer only in a negative case.
- `step_scales`: `{forward: X, backward: Y}`, the scaleValue each step of the chain is called with where it is not
  `scale` (the function meant, which the golden computes; either step may be left out): a training step that
  takes the forward from one entry point and the backward from another, each with its own scale
  (`{forward: 1.0}`: cann_ops_transformer's default). Only with `chain` in `ops:` (autograd hands the forward's
  scale to the backward).
- `expect`: a status as before (`ok`, a code or its name), or a mapping `{status, verdict, cause}`: `verdict`
  PASS or FAIL and `cause` (a word such as `lse-unwritten`) say what judging the pair (chain, autograd) must
  conclude; they mean nothing to other ops (a spec error when its own ops list no pair op).

Each reader raises a SpecError naming the file, the case, the key and the bad value, with what is allowed.
"""

from __future__ import annotations

import re
from typing import Any

from ..core.case import Expect
from ..core.errors import show
from ..ops import (
    DEFAULT_OPS,
    INNER_PRECISE_DEFAULT,
    INNER_PRECISE_VALUES,
    OPS,
    PAIR_STEPS,
    SOFTMAX_LSE_FLAG_DEFAULT,
    Op,
    find,
)
from .fields import INT64_LIMIT, _expect, _mapping, _Reader, _suggest, refuse_unknown, scale_value

EXPECT_KEYS = ("status", "verdict", "cause")
VERDICTS = ("PASS", "FAIL")
#: A cause is one lower-case word, hyphens allowed: `lse-unwritten`, `padding-rows-read`.
CAUSE_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*\Z")

SOFTMAX_LSE_FLAG_VALUES = (0, 1)


def read_ops(r: _Reader) -> tuple[Op, ...]:
    """Return the case's `ops:` in OPS order (DEFAULT_OPS when absent)."""
    if "ops" not in r.raw:
        return DEFAULT_OPS
    value = r.get("ops")
    allowed = ", ".join(OPS)
    if isinstance(value, str):
        raise r.error("ops", f"{show(value)} is not a list: write 'ops: [{value}]' (a list of {allowed})")
    if not isinstance(value, list) or not value:
        raise r.error("ops", f"{show(value)} is not a non-empty list of ops; allowed: {allowed}")
    for word in value:
        if find(word) is None:
            raise r.error("ops", f"{show(word)} is not an op{_suggest(word, OPS)}; allowed: {allowed}")
    if len(set(value)) != len(value):
        twice = next(w for w in value if value.count(w) > 1)
        raise r.error("ops", f"{show(twice)} is listed twice: list each op once")
    return tuple(op for op in OPS if op in value)


def _forward_integer(r: _Reader, key: str, default: int, values: tuple[int, ...], negative: bool, allowed: str) -> int:
    """Return the forward's integer `key`: one of `values`, another integer only in a negative case."""
    value = r.integer(key, default, minimum=None, maximum=INT64_LIMIT - 1)
    if value not in values and not negative:
        raise r.error(key, f"{show(value)} is not allowed; allowed: {allowed}")
    return value


def read_forward_params(r: _Reader, negative: bool) -> tuple[int, int]:
    """Return `inner_precise:` (0, 1, 4) and `softmax_lse_flag:` (0, 1), another integer only in a negative case."""
    precise = (
        "0 (fp32 softmax, bsa's default), 1 (fp16 softmax, torch_npu's default), 4 (Ascend 950); another value "
        "only in a negative case (the aclnn returns 161002: set 'expect: 161002')"
    )
    lse = (
        "1 (lse written, bsa's default), 0 (lse left unwritten, torch_npu's default); another value only in a "
        "negative case (the A2/A3 tiling refuses it: set 'expect: 561002')"
    )
    return (
        _forward_integer(r, "inner_precise", INNER_PRECISE_DEFAULT, INNER_PRECISE_VALUES, negative, precise),
        _forward_integer(r, "softmax_lse_flag", SOFTMAX_LSE_FLAG_DEFAULT, SOFTMAX_LSE_FLAG_VALUES, negative, lse),
    )


def read_step_scales(r: _Reader) -> tuple[tuple[str, float], ...]:
    """Return `step_scales:` as `Case.step_scales` holds it ((step, scale) in PAIR_STEPS order; () when absent)."""
    raw = r.get("step_scales")
    if raw is None:
        return ()
    sub = _mapping(r, "step_scales", raw, PAIR_STEPS, "a chain's steps to the scaleValue each is called with")
    if not raw:
        raise r.error("step_scales", "is empty: give the scale of the forward, the backward or both (forward: 1.0)")
    return tuple((step, scale_value(sub, step, 0.0)) for step in PAIR_STEPS if step in raw)


def read_expect(r: _Reader) -> Expect:
    """Return `expect:`: a status (`fields._expect`), or a mapping {status, verdict, cause}."""
    raw = r.get("expect", "ok")
    if not isinstance(raw, dict):
        return _expect(r)
    refuse_unknown(r, raw, EXPECT_KEYS, "expect.")
    status = _expect(_Reader(r.path, {"expect": raw.get("status", "ok")}, r.case, f"{r.prefix}expect."))
    sub = r.nested("expect", raw)
    verdict = raw.get("verdict", "PASS")
    verdict = verdict.upper() if isinstance(verdict, str) and verdict.upper() in VERDICTS else verdict
    if verdict not in VERDICTS:
        raise sub.error(
            "verdict", f"{show(verdict)} is not allowed{_suggest(verdict, VERDICTS)}; allowed: {', '.join(VERDICTS)}"
        )
    cause = raw.get("cause")
    if cause is not None and not (isinstance(cause, str) and CAUSE_RE.match(cause) and len(cause) <= 64):
        raise sub.error("cause", f"{show(cause)} is not a cause: one lower-case word, hyphens allowed (lse-unwritten)")
    if verdict == "FAIL" and cause is None:
        raise sub.error(
            "cause", "verdict FAIL needs the cause its report must name (for example 'cause: lse-unwritten')"
        )
    if verdict == "PASS" and cause is not None:
        raise sub.error("cause", f"{show(cause)} is for 'verdict: FAIL' only (the cause a failing pair must name)")
    if verdict == "FAIL" and not status.ok:
        raise sub.error(
            "verdict",
            f"FAIL with status {status.status}: a negative case is judged by its status; verdict FAIL is for a "
            "pair the operators accept that must fail its judging",
        )
    return Expect(status=status.status, name=status.name, verdict=verdict, cause=cause)


def judges_pair(expect: Expect) -> bool:
    """Whether an expectation says something only the pair's judging can tell (verdict FAIL, a cause)."""
    return expect.verdict != "PASS" or expect.cause is not None


def forward_keys_given(raw: Any) -> list[str]:
    """Return the forward's own keys a raw case gives (inner_precise, softmax_lse_flag)."""
    return [key for key in ("inner_precise", "softmax_lse_flag") if isinstance(raw, dict) and key in raw]
