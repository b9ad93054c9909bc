"""The forward: aclnnBlockSparseAttention on query, key, value and the mask: attentionOut and softmaxLse."""

from .base import FORWARD_BINDING, FORWARD_OUTPUTS, Op
from .forward_interface import FORWARD_CALL, FORWARD_MASK_DTYPE

FORWARD = Op(
    "forward",
    inputs=("query", "key", "value", "block_sparse_mask"),
    outputs=FORWARD_OUTPUTS,
    calls_forward=True,
    calls_backward=False,
    summary="aclnnBlockSparseAttention: attentionOut and softmaxLse",
    steps=(FORWARD_CALL,),
    mask_dtype=FORWARD_MASK_DTYPE,
    torch_npu_calls=(FORWARD_BINDING,),
)
