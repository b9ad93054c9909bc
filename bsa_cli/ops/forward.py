"""The forward: aclnnBlockSparseAttention on query, key, value and the mask: attentionOut and softmaxLse."""

from __future__ import annotations

from .base import FORWARD_BINDING, FORWARD_OUTPUTS, Op

FORWARD = Op(
    "forward",
    inputs=("query", "key", "value", "block_sparse_mask"),
    outputs=FORWARD_OUTPUTS,
    calls_forward=True,
    calls_backward=False,
    summary="aclnnBlockSparseAttention: attentionOut and softmaxLse",
    torch_npu_calls=(FORWARD_BINDING,),
)
