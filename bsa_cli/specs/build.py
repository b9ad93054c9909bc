"""One expanded raw case -> a validated `Case`: its fields, geometry, sizes, finite values, interface rules, warnings.

`build_case` reads every key (`fields`), works out the shapes (TND takes them from the lengths), refuses
tensors beyond MAX_ELEMENTS and init values or scales with which the inputs or the golden cannot be
finite, then holds the call to the operator's interface rules (`interface`): a case meant to pass must
break none (the likeliest mistakes get their fix first), a negative case must break one whose status is
the one it expects. A valid case carries the warnings where the golden and the A2/A3 kernel part ways.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from ..core import rounding
from ..core.case import BNSD_LENGTHS, LSE_SHAPES, MAX_TOKENS, SEQ_LENGTHS_ENCODINGS, Case, Expect, Layout
from ..core.errors import SpecError, show
from ..core.untrusted import MAX_NAME_BYTES, is_case_name
from ..inputs import fit_explicit, stress, unreachable_kv_blocks
from ..ops import CALLS, FORWARD_OPS, OPS, Op, get, interface
from ..ops.interface import BACKWARD_CALL, LENGTH_KEYS, Call
from .fields import (
    CASE_KEYS,
    FLOAT32_MAX,
    INT64_LIMIT,
    TENSORS,
    _block_shape,
    _compare,
    _init,
    _null_layouts,
    _Reader,
    _release,
    _sparsity,
    _tensors,
    read_dtype,
    refuse_unknown,
    scale_value,
)
from .ops_fields import forward_keys_given, judges_pair, read_expect, read_forward_params, read_ops, read_step_scales

NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+\Z")  # \Z: `$` would also match before a final newline

#: Most elements of one tensor (query, key/value or the block mask) of a case: beyond any real case, and
#: far enough from int64 overflow that every size and cost bsa computes stays exact.
MAX_ELEMENTS = 1 << 40

#: What a layout string may be (a negative case may pass one the operator rejects).
LAYOUT_RE = re.compile(r"^[A-Za-z0-9_]{1,16}\Z")


def build_case(
    path: Path, raw: dict[str, Any], suffix: str = "", release: str | None = None, ops: tuple[Op, ...] | None = None
) -> Case:
    """Validate one expanded raw case and return it as a `Case` (`release`, if given, replacing its own).

    `ops` (`--ops`), if given, replaces the case's own `ops:`; each listed op's status is then worked out
    again (`Case.op_expect`, `Case.skipped_ops`), and the forward's keys and a pair's verdict, which mean
    nothing to the ops it leaves, are not an error then.
    """
    r, name = _reader(path, raw, suffix)
    expect = read_expect(r)
    case_ops = read_ops(r)
    _check_ops_keys(r, case_ops, expect, override=ops is not None)
    case_ops = tuple(op for op in OPS if op in ops) if ops is not None else case_ops
    calls_forward = any(get(op).calls_forward for op in case_ops)
    inner_precise, softmax_lse_flag = read_forward_params(r, not expect.ok)
    step_scales = read_step_scales(r)
    layout, kv_layout, nulls = _layouts(r, raw)
    dtype = read_dtype(r, "dtype", r.get("dtype", "float16"), "float16 (fp16), bfloat16 (bf16)")
    num_heads = r.integer("num_heads", minimum=1)
    num_kv_heads = r.integer("num_kv_heads", num_heads, minimum=1)
    head_dim = r.integer("head_dim", 128, minimum=1)
    batch, q_seq_len, kv_seq_len, q_lengths, kv_lengths = _sizes(r, raw, layout == "TND")
    block_shape = _block_shape(r, expect)
    case = Case(
        name=name,
        source=str(path),
        layout=layout,
        kv_layout=kv_layout,
        dtype=dtype,
        batch=batch,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        q_seq_len=q_seq_len,
        kv_seq_len=kv_seq_len,
        actual_seq_lengths=q_lengths,
        actual_seq_lengths_kv=kv_lengths,
        block_shape=block_shape,
        scale=_scale(r, head_dim),
        seed=r.integer("seed", 0, maximum=2**64 - 1),
        sparsity=_sparsity(r, path),
        init=_init(r),
        expect=expect,
        seq_lengths_encoding=r.choice("seq_lengths_encoding", SEQ_LENGTHS_ENCODINGS, "per_batch"),
        lse_shape=r.choice("lse_shape", LSE_SHAPES, "trailing_one"),
        bnsd_lengths=r.choice("bnsd_lengths", BNSD_LENGTHS, "honored"),
        empty_row_lse=r.number("empty_row_lse", math.inf),
        mask_type=r.integer("mask_type", 0, minimum=None, maximum=INT64_LIMIT - 1),
        pre_tokens=r.integer("pre_tokens", MAX_TOKENS, minimum=None, maximum=INT64_LIMIT - 1),
        next_tokens=r.integer("next_tokens", MAX_TOKENS, minimum=None, maximum=INT64_LIMIT - 1),
        tensors=_tensors(r),
        compare=_compare(r),
        release=release if release is not None else _release(r),
        null_layouts=nulls,
        ops=case_ops,
        inner_precise=inner_precise if calls_forward else Case.inner_precise,
        softmax_lse_flag=softmax_lse_flag if calls_forward else Case.softmax_lse_flag,
        step_scales=step_scales,  # read by the ops that call each step themselves (`Op.scales_per_step`)
    )
    _check_sizes(r, case)
    case = _copies(r, case)
    _check_finite(r, case)
    _check_mask(r, case)
    if all(get(op).is_default for op in case.ops) and not judges_pair(case.expect):
        try:
            return _check_interface(r, case)  # a backward-only case: exactly the Case bsa always built
        except SpecError:
            if ops is None:
                raise
            # --ops backward on a suite written for the forward: skipped with why, not an error
    return _check_ops(r, case, override=ops is not None)


def _reader(path: Path, raw: dict[str, Any], suffix: str) -> tuple[_Reader, str]:
    """Return a reader of a raw case and the case's name (its `name` and `suffix`), refusing a name that
    cannot name a case folder and keys bsa does not know."""
    base_name = raw.get("name")
    r = _Reader(path, raw, base_name if isinstance(base_name, str) else show(base_name))
    if not isinstance(base_name, str) or not base_name:
        raise r.error("name", "every case needs a 'name' (letters, digits, '_', '.', '-')")
    name = base_name + suffix
    r.case = show(name, 80).strip("'")
    if not NAME_RE.match(name):
        raise r.error("name", f"{show(name)} may hold only letters, digits, '_', '.', '-'")
    if not is_case_name(name):
        raise r.error(
            "name",
            f"{show(name)} cannot name a case folder: a name is not '.' or '..', does not "
            f"start with '.' (hidden), and has at most {MAX_NAME_BYTES} characters",
        )
    refuse_unknown(r, raw, CASE_KEYS)
    return r, name


def _layouts(r: _Reader, raw: dict[str, Any]) -> tuple[Layout, Layout | None, tuple[str, ...]]:
    """Return the layout, the kv layout (None: the layout's) and the layouts passed as null."""
    layout = r.get("layout", "BNSD")
    kv_layout = r.get("kv_layout")
    nulls = _null_layouts(r, raw)
    for key, value in (("layout", layout), ("kv_layout", kv_layout)):
        if value is not None and not (isinstance(value, str) and LAYOUT_RE.match(value)):
            raise r.error(
                key, f"{show(value)} is not a layout string (up to 16 letters, digits or '_'); allowed: BNSD, TND"
            )
    return layout, kv_layout, nulls


Lengths = tuple[int, ...] | None


def _sizes(r: _Reader, raw: dict[str, Any], tnd: bool) -> tuple[int, int, int, Lengths, Lengths]:
    """Return (batch, q_seq_len, kv_seq_len, actual lengths, kv actual lengths): TND takes the sizes from
    the lengths; kv lengths not given are the q lengths where they can be."""
    q_lengths = r.lengths("actual_seq_lengths")
    kv_lengths = r.lengths("actual_seq_lengths_kv")
    kv_lengths_null = "actual_seq_lengths_kv" in raw and raw["actual_seq_lengths_kv"] is None
    if tnd:
        if kv_lengths is None and q_lengths is not None and not kv_lengths_null:
            kv_lengths = q_lengths
        for key in ("q_seq_len", "kv_seq_len"):
            if raw.get(key) is not None and q_lengths is not None:
                raise r.error(key, "applies to BNSD only; TND takes its maximum from actual_seq_lengths")
        if q_lengths is None:  # a negative case (missing lengths): tensors still need a shape
            q_seq_len = r.integer("q_seq_len", 128)
            kv_seq_len = r.integer("kv_seq_len", q_seq_len)
            batch = r.integer("batch", 1, minimum=1)
        else:
            batch = len(q_lengths)
            if "batch" in raw and raw["batch"] != batch:
                raise r.error("batch", f"{show(raw['batch'])} differs from the {batch} entries of actual_seq_lengths")
            q_seq_len = max(q_lengths, default=0)
            # a negative case with null kv lengths: kv tensors take the q lengths' shape
            kv_seq_len = max(kv_lengths if kv_lengths is not None else q_lengths, default=0)
    else:
        batch = r.integer("batch", 1, minimum=1)
        q_seq_len = r.integer("q_seq_len", minimum=1)
        kv_seq_len = r.integer("kv_seq_len", q_seq_len, minimum=1)
        if kv_lengths is None and q_lengths is not None and kv_seq_len == q_seq_len and not kv_lengths_null:
            kv_lengths = q_lengths
        for key, lengths, limit in zip(LENGTH_KEYS, (q_lengths, kv_lengths), (q_seq_len, kv_seq_len), strict=True):
            if lengths is not None and max(lengths, default=0) > limit:
                raise r.error(key, f"{show(list(lengths))}: a length exceeds the sequence dimension {limit}")
    for key, lengths in zip(LENGTH_KEYS, (q_lengths, kv_lengths), strict=True):
        if lengths is not None and len(lengths) != batch:
            raise r.error(key, f"has {len(lengths)} entries, but batch is {batch}: give one length per batch")
    return batch, q_seq_len, kv_seq_len, q_lengths, kv_lengths


def _scale(r: _Reader, head_dim: int) -> float:
    return scale_value(r, "scale", 1.0 / math.sqrt(head_dim))


def _check_mask(r: _Reader, case: Case) -> None:
    """Refuse an explicit mask that does not fit the case, and empty rows beyond its query blocks."""
    if case.sparsity.explicit is not None:
        try:
            fit_explicit(case.sparsity.explicit, case.mask_shape)
        except ValueError as exc:
            raise r.error("sparsity.mask", str(exc)) from None
    rows = case.sparsity.empty_rows
    if isinstance(rows, tuple) and rows and max(rows) >= case.num_q_blocks:
        raise r.error(
            "sparsity.empty_rows",
            f"index {max(rows)} is beyond the case's {case.num_q_blocks} query-block "
            f"rows (indices 0 to {case.num_q_blocks - 1}): the mask has no such row",
        )


def _check_ops_keys(r: _Reader, ops: tuple[Op, ...], expect: Expect, override: bool) -> None:
    """Refuse keys the case's own ops never read: the forward's parameters without an op that calls the
    forward, a pair's verdict or cause without chain or autograd (an `--ops` override is not refused)."""
    if override:
        return
    if not any(get(op).calls_forward for op in ops):
        for key in forward_keys_given(r.raw):
            raise r.error(
                key,
                f"is the forward's parameter, but the case's ops are {', '.join(ops)}: add an op that calls the "
                f"forward ({', '.join(FORWARD_OPS)}) to 'ops:', or remove it",
            )
    if "step_scales" in r.raw and not any(get(op).scales_per_step for op in ops):
        steps = ", ".join(op for op in OPS if get(op).scales_per_step)
        raise r.error(
            "step_scales",
            f"is the scale of each step of a pair of separate calls, but the case's ops are {', '.join(ops)}: add "
            f"{steps} to 'ops:', or remove it (autograd hands the forward's scale to the backward)",
        )
    if judges_pair(expect) and not any(get(op).pair for op in ops):
        raise r.error(
            "expect",
            f"verdict and cause judge the pair, but the case's ops are {', '.join(ops)}: add chain or autograd "
            "to 'ops:', or expect a status only",
        )


def _check_sizes(r: _Reader, case: Case) -> None:
    """Refuse a case whose tensors hold more than MAX_ELEMENTS elements, or that has nothing to compute."""
    shapes = {"query": case.q_shape, "key and value": case.kv_shape, "block_sparse_mask": case.mask_shape}
    for what, shape in shapes.items():
        count = math.prod(shape)
        if count > MAX_ELEMENTS:
            raise r.error(
                "batch" if what != "block_sparse_mask" else "block_shape",
                f"{what} would have shape {list(shape)}: {count:.3g} elements, more than bsa's limit "
                f"of 2^{MAX_ELEMENTS.bit_length() - 1}",
            )
    if case.expect.ok and math.prod(case.q_shape) == 0 and math.prod(case.kv_shape) == 0:
        raise r.error("actual_seq_lengths", "every length is 0: the case has nothing to compute or compare")


def _copies(r: _Reader, case: Case) -> Case:
    """Read `copies: [[copy, source], ...]`: batch entries that hold another entry's sequence, of equal lengths."""
    raw = r.get("copies", None)
    if raw is None:
        return case
    spans = case.spans()
    allowed = f"a list of [copy, source] pairs of batch entries 0..{len(spans) - 1} with equal lengths"
    if not isinstance(raw, list) or not raw:
        raise r.error("copies", f"{show(raw)} is not {allowed}")
    pairs: list[tuple[int, int]] = []
    for pair in raw:
        ok = isinstance(pair, list) and len(pair) == 2 and all(type(v) is int for v in pair)
        if not ok or not all(0 <= v < len(spans) for v in pair) or pair[0] == pair[1]:
            raise r.error("copies", f"{show(pair)} is not a pair [copy, source] of batch entries 0..{len(spans) - 1}")
        copy, source = pair
        if (spans[copy].q_len, spans[copy].kv_len) != (spans[source].q_len, spans[source].kv_len):
            raise r.error("copies", f"{show(pair)}: entries {copy} and {source} have other lengths; {allowed}")
        if copy in {c for c, _ in pairs} or copy in {s for _, s in pairs} or source in {c for c, _ in pairs}:
            raise r.error("copies", f"{show(pair)}: an entry is a copy once, and a copy is no source")
        pairs.append((copy, source))
    return dataclasses.replace(case, copies=tuple(pairs))


def _check_finite(r: _Reader, case: Case) -> None:
    """Refuse init values and scales with which the inputs or the golden cannot be finite.

    Inputs are drawn then rounded to the case dtype: values beyond its largest finite number become inf.
    Scores (scale * q.k over head_dim), dP and the gradients are bounded with those magnitudes; a bound
    past float32's largest number means the golden overflows.
    """
    if case.dtype not in ("float16", "bfloat16", "float32", "float64"):
        return  # a negative case of another dtype: the operator rejects it before reading values
    largest = rounding.largest(case.dtype)
    size = {}
    init = case.init
    if (init.sink is not None or init.logit_std is not None) and case.kernel_scale == 0:
        raise r.error(
            "init.sink" if init.sink is not None else "init.logit_std",
            "needs a nonzero scale: it is defined by the scaled scores",
        )
    if init.sink is not None and stress.query_spread(case) == 0:
        raise r.error("init.sink", "needs queries that vary (std or range > 0): they move by twice their std")
    for tensor in TENSORS:
        dist = getattr(init, tensor)
        if init.logit_std is not None and tensor in ("query", "key"):
            dist = dataclasses.replace(dist, kind="normal", mean=0.0, std=stress.logit_std_spread(case))
        # a bound that drawn values exceed only rarely: the larger uniform bound, or |mean| + 4 std
        bounded = dist.kind in ("uniform", "exact")  # these lie in [low, high]; normal and noisy by mean and std
        size[tensor] = max(abs(dist.low), abs(dist.high)) if bounded else abs(dist.mean) + 4.0 * dist.std
        if dist.row_scale is not None:
            size[tensor] *= dist.row_scale.high
        if dist.outliers is not None:
            size[tensor] *= max(1.0, dist.outliers.factor)
        if dist.kind == "noisy":
            size[tensor] *= stress.NOISE_FACTOR
        if init.sink is not None and tensor == "query":
            size[tensor] += stress.sink_query_shift(case)
        if init.sink is not None and tensor == "key":
            size[tensor] = max(size[tensor], stress.sink_key_length(case))
        if size[tensor] > largest:
            raise r.error(
                f"init.{tensor}",
                f"values of {tensor} reach about {size[tensor]:.3g}, beyond "
                f"{case.dtype}'s largest number {largest:.5g}: the inputs and the golden cannot be "
                "finite",
            )
    d = case.head_dim
    scale = max(abs(s) for s in (case.scale, *dict(case.step_scales).values()))  # a chain step's own scale too
    scores = scale * d * size["query"] * size["key"]
    dscores = 2.0 * d * size["dout"] * size["value"]
    grads = scale * max(case.q_seq_len, case.kv_seq_len) * dscores * max(size["key"], size["query"])
    for what, bound in (("scores scale*q.k", scores), ("dP = dout.v", dscores), ("dq and dk", grads)):
        if bound > FLOAT32_MAX:
            raise r.error(
                "init",
                f"with these values and scale {scale:.3g}, {what} may reach {bound:.3g}, "
                "beyond float32's largest number: the golden cannot be finite; use a smaller scale or "
                "init",
            )


def _fix_first(case: Case, v: interface.Violation) -> str | None:
    """Return the message of an interface violation that a case meant to pass has most likely made by
    mistake, with the fix first and `expect:` (for a negative case) second; None for any other."""
    negative = (
        f"for a negative case that tests this instead, set 'expect: {v.status}' (the operator returns {v.status})"
    )
    if v.key in ("layout", "kv_layout"):
        value = getattr(case, v.key)
        if isinstance(value, str) and value != value.upper() and value.upper() in interface.TILING_LAYOUTS:
            return (
                f"{show(value)} is not a layout the operator knows (did you mean '{value.upper()}'? layout "
                f"strings are upper case); {negative}"
            )
    if v.key in LENGTH_KEYS and "TND" in v.message and "is null" in v.message:
        which = "query" if v.key == "actual_seq_lengths" else "key/value"
        return (
            f"{v.message}: add '{v.key}: [...]' to the case, one {which} length per batch entry (for example "
            f"'{v.key}: [1000, 333]'); {negative}"
        )
    return None


def _check_interface(r: _Reader, case: Case) -> Case:
    """Refuse interface violations the case does not expect; attach kernel-constraint warnings."""
    undefined = BACKWARD_CALL.undefined_behaviour(case)
    if undefined:
        key = "tensors" if case.tensors else "layout"
        key = "null_layouts" if case.null_layouts and "layout" in undefined[0] else key
        raise r.error(
            key,
            f"{undefined[0]}: undefined behaviour, no status to expect (ops-transformer "
            f"{case.release} reads it unchecked)",
        )
    broken = BACKWARD_CALL.violations(case)
    if case.expect.ok:
        if broken:
            v = broken[0]
            key = v.key if v.key in CASE_KEYS or v.key != "query" or case.override("query") else "dtype"
            key = key if key in CASE_KEYS else f"tensors.{key}"
            raise r.error(
                key,
                _fix_first(case, v)
                or f"{v.message}: the operator returns {v.status}; set 'expect: {v.status}' for a negative case",
            )
        warnings = (*BACKWARD_CALL.kernel_constraints(case), *unreachable_kv_blocks(case))
        return dataclasses.replace(case, warnings=tuple(warnings))
    if not broken:
        raise r.error(
            "expect", f"expects {case.expect.name} ({case.expect.status}), but the case breaks no interface rule"
        )
    if broken[0].status != case.expect.status:
        v = broken[0]
        raise r.error(
            "expect", f"expects {case.expect.status}, but '{v.key}' ({v.message}) makes the operator return {v.status}"
        )
    return case


def _check_ops(r: _Reader, case: Case, override: bool = False) -> Case:
    """Work out each listed op's status and fill `op_expect` and `skipped_ops` (docs/interface.md, "The forward").

    A valid case: an op its operator refuses is skipped with why when another listed op accepts the case;
    when every listed op refuses it, the error of a valid case that breaks a rule. A negative case: every
    listed op returns the expected status or accepts the case (then judged as a valid op); another nonzero
    status is an error, and so is no op returning the expected one. An op that does not judge the pair gets
    a plain Expect() where `expect` holds a verdict or cause.

    With `override` (the ops came from `--ops`, not from the case), what would be an error is a skip with
    why: the suite was written for other ops, and each case is judged for the ops that accept it.
    """
    undefined_for = _undefined_ops(r, case, override)  # under --ops: ops with no status to expect, skipped
    if undefined_for:
        rest = [op for op in case.ops if op not in undefined_for]
        narrowed = _check_ops(r, dataclasses.replace(case, ops=tuple(rest)), override) if rest else case
        skipped_all = sorted((*narrowed.skipped_ops, *undefined_for.items()), key=lambda item: OPS.index(item[0]))
        return dataclasses.replace(narrowed, ops=case.ops, skipped_ops=tuple(skipped_all))
    statuses = {op: get(op).status(case) for op in case.ops}
    if case.expect.ok and not override and all(status for status, _ in statuses.values()):
        return _every_op_refuses(r, case, statuses)
    op_expect, skipped = _valid_ops(case, statuses) if case.expect.ok else _negative_ops(r, case, statuses, override)
    warnings: tuple[str, ...] = ()
    if case.expect.ok:  # each operator's own gaps between golden and kernel, for the ops that call it
        warnings = (*(w for call in _calls(case) for w in call.kernel_constraints(case)), *unreachable_kv_blocks(case))
    return dataclasses.replace(
        case,
        op_expect=tuple(sorted(op_expect, key=lambda item: OPS.index(item[0]))),
        skipped_ops=tuple(skipped),
        warnings=warnings,
    )


def _calls(case: Case) -> list[Call]:
    """Return the operators the case's ops call, in the order their rules are checked (`CALLS`)."""
    return [call for call in CALLS if any(call in get(op).steps for op in case.ops)]


def _undefined_ops(r: _Reader, case: Case, override: bool) -> dict[str, str]:
    """Return the ops whose operators leave something of the case undefined (no status to expect), each with
    why; without `override`, such a case is an error."""
    found: dict[str, str] = {}
    for call in _calls(case):
        calling = [op for op in case.ops if call in get(op).steps]
        undefined = call.undefined_behaviour(case)
        if undefined and not override:
            key = "null_layouts" if case.null_layouts and "layout" in undefined[0] else "tensors"
            ops = ", ".join(calling)
            raise r.error(key, call.undefined_error.format(first=undefined[0], ops=ops, release=case.release))
        for op in calling if undefined else ():
            found.setdefault(op, call.undefined_skip.format(first=undefined[0]))
    return found


#: What `_check_ops` makes of each op: (its op_expect, its skipped ops).
Judged = tuple[list[tuple[str, Expect]], list[tuple[str, str]]]


def _every_op_refuses(r: _Reader, case: Case, statuses: dict[str, tuple[int, str]]) -> Case:
    """Refuse a valid case that every listed op refuses: the backward's own message (with the fix first
    where there is one) when the first op calls the backward alone."""
    op = case.ops[0]
    status, message = statuses[op]
    if not get(op).calls_forward:
        return _check_interface(r, case)
    raise r.error(
        "expect",
        f"every listed op refuses the case; the {op} returns {status} ({message}): set "
        f"'expect: {status}' for a negative case, or list an op that accepts it",
    )


def _valid_ops(case: Case, statuses: dict[str, tuple[int, str]]) -> Judged:
    """A valid case: the ops that refuse it are skipped with why (all of them, under `--ops`, when none accepts)."""
    accepting = [op for op in case.ops if statuses[op][0] == 0]
    if not accepting:
        return [], [(op, f"{get(op).refusal(case)}; no op --ops asked for accepts it") for op in case.ops]
    accepted = f"{' and '.join(f'the {op}' for op in accepting)} accept{'s' if len(accepting) == 1 else ''} it"
    op_expect: list[tuple[str, Expect]] = []
    skipped: list[tuple[str, str]] = []
    for op in case.ops:
        if statuses[op][0] != 0:
            skipped.append((op, f"{get(op).refusal(case)}; {accepted}"))  # "the backward and the chain accept it"
        elif judges_pair(case.expect) and not get(op).pair:
            op_expect.append((op, Expect()))
        elif judges_pair(case.expect) and case.step_scales and not get(op).scales_per_step:
            op_expect.append((op, Expect()))  # autograd hands the forward's scale on: the steps' scales are not its
    return op_expect, skipped


def _negative_ops(r: _Reader, case: Case, statuses: dict[str, tuple[int, str]], override: bool) -> Judged:
    """A negative case: each op returns the expected status, or accepts the case (then judged as a valid op)."""
    op_expect: list[tuple[str, Expect]] = []
    skipped: list[tuple[str, str]] = []
    expected = case.expect.status
    for op in case.ops:
        status, message = statuses[op]
        if status == 0:
            op_expect.append((op, Expect()))
        elif status != expected and override:
            skipped.append((op, f"the {op} returns {status} ({message}) where the case expects {expected}"))
        elif status != expected:
            raise r.error(
                "expect", f"expects {expected}, but for op {op} '{message}' makes the operator return {status}"
            )
    if not override and all(status != expected for status, _ in statuses.values()):
        raise r.error(
            "expect",
            f"expects {case.expect.name} ({expected}), but no listed op ({', '.join(case.ops)}) "
            "breaks an interface rule",
        )
    return op_expect, skipped
