"""The aclnnBlockSparseAttentionGrad interface rules, and the A2/A3 kernel constraints.

Interface rules decide the aclnn status a call returns (DOMAIN.md section 1); kernel constraints are
limits of the current A2/A3 kernel that a valid call may still be outside of (a warning, not an error).
Both read the manifest `params` dict, so a spec, a manifest and the reference device agree on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .case import MAX_TOKENS

ACLNN_SUCCESS = 0
ACLNN_ERR_PARAM_NULLPTR = 161001
ACLNN_ERR_PARAM_INVALID = 161002

OP_DTYPES = ("float16", "bfloat16")
OP_LAYOUTS = ("BNSD", "TND")


@dataclass(frozen=True)
class Violation:
    """One broken interface rule: the parameter, what is wrong, and the status the op returns."""

    key: str
    message: str
    status: int


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def violations(params: Mapping[str, Any]) -> list[Violation]:
    """Return every interface rule that `params` breaks, in the order the op would check them."""
    found: list[Violation] = []
    # Null pointers are checked before parameter values, as aclnn operators do.
    block_shape = params.get("block_shape")
    if block_shape is None:
        found.append(Violation("block_shape", "blockShape is null", ACLNN_ERR_PARAM_NULLPTR))
    if params.get("layout") == "TND":
        for key in ("actual_seq_lengths", "actual_seq_lengths_kv"):
            if params.get(key) is None:
                found.append(Violation(key, "is null, but TND needs it", ACLNN_ERR_PARAM_NULLPTR))
    if params.get("dtype") not in OP_DTYPES:
        found.append(Violation("dtype", f"{params.get('dtype')!r} is not float16 or bfloat16", ACLNN_ERR_PARAM_INVALID))
    layout, kv_layout = params.get("layout"), params.get("kv_layout", params.get("layout"))
    if layout not in OP_LAYOUTS:
        found.append(Violation("layout", f"{layout!r} is not BNSD or TND", ACLNN_ERR_PARAM_INVALID))
    if kv_layout != layout:
        found.append(
            Violation(
                "kv_layout",
                f"kvInputLayout {kv_layout!r} differs from qInputLayout {layout!r}",
                ACLNN_ERR_PARAM_INVALID,
            )
        )
    n1, n2 = params.get("num_heads"), params.get("num_kv_heads")
    if not (isinstance(n1, int) and isinstance(n2, int) and n1 > 0 and n2 > 0 and n1 >= n2 and n1 % n2 == 0):
        found.append(
            Violation("num_kv_heads", f"N1={n1}, N2={n2}: need N1 % N2 == 0 and N1 >= N2", ACLNN_ERR_PARAM_INVALID)
        )
    if block_shape is not None and not (
        isinstance(block_shape, (list, tuple)) and len(block_shape) == 2 and all(map(_positive_int, block_shape))
    ):
        found.append(
            Violation("block_shape", f"{block_shape!r} is not two positive integers [X, Y]", ACLNN_ERR_PARAM_INVALID)
        )
    if params.get("mask_type", 0) != 0:
        found.append(
            Violation("mask_type", f"{params.get('mask_type')!r}: only 0 is supported", ACLNN_ERR_PARAM_INVALID)
        )
    for key in ("pre_tokens", "next_tokens"):
        if params.get(key, MAX_TOKENS) != MAX_TOKENS:
            found.append(
                Violation(key, f"{params.get(key)!r}: only {MAX_TOKENS} is supported", ACLNN_ERR_PARAM_INVALID)
            )
    return found


def check(params: Mapping[str, Any]) -> tuple[int, str]:
    """Return the aclnn status of a call with `params` and a message: the first broken rule, or (0, "")."""
    found = violations(params)
    if not found:
        return ACLNN_SUCCESS, ""
    first = found[0]
    return first.status, f"{first.key}: {first.message}"


def kernel_constraints(params: Mapping[str, Any]) -> list[str]:
    """Return the documented A2/A3 kernel constraints a valid call is outside of."""
    notes = []
    if params.get("head_dim") != 128:
        notes.append(f"head_dim {params.get('head_dim')}: the A2/A3 kernel supports D = 128 only")
    if params.get("layout") != "BNSD":
        notes.append(f"layout {params.get('layout')}: the A2/A3 kernel supports BNSD only")
    if params.get("num_heads") != params.get("num_kv_heads"):
        notes.append(
            f"N1={params.get('num_heads')} != N2={params.get('num_kv_heads')}: "
            "the A2/A3 kernel supports MHA (N1 == N2) only"
        )
    x, y = params.get("block_shape") or (0, 0)
    if x % 16 or y % 16:
        notes.append(f"block_shape [{x}, {y}]: the operator README asks for multiples of 16")
    return notes


def call_lengths(params: Mapping[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    """Return the actualSeqLengths and actualSeqLengthsKv to pass to the operator for manifest `params`.

    A BNSD case without lengths passes `[S] * B` (q and kv S), never a null list: the A2/A3
    post-processing reads `actualSeqLengths[b]` even for BNSD, and the operator's example and
    torch_npu's tests always pass the lengths. TND passes the lengths as the case has them (a TND
    case without lengths is a negative case and passes null).
    """
    q_lengths, kv_lengths = params.get("actual_seq_lengths"), params.get("actual_seq_lengths_kv")
    if params.get("layout") == "BNSD":
        batch = params.get("batch")
        if q_lengths is None and isinstance(batch, int):
            q_lengths = [params.get("q_seq_len")] * batch
        if kv_lengths is None and isinstance(batch, int):
            kv_lengths = [params.get("kv_seq_len")] * batch
    return (list(q_lengths) if q_lengths is not None else None, list(kv_lengths) if kv_lengths is not None else None)
