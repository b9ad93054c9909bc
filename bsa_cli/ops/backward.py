"""The backward: aclnnBlockSparseAttentionGrad on the golden's rounded attentionOut and softmaxLse (what bsa
always tested; a case's default, with unchanged files)."""

from .base import BACKWARD_BINDING, BACKWARD_INPUTS, GRAD_NAMES, Op
from .interface import BACKWARD_CALL

BACKWARD = Op(
    "backward",
    inputs=BACKWARD_INPUTS,
    outputs=GRAD_NAMES,
    calls_forward=False,
    calls_backward=True,
    summary="aclnnBlockSparseAttentionGrad on the golden's attentionOut and softmaxLse",
    steps=(BACKWARD_CALL,),
    torch_npu_calls=(BACKWARD_BINDING,),
)
