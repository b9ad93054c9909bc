"""The torch_npu device: run one case through `torch_npu.npu_block_sparse_attention_backward`.

    python -m bsa_cli.devices.torch_npu <case_dir>/case.json <output_dir>

`bsa run --device torch_npu` runs this module once per case, in a child process, so the binary contract
of docs/run.md applies unchanged (timeout, crash, status.txt, output checks): it writes dq.bin, dk.bin,
dv.bin as the manifest's `outputs` say and then status.txt "0"; when the operator rejects the call with an
aclnn status it writes only status.txt (the status, then the operator's message) and exits 0 too.

The binding, as read in op-plugin (github.com/Ascend/op-plugin, master at 517f2e7d, 2026-08-21; the
binding's files last changed in c0f67e98):

* `op_plugin/config/op_plugin_functions.yaml`: `npu_block_sparse_attention_backward(Tensor d_out,
  Tensor query, Tensor key, Tensor value, Tensor attention_out, Tensor softmax_lse, Tensor
  block_sparse_mask, int[]? block_shape, int[]? actual_seq_lengths, int[]? actual_seq_lengths_kv,
  str q_input_layout, str kv_input_layout, int num_key_value_heads, float scale_value)
  -> (Tensor, Tensor, Tensor)`: no defaults, every argument positional or keyword. torch_npu exports it
  as `torch_npu.npu_block_sparse_attention_backward` (= `torch.ops.npu....`), whose schema matcher
  passes None for a `Tensor` as an undefined tensor.
* `op_plugin/ops/opapi/BlockSparseAttentionBackwardKernelNpuOpApi.cpp`: before aclnn it checks that
  query, key, value share a dtype, that head_dim (query.size(-1)) <= 128, and (master, not the 26.0.0
  branch) that a TND layout comes with non-empty lengths; a block_shape of fewer than 2 values becomes
  [128, 128]; attenMask = null, maskType = 0, preTokens = nextTokens = 2147483647 are fixed; dq, dk, dv
  are allocated like query, key, value; an undefined tensor reaches aclnn as a null aclTensor
  (`ConvertType` in `op_plugin/utils/op_api_common.cpp`).
* `op_plugin/utils/op_api_common.h`, EXEC_NPU_NO_FORMAT_CHECK_CMD: a failing
  aclnnBlockSparseAttentionGradGetWorkspaceSize (or launch) goes through torch_npu's NPU_CHECK_ERROR
  (github.com/Ascend/pytorch 9e73e708, `torch_npu/csrc/core/npu/NPUException.h`), a RuntimeError whose
  message holds "call aclnnBlockSparseAttentionGrad failed, error code is 161002". With
  TASK_QUEUE_ENABLE=2 the workspace call runs on the task-queue thread and the message that reaches
  Python is another one; with TORCH_NPU_COMPACT_ERROR_OUTPUT set CANN's own message may replace it. This
  module therefore runs with TASK_QUEUE_ENABLE=1 (if it was 2) and without the compact output, and says
  so on stderr.

So a case whose call the binding can make runs as the harness would run it; a case it cannot express
(a non-null attenMask, maskType or tokens other than the defaults, a null or short blockShape, a null
layout, outputs unlike query/key/value, a dtype torch has no tensor for) is refused with exit code 2.

A case folder of another op (`manifest.op`: forward, chain, autograd) runs through
`npu_block_sparse_attention` and, for the chain, this binding too (`torch_npu_ops`, which says how).

Exit codes: 0 a status was recorded; 2 bad arguments, an unreadable case, a case the binding cannot
express, torch or torch_npu cannot be imported; 3 the operator or the device failed without an aclnn
status, or returned gradients of the wrong dtype or shape; 4 an output file could not be written; 5 this
op cannot run here (autograd before torch 2.6, or a folder gen skipped): no status, and the first line of
stderr is `cannot run: <why>`.
torch and torch_npu are imported only when a case runs, never by `import bsa_cli`; only APIs that
PyTorch 2.1 has are used.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..core.errors import DataError
from ..ops.interface import call_lengths
from ..store import DETERMINISTIC_ENV, MANIFEST, load_manifest, read_array
from ..store.manifest import INPUT_NAMES, Manifest
from . import software, torch_npu_ops
from .base import Attempt, ChildDevice, DeviceKind, Execution, RunConfigError, fresh_outputs
from .binary import CANNOT_RUN_PREFIX, ChildExit, mark_cannot_run, mark_device_lines
from .process import spawn
from .torch_npu_ops import CannotRun, DeviceFailure, NotExpressible, TorchNpuMissing, _int, _int_list, to_tensor

#: How the torch_npu device is named in records and output.
TORCH_NPU_DEVICE = "torch_npu (torch_npu.npu_block_sparse_attention_backward)"
#: The module each run of the torch_npu device executes (`python -m`), one child process per run.
TORCH_NPU_MODULE = "bsa_cli.devices.torch_npu"

#: The torch_npu function this device calls.
BINDING = "npu_block_sparse_attention_backward"

#: The manifest inputs in the binding's order (d_out first): the seven tensors, passed positionally.
CALL_ORDER = ("dout", "query", "key", "value", "attention_out", "softmax_lse", "block_sparse_mask")

#: The input each gradient is allocated like by the binding (`apply_tensor_without_format`).
GRAD_OF = {"dq": "query", "dk": "key", "dv": "value"}


@dataclass(frozen=True)
class Call:
    """The non-tensor arguments of one binding call, and which inputs are passed as None (null)."""

    block_shape: list[int]
    actual_seq_lengths: list[int] | None
    actual_seq_lengths_kv: list[int] | None
    q_input_layout: str
    kv_input_layout: str
    num_key_value_heads: int
    scale_value: float
    null_inputs: tuple[str, ...] = ()

    def keywords(self) -> dict[str, Any]:
        """Return the arguments after the seven tensors, by their names in the binding's schema."""
        return torch_npu_ops.call_keywords(self, "null_inputs")


def _desc(entry: Mapping[str, Any] | None) -> tuple[Any, tuple[int, ...]]:
    """Return (dtype, shape) of a manifest entry ((None, ()) for a null one)."""
    entry = entry or {}
    return entry.get("dtype"), tuple(entry.get("shape") or ())


def _default_outputs(manifest: Manifest) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """Return dq, dk, dv as a case without tensor overrides has them (case dtype, shapes of q and kv)."""
    try:
        case = manifest.case
        q_shape, kv_shape = tuple(case.q_shape), tuple(case.kv_shape)
    except (KeyError, TypeError, ValueError):
        return {}
    return {"dq": (case.dtype, q_shape), "dk": (case.dtype, kv_shape), "dv": (case.dtype, kv_shape)}


def plan_call(manifest: Manifest) -> Call:
    """Return the binding call that runs a case, as the C++ harness would make the aclnn call.

    Raises:
        NotExpressible: the binding fixes or fills in something the case sets otherwise.
    """
    name, params, inputs, outputs = manifest.name, manifest.params, manifest.inputs, manifest.outputs

    def refuse(reason: str) -> NotExpressible:
        return NotExpressible(f"case {name}: torch_npu.{BINDING} cannot express this call: {reason}")

    extra = sorted(set(inputs) - set(INPUT_NAMES))
    if extra:
        raise refuse(f"input {extra[0]} is passed, but the binding always passes a null attenMask")
    torch_npu_ops.refuse_fixed(params, refuse)
    block_shape = params.get("block_shape")
    if not isinstance(block_shape, list) or len(block_shape) < 2:
        raise refuse(f"blockShape {block_shape!r}: the binding passes [128, 128] for a null or short block_shape")
    for key in ("layout", "kv_layout"):
        if not isinstance(params.get(key, params.get("layout")), str):
            raise refuse(f"{key} is null: the binding takes a str")
    for which in params.get("null_layouts") or []:
        raise refuse(f"a null {'qInputLayout' if which == 'q' else 'kvInputLayout'}: the binding takes a str")
    defaults = _default_outputs(manifest)
    for grad, source in GRAD_OF.items():
        entry, like = outputs.get(grad), inputs.get(source)
        if entry is None:
            raise refuse(f"{grad} is null: the binding always allocates dq, dk, dv")
        # An output the case left alone may follow its input's override (the binding allocates it like the
        # input); an output the case set itself cannot be passed.
        dtype, shape = _desc(entry)
        if (dtype, shape) not in (_desc(like), defaults.get(grad)):
            raise refuse(
                f"{grad} is {dtype} {list(shape)}, but the binding allocates it like {source}"
                + (f" ({like.get('dtype')} {list(like.get('shape', ()))})" if like else " (null here)")
            )
    for input_name, entry in manifest.entries("inputs"):
        if entry.get("dtype") not in torch_npu_ops.TORCH_DTYPES:
            raise refuse(f"{input_name} has dtype {entry.get('dtype')!r}, which torch has no tensor for")
    q_lengths, kv_lengths = call_lengths(params)
    try:
        return Call(
            block_shape=[_int(v) for v in block_shape],
            actual_seq_lengths=_int_list(q_lengths),
            actual_seq_lengths_kv=_int_list(kv_lengths),
            q_input_layout=str(params.get("layout")),
            kv_input_layout=str(params.get("kv_layout", params.get("layout"))),
            num_key_value_heads=_int(params.get("num_kv_heads")),
            scale_value=float(params["scale"]),
            null_inputs=tuple(n for n in CALL_ORDER if n not in inputs),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise refuse(f"a value the binding takes as int, int list or float is {exc}") from None


def aclnn_status(message: str) -> int | None:
    """Return the aclnn status an exception message from torch_npu carries, or None."""
    found = torch_npu_ops.BACKWARD_STATUS_PATTERN.search(message)  # NPU_CHECK_ERROR after EXEC_NPU_CMD
    return int(found.group(1)) if found else None


# ---- one case --------------------------------------------------------------------------------------


def prepare_environment(env: MutableMapping[str, str]) -> list[str]:
    """Make torch_npu report aclnn statuses in the calling thread; return what was changed, in words."""
    notes = []
    if env.get("TASK_QUEUE_ENABLE", "").strip() == "2":
        env["TASK_QUEUE_ENABLE"] = "1"
        notes.append(
            "TASK_QUEUE_ENABLE=2 runs aclnn's parameter checks on the task queue, where their status is "
            "lost: this case runs with TASK_QUEUE_ENABLE=1"
        )
    if env.get("TORCH_NPU_COMPACT_ERROR_OUTPUT", "").strip() not in ("", "0"):
        del env["TORCH_NPU_COMPACT_ERROR_OUTPUT"]
        notes.append("TORCH_NPU_COMPACT_ERROR_OUTPUT may hide the aclnn status: unset for this case")
    return notes


def import_torch_npu() -> tuple[Any, Any]:
    """Import torch and torch_npu (torch_npu patches `Tensor.npu` and `torch.npu` in).

    Raises:
        TorchNpuMissing: naming the module and what to install.
    """
    try:
        import torch
    except ImportError as exc:
        raise TorchNpuMissing(f"cannot import torch: {exc}; install torch and torch_npu (README.md)") from None
    advice = f"install the torch_npu release that matches torch {torch.__version__}, and source <CANN>/set_env.sh first"
    try:
        import torch_npu
    except ImportError as exc:
        raise TorchNpuMissing(f"cannot import torch_npu: {exc}; {advice}") from None
    except Exception as exc:  # torch_npu's own initialisation failed (driver, CANN version)
        raise TorchNpuMissing(f"importing torch_npu failed: {type(exc).__name__}: {exc}; {advice}") from None
    return torch, torch_npu


def run_case(case_dir: Path, output_dir: Path, device_id: int) -> int:
    """Run one case folder through torch_npu (by its `op`) and write its outputs and status; return the
    aclnn status. The backward is called here; the forward, the chain and autograd in `torch_npu_ops`.

    Raises:
        DataError: the manifest or an input file is missing or malformed.
        NotExpressible: the binding cannot express the case.
        CannotRun: an op this device cannot run here (autograd before torch 2.6, an op gen skipped).
        DeviceFailure: the operator or device failed without a status, or returned unusable gradients.
        OSError: an output file could not be written.
    """
    case_dir, output_dir = Path(case_dir), Path(output_dir)
    manifest = load_manifest(case_dir)
    op_plan = torch_npu_ops.plan_op(manifest) if manifest.op.calls_forward else None
    call = plan_call(manifest) if op_plan is None else None
    fresh_outputs(output_dir, manifest)
    # `bsa run` checked every input against its sha256 just before starting this process.
    arrays = {name: read_array(case_dir, entry, verify=False) for name, entry in manifest.entries("inputs")}
    dtypes = {name: str(entry["dtype"]) for name, entry in manifest.entries("inputs")}
    for note in prepare_environment(os.environ):
        print(f"note: {note}", file=sys.stderr)
    torch, torch_npu = import_torch_npu()
    version = getattr(torch_npu, "__version__", "?")
    print(f"torch {torch.__version__}, torch_npu {version}, device {device_id}")
    print(software.torch_npu_line(software.torch_npu_software(torch, torch_npu, os.environ)), flush=True)
    if os.environ.get(DETERMINISTIC_ENV) == "1":  # reaches the operator's deterministic path (op-plugin)
        torch.use_deterministic_algorithms(True)
        print("deterministic mode: torch.use_deterministic_algorithms(True)")
    if op_plan is not None:
        try:
            torch.npu.set_device(device_id)
        except Exception as exc:
            raise DeviceFailure(f"cannot set NPU {device_id}: {type(exc).__name__}: {exc}") from None
        return torch_npu_ops.run_op(op_plan, manifest, arrays, torch, torch_npu, output_dir)
    assert call is not None
    binding = getattr(torch_npu, BINDING, None)
    if binding is None:
        raise TorchNpuMissing(
            f"torch_npu {version} has no {BINDING} (op-plugin added it in 2026-03, branch 26.0.0): update torch_npu"
        )
    if call.null_inputs:
        print(f"null inputs, passed as None: {', '.join(call.null_inputs)}")
    try:
        torch.npu.set_device(device_id)
        tensors = {
            name: to_tensor(torch, arrays[name], dtypes[name]).npu() if name in arrays else None for name in CALL_ORDER
        }
    except Exception as exc:
        raise DeviceFailure(f"cannot place the inputs on NPU {device_id}: {type(exc).__name__}: {exc}") from None
    args = [tensors[name] for name in CALL_ORDER]
    grads = torch_npu_ops.backward_grads(lambda: binding(*args, **call.keywords()), torch, "(dq, dk, dv)")
    if isinstance(grads, torch_npu_ops.Refusal):
        return torch_npu_ops.refused(output_dir, grads)
    status = torch_npu_ops.written(torch, output_dir, manifest, grads)
    torch_npu_ops.time_calls(torch, "backward", lambda: binding(*args, **call.keywords()))
    return status


def child_main(argv: Sequence[str] | None, module: str, run: Callable[[Path, Path, int], object]) -> int:
    """Run a torch child device (`module`, whose `run` does one case) on the case named on the command line;
    return the exit code (`ChildExit`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0].startswith("-"):
        print(f"usage: {sys.executable} -m {module} <case_dir>/case.json <output_dir>", file=sys.stderr)
        return ChildExit.USAGE
    manifest, output_dir = Path(args[0]), Path(args[1])
    case_dir = manifest if manifest.is_dir() else manifest.parent
    try:
        device_id = int(os.environ.get("ASCEND_DEVICE_ID", "0"))
    except ValueError:
        print(f"Error: ASCEND_DEVICE_ID={os.environ['ASCEND_DEVICE_ID']!r} is not a device id", file=sys.stderr)
        return ChildExit.USAGE
    try:
        run(case_dir, output_dir, device_id)
    except CannotRun as exc:
        print(f"{CANNOT_RUN_PREFIX}{exc}", file=sys.stderr)
        return ChildExit.CANNOT_RUN
    except (DataError, NotExpressible, TorchNpuMissing) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return ChildExit.USAGE
    except DeviceFailure as exc:
        print(f"Error: {exc}", file=sys.stderr)
        if "\n" in exc.detail:
            print(f"the whole message:\n{exc.detail}", file=sys.stderr)
        return ChildExit.DEVICE
    except OSError as exc:
        print(f"Error: cannot write the outputs into {output_dir}: {exc.strerror or exc}", file=sys.stderr)
        return ChildExit.WRITE
    return ChildExit.STATUS


def main(argv: Sequence[str] | None = None) -> int:
    """Run the device on the case named on the command line; return the exit code."""
    return child_main(argv, TORCH_NPU_MODULE, run_case)


# ---- the device, as `bsa run` sees it ----------------------------------------------------------------


@dataclass(frozen=True)
class TorchNpuDevice(ChildDevice):
    """The torch_npu device: this module in a child process per run. Build one with `create`, which
    checks that torch and torch_npu are installed."""

    kind: ClassVar[DeviceKind] = "torch_npu"
    name = TORCH_NPU_DEVICE
    binary_record = None

    @classmethod
    def create(cls) -> TorchNpuDevice:
        """Return the device once this Python finds torch and torch_npu, without importing them (the child
        imports them).

        Raises:
            RunConfigError: naming the module that is missing and what to install.
        """
        for module in ("torch", "torch_npu"):
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                raise RunConfigError(
                    f"--device torch_npu: the module {module} is not installed for {sys.executable}; install "
                    "torch and the torch_npu release that matches it and your CANN toolkit (README.md, "
                    "'On an Ascend host'), or run the C++ harness with --binary"
                )
        return cls()

    @property
    def announcement(self) -> str:
        return f"device: {self.name}, through {TORCH_NPU_MODULE} in {sys.executable}"

    def argv(self, case_dir: Path, output_dir: Path, device_id: int) -> list[str]:
        return [sys.executable, "-m", TORCH_NPU_MODULE, str(case_dir / MANIFEST), str(output_dir)]

    def execute(self, attempt: Attempt, execution: Execution) -> None:
        spawn(attempt, execution)
        mark_cannot_run(attempt, execution)  # the child's exit 5: autograd before torch 2.6
        mark_device_lines(attempt, execution)  # its timed calls (--time)

    def software(self, stdout_log: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
        return software.from_torch_npu_log(stdout_log)

    def unsupported(self, manifest: Manifest) -> str | None:
        """Return why this device cannot run a case folder's op (autograd before torch 2.6), or None.

        torch's version is read from its installed metadata (`importlib.metadata`), never by importing it;
        the child checks `torch.__version__` again (exit 5, `ChildExit.CANNOT_RUN`).
        """
        if not manifest.op.autograd_only:
            return None
        try:
            version = importlib.metadata.version("torch")
        except (importlib.metadata.PackageNotFoundError, ValueError):
            return None  # unknown here: the child decides
        return torch_npu_ops.autograd_refusal(version)


if __name__ == "__main__":
    sys.exit(main())
