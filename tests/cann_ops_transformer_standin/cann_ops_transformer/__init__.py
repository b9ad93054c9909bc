"""A stand-in for ops-transformer's `cann_ops_transformer` package, for bsa's tests only: its forward entry.

Put `tests/cann_ops_transformer_standin` (and `tests/torch_npu_standin`, which it imports as the real one imports
torch_npu) on PYTHONPATH. `cann_ops_transformer.block_sparse_attention` is registered with torch's own dispatcher
under the schema of libochao-huawei/ops-transformer
`attention/block_sparse_attention/torch_extension/block_sparse_attention.py` (6ef2df64), word for word, so torch
checks names, keyword-only arguments and types; its defaults are the entry's (scale_value 1.0,
return_softmax_lse False). The math and aclnn's statuses are the torch_npu stand-in's forward (computed apart
from bsa's golden), called with `softmax_lse_flag = return_softmax_lse`; without `return_softmax_lse` the lse
returned is empty, as the entry's Meta makes it.

`BSA_COT_STANDIN_FAULT=default-scale` plants the entry's pitfall: the given scale_value is dropped, so the
forward runs at its default 1.0.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch_npu

NAME = "block_sparse_attention"
SCHEMA = (
    "block_sparse_attention(Tensor query, Tensor key, Tensor value, Tensor block_sparse_mask, int[] block_shape, *, "
    'str q_input_layout="TND", str kv_input_layout="TND", int num_key_value_heads=1, float scale_value=1.0, '
    "int inner_precise=1, int[]? actual_seq_lengths=None, int[]? actual_seq_lengths_kv=None, "
    "bool return_softmax_lse=False, int mask_type=0, int quant_mode=0, int block_size=0, "
    "int pre_tokens=2147483647, int next_tokens=2147483647, float dst_type_max=0.0, Tensor? atten_mask=None, "
    "Tensor? block_table=None, Tensor? q_dequant_scale=None, Tensor? k_dequant_scale=None, "
    "Tensor? v_dequant_scale=None, Tensor? p_quant_scale=None, ScalarType? attention_out_dtype=None"
    ") -> (Tensor, Tensor)"
)
FAULT_VARIABLE = "BSA_COT_STANDIN_FAULT"
DEFAULT_SCALE = 1.0

__version__ = "0.0.0+bsa.standin"


def _block_sparse_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_sparse_mask: torch.Tensor,
    block_shape: list[int],
    *,
    q_input_layout: str = "TND",
    kv_input_layout: str = "TND",
    num_key_value_heads: int = 1,
    scale_value: float = DEFAULT_SCALE,
    inner_precise: int = 1,
    actual_seq_lengths: list[int] | None = None,
    actual_seq_lengths_kv: list[int] | None = None,
    return_softmax_lse: bool = False,
    **rest: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    if os.environ.get(FAULT_VARIABLE) == "default-scale":
        scale_value = DEFAULT_SCALE
    if rest.get("atten_mask") is not None or rest.get("block_table") is not None or rest.get("quant_mode", 0):
        raise RuntimeError("the stand-in plays no attenMask, blockTable or quantization")
    out, lse = torch_npu.npu_block_sparse_attention(
        query,
        key,
        value,
        block_sparse_mask,
        block_shape,
        q_input_layout=q_input_layout,
        kv_input_layout=kv_input_layout,
        num_key_value_heads=num_key_value_heads,
        scale_value=scale_value,
        inner_precise=inner_precise,
        actual_seq_lengths=actual_seq_lengths,
        actual_seq_lengths_kv=actual_seq_lengths_kv,
        softmax_lse_flag=int(return_softmax_lse),
    )
    if not return_softmax_lse:
        lse = query.new_empty((0,), dtype=torch.float32)
    for tensor in (out, lse):
        tensor._bsa_standin_on_npu = True  # type: ignore[attr-defined]
    return out, lse


_library = torch.library.Library("bsa_cot_standin", "DEF")
_library.define(SCHEMA)
_library.impl(NAME, _block_sparse_attention, "CPU")

block_sparse_attention = getattr(torch.ops.bsa_cot_standin, NAME)
