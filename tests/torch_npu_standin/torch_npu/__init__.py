"""A stand-in for torch_npu, for bsa's tests only: plays `npu_block_sparse_attention_backward` on the CPU.

Put `tests/torch_npu_standin` on PYTHONPATH and `import torch_npu` gives torch what the real one gives it
for bsa's torch_npu device: `Tensor.npu()` (the tensor stays on the CPU, marked as moved), `Tensor.cpu()`,
`torch.npu.set_device`, `torch.npu.synchronize`, and `torch_npu.npu_block_sparse_attention_backward`.

Strict where the real binding is (read in github.com/Ascend/op-plugin, master 517f2e7d, 2026-08-21):

* The schema is registered with torch's own dispatcher, word for word from
  `op_plugin/config/op_plugin_functions.yaml`, and the function is `torch.ops.npu.<name>`, as torch_npu
  exports it: torch itself checks argument names, count, order and types (Tensor, int[]?, str, int,
  float) and raises its own RuntimeErrors; None for a Tensor arrives as an undefined tensor.
* Tensors that were not moved with `.npu()` are refused, as the dispatcher would find no CPU kernel.
* The binding's checks of `op_plugin/ops/opapi/BlockSparseAttentionBackwardKernelNpuOpApi.cpp`, with its
  messages: q/k/v of one dtype, head_dim <= 128, TND with non-empty lengths; block_shape None or shorter
  than 2 becomes [128, 128]; attenMask null, maskType 0, tokens 2147483647.
* The aclnn call plays the operator like bsa's reference device: `bsa_cli.ops.interface.check` decides the
  status from the call's tensors and values, and a non-zero status raises RuntimeError in the format of
  torch_npu's NPU_CHECK_ERROR (github.com/Ascend/pytorch 9e73e708, `torch_npu/csrc/core/npu/NPUException.h`)
  after op-plugin's EXEC_NPU_NO_FORMAT_CHECK_CMD: "... NPU function error: call aclnnBlockSparseAttentionGrad
  failed, error code is 161002 ...".

The gradients are computed here, in torch, independently of bsa's golden and reference device, along the
A2/A3 kernel's precision path (docs/operator.md section 2): fp32 scores times the fp32 scale, P32 = exp(S - lse),
P16 and dS16 casts to the input dtype, Dsum = rowsum(dout * out) in fp32, fp32 accumulation of dV += P16^T
dout, dQ += dS16 K, dK += dS16^T Q, dQ and dK times the fp32 scale at the end. BNSD computes over the full
S, whatever the lengths (as the A2/A3 code does); TND lengths are read per batch (A2/A3) or as cumulative
end offsets (Ascend 950), whichever matches the number of tokens (anything else raises: the real kernels
would read out of bounds).

`__version__` is "0.0.0+bsa.standin"; `torch_npu.utils.get_cann_version(module="CANN")` returns
`BSA_TORCH_NPU_STANDIN_CANN` ("" when unset, as torch_npu does before CANN 8.1.RC1).

`BSA_TORCH_NPU_STANDIN_FAULT` makes it misbehave, for the runner's paths: `import` (importing it raises
ImportError, as torch_npu does without the CANN environment), `crash` (SIGSEGV in the call), `hang` (never
returns), `error` (torch.npu.synchronize raises a device error without an aclnn status), `wrong-dtype`
(returns float32 gradients), `old-torch` (torch.__version__ reads "2.5.1" and the forward gets no autograd
link, as torch_npu before 2.6). The value is a fault for every process, or `FAULT@ID,...`: a fault for the
process whose ASCEND_DEVICE_ID is ID (so one run on several device ids meets several faults).
"""

from __future__ import annotations

import datetime
import os
import random
import signal
import sys
import time
import types
from typing import Any

import torch

from bsa_cli.ops import forward_interface, interface

from . import _forward

__version__ = "0.0.0+bsa.standin"

CANN_VARIABLE = "BSA_TORCH_NPU_STANDIN_CANN"
"""The CANN version `torch_npu.utils.get_cann_version(module="CANN")` reports ("" when unset, as the real one
does before CANN 8.1.RC1): what bsa records in run.json's `device_software`."""


def _get_cann_version(module: str = "CANN") -> str:
    return os.environ.get(CANN_VARIABLE, "") if module == "CANN" else ""


utils = types.ModuleType("torch_npu.utils")
utils.get_cann_version = _get_cann_version  # type: ignore[attr-defined]
sys.modules["torch_npu.utils"] = utils

NAME = "npu_block_sparse_attention_backward"
SCHEMA = (
    "npu_block_sparse_attention_backward(Tensor d_out, Tensor query, Tensor key, Tensor value, "
    "Tensor attention_out, Tensor softmax_lse, Tensor block_sparse_mask, int[]? block_shape, "
    "int[]? actual_seq_lengths, int[]? actual_seq_lengths_kv, str q_input_layout, str kv_input_layout, "
    "int num_key_value_heads, float scale_value) -> (Tensor, Tensor, Tensor)"
)
"""op_plugin/config/op_plugin_functions.yaml at 517f2e7d, unchanged since the binding came (9bbf9610)."""

FAULT_VARIABLE = "BSA_TORCH_NPU_STANDIN_FAULT"
FAULTS = ("import", "crash", "hang", "error", "wrong-dtype", "old-torch")
MAX_HEAD_DIM = 128
MAX_TOKENS = 2147483647
_ON_NPU = "_bsa_standin_on_npu"

# c10 ScalarType names, as TORCH_CHECK prints them.
_SCALAR_TYPE = {
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.bool: "Bool",
}


def _fault() -> str:
    """Return the fault `BSA_TORCH_NPU_STANDIN_FAULT` asks of this process ("" for none)."""
    device = os.environ.get("ASCEND_DEVICE_ID", "0")
    chosen = ""
    for item in filter(None, (part.strip() for part in os.environ.get(FAULT_VARIABLE, "").split(","))):
        name, _, where = item.partition("@")
        if name not in FAULTS:
            raise ValueError(f"{FAULT_VARIABLE}: unknown fault {name!r}; known faults: {', '.join(FAULTS)}")
        if not where or where == device:
            chosen = name
    return chosen


if _fault() == "old-torch":
    torch.__version__ = "2.5.1"  # type: ignore[assignment]

if _fault() == "import":
    raise ImportError("libhccl.so: cannot open shared object file: No such file or directory (stand-in fault)")


# ---- what torch_npu gives torch --------------------------------------------------------------------

_state = {"device": 0}


def _set_device(device: Any) -> None:
    if isinstance(device, torch.device):
        device = device.index or 0
    elif isinstance(device, str):
        device = int(device.rsplit(":", 1)[-1]) if ":" in device else 0
    if not isinstance(device, int) or isinstance(device, bool) or not 0 <= device < _device_count():
        raise RuntimeError(f"set_device: invalid device {device!r}{_pta_error(100)}")
    _state["device"] = device


def _device_count() -> int:
    return 8


def _synchronize(device: Any = None) -> None:
    if _fault() == "error":
        raise RuntimeError(
            "synchronize:torch_npu/csrc/core/npu/NPUStream.cpp:1 NPU function error: "
            "c10_npu::acl::AclrtSynchronizeStreamWithTimeout(stream), error code is 507015"
            f"{_pta_error(100)}\n[Error]: The aicore execution is abnormal. (stand-in fault 'error')"
        )


#: The stand-in's device clock in microseconds: each backward call advances it by $TORCH_NPU_STANDIN_KERNEL_US
#: (default 100), each forward call by $TORCH_NPU_STANDIN_FORWARD_US (default 40), and an `Event` records it,
#: so a timed run reports a known time per call (and a forward timed into a backward shows).
_clock = {"us": 0.0}


def _kernel_ran(variable: str = "TORCH_NPU_STANDIN_KERNEL_US", default: str = "100") -> None:
    _clock["us"] += float(os.environ.get(variable, default))


class _Event:
    """torch.npu.Event(enable_timing=True): record() stamps the stand-in's clock."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing, self.stamp = enable_timing, None

    def record(self, stream: Any = None) -> None:
        self.stamp = _clock["us"]

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        if not (self.enable_timing and end.enable_timing) or self.stamp is None or end.stamp is None:
            raise RuntimeError("elapsed_time: both events must be recorded with enable_timing=True")
        return (end.stamp - self.stamp) / 1000.0


npu = types.ModuleType("torch.npu")
npu.Event = _Event  # type: ignore[attr-defined]
#: The chip's SoC name, as torch.npu.get_device_name() gives it: $TORCH_NPU_STANDIN_CHIP, else Ascend910B2.
npu.get_device_name = lambda device=None: os.environ.get("TORCH_NPU_STANDIN_CHIP", "Ascend910B2")  # type: ignore[attr-defined]
npu.set_device = _set_device  # type: ignore[attr-defined]
npu.synchronize = _synchronize  # type: ignore[attr-defined]
npu.device_count = _device_count  # type: ignore[attr-defined]
npu.current_device = lambda: _state["device"]  # type: ignore[attr-defined]
npu.is_available = lambda: True  # type: ignore[attr-defined]
torch.npu = npu  # type: ignore[attr-defined]
sys.modules["torch.npu"] = npu

_tensor_cpu = torch.Tensor.cpu


def _to_npu(self: torch.Tensor, device: Any = None, non_blocking: bool = False) -> torch.Tensor:
    """Tensor.npu(): a copy that stays on the CPU, marked as being on the NPU."""
    moved = self.detach().clone()
    setattr(moved, _ON_NPU, True)
    return moved


def _to_cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Tensor.cpu(): a tensor "on the NPU" comes back as an unmarked copy."""
    if getattr(self, _ON_NPU, False):
        return self.detach().clone()
    return _tensor_cpu(self, *args, **kwargs)


torch.Tensor.npu = _to_npu  # type: ignore[attr-defined]
torch.Tensor.cpu = _to_cpu  # type: ignore[method-assign, assignment]


# ---- error messages in torch_npu's format ------------------------------------------------------------


def _timestamp() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d-%H:%M:%S.%f")


def _error_tail(submodule: int, name: str, code: int, text: str) -> str:
    """formatErrorCode (NPUException.cpp): the line torch_npu appends to its error messages."""
    return (
        f"\n[ERROR] {_timestamp()} (PID:{os.getpid()}, Device:{_state['device']}, RankID:-1) "
        f"ERR{submodule:02d}{code:03d} {name} {text}"
    )


def _pta_error(code: int) -> str:
    return _error_tail(0, "PTA", code, {100: "call acl api failed"}.get(code, "internal error"))


def _ops_param_error() -> str:
    return _error_tail(1, "OPS", 1, "invalid parameter")


def _aclnn_failure(status: int, reason: str) -> RuntimeError:
    """The RuntimeError NPU_CHECK_ERROR raises when aclnnBlockSparseAttentionGradGetWorkspaceSize fails."""
    return RuntimeError(
        f"{NAME}:op_plugin/ops/opapi/BlockSparseAttentionBackwardKernelNpuOpApi.cpp:99 NPU function error: "
        f"call aclnnBlockSparseAttentionGrad failed, error code is {status}{_pta_error(100)}.\n"
        f"EZ1001: [PID: {os.getpid()}] {_timestamp()} {reason} (bsa torch_npu stand-in)"
    )


# ---- the binding -----------------------------------------------------------------------------------


def _dtype_name(tensor: torch.Tensor | None) -> str:
    return "Undefined" if tensor is None else _SCALAR_TYPE.get(tensor.dtype, str(tensor.dtype))


def _check_params(
    query: torch.Tensor | None,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    actual_seq_lengths: list[int] | None,
    actual_seq_lengths_kv: list[int] | None,
    q_input_layout: str,
    kv_input_layout: str,
) -> None:
    """The binding's `check_params` (TORCH_CHECKs before aclnn), with its messages."""
    dtypes = [_dtype_name(t) for t in (query, key, value)]
    if len(set(dtypes)) != 1:
        raise RuntimeError(
            f"query, key, value must have the same dtype, got query={dtypes[0]}, key={dtypes[1]}, "
            f"value={dtypes[2]}{_ops_param_error()}"
        )
    if query is None:
        raise IndexError("Dimension specified as -1 but tensor has no dimensions")
    head_dim = query.size(-1)
    if head_dim > MAX_HEAD_DIM:
        raise RuntimeError(f"head_dim must be <= {MAX_HEAD_DIM}, but got {head_dim}{_ops_param_error()}")
    if q_input_layout == "TND" and not actual_seq_lengths:
        raise RuntimeError(f"actual_seq_lengths must be specified when q_input_layout is TND{_ops_param_error()}")
    if kv_input_layout == "TND" and not actual_seq_lengths_kv:
        raise RuntimeError(f"actual_seq_lengths_kv must be specified when kv_input_layout is TND{_ops_param_error()}")


def _aclnn_status(tensors: dict[str, torch.Tensor | None], params: dict[str, Any]) -> tuple[int, str]:
    """What aclnnBlockSparseAttentionGradGetWorkspaceSize returns for this call (bsa's interface rules)."""
    table = {
        name: {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
        for name, t in tensors.items()
        if t is not None
    }
    for grad, source in (("dq", "query"), ("dk", "key"), ("dv", "value")):
        if source in table:
            table[grad] = dict(table[source])
    return interface.check(params, table)


def _lengths(values: list[int], total: int, what: str) -> list[int]:
    """Per-batch lengths from per-batch values (A2/A3) or cumulative end offsets (Ascend 950)."""
    if sum(values) == total and all(v >= 0 for v in values):
        return list(values)
    ends = [0, *values]
    if values and values[-1] == total and all(b >= a for a, b in zip(ends, ends[1:], strict=False)):
        return [b - a for a, b in zip(ends, ends[1:], strict=False)]
    raise RuntimeError(
        f"stand-in: {what} {values} neither sum to nor end at the {total} tokens of the tensor; the real "
        "kernels do not check this and read out of bounds"
    )


def _backward(
    d_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_out: torch.Tensor,
    softmax_lse: torch.Tensor,
    block_sparse_mask: torch.Tensor,
    block_shape: list[int],
    actual_seq_lengths: list[int] | None,
    actual_seq_lengths_kv: list[int] | None,
    layout: str,
    scale_value: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv along the kernel's precision path, in the input dtype (see the module docstring)."""
    io_dtype = query.dtype
    scale = torch.tensor(scale_value, dtype=torch.float32)  # the kernel gets float(scaleValue)
    x, y = int(block_shape[0]), int(block_shape[1])
    if layout == "TND":
        # [T, N, D] -> one [N, S, D] view per batch entry.
        q_lengths = _lengths(list(actual_seq_lengths or []), query.shape[0], "actual_seq_lengths")
        kv_lengths = _lengths(list(actual_seq_lengths_kv or []), key.shape[0], "actual_seq_lengths_kv")
        if len(q_lengths) != len(kv_lengths):
            raise RuntimeError(f"stand-in: {len(q_lengths)} q lengths but {len(kv_lengths)} kv lengths")
        q_starts = [sum(q_lengths[:b]) for b in range(len(q_lengths))]
        kv_starts = [sum(kv_lengths[:b]) for b in range(len(kv_lengths))]

        def q_rows(t: torch.Tensor, b: int) -> torch.Tensor:
            return t[q_starts[b] : q_starts[b] + q_lengths[b]].transpose(0, 1)

        def kv_rows(t: torch.Tensor, b: int) -> torch.Tensor:
            return t[kv_starts[b] : kv_starts[b] + kv_lengths[b]].transpose(0, 1)

        batch = len(q_lengths)
    else:
        # BNSD: the full S of every batch entry; the A2/A3 code does not skip padding, but its
        # post-processing reads actualSeqLengths[b] all the same.
        given = {"actual_seq_lengths": actual_seq_lengths, "actual_seq_lengths_kv": actual_seq_lengths_kv}
        for what, values in given.items():
            if values is None or len(values) < query.shape[0]:
                raise RuntimeError(
                    f"stand-in: {what} {values} with BNSD batch {query.shape[0]}: the A2/A3 kernel reads "
                    "actualSeqLengths[b] for every batch entry, out of bounds here (pass [S] * B)"
                )

        def q_rows(t: torch.Tensor, b: int) -> torch.Tensor:
            return t[b]

        kv_rows = q_rows
        batch = query.shape[0]
    num_heads, num_kv_heads = query.shape[-2 if layout == "TND" else 1], key.shape[-2 if layout == "TND" else 1]
    group = num_heads // num_kv_heads
    lse = softmax_lse.reshape(query.shape[:-1])
    dq32 = torch.zeros(query.shape, dtype=torch.float32)
    dk32 = torch.zeros(key.shape, dtype=torch.float32)
    dv32 = torch.zeros(key.shape, dtype=torch.float32)
    zero = torch.zeros((), dtype=torch.float32)  # P where the block is not selected (whatever exp gave)
    for b in range(batch):
        q_b, do_b, o_b = q_rows(query, b), q_rows(d_out, b), q_rows(attention_out, b)
        lse_b = q_rows(lse.unsqueeze(-1), b)[..., 0]
        k_b, v_b = kv_rows(key, b), kv_rows(value, b)
        dq_b, dk_b, dv_b = q_rows(dq32, b), kv_rows(dk32, b), kv_rows(dv32, b)  # views: written in place
        sq, skv = q_b.shape[1], k_b.shape[1]
        if sq == 0 or skv == 0:
            continue
        row_blocks = torch.arange(sq) // x
        col_blocks = torch.arange(skv) // y
        if row_blocks[-1] >= block_sparse_mask.shape[2] or col_blocks[-1] >= block_sparse_mask.shape[3]:
            raise RuntimeError(
                f"stand-in: blockSparseMask {list(block_sparse_mask.shape)} has too few blocks for "
                f"{sq} x {skv} with block shape [{x}, {y}]; the real kernel reads out of bounds"
            )
        partials = []  # (kv head, dK part, dV part) of each (query head, query block): the kernel's atomic adds
        for n in range(num_heads):
            kv_head = n // group
            selected = (block_sparse_mask[b, n] != 0)[row_blocks][:, col_blocks]
            q, do, o = q_b[n].float(), do_b[n].float(), o_b[n].float()
            k, v = k_b[kv_head].float(), v_b[kv_head].float()
            scores = (q @ k.T) * scale
            p32 = torch.where(selected, torch.exp(scores - lse_b[n].unsqueeze(1)), zero)
            p16 = p32.to(io_dtype).float()
            dsum = (do * o).sum(dim=1, keepdim=True)
            # Only selected blocks are formed: a row the forward left unwritten (NaN out, no selected block)
            # never reaches dS, as on the kernel, whose Dsum is read only by the blocks it processes.
            ds32 = torch.where(selected, p32 * (do @ v.T - dsum), zero)
            ds16 = ds32.to(io_dtype).float()
            dq_b[n] += ds16 @ k
            for first in range(0, sq, x):
                rows = slice(first, first + x)
                partials.append((kv_head, ds16[rows].T @ q[rows], p16[rows].T @ do[rows]))
        # As the real binding: fp32 atomic adds in whatever order the cores finish, unless
        # torch.use_deterministic_algorithms(True) chose the deterministic path (one fixed order).
        if not torch.are_deterministic_algorithms_enabled():
            random.shuffle(partials)
        for kv_head, dk_part, dv_part in partials:
            dk_b[kv_head] += dk_part
            dv_b[kv_head] += dv_part
    return (dq32 * scale).to(io_dtype), (dk32 * scale).to(io_dtype), dv32.to(io_dtype)


def _npu_block_sparse_attention_backward(
    d_out: torch.Tensor | None,
    query: torch.Tensor | None,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    attention_out: torch.Tensor | None,
    softmax_lse: torch.Tensor | None,
    block_sparse_mask: torch.Tensor | None,
    block_shape: list[int] | None,
    actual_seq_lengths: list[int] | None,
    actual_seq_lengths_kv: list[int] | None,
    q_input_layout: str,
    kv_input_layout: str,
    num_key_value_heads: int,
    scale_value: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel torch's dispatcher calls once it has matched the arguments to `SCHEMA`."""
    fault = _fault()
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        while True:
            time.sleep(60)
    tensors = {
        "dout": d_out,
        "query": query,
        "key": key,
        "value": value,
        "attention_out": attention_out,
        "softmax_lse": softmax_lse,
        "block_sparse_mask": block_sparse_mask,
    }
    for name, tensor in tensors.items():
        if tensor is not None and not getattr(tensor, _ON_NPU, False):
            raise NotImplementedError(
                f"Could not run 'npu::{NAME}' with arguments from the 'CPU' backend: {name} is on the CPU "
                "(move it with .npu() first; bsa torch_npu stand-in)"
            )
    _check_params(query, key, value, actual_seq_lengths, actual_seq_lengths_kv, q_input_layout, kv_input_layout)
    shape = list(block_shape) if block_shape is not None and len(block_shape) >= 2 else [128, 128]
    params = {
        "layout": q_input_layout,
        "kv_layout": kv_input_layout,
        "block_shape": shape,
        "actual_seq_lengths": actual_seq_lengths,
        "actual_seq_lengths_kv": actual_seq_lengths_kv,
        "num_kv_heads": num_key_value_heads,
        "mask_type": 0,
        "pre_tokens": MAX_TOKENS,
        "next_tokens": MAX_TOKENS,
    }
    status, reason = _aclnn_status(tensors, params)
    if status != 0:
        raise _aclnn_failure(status, reason)
    assert d_out is not None and query is not None and key is not None and value is not None
    assert attention_out is not None and softmax_lse is not None and block_sparse_mask is not None
    grads = _backward(
        d_out,
        query,
        key,
        value,
        attention_out,
        softmax_lse,
        block_sparse_mask,
        shape,
        actual_seq_lengths,
        actual_seq_lengths_kv,
        q_input_layout,
        scale_value,
    )
    _kernel_ran()
    if fault == "wrong-dtype":
        grads = tuple(g.float() for g in grads)  # type: ignore[assignment]
    for grad in grads:
        setattr(grad, _ON_NPU, True)
    return grads


_library = torch.library.Library("npu", "DEF")  # kept alive: the registration lives as long as it does
_library.define(SCHEMA)
_library.impl(NAME, _npu_block_sparse_attention_backward, "CPU")

npu_block_sparse_attention_backward = getattr(torch.ops.npu, NAME)
"""As torch_npu exports it: `torch_npu.<op> = torch.ops.npu.<op>` (torch_npu/_init/core/_exports.py)."""


# ---- the forward and its autograd link ---------------------------------------------------------------

FORWARD_NAME = "npu_block_sparse_attention"
FORWARD_SCHEMA = (
    "npu_block_sparse_attention(Tensor query, Tensor key, Tensor value, Tensor block_sparse_mask, "
    "int[] block_shape, *, str q_input_layout='TND', str kv_input_layout='TND', int num_key_value_heads=1, "
    "float scale_value=0.0, int inner_precise=1, int[]? actual_seq_lengths=None, "
    "int[]? actual_seq_lengths_kv=None, int? softmax_lse_flag=0) -> (Tensor, Tensor)"
)
"""op_plugin/config/op_plugin_functions.yaml at 517f2e7d, word for word."""

AUTOGRAD_SINCE = (2, 6)
"""op_plugin/config/derivatives.yaml registers the forward's gradient for `version: [v2.6, newest]`."""


def _forward_failure(status: int, reason: str) -> RuntimeError:
    """The RuntimeError NPU_CHECK_ERROR raises when aclnnBlockSparseAttentionGetWorkspaceSize fails."""
    return RuntimeError(
        f"{FORWARD_NAME}:op_plugin/ops/opapi/BlockSparseAttentionKernelNpuOpApi.cpp:86 NPU function error: "
        f"call aclnnBlockSparseAttention failed, error code is {status}{_pta_error(100)}.\n"
        f"EZ1001: [PID: {os.getpid()}] {_timestamp()} {reason} (bsa torch_npu stand-in)"
    )


def _desc(tensor: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape)}


def _forward_lengths(values: list[int] | None, count: int, tensor: torch.Tensor, layout: str) -> list[int]:
    """Per-batch lengths the kernel uses: the list (TND, or BNSD given), else S for every batch entry."""
    if values is not None:
        return list(values)
    return [tensor.shape[2]] * count if layout != "TND" else []


def _npu_block_sparse_attention(
    query: torch.Tensor | None,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    block_sparse_mask: torch.Tensor | None,
    block_shape: list[int],
    *,
    q_input_layout: str = "TND",
    kv_input_layout: str = "TND",
    num_key_value_heads: int = 1,
    scale_value: float = 0.0,
    inner_precise: int = 1,
    actual_seq_lengths: list[int] | None = None,
    actual_seq_lengths_kv: list[int] | None = None,
    softmax_lse_flag: int | None = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's kernel: the binding's check, aclnn's statuses (bsa's forward rules), then the math."""
    fault = _fault()
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    tensors = {"query": query, "key": key, "value": value, "block_sparse_mask": block_sparse_mask}
    for name, tensor in tensors.items():
        if tensor is not None and not getattr(tensor, _ON_NPU, False):
            raise NotImplementedError(
                f"Could not run 'npu::{FORWARD_NAME}' with arguments from the 'CPU' backend: {name} is on the CPU "
                "(move it with .npu() first; bsa torch_npu stand-in)"
            )
    # check_params of BlockSparseAttentionKernelNpuOpApi.cpp: q, k, v of one dtype, nothing else.
    dtypes = [_dtype_name(t) for t in (query, key, value)]
    if len(set(dtypes)) != 1:
        raise RuntimeError(
            f"query, key, value must have the same dtype, got query={dtypes[0]}, key={dtypes[1]}, "
            f"value={dtypes[2]}{_ops_param_error()}"
        )
    if query is None or key is None or value is None:
        raise RuntimeError(f"{FORWARD_NAME}: undefined tensors reach aclnn as null: not played by the stand-in")
    flag = 0 if softmax_lse_flag is None else softmax_lse_flag  # softmax_lse_flag.value_or(0)
    lse_shape = _forward.lse_shape(query)
    table = {name: _desc(t) for name, t in tensors.items() if t is not None}
    table["attention_out"] = _desc(query)  # apply_tensor_without_format(query.sizes(), query.options())
    table["softmax_lse"] = {"dtype": "float32", "shape": lse_shape}
    params = {
        "layout": q_input_layout,
        "kv_layout": kv_input_layout,
        "block_shape": list(block_shape),
        "actual_seq_lengths": actual_seq_lengths,
        "actual_seq_lengths_kv": actual_seq_lengths_kv,
        "num_kv_heads": num_key_value_heads,
        "inner_precise": inner_precise,
        "softmax_lse_flag": flag,
        "mask_type": 0,
        "pre_tokens": MAX_TOKENS,
        "next_tokens": MAX_TOKENS,
    }
    status, reason = forward_interface.check(params, table)
    if status != 0:
        raise _forward_failure(status, reason)
    assert block_sparse_mask is not None
    layout = q_input_layout
    batch = block_sparse_mask.shape[0]
    q_lengths = _forward_lengths(actual_seq_lengths, batch, query, layout)
    kv_lengths = _forward_lengths(actual_seq_lengths_kv, batch, key, layout)
    out, lse = _forward.forward(
        query,
        key,
        value,
        block_sparse_mask,
        list(block_shape),
        layout,
        q_lengths,
        kv_lengths,
        scale_value,
        inner_precise,
        flag,
    )
    _kernel_ran("TORCH_NPU_STANDIN_FORWARD_US", "40")
    for tensor in (out, lse):
        setattr(tensor, _ON_NPU, True)
    return out, lse


class _BlockSparseAttentionFunction(torch.autograd.Function):
    """derivatives.yaml's link: out's gradient is npu_block_sparse_attention_backward(grad, query, key, value,
    result0, result1, block_sparse_mask, block_shape, actual_seq_lengths, actual_seq_lengths_kv,
    q_input_layout, kv_input_layout, num_key_value_heads, scale_value); lse is not differentiable."""

    @staticmethod
    def forward(ctx: Any, query: Any, key: Any, value: Any, mask: Any, block_shape: Any, options: Any) -> Any:
        out, lse = _npu_block_sparse_attention(query, key, value, mask, block_shape, **options)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(query, key, value, out, lse, mask)
        ctx.call = (block_shape, options)
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad: Any, grad_lse: Any) -> Any:
        query, key, value, out, lse, mask = ctx.saved_tensors
        for tensor in (query, key, value, out, lse, mask):  # unpacked saved tensors lose Python attributes
            setattr(tensor, _ON_NPU, True)
        block_shape, options = ctx.call
        dq, dk, dv = npu_block_sparse_attention_backward(
            grad,
            query,
            key,
            value,
            out,  # result0: the forward's own out
            lse,  # result1: the forward's own lse, written or not
            mask,
            block_shape,
            options.get("actual_seq_lengths"),
            options.get("actual_seq_lengths_kv"),
            options.get("q_input_layout", "TND"),
            options.get("kv_input_layout", "TND"),
            options.get("num_key_value_heads", 1),
            options.get("scale_value", 0.0),
        )
        return dq, dk, dv, None, None, None


def _npu_block_sparse_attention_autograd(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_sparse_mask: torch.Tensor,
    block_shape: Any,
    **options: Any,
) -> Any:
    """The Autograd kernel torch_npu generates from derivatives.yaml (torch 2.6 and later)."""
    return _BlockSparseAttentionFunction.apply(query, key, value, block_sparse_mask, block_shape, options)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


_library.define(FORWARD_SCHEMA)
_library.impl(FORWARD_NAME, _npu_block_sparse_attention, "CPU")
if _torch_version() >= AUTOGRAD_SINCE:
    _library.impl(FORWARD_NAME, _npu_block_sparse_attention_autograd, "Autograd")

npu_block_sparse_attention = getattr(torch.ops.npu, FORWARD_NAME)
"""As torch_npu exports it (`torch.ops.npu.npu_block_sparse_attention`)."""
