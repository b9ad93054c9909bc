"""The torch_npu device's calls other than the backward alone: the forward, the chain, autograd.

`devices.torch_npu` runs a case folder by its `manifest.op`; this module plans and makes the calls of the
three ops that call the forward, and holds what both modules share (the tensors in and out of torch, the
errors). The binding, as read in op-plugin (github.com/Ascend/op-plugin, master 517f2e7d):

* `op_plugin/config/op_plugin_functions.yaml`: `npu_block_sparse_attention(Tensor query, Tensor key,
  Tensor value, Tensor block_sparse_mask, int[] block_shape, *, str q_input_layout='TND', str
  kv_input_layout='TND', int num_key_value_heads=1, float scale_value=0.0, int inner_precise=1, int[]?
  actual_seq_lengths=None, int[]? actual_seq_lengths_kv=None, int? softmax_lse_flag=0) -> (Tensor, Tensor)`:
  block_shape is a required `int[]` (never None), everything after it keyword-only.
* `op_plugin/ops/opapi/BlockSparseAttentionKernelNpuOpApi.cpp`: the binding checks only that query, key,
  value share a dtype; it allocates attention_out like query and softmax_lse float32 `[d0, d1, d2, 1]`
  (4-D query) or `[d0, d1, 1]` (`apply_tensor_without_format`: uninitialised memory, never pre-filled),
  passes attenMask and blockTable null, maskType 0, blockSize 0, tokens 2147483647, `softmax_lse_flag`
  `value_or(0)`, and calls aclnnBlockSparseAttention through EXEC_NPU_NO_FORMAT_CHECK_CMD: a failure is a
  RuntimeError holding "call aclnnBlockSparseAttention failed, error code is N".
* `op_plugin/config/derivatives.yaml` (`version: [v2.6, newest]`): the gradient of query, key, value is
  `npu_block_sparse_attention_backward(grad, query, key, value, result0, result1, block_sparse_mask,
  block_shape, actual_seq_lengths, actual_seq_lengths_kv, q_input_layout, kv_input_layout,
  num_key_value_heads, scale_value)`: the forward's own out and lse (`output_differentiability: [true,
  false]`), and the forward's lengths. Before torch 2.6 the forward has no autograd formula: `autograd`
  cannot run there (`CannotRun`).

The ops:

* `forward`: the mask as int8 (the forward's registered dtype; same bytes), out and lse written as the
  manifest's `outputs` say. lse is written whatever `softmax_lse_flag` (the binding allocates it; with flag
  0 the operator leaves it unwritten: what it holds is judged by nobody).
* `chain`: the forward, then `npu_block_sparse_attention_backward` on the forward's own out and lse
  (still on the device), the mask as the manifest's dtype (the backward's: uint8 or bool), its lengths as
  the backward's harness passes them (`interface.call_lengths`). Status: the forward's, then the backward's.
* `autograd`: query, key, value with `requires_grad`, the forward, `out.backward(dout)`; dq, dk, dv from
  `.grad`. This is a training step: the backward receives what derivatives.yaml hands it, the forward's
  own mask tensor included, so the forward gets the mask in the manifest's dtype (the backward's: uint8 or
  bool; an int8 one reaches the backward, which refuses it since v9.1.0 with 161002). The forward
  registers only DT_INT8 for it (ops-transformer `block_sparse_attention_def.cpp`) and its aclnn layer does
  not check the mask's dtype: whether the NPU's forward takes a uint8/bool mask is for a real run to show.

Lengths passed to the forward: the case's own, except a BNSD case without any, which passes `[S] * B` for
both (the forward accepts both-or-neither; the A2/A3 backward reads `actualSeqLengths[b]` even for BNSD, and
autograd hands it the forward's lengths). A case giving one list and not the other passes exactly that.

The child never pre-fills outputs (the binding allocates them): run.json records no `prefilled_outputs`.

`bsa run --time`: after the outputs are written, `time_calls` times the forward and the backward apart
(the backward alone, the chain's backward on the judged forward's out and lse, autograd's `out.backward`
each after an untimed forward), as docs/run.md's "Timed runs" says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.case import MAX_TOKENS, numpy_dtype
from ..core.errors import BsaError
from ..core.untrusted import inside_parent
from ..ops import Op
from ..ops.base import AUTOGRAD_STEP, BACKWARD_BINDING, FORWARD_BINDING
from ..ops.interface import call_lengths
from ..store import array_bytes
from ..store.manifest import GRAD_NAMES, Manifest
from . import timing
from .base import write_atomic, write_status

#: How the forward's aclnn status appears in torch_npu's RuntimeError (NPU_CHECK_ERROR).
FORWARD_STATUS_PATTERN = re.compile(r"call aclnnBlockSparseAttention failed, error code is (\d+)")
#: How the backward's aclnn status appears in torch_npu's RuntimeError (NPU_CHECK_ERROR).
BACKWARD_STATUS_PATTERN = re.compile(r"call aclnnBlockSparseAttentionGrad failed, error code is (\d+)")

#: The first torch whose torch_npu has the forward's autograd formula (derivatives.yaml `version: [v2.6, newest]`).
AUTOGRAD_SINCE = (2, 6)

#: The forward's tensors, in the binding's order.
FORWARD_INPUTS = ("query", "key", "value", "block_sparse_mask")

#: Manifest dtypes this device can hand to torch (torch names them alike).
TORCH_DTYPES = ("float16", "bfloat16", "float32", "float64", "uint8", "int8", "int16", "int32", "int64", "bool")


class NotExpressible(BsaError):
    """A case that the torch_npu binding cannot express (it fixes or fills in what the case varies)."""


class TorchNpuMissing(BsaError):
    """torch or torch_npu cannot be imported in this Python, or has no such binding."""


class CannotRun(BsaError):
    """An op this device cannot run here (autograd before torch 2.6, an op gen skipped): the case is skipped."""


class DeviceFailure(BsaError):
    """The operator or the device failed without an aclnn status, or returned unusable outputs.

    `str()` is one line; `detail` holds the whole message of the exception behind it, if any.
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def _int(value: Any) -> int:
    """Return an integer value as a Python int (the binding's `int`), refusing anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{value!r}, not an integer")
    return int(value)


def _int_list(values: Sequence[Any] | None) -> list[int] | None:
    return None if values is None else [_int(v) for v in values]


def autograd_refusal(version: str | None) -> str | None:
    """Return why autograd cannot run with torch `version` ("2.6.0+cpu": major 2, minor 6; None: it can, or the
    version is unknown)."""
    found = re.match(r"\s*(\d+)\.(\d+)", version or "")
    if found is None or (int(found.group(1)), int(found.group(2))) >= AUTOGRAD_SINCE:
        return None
    return (
        f"autograd needs torch 2.6 or later (torch_npu registers the forward's gradient for v2.6 and newer, "
        f"op-plugin derivatives.yaml); this Python has torch {version}"
    )


# ---- the calls ----------------------------------------------------------------------------------------


def refuse_fixed(params: Mapping[str, Any], refuse: Callable[[str], NotExpressible]) -> None:
    """Refuse a case whose maskType or tokens are not what both bindings always pass (`refuse` words it)."""
    if params.get("mask_type", 0) != 0:
        raise refuse(f"maskType {params.get('mask_type')!r}: the binding always passes 0")
    for key in ("pre_tokens", "next_tokens"):
        if params.get(key, MAX_TOKENS) != MAX_TOKENS:
            raise refuse(f"{key} {params.get(key)!r}: the binding always passes {MAX_TOKENS}")


def call_keywords(call: Any, *skipped: str) -> dict[str, Any]:
    """Return the fields of a call dataclass but `skipped`, in field order, by name (the binding's keywords)."""
    return {f.name: getattr(call, f.name) for f in dataclasses.fields(call) if f.name not in skipped}


@dataclass(frozen=True)
class ForwardCall:
    """The non-tensor arguments of one `npu_block_sparse_attention` call."""

    block_shape: list[int]
    q_input_layout: str
    kv_input_layout: str
    num_key_value_heads: int
    scale_value: float
    inner_precise: int
    actual_seq_lengths: list[int] | None
    actual_seq_lengths_kv: list[int] | None
    softmax_lse_flag: int

    def keywords(self) -> dict[str, Any]:
        """Return the keyword-only arguments after `block_shape`, by their names in the binding's schema."""
        return call_keywords(self, "block_shape")


@dataclass(frozen=True)
class OpPlan:
    """What one op folder calls: the forward's arguments and, for the chain, the backward's keywords."""

    op: Op
    forward: ForwardCall
    backward: dict[str, Any] | None  # the chain's explicit backward call (autograd: derivatives.yaml's)
    outputs: tuple[str, ...]


def forward_lengths(params: Mapping[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    """Return the lengths the forward gets: the case's; `[S] * B` for both when a BNSD case has none."""
    q_lengths, kv_lengths = params.get("actual_seq_lengths"), params.get("actual_seq_lengths_kv")
    if params.get("layout") == "BNSD" and q_lengths is None and kv_lengths is None:
        return call_lengths(params)
    return (list(q_lengths) if q_lengths is not None else None, list(kv_lengths) if kv_lengths is not None else None)


def plan_op(manifest: Manifest) -> OpPlan:
    """Return the calls that run a forward, chain or autograd case folder.

    Raises:
        NotExpressible: the binding fixes or fills in something the case sets otherwise.
        CannotRun: gen skipped this op (the manifest's `skip`).
    """
    name, params, inputs, outputs = manifest.name, manifest.params, manifest.inputs, manifest.outputs
    op = manifest.op
    if manifest.skip is not None:
        raise CannotRun(f"gen skipped this op: {manifest.skip}")

    def refuse(reason: str) -> NotExpressible:
        return NotExpressible(f"case {name}: torch_npu.{FORWARD_BINDING} cannot express this call: {reason}")

    if "atten_mask" in inputs or "block_table" in inputs:
        raise refuse("an attenMask or blockTable is passed, but the binding always passes null")
    refuse_fixed(params, refuse)
    block_shape = params.get("block_shape")
    if not isinstance(block_shape, list):
        raise refuse(f"blockShape {block_shape!r}: the binding's block_shape is a required int[]")
    if params.get("null_layouts"):
        raise refuse("a null layout: the binding takes a str")
    for tensor in (*FORWARD_INPUTS, *(("dout",) if op.calls_backward else ())):
        if inputs.get(tensor) is None:
            raise refuse(f"{tensor} is null: the binding takes a Tensor")
    for input_name, entry in manifest.entries("inputs"):
        if entry.get("dtype") not in TORCH_DTYPES:
            raise refuse(f"{input_name} has dtype {entry.get('dtype')!r}, which torch has no tensor for")
    descs = {name: (entry.get("dtype"), list(entry.get("shape") or ())) for name, entry in manifest.entries("inputs")}
    q_shape = descs["query"][1]  # the binding allocates softmax_lse as [d0, d1, d2, 1] (4-D query) or [d0, d1, 1]
    wanted = {"out": descs["query"], "lse": ("float32", [*q_shape[:3], 1] if len(q_shape) == 4 else [*q_shape[:2], 1])}
    wanted |= {"dq": descs["query"], "dk": descs["key"], "dv": descs["value"]}
    for output in op.outputs:
        found = outputs.get(output)
        if found is None:
            raise refuse(f"{output} is null: the binding always returns it")
        dtype, shape = found.get("dtype"), list(found.get("shape") or ())
        like_dtype, like_shape = wanted[output]
        same_bytes = output == "lse" and int(np.prod(shape)) == int(np.prod(like_shape))  # squeezed lse
        if dtype != like_dtype or (shape != like_shape and not same_bytes):
            raise refuse(f"{output} is {dtype} {shape}, but the binding returns {like_dtype} {like_shape}")
    forward_params = manifest.forward_params
    q_lengths, kv_lengths = forward_lengths(params)
    try:
        layout = str(params.get("layout"))
        forward = ForwardCall(
            block_shape=[_int(v) for v in block_shape],
            q_input_layout=layout,
            kv_input_layout=str(params.get("kv_layout", layout)),
            num_key_value_heads=_int(params.get("num_kv_heads")),
            scale_value=manifest.step_scales["forward"],
            inner_precise=_int(forward_params["inner_precise"]),
            actual_seq_lengths=_int_list(q_lengths),
            actual_seq_lengths_kv=_int_list(kv_lengths),
            softmax_lse_flag=_int(forward_params["softmax_lse_flag"]),
        )
        backward = None
        if BACKWARD_BINDING in op.torch_npu_calls:
            bq, bkv = call_lengths(params)
            shared = ("q_input_layout", "kv_input_layout", "num_key_value_heads")
            lengths = {"actual_seq_lengths": _int_list(bq), "actual_seq_lengths_kv": _int_list(bkv)}
            # the forward's own values, in the backward's order; the scale its own (a chain's `step_scales`)
            backward = {"block_shape": forward.block_shape, **lengths, **{key: getattr(forward, key) for key in shared}}
            backward["scale_value"] = manifest.step_scales["backward"]
    except (KeyError, TypeError, ValueError) as exc:
        raise refuse(f"a value the binding takes as int, int list or float is {exc}") from None
    return OpPlan(op=op, forward=forward, backward=backward, outputs=op.outputs)


def aclnn_status(message: str) -> int | None:
    """Return the aclnn status (the forward's or the backward's) an exception message from torch_npu carries."""
    found = FORWARD_STATUS_PATTERN.search(message) or BACKWARD_STATUS_PATTERN.search(message)
    return int(found.group(1)) if found else None


# ---- tensors (torch is imported by the caller and passed in) --------------------------------------


def to_tensor(torch: Any, array: np.ndarray, dtype_name: str) -> Any:
    """Return a CPU tensor holding exactly the bytes of `array` (bfloat16 through an int16 view)."""
    array = np.ascontiguousarray(array)
    if dtype_name == "bfloat16":
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())


def to_array(torch: Any, tensor: Any, dtype_name: str, shape: Sequence[int], what: str) -> np.ndarray:
    """Return the bytes of a CPU tensor as a NumPy array of the manifest dtype (bfloat16 through int16).

    Raises:
        DeviceFailure: the tensor is not of `dtype_name` and `shape`.
    """
    expected = getattr(torch, dtype_name)
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != expected or list(tensor.shape) != list(shape):
        found = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise DeviceFailure(f"{what}: torch_npu returned {found}, the manifest wants {expected} {list(shape)}")
    tensor = tensor.contiguous()
    if dtype_name == "bfloat16":
        return tensor.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return tensor.numpy()


def write_output(torch: Any, output_dir: Path, entry: Mapping[str, Any], tensor: Any, what: str) -> None:
    """Write one returned tensor as its manifest entry says (a squeezed lse entry takes the same bytes)."""
    host = tensor.detach().cpu()
    shape = list(entry["shape"])
    if what == "lse" and list(host.shape) != shape and host.numel() == int(np.prod(shape)):
        host = host.reshape(shape)
    array = to_array(torch, host, entry["dtype"], shape, what)
    path = inside_parent(output_dir, entry["file"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, array_bytes(array))


# ---- one op ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A step the operator refused with an aclnn status (torch_npu's message with it)."""

    status: int
    message: str


def _call(what: str, function: Any, torch: Any) -> Any:
    """Run one step and synchronize; return its result, or the `Refusal` it failed with.

    Raises:
        DeviceFailure: the step failed without an aclnn status.
    """
    try:
        result = function()
        torch.npu.synchronize()
    except Exception as exc:
        message = str(exc).strip()
        status = aclnn_status(message)
        if status is None:
            first = message.splitlines()[0] if message else ""
            raise DeviceFailure(f"{what} raised {type(exc).__name__}: {first}", detail=message) from None
        return Refusal(status, message)
    return result


def _tensors(result: Any, count: int, what: str, wanted: str = "") -> tuple[Any, ...]:
    if not isinstance(result, (tuple, list)) or len(result) != count:
        raise DeviceFailure(f"{what} returned {type(result).__name__}, not {wanted or f'{count} tensors'}")
    return tuple(result)


def refused(output_dir: Path, refusal: Refusal) -> int:
    """Record a call the operator refused: status.txt only, the status and torch_npu's message."""
    print(f"status {refusal.status}")
    return write_status(output_dir, refusal.status, refusal.message)


def written(torch: Any, output_dir: Path, manifest: Manifest, returned: Mapping[str, Any]) -> int:
    """Write each returned tensor as its output entry says, then status.txt "0" (last: a status of 0
    promises complete output files); return 0."""
    for output, tensor in returned.items():
        write_output(torch, output_dir, manifest.entry("outputs", output), tensor, output)
    print("status 0")
    return write_status(output_dir, 0)


def time_calls(torch: Any, step: str, call: Callable[[], Any], prepare: Callable[[], Any] | None = None) -> None:
    """Time `call` as `bsa run --time` asks ($BSA_TIME_RUNS timed calls after $BSA_TIME_WARMUP untimed ones;
    none without it): each timed call between two `torch.npu.Event(enable_timing=True)` recorded on the current
    stream, torch_npu's counterpart of torch.cuda.Event, printing one `bsa-time-us:` line per call. `prepare`
    runs before each call, outside the events (autograd's forward, whose graph each backward consumes). The
    call writes none of its inputs; its outputs are new tensors from the caching allocator, inside the timing.

    Raises:
        DeviceFailure: a timed call failed (after the judged one passed).
    """
    runs, warmup = (_count(os.environ.get(name)) for name in (timing.RUNS_ENV, timing.WARMUP_ENV))
    if not runs:
        return
    print(f"bsa-timing: {step} warmup {warmup} runs {runs}")
    with contextlib.suppress(Exception):  # the SoC name (Ascend/torchair reads it so); none is no failure
        print(f"{timing.CHIP_PREFIX}{torch.npu.get_device_name()}")
    try:
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        for index in range(warmup + runs):
            if prepare is not None:
                prepare()
            start.record()
            call()
            end.record()
            end.synchronize()
            if index >= warmup:
                print(f"{timing.TIME_PREFIX}{step} {start.elapsed_time(end) * 1000:.3f}", flush=True)
    except Exception as exc:
        raise DeviceFailure(
            f"a timed {step} call failed after the judged one passed: {type(exc).__name__}: {exc}"
        ) from None


def _count(text: str | None) -> int:
    """A count of calls from the environment: a whole number from 0 to `timing.MAX_RUNS`, else 0."""
    return int(text) if text is not None and text.isdigit() and int(text) <= timing.MAX_RUNS else 0


def backward_grads(call: Any, torch: Any, wanted: str = "") -> dict[str, Any] | Refusal:
    """Call the backward binding (`call()`); return dq, dk, dv, or the `Refusal` it failed with."""
    grads = _call(BACKWARD_BINDING, call, torch)
    if isinstance(grads, Refusal):
        return grads
    return dict(zip(GRAD_NAMES, _tensors(grads, len(GRAD_NAMES), BACKWARD_BINDING, wanted), strict=True))


def run_op(
    plan: OpPlan, manifest: Manifest, arrays: Mapping[str, np.ndarray], torch: Any, torch_npu: Any, output_dir: Path
) -> int:
    """Run one forward, chain or autograd case on the current NPU; write its outputs and status.

    Returns the aclnn status: the first nonzero one (the forward's, then the backward's), or 0.

    Raises:
        CannotRun: autograd before torch 2.6.
        TorchNpuMissing: torch_npu has no such binding.
        DeviceFailure: the operator or device failed without a status, or returned unusable outputs.
        OSError: an output file could not be written.
    """
    op = plan.op
    if op.autograd_only:
        refusal = autograd_refusal(str(torch.__version__))
        if refusal is not None:
            raise CannotRun(refusal)
    forward: Any = getattr(torch_npu, FORWARD_BINDING, None)
    backward: Any = getattr(torch_npu, BACKWARD_BINDING, None)
    for binding, function in ((FORWARD_BINDING, forward), (BACKWARD_BINDING, backward)):
        if function is None and binding in op.torch_npu_calls:
            version = getattr(torch_npu, "__version__", "?")
            raise TorchNpuMissing(
                f"torch_npu {version} has no {binding} (op-plugin added it in 2026-03): update torch_npu"
            )
    dtypes = {name: str(entry["dtype"]) for name, entry in manifest.entries("inputs")}
    try:
        tensors = {name: to_tensor(torch, arrays[name], dtypes[name]).npu() for name in arrays}
        # The forward's registered mask dtype is int8: the same bytes, another dtype. Autograd hands the
        # backward the forward's own mask tensor (derivatives.yaml), so there it keeps the backward's dtype.
        mask_bytes = np.ascontiguousarray(arrays["block_sparse_mask"]).view(np.int8)
        forward_mask = tensors["block_sparse_mask"] if op.autograd_only else to_tensor(torch, mask_bytes, "int8").npu()
        if op.autograd_only:
            for name in ("query", "key", "value"):
                tensors[name] = tensors[name].requires_grad_(True)
    except Exception as exc:
        raise DeviceFailure(f"cannot place the inputs on the NPU: {type(exc).__name__}: {exc}") from None
    mask_dtype = dtypes["block_sparse_mask"] if op.autograd_only else "int8"
    steps = "".join(f", then {step}" for step in op.torch_npu_calls[1:])
    print(f"op {op}: {FORWARD_BINDING} (mask as {mask_dtype}){steps}")
    call = plan.forward
    query, key, value = (tensors[n] for n in ("query", "key", "value"))

    def run_forward() -> Any:
        return forward(query, key, value, forward_mask, call.block_shape, **call.keywords())

    result = _call(FORWARD_BINDING, run_forward, torch)
    if isinstance(result, Refusal):
        return refused(output_dir, result)
    out, lse = _tensors(result, 2, FORWARD_BINDING)
    returned = {"out": out, "lse": lse}
    timed_backward: Callable[[], Any] | None = None
    prepare: Callable[[], Any] | None = None
    if BACKWARD_BINDING in op.torch_npu_calls:
        keywords = plan.backward or {}
        mask = tensors["block_sparse_mask"]  # the manifest's dtype: the backward's

        def timed_backward() -> Any:
            return backward(tensors["dout"], query, key, value, out, lse, mask, **keywords)

        grads = backward_grads(timed_backward, torch)
        if isinstance(grads, Refusal):
            return refused(output_dir, grads)
        returned.update(grads)
    elif AUTOGRAD_STEP in op.torch_npu_calls:
        step = _call(AUTOGRAD_STEP, lambda: out.backward(tensors["dout"]), torch)
        if isinstance(step, Refusal):
            return refused(output_dir, step)
        for grad_name, source in zip(GRAD_NAMES, (query, key, value), strict=True):
            if source.grad is None:
                raise DeviceFailure(f"{AUTOGRAD_STEP} left no {grad_name}: the forward has no gradient here")
            returned[grad_name] = source.grad
        # Each out.backward consumes its forward's graph: an untimed forward (and cleared .grad, so no
        # accumulation is timed) comes before each timed backward.
        graph: dict[str, Any] = {}

        def prepare() -> None:
            for source in (query, key, value):
                source.grad = None
            graph["out"] = run_forward()[0]

        def timed_backward() -> Any:
            return graph["out"].backward(tensors["dout"])

    status = written(torch, output_dir, manifest, {output: returned[output] for output in plan.outputs})
    time_calls(torch, "forward", run_forward)
    if timed_backward is not None:
        time_calls(torch, "backward", timed_backward, prepare)
    return status
