"""An operator engineer's torch_npu test of aclnnBlockSparseAttentionGrad, over a whole bsa suite.

On an Ascend host with torch and torch_npu (and bsa) installed:

    bsa gen cases/smoke.yaml cases/edge.yaml cases/negative.yaml -o out/suite
    TASK_QUEUE_ENABLE=1 pytest --bsa-cases out/suite examples/test_torch_npu.py --junitxml torch_npu.xml

Every generated case folder becomes one test, named after the case (`NAME[forward]` for a case's forward
folder: generate with `--ops forward,backward` to test both). A valid case runs the binding and judges
dq, dk, dv exactly as `bsa compare` would; a failing verdict fails the test with the deciding check.
A negative case expects the binding to raise the RuntimeError that carries the aclnn status it
expects. A case the binding cannot express (a null blockShape, an attenMask, ...) is skipped.
(TASK_QUEUE_ENABLE=2 runs aclnn's checks on the task queue, where their status does not reach Python.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch_npu = pytest.importorskip("torch_npu")  # gives torch `Tensor.npu()` and `torch.npu`

import bsa_cli as bsa  # noqa: E402
from bsa_cli.devices.torch_npu import NotExpressible, plan_call
from bsa_cli.devices.torch_npu_ops import plan_op

TENSORS = ("dout", "query", "key", "value", "attention_out", "softmax_lse", "block_sparse_mask")
"""The binding's tensors, in its order (d_out first)."""


def on_npu(array: np.ndarray | None) -> Any:
    """Return an input on the NPU, or None for a tensor the case passes null."""
    return None if array is None else bsa.to_torch(array).npu()


@pytest.mark.bsa_ops("backward")
def test_block_sparse_attention_backward(bsa_case: bsa.LoadedCase) -> None:
    try:
        plan_call(bsa_case.manifest)
    except NotExpressible as exc:
        pytest.skip(str(exc))
    tensors = [on_npu(bsa_case.inputs.get(name)) for name in TENSORS]
    if bsa_case.expect:
        with pytest.raises(RuntimeError) as refused:
            torch_npu.npu_block_sparse_attention_backward(*tensors, **bsa_case.op_args)
            torch.npu.synchronize()
        bsa.assert_passed(bsa.judge_status(bsa_case, refused.value, device="torch_npu"))
        return
    dq, dk, dv = torch_npu.npu_block_sparse_attention_backward(*tensors, **bsa_case.op_args)
    torch.npu.synchronize()
    bsa.assert_passed(bsa.judge(bsa_case, dq.cpu(), dk.cpu(), dv.cpu(), device="torch_npu"))


@pytest.mark.bsa_ops("forward")
def test_block_sparse_attention_forward(bsa_case: bsa.LoadedCase) -> None:
    """The forward (`npu_block_sparse_attention`): out and lse judged on the rows the forward writes."""
    try:
        call = plan_op(bsa_case.manifest).forward
    except NotExpressible as exc:
        pytest.skip(str(exc))
    query, key, value, mask = (on_npu(bsa_case.inputs[name]) for name in ("query", "key", "value", "block_sparse_mask"))
    if bsa_case.expect:
        with pytest.raises(RuntimeError) as refused:
            torch_npu.npu_block_sparse_attention(query, key, value, mask, call.block_shape, **call.keywords())
            torch.npu.synchronize()
        bsa.assert_passed(bsa.judge_status(bsa_case, refused.value, device="torch_npu"))
        return
    out, lse = torch_npu.npu_block_sparse_attention(query, key, value, mask, call.block_shape, **call.keywords())
    torch.npu.synchronize()
    bsa.assert_passed(bsa.judge(bsa_case, out=out.cpu(), lse=lse.cpu(), device="torch_npu"))
