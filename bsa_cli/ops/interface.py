"""The aclnnBlockSparseAttentionGrad interface rules, and the A2/A3 kernel constraints.

The rules are those of ops-transformer master (v9.1.x), read from its code at commit 3a280bcc
(2026-07-21; the dtype and shape rules came with af7571d0, 2026-07-03):
`attention/block_sparse_attention_grad/op_host/op_api/aclnn_block_sparse_attention_grad.cpp`
(`ValidateParams`: statuses 161001 and 161002, in the order below) and
`op_host/arch22/block_sparse_attention_grad_tiling_arch22.cpp` (the A2/A3 tiling, which runs inside
GetWorkspaceSize after those checks: its refusals come back as ACLNN_ERR_INNER_TILING_ERROR, 561002).
The operator's documentation differs in places (TND without lengths is 161002 in the code, 161001 in
the doc; the doc's "D = 128, BNSD and MHA only" on A2/A3 is not enforced): the code wins here.

`RULES` names the rule set; the manifest records it (`semantics.interface`), so a case says which
operator version its expected status comes from. The rules read the call's parameters as the operator
receives them (`case_params` of a `Case`, or a manifest's `params`, which records them) and a table of
the call's tensors ({name: {"dtype", "shape"}}, a null tensor absent: `Case.tensor_descs`, or a
manifest's `inputs` and `outputs` entries), so a spec, a manifest and the reference device agree.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..core.case import MAX_TOKENS, Case, Layout

#: A call's parameters as a manifest's `params` records them (`case_params`).
Params = Mapping[str, Any]
#: A call's non-null tensors, {name: {"dtype", "shape"}} (`Case.tensor_descs`).
Tensors = Mapping[str, Mapping[str, Any]]

ACLNN_SUCCESS = 0
ACLNN_ERR_PARAM_NULLPTR = 161001
ACLNN_ERR_PARAM_INVALID = 161002
ACLNN_ERR_INNER_TILING_ERROR = 561002

#: The operator releases whose rules bsa knows (a case's `release:`; `--release` overrides).
RELEASES = ("9.0.0", "9.1.0", "master")

#: The release a case targets unless it says otherwise: the newest public code.
DEFAULT_RELEASE = "master"

#: The rule set `violations` follows for each release, as manifests record it (`semantics.interface`).
RULES_BY_RELEASE = {
    "9.0.0": "ops-transformer 9.0.0 (cannmirror/ops-transformer release branch): aclnn null, query dtype, "
    "key/value dtype, layout whitelist (TND/BNSD) checks + A2/A3 (arch22) tiling",
    "9.1.0": "ops-transformer 9.1.0 / master 3a280bcc: aclnn ValidateParams (dtypes and shapes since af7571d0) "
    "+ A2/A3 (arch22) tiling",
    "master": "ops-transformer master 5778144: null layouts first (d42799fe6), aclnn ValidateParams + A2/A3 "
    "(arch22) tiling; deterministic mode (8ba7ee217 / e6d22a23e)",
}

RULES = RULES_BY_RELEASE[DEFAULT_RELEASE]

#: Releases whose A2/A3 tiling has the deterministic mode (`GetDeterministic()`, master since 2026-08-04).
DETERMINISTIC_RELEASES = ("master",)


def release_counts(releases: Iterable[str | None]) -> str:
    """Return e.g. "9.0.0 (11 cases), master (53 cases)" for the releases of some cases ("" for none)."""
    counts = Counter(release for release in releases if release)
    return ", ".join(f"{release} ({n} case{'s' if n != 1 else ''})" for release, n in sorted(counts.items()))


def release_of_cann(version: str | None) -> str | None:
    """Return the ops-transformer release a CANN version ships (9.0.x -> 9.0.0, 9.1.x -> 9.1.0), or None
    when bsa cannot tell (another version, none recorded): the release branches carry the CANN numbers."""
    if not isinstance(version, str):
        return None
    for release in ("9.0.0", "9.1.0"):
        if version.startswith(release.rsplit(".", 1)[0] + "."):  # 9.0.x for 9.0.0
            return release
    return None


LENGTH_KEYS = ("actual_seq_lengths", "actual_seq_lengths_kv")

#: A case's null layouts (`null_layouts` in params: "q", "kv") and the parameter each stands for.
LAYOUT_KEYS = {"q": "layout", "kv": "kv_layout"}

OP_DTYPES = ("float16", "bfloat16")
MASK_DTYPES = ("bool", "uint8")
TILING_LAYOUTS: tuple[Layout, ...] = ("TND", "BNSD")

#: Tensors a null pointer of which is 161001, in the order `CheckMandatoryTensors` reads them.
MANDATORY = ("dout", "query", "key", "value", "attention_out", "softmax_lse", "block_sparse_mask")

SAME_DTYPE_AS_QUERY = ("key", "value", "attention_out", "dout")
OUTPUTS = ("dq", "dk", "dv")

#: Non-TND layouts: pairs of tensors whose dim 3 (D) must be equal. q and v are not compared.
BNSD_HEAD_DIM_PAIRS = (
    ("query", "key"),
    ("value", "attention_out"),
    ("value", "dout"),
    ("query", "dq"),
    ("key", "dk"),
    ("value", "dv"),
)

#: Non-TND layouts: tensors whose dim 0 must equal query's.
BNSD_BATCH_TENSORS = ("key", "value", "attention_out", "dout", "softmax_lse", "dq", "dk", "dv")

#: TND: tensors whose dim 2 (D) must equal query's; nothing else of the shapes is checked.
TND_DIM2_TENSORS = ("key", "value", "attention_out", "dout", "dq", "dk", "dv")


@dataclass(frozen=True)
class Violation:
    """One broken interface rule: the parameter, what is wrong, and the status the op returns."""

    key: str
    message: str
    status: int


def encode_lengths(lengths: tuple[int, ...] | None, encoding: str) -> list[int] | None:
    """Return lengths as the operator receives them: per batch, or cumulative end offsets without a leading 0."""
    if lengths is None:
        return None
    return list(itertools.accumulate(lengths)) if encoding == "cumulative" else list(lengths)


#: The parameters of a call that `case_params` records, in its order (`null_layouts` last, when given).
PARAM_KEYS = tuple(
    "layout kv_layout dtype batch num_heads num_kv_heads head_dim q_seq_len kv_seq_len block_shape actual_seq_lengths "
    "actual_seq_lengths_kv seq_lengths_encoding scale kernel_scale mask_type pre_tokens next_tokens lse_shape".split()
)


def case_params(case: Case) -> dict[str, Any]:
    """Return the parameters of a case's call, as the operator receives them and a manifest's `params` records
    them: layouts (kv_layout defaults to layout), sizes, the block shape as a list (None for a null one), lengths
    in the case's `seq_lengths_encoding`, both scales, the attributes, and `null_layouts` when the call passes
    a layout as null. The rules read what they need of them (tests/spec/test_interface.py)."""
    params = {key: getattr(case, key) for key in PARAM_KEYS}
    params.update(
        kv_layout=case.kv_layout or case.layout,
        block_shape=list(case.block_shape) if case.block_shape else None,  # () is a null blockShape
        actual_seq_lengths=encode_lengths(case.actual_seq_lengths, case.seq_lengths_encoding),
        actual_seq_lengths_kv=encode_lengths(case.actual_seq_lengths_kv, case.seq_lengths_encoding),
    )
    if case.null_layouts:
        params["null_layouts"] = list(case.null_layouts)
    return params


def _invalid(key: str, message: str) -> Violation:
    return Violation(key, message, ACLNN_ERR_PARAM_INVALID)


def _dim(desc: Mapping[str, Any] | None, axis: int) -> Any:
    shape = list((desc or {}).get("shape") or ())
    return shape[axis] if len(shape) > axis else None


def null_layouts(params: Params) -> list[str]:
    """Return the layout parameters a call passes as null pointers ("layout", "kv_layout")."""
    nulls = params.get("null_layouts") or []
    return [LAYOUT_KEYS[n] for n in ("q", "kv") if n in nulls]


def undefined_behaviour(params: Params, tensors: Tensors, release: str = DEFAULT_RELEASE) -> list[str]:
    """Return what in a call `release` does not check before reading it (so no status can be expected).

    Before master's d42799fe6 a null layout string is read before any check; dq, dk and dv are read
    unchecked in every release; the shape checks read dims 3 (non-TND) or 2 (TND) without checking the rank.
    """
    found = []
    if release != "master":
        for key in null_layouts(params):
            found.append(f"{key} is null: {release} reads the layout string before any check (master returns 161002)")
    for name in OUTPUTS:
        if name not in tensors:
            found.append(f"{name} is null: {release} reads its dtype without a null check")
    rank = 3 if params.get("layout") == "TND" else 4
    for name, desc in tensors.items():
        if name in ("query", *TND_DIM2_TENSORS) and len(desc.get("shape") or ()) < rank:
            found.append(f"{name} has rank {len(desc.get('shape') or ())}: the shape checks read dim {rank - 1}")
    return found


def violations(params: Params, tensors: Tensors, release: str = DEFAULT_RELEASE) -> list[Violation]:
    """Return every interface rule that a call breaks, in the order `release` checks them.

    Args:
        params: manifest `params` (layouts, heads, block shape, lengths, maskType, tokens, null_layouts...).
        tensors: the call's non-null tensors, {name: {"dtype": str, "shape": [...]}}; `atten_mask` is
            present only when the call passes one.
        release: one of `RELEASES` (docs/interface.md says what each checks).

    Returns:
        The aclnn `ValidateParams` violations (161001/161002) in its order, then the A2/A3 tiling's
        refusals (561002). The first one decides the status.
    """
    if release not in RELEASES:
        raise ValueError(f"release {release!r}: known releases are {', '.join(RELEASES)}")
    found: list[Violation] = []

    def add(key: str, message: str, status: int = ACLNN_ERR_PARAM_INVALID) -> None:
        found.append(Violation(key, message, status))

    # 0. master (d42799fe6): a null qInputLayout or kvInputLayout first, before every other rule.
    if release == "master":
        for key in null_layouts(params):
            add(key, f"{'qInputLayout' if key == 'layout' else 'kvInputLayout'} is null")
    # 1. CheckMandatoryTensors: null inputs.
    found += [Violation(name, f"{name} is null", ACLNN_ERR_PARAM_NULLPTR) for name in MANDATORY if name not in tensors]
    if release == "9.0.0":
        return found + _rules_9_0(params, tensors) + tiling_refusals(params, tensors)
    # 2. dtypes.
    found.extend(query_dtype_rules(tensors, SAME_DTYPE_AS_QUERY))
    lse = tensors.get("softmax_lse")
    if lse is not None and lse.get("dtype") != "float32":
        add("softmax_lse", f"dtype {lse.get('dtype')!r} is not float32")
    mask = tensors.get("block_sparse_mask")
    if mask is not None and mask.get("dtype") not in MASK_DTYPES:
        add("block_sparse_mask", f"dtype {mask.get('dtype')!r} is not bool or uint8")
    found.extend(query_dtype_rules(tensors, OUTPUTS, query_itself=False))
    # 3. shapes (with a query): TND compares dim 2 only; any other q layout string takes the BNSD branch.
    if params.get("layout") == "TND":
        compared = [(2, "D", "query", name) for name in TND_DIM2_TENSORS]
    else:
        compared = [(0, "B", "query", name) for name in BNSD_BATCH_TENSORS]
        compared += [(3, "D", first, second) for first, second in BNSD_HEAD_DIM_PAIRS]
    for axis, letter, first, second in compared if "query" in tensors else ():
        if first in tensors and second in tensors:
            this, other = _dim(tensors[second], axis), _dim(tensors[first], axis)
            if this != other:
                add(second, f"dim {axis} ({letter}) {this} differs from {first}'s {other}")
    # 4. attributes; 5. layouts and lengths.
    found += _attribute_rules(params, tensors) + _tnd_length_rules(params)
    layout, kv_layout = params.get("layout"), params.get("kv_layout", params.get("layout"))
    if (layout == "BNSD") != (kv_layout == "BNSD"):
        add("kv_layout", f"kvInputLayout {kv_layout!r} and qInputLayout {layout!r}: both BNSD or neither")
    # 6. ParseBlockShape (below).
    return found + _block_shape_rules(params) + tiling_refusals(params, tensors)


def _block_shape_rules(params: Params) -> list[Violation]:
    """ParseBlockShape: null 161001; fewer than 2 values or a value <= 0 161002 (every release)."""
    block_shape = params.get("block_shape")
    if block_shape is None:
        return [Violation("block_shape", "blockShape is null", ACLNN_ERR_PARAM_NULLPTR)]
    if not isinstance(block_shape, (list, tuple)) or len(block_shape) < 2:
        return [_invalid("block_shape", f"{block_shape!r} has fewer than 2 values [X, Y]")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block_shape[:2]):
        return [_invalid("block_shape", f"{block_shape!r}: X and Y must be positive")]
    return []


def _rules_9_0(params: Params, tensors: Tensors) -> list[Violation]:
    """The 9.0.x checks after the null inputs: query fp16/bf16, key and value of query's dtype, layouts in the
    whitelist TND/BNSD, TND with lengths, the attributes and blockShape. No other dtype or shape rule (those
    came with v9.1.0), so an int8 mask or a float16 lse passes aclnn there."""
    found = query_dtype_rules(tensors, ("key", "value"))
    layout, kv_layout = params.get("layout"), params.get("kv_layout", params.get("layout"))
    for key, value in (("layout", layout), ("kv_layout", kv_layout)):
        if value not in TILING_LAYOUTS:
            found.append(_invalid(key, f"{value!r}: 9.0.x accepts the layouts TND and BNSD only"))
    return found + _attribute_rules(params, tensors) + _tnd_length_rules(params) + _block_shape_rules(params)


def query_dtype_rules(tensors: Tensors, same: tuple[str, ...], query_itself: bool = True) -> list[Violation]:
    """query float16 or bfloat16 (with `query_itself`), and the tensors `same` of its dtype (161002)."""
    if "query" not in tensors:
        return []
    q_dtype = tensors["query"].get("dtype")
    found = []
    if query_itself and q_dtype not in OP_DTYPES:
        found.append(_invalid("query", f"dtype {q_dtype!r} is not float16 or bfloat16"))
    for name in same:
        if name in tensors and tensors[name].get("dtype") != q_dtype:
            found.append(_invalid(name, f"dtype {tensors[name].get('dtype')!r} differs from query's {q_dtype!r}"))
    return found


def _attribute_rules(params: Params, tensors: Tensors) -> list[Violation]:
    """A non-null attenMask, a maskType other than 0, tokens other than MAX_TOKENS (161002, every release)."""
    found = []
    if "atten_mask" in tensors:
        found.append(("atten_mask", "attenMask is not null: only a null attenMask is supported"))
    if params.get("mask_type", 0) != 0:
        found.append(("mask_type", f"{params.get('mask_type')!r}: only 0 is supported"))
    for key in ("pre_tokens", "next_tokens"):
        if params.get(key, MAX_TOKENS) != MAX_TOKENS:
            found.append((key, f"{params.get(key)!r}: only {MAX_TOKENS} is supported"))
    return [_invalid(key, message) for key, message in found]


def _tnd_length_rules(params: Params) -> list[Violation]:
    """A TND query or key/value without its lengths (161002, every release)."""
    found = []
    if params.get("layout") == "TND" and params.get("actual_seq_lengths") is None:
        found.append(_invalid("actual_seq_lengths", "is null, but a TND query needs it"))
    kv_layout = params.get("kv_layout", params.get("layout"))
    if kv_layout == "TND" and params.get("actual_seq_lengths_kv") is None:
        found.append(_invalid("actual_seq_lengths_kv", "is null, but a TND key/value needs it"))
    return found


def tiling_refusals(params: Params, tensors: Tensors) -> list[Violation]:
    """Return what the A2/A3 tiling refuses in a call that passed `ValidateParams` (status 561002).

    It reads only the q layout (TND or BNSD), asks BNSD query, key and blockSparseMask of rank 4 and TND
    query and key of rank 3, takes N1 from query and N2 from key (numKeyValueHeads is never read) and needs
    N1 >= N2, N1 % N2 == 0, D > 0 and at least one query block to work on (TND: a query token; BNSD: B > 0
    and Sq > 0, else "blockDim is 0"). Which status GetWorkspaceSize returns for a tiling refusal is not
    visible in public code (the l0op discards the launcher's status); 561002 is the likely code.
    """
    tiling = ACLNN_ERR_INNER_TILING_ERROR
    layout = params.get("layout")
    if layout not in TILING_LAYOUTS:
        return [Violation("layout", f"{layout!r}: the A2/A3 tiling supports TND and BNSD only", tiling)]
    found = []
    rank = 3 if layout == "TND" else 4
    for name in ("query", "key", *(("block_sparse_mask",) if layout == "BNSD" else ())):
        shape = (tensors.get(name) or {}).get("shape")
        if shape is not None and len(shape) != rank:
            found.append(Violation(name, f"rank {len(shape)}: the {layout} tiling needs rank {rank}", tiling))
    if found:
        return found
    if layout == "BNSD" and (_dim(tensors.get("query"), 0) == 0 or _dim(tensors.get("query"), 2) == 0):
        message = (
            f"shape {list(tensors['query']['shape'])}: B == 0 or Sq == 0 leaves no block to work on (blockDim is 0)"
        )
        found.append(Violation("query", message, tiling))
    n1, n2 = _dim(tensors.get("query"), 1), _dim(tensors.get("key"), 1)  # N: dim 1 of TND and BNSD
    if isinstance(n1, int) and isinstance(n2, int) and not (n2 > 0 and n1 >= n2 and n1 % n2 == 0):
        found.append(Violation("num_kv_heads", f"N1={n1}, N2={n2}: the tiling needs N1 % N2 == 0 and N1 >= N2", tiling))
    if _dim(tensors.get("query"), 2 if layout == "TND" else 3) == 0:
        found.append(Violation("head_dim", "D = 0: the tiling needs a head dim", tiling))
    lengths = params.get("actual_seq_lengths")
    if layout == "TND" and lengths is not None and not any(lengths):
        found.append(Violation("actual_seq_lengths", f"{lengths}: no query tokens, so no block to work on", tiling))
    return found


def kernel_constraints(params: Params, bnsd_lengths: str) -> list[str]:
    """Return warnings for a valid call whose golden the A2/A3 kernel will not match.

    `bnsd_lengths` is the case's (`honored` or `ignored`): what its golden assumes of BNSD lengths.

    Master's A2/A3 tiling accepts GQA and TND (since v9.1.0), any block shape with positive values
    (no multiple-of-16 rule), and does not check D, so a call it accepts gets no warning for its shape
    (torch_npu's binding alone asks D <= 128; its device reports that itself). What remains is a
    semantic gap: with BNSD actual lengths shorter than S, the A2/A3 code computes over the whole S,
    so a golden that honours the lengths (the documentation's semantics) is not what it computes.
    """
    if params.get("layout") == "BNSD" and bnsd_lengths == "honored":
        for key, full in (("actual_seq_lengths", "q_seq_len"), ("actual_seq_lengths_kv", "kv_seq_len")):
            lengths = params.get(key) or []
            if any(n < params.get(full, 0) for n in lengths):
                return [
                    f"{key} {list(lengths)} shorter than {full} {params.get(full)} with bnsd_lengths: honored: "
                    "the A2/A3 kernel ignores BNSD lengths (computes over all S); use bnsd_lengths: ignored "
                    "to judge it on its own terms"
                ]
    return []


#: The largest D torch_npu's binding passes on: op-plugin (github.com/Ascend/op-plugin master 517f2e7d, the
#: binding last changed in c0f67e98) `BlockSparseAttentionBackwardKernelNpuOpApi.cpp` checks
#: query.size(-1) <= 128 before aclnn (bsa_cli/devices/torch_npu.py).
TORCH_NPU_MAX_HEAD_DIM = 128


def callers_refusals(params: Params, forward_head_dims: Sequence[int]) -> list[str]:
    """Return why torch_npu's binding (`TORCH_NPU_MAX_HEAD_DIM`) and the forward (whose tiling takes
    `forward_head_dims`; its out and lse are what the backward receives in training) would both refuse a call
    the A2/A3 backward accepts, for its D: such a case runs on a --binary alone."""
    head_dim = params.get("head_dim")
    if not isinstance(head_dim, int) or head_dim <= TORCH_NPU_MAX_HEAD_DIM:
        return []
    dims = " or ".join(map(str, forward_head_dims))
    return [f"D = {head_dim}: torch_npu takes D <= {TORCH_NPU_MAX_HEAD_DIM}, the forward D {dims}"]


def arch35_refusals(params: Params) -> list[str]:
    """Return why the Ascend 950 (arch35) tiling would refuse a call that the A2/A3 tiling accepts.

    `op_host/arch35/block_sparse_attention_grad_tiling_arch35.cpp` (master 5778144): layouts BSND, BNSD or
    TND with identical q and kv strings, D == 128, X and Y multiples of 64, Sq == Skv (TND: equal lengths),
    and no deterministic mode. A suite says with these which chips it can run on.
    """
    reasons = []
    if params.get("layout") != params.get("kv_layout", params.get("layout")):
        reasons.append("q and kv layout strings differ")
    if params.get("head_dim") != 128:
        reasons.append(f"D = {params.get('head_dim')}, not 128")
    block = params.get("block_shape") or []
    if len(block) >= 2 and any(isinstance(v, int) and v % 64 for v in block[:2]):
        reasons.append(f"block shape {list(block[:2])} not multiples of 64")
    if params.get("layout") == "TND":
        if params.get("actual_seq_lengths") != params.get("actual_seq_lengths_kv"):
            reasons.append("q and kv lengths differ")
    elif params.get("q_seq_len") != params.get("kv_seq_len"):
        reasons.append(f"Sq {params.get('q_seq_len')} != Skv {params.get('kv_seq_len')}")
    return reasons


def call_lengths(params: Params) -> tuple[list[int] | None, list[int] | None]:
    """Return the actualSeqLengths and actualSeqLengthsKv to pass to the operator for manifest `params`.

    A BNSD case without lengths passes `[S] * B` (q and kv S), never a null list: the A2/A3
    post-processing reads `actualSeqLengths[b]` even for BNSD, and the operator's example and
    torch_npu's tests always pass the lengths. TND passes the lengths as the case has them (a TND
    case without lengths is a negative case and passes null).
    """
    q_lengths, kv_lengths = params.get("actual_seq_lengths"), params.get("actual_seq_lengths_kv")
    batch = params.get("batch")
    if params.get("layout") == "BNSD" and isinstance(batch, int):
        q_lengths = q_lengths if q_lengths is not None else [params.get("q_seq_len")] * batch
        kv_lengths = kv_lengths if kv_lengths is not None else [params.get("kv_seq_len")] * batch
    return (list(q_lengths) if q_lengths is not None else None, list(kv_lengths) if kv_lengths is not None else None)


@dataclass(frozen=True)
class Call:
    """One operator an op calls (the forward or the backward): how a case is seen as its call, its rules,
    what it leaves undefined, where its kernel parts ways with the golden, and how its refusals are named.

    An op holds its calls in the order it makes them (`Op.steps`); specs, gen and devices ask the calls."""

    name: Literal["forward", "backward"]
    #: Who refuses a call of an op of this one step ("the A2/A3 forward").
    refuser: str
    #: The error of a case with undefined behaviour ({first}: the first, {ops}, {release}).
    undefined_error: str
    #: The skip reason of an op with undefined behaviour under `--ops` ({first}).
    undefined_skip: str
    params: Callable[[Case], dict[str, Any]]
    tensors: Callable[[Case], dict[str, dict[str, Any]]]
    rules: Callable[[Params, Tensors, str], list[Violation]]
    undefined: Callable[[Params, Tensors, str], list[str]]
    constraints: Callable[[Params, str], list[str]]
    #: Which part of the operator returns a status (skip reasons name it; "aclnn" when absent).
    stages: Mapping[int, str]

    def check(self, params: Params, tensors: Tensors, release: str = DEFAULT_RELEASE) -> tuple[int, str]:
        """Return the status of a call under `release` and a message: the first broken rule, or (0, "")."""
        found = self.rules(params, tensors, release)
        return (found[0].status, f"{found[0].key}: {found[0].message}") if found else (ACLNN_SUCCESS, "")

    def violations(self, case: Case) -> list[Violation]:
        return self.rules(self.params(case), self.tensors(case), case.release)

    def undefined_behaviour(self, case: Case) -> list[str]:
        return self.undefined(self.params(case), self.tensors(case), case.release)

    def kernel_constraints(self, case: Case) -> list[str]:
        return self.constraints(self.params(case), case.bnsd_lengths)


#: aclnnBlockSparseAttentionGrad.
BACKWARD_CALL = Call(
    name="backward",
    refuser="the backward",
    undefined_error="{first}: undefined behaviour for the backward ({ops}), no status to expect "
    "(ops-transformer {release} reads it unchecked)",
    undefined_skip="{first}: undefined behaviour, no status to expect",
    params=case_params,
    tensors=Case.tensor_descs,
    rules=violations,
    undefined=undefined_behaviour,
    constraints=kernel_constraints,
    stages={ACLNN_ERR_INNER_TILING_ERROR: "tiling"},
)

check = BACKWARD_CALL.check
