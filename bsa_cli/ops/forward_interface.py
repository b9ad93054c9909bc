"""The aclnnBlockSparseAttention (forward) interface rules, and the chain's: the forward, then the backward.

Read from ops-transformer master 5778144 (5778144076def6311557939ab5cbfe8303f13e8f, 2026-08-21; public mirror
github.com/libochao-huawei/ops-transformer), under `attention/block_sparse_attention/op_host/`:

- `op_api/aclnn_block_sparse_attention.cpp`: `ValidateParams` (query/key/value null 161001; query
  fp16/bf16 and key/value of its dtype 161002; a null layout 161001; layout whitelist TND/BNSD/BSND,
  q == kv layout, blockShape of 2 positive values when given: 161002), `ValidateAdditionalParams`
  (innerPrecise in {0, 1, 4} 161002, attentionOut null 161001), `MakeContiguous` (a given mask not 4-D
  161002). A null blockSparseMask or blockShape passes aclnn; maskType is never checked.
- `block_sparse_attention_infershape.cpp`: the query's rank per q layout, key/value ranks per kv layout,
  numKeyValueHeads != key's N when nonzero, value's B (BNSD/BSND) and D != key's. `op_api/block_sparse_attention.cpp`
  (the l0op) returns null outputs when infershape fails, and GetWorkspaceSize then returns
  ACLNN_ERR_INNER_NULLPTR (561103).
- `block_sparse_attention_tiling.cpp` (one file for A2/A3 and the 950; bsa models A2/A3): `GetInputLayout`
  (BSND only on the 950), `ParseAttrs` (numKeyValueHeads 0; innerPrecise 0 or 1 only, 1 not with bf16;
  preTokens/nextTokens 2147483647; softmaxLseFlag 0 or 1), `ParseRequiredTensors` (BNSD q/k/v batch, q/k/v D,
  k/v N == numKeyValueHeads, N1 % numKeyValueHeads, D in {64, 128}), `ParseOptionalTensors` (lengths: TND
  both given and of one size; BNSD both or neither, B entries, each <= S; the mask given, Y % 128, mask shape
  exactly [B, N1, ceil(maxSq/X), ceil(maxSkv/Y)]; attenMask and blockTable null), `ValidateTNDSeqlenSum`
  (TND lengths sum to Tq and Tkv), `CalculateTaskSplit`/`CalculateWorkSpace` (no query block: "blockDim is
  0"). Which status a tiling refusal returns is not visible (the launcher's status is discarded, as in the
  backward); bsa expects ACLNN_ERR_INNER_TILING_ERROR (561002), as `interface` does.

The rules read the forward call's parameters (`case_params_forward`, or `params_forward` of a manifest's
`params`) and its tensors ({name: {"dtype", "shape"}}, a null one absent: `forward_tensors`): query, key,
value, block_sparse_mask (int8: the dtype the forward registers; the chain hands the forward the case's mask
bytes as int8), atten_mask and block_table (only when passed), attention_out and softmax_lse (the outputs).
The forward's rules do not differ by release (bsa read master only); `release` picks the backward's rules
in a chain (`Op.status`). `FORWARD_CALL` is the forward as the ops that call it hold it (`Op.steps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.case import MAX_TOKENS, Case
from . import interface
from .base import INNER_PRECISE_DEFAULT, INNER_PRECISE_VALUES, SOFTMAX_LSE_FLAG_DEFAULT
from .interface import (
    ACLNN_ERR_INNER_TILING_ERROR,
    ACLNN_ERR_PARAM_INVALID,
    ACLNN_ERR_PARAM_NULLPTR,
    DEFAULT_RELEASE,
    LENGTH_KEYS,
    Call,
    Params,
    Tensors,
    Violation,
)

#: What GetWorkspaceSize returns when the forward's infershape fails (the l0op hands back null outputs).
ACLNN_ERR_INNER_NULLPTR = 561103

#: The forward's tensors in its parameter order (block_table and atten_mask only when a call passes them).
FORWARD_TENSORS = tuple("query key value block_sparse_mask atten_mask block_table attention_out softmax_lse".split())

#: The mask dtype the forward registers (`block_sparse_attention_def.cpp`): the case's mask bytes as int8.
FORWARD_MASK_DTYPE = "int8"

#: Layout strings aclnn accepts (the A2/A3 tiling refuses BSND: only the 950 takes it).
LAYOUTS = ("TND", "BNSD", "BSND")

#: D values the tiling accepts ("temporary regulations of D").
HEAD_DIMS = (64, 128)

#: The A2/A3 tiling asks Y % 128 == 0 (the 950: 16).
Y_ALIGNMENT = 128

#: What the tiling uses for a null blockShape (aclnn passes a null one on).
DEFAULT_BLOCK_SHAPE = (128, 128)

#: Which part of the forward returns each status (skip reasons name it).
STAGES = {
    ACLNN_ERR_PARAM_NULLPTR: "aclnn",
    ACLNN_ERR_PARAM_INVALID: "aclnn",
    ACLNN_ERR_INNER_NULLPTR: "infershape",
    ACLNN_ERR_INNER_TILING_ERROR: "tiling",
}


def case_params_forward(case: Case) -> dict[str, Any]:
    """Return the parameters of a case's forward call (as a forward op folder's manifest `params` records
    them): `interface.case_params` and the forward's own innerPrecise and softmaxLseFlag."""
    return {
        **interface.case_params(case),
        "inner_precise": case.inner_precise,
        "softmax_lse_flag": case.softmax_lse_flag,
    }


def params_forward(params: Params) -> dict[str, Any]:
    """Return a manifest's `params` for the forward's rules: bsa's innerPrecise and softmaxLseFlag where absent."""
    return {"inner_precise": INNER_PRECISE_DEFAULT, "softmax_lse_flag": SOFTMAX_LSE_FLAG_DEFAULT, **params}


def forward_tensors(case: Case) -> dict[str, dict[str, Any]]:
    """Return the forward call's non-null tensors of a case ({name: {"dtype", "shape"}}, overrides applied).

    The mask is int8 whatever dtype the case gives the backward (a shape override or null applies);
    dout, dq, dk and dv are not the forward's. (Autograd hands the forward and the backward one mask tensor,
    in the backward's dtype: whether the NPU's forward takes a uint8 or bool mask is not visible in public
    code, so bsa expects the forward's status as for int8 there too.)
    """
    descs = case.tensor_descs()
    found = {name: descs[name] for name in FORWARD_TENSORS if name in descs}
    if "block_sparse_mask" in found:
        found["block_sparse_mask"] = {"dtype": FORWARD_MASK_DTYPE, "shape": found["block_sparse_mask"]["shape"]}
    return found


def manifest_tensors(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return the forward's tensor table from a forward folder's manifest entries ({name: entry} of its
    inputs and outputs): `out` is attention_out and `lse` softmax_lse; dtype and shape are kept."""
    aliases = {"out": "attention_out", "lse": "softmax_lse"}
    found = {}
    for name, entry in sections.items():
        key = aliases.get(name, name)
        if key in FORWARD_TENSORS and isinstance(entry, Mapping):
            found[key] = {"dtype": entry.get("dtype"), "shape": tuple(entry.get("shape") or ())}
    return found


def call_lengths(params: Params) -> tuple[list[int] | None, list[int] | None]:
    """Return the actualSeqLengths and actualSeqLengthsKv the forward is passed: as the case has them.

    Unlike the backward (`interface.call_lengths`, which passes `[S] * B` for a BNSD case without lengths),
    the forward takes null lengths for BNSD (the tiling then uses S for every batch entry), so a BNSD case
    with one list and not the other reaches the tiling's both-or-neither rule.
    """
    q_lengths, kv_lengths = params.get("actual_seq_lengths"), params.get("actual_seq_lengths_kv")
    return (list(q_lengths) if q_lengths is not None else None, list(kv_lengths) if kv_lengths is not None else None)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shape(tensors: Tensors, name: str) -> list[Any]:
    return list((tensors.get(name) or {}).get("shape") or ())


def _ceil_div(n: int, d: int) -> int:
    """The tiling's CeilDiv: 0 for n == 0."""
    return 0 if n == 0 else -(-n // d)


def undefined_behaviour(params: Params, tensors: Tensors, release: str = DEFAULT_RELEASE) -> list[str]:
    """Return what in a forward call has no status bsa can expect.

    A null softmaxLse with softmaxLseFlag 1 reaches `ViewCopy` into a null tensor after tiling; a mask of
    another dtype than int8 is not checked by aclnn and fails kernel selection with a status public code
    does not show. (They do not differ by release.)
    """
    found = []
    if "softmax_lse" not in tensors and params.get("softmax_lse_flag", SOFTMAX_LSE_FLAG_DEFAULT) == 1:
        found.append("softmax_lse is null with softmax_lse_flag 1: the forward copies lse into a null tensor")
    mask = tensors.get("block_sparse_mask")
    if mask is not None and mask.get("dtype") != FORWARD_MASK_DTYPE:
        found.append(f"block_sparse_mask dtype {mask.get('dtype')!r}: the forward registers int8 only")
    return found


def kernel_constraints(params: Params, bnsd_lengths: str) -> list[str]:
    """Return warnings for a valid forward call whose golden the A2/A3 forward will not match.

    The forward honours BNSD lengths (`call_lengths`: the tiling walks each batch entry's kv length), so a
    golden that computes over the whole S (`bnsd_lengths: ignored`, the backward's A2/A3 semantics) parts
    ways with it where actual_seq_lengths_kv is shorter than kv_seq_len. (Shorter query lengths only leave
    rows unwritten, which judging excludes.)
    """
    if params.get("layout") != "BNSD" or bnsd_lengths != "ignored":
        return []
    lengths = params.get("actual_seq_lengths_kv") or []
    full = params.get("kv_seq_len", 0)
    if any(n < full for n in lengths):
        return [
            f"forward: actual_seq_lengths_kv {list(lengths)} shorter than kv_seq_len {full} with bnsd_lengths: "
            "ignored: the forward attends only to each entry's first keys, the golden to all S; use "
            "bnsd_lengths: honored to judge the forward on its own terms"
        ]
    return []


def violations(params: Params, tensors: Tensors, release: str = DEFAULT_RELEASE) -> list[Violation]:
    """Return the forward's rules a call breaks, in the order the forward checks them.

    Args:
        params: `case_params_forward` or `params_forward` of a manifest: layouts, block_shape, lengths (as
            passed: `call_lengths`), num_kv_heads (numKeyValueHeads), inner_precise, softmax_lse_flag,
            pre_tokens, next_tokens, null_layouts.
        tensors: the forward call's non-null tensors (`forward_tensors`).
        release: accepted for symmetry with `interface.violations`; the forward's rules are master's.

    Returns:
        aclnn's violations (161001/161002), or else infershape's (561103), or else the A2/A3 tiling's
        (561002): each stage runs only when the one before passed. The first decides the status.
    """
    if release not in interface.RELEASES:
        raise ValueError(f"release {release!r}: known releases are {', '.join(interface.RELEASES)}")
    return _aclnn_rules(params, tensors) or _infershape_rules(params, tensors) or _tiling_rules(params, tensors)


def _aclnn_rules(params: Params, tensors: Tensors) -> list[Violation]:
    """ValidateParams, ValidateAdditionalParams and MakeContiguous of aclnn_block_sparse_attention.cpp."""
    invalid, nullptr = ACLNN_ERR_PARAM_INVALID, ACLNN_ERR_PARAM_NULLPTR
    found = [Violation(name, f"{name} is null", nullptr) for name in ("query", "key", "value") if name not in tensors]
    if found:
        return found
    found = interface.query_dtype_rules(tensors, ("key", "value"))
    if found:  # a query of another dtype than float16 or bfloat16 alone: key and value are not compared then
        return found[:1] if found[0].key == "query" else found
    nulls = interface.null_layouts(params)
    if nulls:
        names = " and ".join("qInputLayout" if key == "layout" else "kvInputLayout" for key in nulls)
        return _refuse(nulls[0], f"{names} {'are' if len(nulls) > 1 else 'is'} null", nullptr)
    layout, kv_layout = params.get("layout"), params.get("kv_layout", params.get("layout"))
    if layout not in LAYOUTS:
        return _refuse("layout", f"{layout!r}: qInputLayout is one of TND, BNSD, BSND", invalid)
    # The kv whitelist reads `kvLayout != "TND" && kvLayout != "BNSD" && qLayout != "BSND"` (sic): a BSND kv
    # layout is refused here unless the query is BSND, and with a BSND query any kv string passes it (the
    # equality rule below then refuses a different one: the same status).
    if kv_layout not in ("TND", "BNSD") and layout != "BSND":
        return _refuse(
            "kv_layout", f"{kv_layout!r}: kvInputLayout is TND or BNSD (BSND only with a BSND query)", invalid
        )
    if layout != kv_layout:
        return _refuse("kv_layout", f"{kv_layout!r} differs from qInputLayout {layout!r}: they must be equal", invalid)
    block_shape = params.get("block_shape")
    if block_shape is not None:
        if not isinstance(block_shape, (list, tuple)) or len(block_shape) != 2:
            return _refuse("block_shape", f"{_show(block_shape)}: a given blockShape holds two values [X, Y]", invalid)
        if not all(_int(v) and v > 0 for v in block_shape):
            return _refuse("block_shape", f"{_show(block_shape)}: X and Y must be positive", invalid)
    inner_precise = params.get("inner_precise", INNER_PRECISE_DEFAULT)
    if inner_precise not in INNER_PRECISE_VALUES:
        return _refuse("inner_precise", f"{inner_precise!r}: innerPrecise is 0, 1 or 4", invalid)
    if "attention_out" not in tensors:
        return _refuse("attention_out", "attentionOut is null", nullptr)
    mask = _shape(tensors, "block_sparse_mask")
    if "block_sparse_mask" in tensors and len(mask) != 4:
        return _refuse("block_sparse_mask", f"shape {mask}: a given blockSparseMask is 4-D", invalid)
    return []


def _axes(layout: Any) -> tuple[int, int, int | None, int]:
    """Return (rank, N axis, B axis or None, D axis) of a layout (one aclnn accepted: a string)."""
    return {"TND": (3, 1, None, 2), "BSND": (4, 2, 0, 3)}.get(layout, (4, 1, 0, 3))


def _infershape_rules(params: Params, tensors: Tensors) -> list[Violation]:
    """InferShapeBlockSparseAttention (block_sparse_attention_infershape.cpp): its failure is 561103."""
    status = ACLNN_ERR_INNER_NULLPTR
    layout = params.get("layout")
    rank, n_axis, b_axis, d_axis = _axes(layout)
    query, key, value = _shape(tensors, "query"), _shape(tensors, "key"), _shape(tensors, "value")
    if len(query) != rank:
        return _refuse("query", f"shape {query}: a {layout} query has rank {rank}", status)
    for name, shape in (("key", key), ("value", value)):
        if len(shape) != rank:
            return _refuse(name, f"shape {shape}: a {layout} {name} has rank {rank}", status)
    num_kv_heads = params.get("num_kv_heads")
    if _int(num_kv_heads) and num_kv_heads != 0 and key[n_axis] != num_kv_heads:
        return _refuse("num_kv_heads", f"numKeyValueHeads {num_kv_heads} differs from key's N {key[n_axis]}", status)
    if b_axis is not None and value[b_axis] != key[b_axis]:
        return _refuse("value", f"B {value[b_axis]} differs from key's {key[b_axis]}", status)
    if value[d_axis] != key[d_axis]:
        return _refuse("value", f"D {value[d_axis]} differs from key's {key[d_axis]}", status)
    return []


def _refuse(key: str, message: str, status: int = ACLNN_ERR_INNER_TILING_ERROR) -> list[Violation]:
    """The one rule a call breaks (each stage stops at its first), by default a tiling refusal."""
    return [Violation(key, message, status)]


def _tiling_rules(params: Params, tensors: Tensors) -> list[Violation]:
    """The A2/A3 refusals of block_sparse_attention_tiling.cpp (`GetBsaTiling`), in its order: 561002."""
    if params.get("layout") == "BSND":
        return _refuse("layout", "'BSND': the A2/A3 tiling takes TND and BNSD (only the 950 takes BSND)")
    return (
        _parse_attrs(params, tensors)
        or _parse_required_tensors(params, tensors)
        or _parse_lengths(params, tensors)
        or _parse_sparse_pattern(params, tensors)
        or _task_split(params, tensors)
    )


def _parse_attrs(params: Params, tensors: Tensors) -> list[Violation]:
    """ParseAttrs: numKeyValueHeads, innerPrecise, the tokens, softmaxLseFlag."""
    if params.get("num_kv_heads") == 0:
        return _refuse("num_kv_heads", "numKeyValueHeads 0: the tiling needs the kv head count")
    inner_precise = params.get("inner_precise", INNER_PRECISE_DEFAULT)
    if inner_precise not in (0, 1):
        return _refuse("inner_precise", f"{inner_precise}: A2/A3 takes innerPrecise 0 or 1 (4 is the 950's)")
    if inner_precise == 1 and tensors["query"].get("dtype") == "bfloat16":
        return _refuse("inner_precise", "1 with bfloat16: A2/A3 takes only innerPrecise 0 for bfloat16")
    for token_key in ("pre_tokens", "next_tokens"):
        if params.get(token_key, MAX_TOKENS) != MAX_TOKENS:
            return _refuse(token_key, f"{params.get(token_key)!r}: only {MAX_TOKENS} is supported (no windowed mask)")
    flag = params.get("softmax_lse_flag", SOFTMAX_LSE_FLAG_DEFAULT)
    if flag not in (0, 1):
        return _refuse("softmax_lse_flag", f"{flag!r}: softmaxLseFlag is 0 or 1")
    return []


def _parse_required_tensors(params: Params, tensors: Tensors) -> list[Violation]:
    """ParseRequiredTensors: B, D and N of query, key and value, and the head dim."""
    _, n_axis, b_axis, d_axis = _axes(params.get("layout"))
    query, key, value = _shape(tensors, "query"), _shape(tensors, "key"), _shape(tensors, "value")
    num_kv_heads = params.get("num_kv_heads")
    for letter, axis in (("B", b_axis), ("D", d_axis)):
        if axis is not None and not (query[axis] == key[axis] == value[axis]):
            message = f"{letter} of query {query[axis]}, key {key[axis]}, value {value[axis]}: they must be equal"
            return _refuse("key", message)
    if not (key[n_axis] == value[n_axis] == num_kv_heads):
        return _refuse(
            "num_kv_heads",
            f"N of key {key[n_axis]}, value {value[n_axis]} and numKeyValueHeads {num_kv_heads}: they must be equal",
        )
    n1, head_dim = query[n_axis], query[d_axis]
    if not (_int(n1) and _int(num_kv_heads) and n1 % num_kv_heads == 0):
        return _refuse("num_kv_heads", f"N1 {n1} is not a multiple of numKeyValueHeads {num_kv_heads}")
    if head_dim not in HEAD_DIMS:
        return _refuse("head_dim", f"D = {head_dim}: the forward takes D 64 or 128")
    return []


def _extent(params: Params, tensors: Tensors) -> tuple[int, int, int]:
    """Return (B, max Sq, max Skv) as the tiling reads them: from the lengths (TND) or the shapes (BNSD)."""
    q_lengths, kv_lengths = call_lengths(params)
    if params.get("layout") == "TND":
        return len(q_lengths or ()), max(q_lengths or (), default=0), max(kv_lengths or (), default=0)
    query, key = _shape(tensors, "query"), _shape(tensors, "key")
    return int(query[0]), int(query[2]), int(key[2])


def _parse_lengths(params: Params, tensors: Tensors) -> list[Violation]:
    """ParseOptionalTensors' lengths: TND both given and of one size; BNSD both or neither, B entries, each <= S."""
    q_lengths, kv_lengths = call_lengths(params)
    if params.get("layout") == "TND":
        if q_lengths is None or kv_lengths is None:
            key_name = "actual_seq_lengths" if q_lengths is None else "actual_seq_lengths_kv"
            return _refuse(key_name, "is null, but a TND forward needs both lengths")
        if len(q_lengths) != len(kv_lengths):
            return _refuse(
                "actual_seq_lengths_kv", f"{len(kv_lengths)} entries, actual_seq_lengths {len(q_lengths)}: one size"
            )
        return []
    batch, max_q, max_kv = _extent(params, tensors)
    if (q_lengths is None) != (kv_lengths is None):
        given = "actual_seq_lengths" if q_lengths is not None else "actual_seq_lengths_kv"
        return _refuse(given, "is given alone: a BNSD forward takes both lengths or neither")
    if q_lengths is None or kv_lengths is None:
        return []
    if len(q_lengths) != batch or len(kv_lengths) != batch:
        return _refuse(
            "actual_seq_lengths",
            f"{len(q_lengths)} and {len(kv_lengths)} entries for B = {batch}: one length per batch entry",
        )
    for key_name, lengths, limit in zip(LENGTH_KEYS, (q_lengths, kv_lengths), (max_q, max_kv), strict=True):
        if any(n > limit for n in lengths):
            return _refuse(key_name, f"{_show(lengths)}: a length exceeds the tensor's S {limit}")
    return []


def _parse_sparse_pattern(params: Params, tensors: Tensors) -> list[Violation]:
    """ParseSparsePattern and the rest of ParseOptionalTensors: the mask, attenMask and blockTable; then
    ValidateTNDSeqlenSum."""
    if "block_sparse_mask" not in tensors:
        return _refuse("block_sparse_mask", "is null: the forward needs a blockSparseMask")
    x, y = tuple(params.get("block_shape") or DEFAULT_BLOCK_SHAPE)[:2]
    if y % Y_ALIGNMENT:
        return _refuse("block_shape", f"{_show([x, y])}: Y % {Y_ALIGNMENT} != 0")
    batch, max_q, max_kv = _extent(params, tensors)
    mask = _shape(tensors, "block_sparse_mask")
    n1 = _shape(tensors, "query")[_axes(params.get("layout"))[1]]
    expected = [batch, n1, _ceil_div(max_q, x), _ceil_div(max_kv, y)]
    if mask != expected:
        return _refuse(
            "block_sparse_mask",
            f"shape {mask}: the forward needs exactly [B, N1, ceil(maxSq/X), ceil(maxSkv/Y)] = {expected}",
        )
    if "atten_mask" in tensors:
        return _refuse("atten_mask", "attenMask is not null: the forward does not support it yet")
    if "block_table" in tensors:
        return _refuse("block_table", "blockTable is not null: the forward has no paged cache")
    q_lengths, kv_lengths = call_lengths(params)
    if params.get("layout") == "TND" and q_lengths is not None and kv_lengths is not None:
        for key_name, lengths, tensor in zip(LENGTH_KEYS, (q_lengths, kv_lengths), ("query", "key"), strict=True):
            tokens = _shape(tensors, tensor)[0]
            if sum(lengths) != tokens:
                return _refuse(key_name, f"{_show(lengths)} sums to {sum(lengths)}, not {tensor}'s T {tokens}")
    return []


def _task_split(params: Params, tensors: Tensors) -> list[Violation]:
    """CalculateTaskSplit / CalculateWorkSpace: some query row to work on."""
    batch, max_q, _ = _extent(params, tensors)
    if batch == 0:
        return _refuse("batch", "B = 0: no batch entry to work on")
    q_lengths = call_lengths(params)[0]
    rows = q_lengths if q_lengths is not None else [max_q] * batch
    if _shape(tensors, "query")[_axes(params.get("layout"))[1]] == 0 or not any(rows):
        return _refuse("actual_seq_lengths", "no query row to work on (blockDim is 0)")
    return []


def _show(value: Any) -> str:
    return str(list(value)) if isinstance(value, (list, tuple)) else repr(value)


#: aclnnBlockSparseAttention.
FORWARD_CALL = Call(
    name="forward",
    refuser="the A2/A3 forward",
    undefined_error="{first}: no status bsa can expect from the forward",
    undefined_skip="{first}: no status bsa can expect from the forward",
    params=case_params_forward,
    tensors=forward_tensors,
    rules=violations,
    undefined=undefined_behaviour,
    constraints=kernel_constraints,
    stages=STAGES,
)

check = FORWARD_CALL.check
