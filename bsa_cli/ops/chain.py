"""The chain: the forward, then the backward on the forward's OWN out and lse (what a training step does),
each call with the dtypes it accepts."""

from .base import BACKWARD_BINDING, FORWARD_BINDING, FORWARD_OUTPUTS, GRAD_NAMES, Op
from .forward_interface import FORWARD_CALL
from .interface import BACKWARD_CALL

CHAIN = Op(
    "chain",
    inputs=("query", "key", "value", "dout", "block_sparse_mask"),
    outputs=FORWARD_OUTPUTS + GRAD_NAMES,
    calls_forward=True,
    calls_backward=True,
    summary="the forward, then the backward on the forward's own out and lse",
    steps=(FORWARD_CALL, BACKWARD_CALL),
    step_owner="the chain's",
    torch_npu_calls=(FORWARD_BINDING, BACKWARD_BINDING),
    scales_per_step=True,
)
