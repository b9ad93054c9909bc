"""Autograd: the chain through torch_npu's autograd (`npu_block_sparse_attention` with `requires_grad`
inputs, then `out.backward(dout)`): only a torch_npu device runs it."""

from .base import AUTOGRAD_STEP, FORWARD_BINDING, FORWARD_OUTPUTS, GRAD_NAMES, Op
from .forward_interface import FORWARD_CALL
from .interface import BACKWARD_CALL

AUTOGRAD = Op(
    "autograd",
    inputs=("query", "key", "value", "dout", "block_sparse_mask"),
    outputs=FORWARD_OUTPUTS + GRAD_NAMES,
    calls_forward=True,
    calls_backward=True,
    summary="the chain through torch_npu's autograd (torch_npu only)",
    steps=(FORWARD_CALL, BACKWARD_CALL),
    step_owner="autograd's",
    torch_npu_calls=(FORWARD_BINDING, AUTOGRAD_STEP),
    autograd_only=True,
)
