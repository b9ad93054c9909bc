"""The cann_ops_transformer device: run forward folders through ops-transformer's own PyTorch entry point.

    python -m bsa_cli.devices.cann_ops_transformer <case_dir>/case.json <output_dir>

`bsa run --device cann_ops_transformer` runs this module once per forward folder, in a child process, under
the binary contract of docs/run.md (as `devices.torch_npu` does), calling
`cann_ops_transformer.block_sparse_attention`. The entry point, as read in ops-transformer
(libochao-huawei/ops-transformer `attention/block_sparse_attention/torch_extension/block_sparse_attention.py`
at 6ef2df64; its doc `attention/block_sparse_attention/docs/torchapi_block_sparse_attention.md`, hicann
0b650e26):

* schema `block_sparse_attention(Tensor query, Tensor key, Tensor value, Tensor block_sparse_mask, int[]
  block_shape, *, str q_input_layout="TND", str kv_input_layout="TND", int num_key_value_heads=1, float
  scale_value=1.0, int inner_precise=1, int[]? actual_seq_lengths=None, int[]? actual_seq_lengths_kv=None,
  bool return_softmax_lse=False, int mask_type=0, ...) -> (Tensor, Tensor)`, registered for PrivateUse1 and
  Meta only: the forward alone, with no autograd and no backward, so every other op is refused here;
* `scale_value` defaults to 1.0 where op-plugin's `npu_block_sparse_attention` defaults to 0.0: this device
  always passes the case's scale, so neither default applies silently (docs/run.md says what a default does);
* `return_softmax_lse` (bool) where op-plugin has `softmax_lse_flag` (int): False returns an empty lse
  (`query.new_empty((0,))` in the Meta), so this device writes lse.bin as NaN then, and says so (with flag 0
  the lse is judged by nobody, as with torch_npu);
* the mask is int8 (the doc's table, and the operator's registered dtype): the case's mask bytes as int8.

The C++ behind it (`csrc/attention/block_sparse_attention.cpp`) is not public: bsa reads an aclnn status from
its error as from op-plugin's ("call aclnnBlockSparseAttention failed, error code is N"), and a failure
without one is a device failure. Exit codes are `devices.torch_npu`'s.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..store import DETERMINISTIC_ENV, MANIFEST, load_manifest, read_array
from ..store.manifest import Manifest
from . import software, torch_npu_ops
from .base import Attempt, ChildDevice, DeviceKind, Execution, RunConfigError, fresh_outputs
from .binary import mark_cannot_run, mark_device_lines
from .process import spawn
from .torch_npu import child_main, import_torch_npu, prepare_environment
from .torch_npu_ops import DeviceFailure, NotExpressible, TorchNpuMissing, to_tensor

#: The package and function this device calls.
PACKAGE = "cann_ops_transformer"
ENTRY = "block_sparse_attention"
#: How the device is named in records and output.
DEVICE_NAME = f"{PACKAGE} ({PACKAGE}.{ENTRY}, the forward)"
#: The module each run executes (`python -m`).
MODULE = "bsa_cli.devices.cann_ops_transformer"
#: The entry's own default scale (its schema); op-plugin's forward defaults to 0.0.
ENTRY_DEFAULT_SCALE = 1.0


def plan(manifest: Manifest) -> dict[str, Any]:
    """Return the entry's keyword arguments after `block_shape` for a forward folder, its scale always given.

    Raises:
        CannotRun: gen skipped the folder.
        NotExpressible: what the op-plugin binding cannot express the entry cannot either (an attenMask,
            a blockTable, tokens, a null layout or tensor; `torch_npu_ops.plan_op` decides), or the folder
            is of another op.
    """
    if manifest.op.calls_backward or not manifest.op.calls_forward:
        raise NotExpressible(f"case {manifest.name}: {PACKAGE}.{ENTRY} is the forward alone, not the {manifest.op}")
    try:
        call = torch_npu_ops.plan_op(manifest).forward
    except NotExpressible as exc:
        raise NotExpressible(
            str(exc).replace(f"torch_npu.{torch_npu_ops.FORWARD_BINDING}", f"{PACKAGE}.{ENTRY}")
        ) from None
    keywords = call.keywords()
    flag = keywords.pop("softmax_lse_flag")
    return {"block_shape": call.block_shape, **keywords, "return_softmax_lse": bool(flag)}


def run_case(case_dir: Path, output_dir: Path, device_id: int) -> int:
    """Run one forward folder through the entry and write out, lse and status.txt; return the aclnn status.

    Raises:
        DataError, NotExpressible, CannotRun, TorchNpuMissing, DeviceFailure, OSError: as `torch_npu.run_case`.
    """
    case_dir, output_dir = Path(case_dir), Path(output_dir)
    manifest = load_manifest(case_dir)
    keywords = plan(manifest)
    block_shape = keywords.pop("block_shape")
    fresh_outputs(output_dir, manifest)
    arrays = {name: read_array(case_dir, entry, verify=False) for name, entry in manifest.entries("inputs")}
    for note in prepare_environment(os.environ):
        print(f"note: {note}", file=sys.stderr)
    torch, torch_npu = import_torch_npu()
    try:
        package = __import__(PACKAGE)
    except ImportError as exc:
        raise TorchNpuMissing(
            f"cannot import {PACKAGE}: {exc}; build and install ops-transformer's torch_extension"
        ) from None
    entry = getattr(package, ENTRY, None)
    if entry is None:
        raise TorchNpuMissing(f"{PACKAGE} has no {ENTRY}: update ops-transformer's torch_extension")
    print(f"torch {torch.__version__}, torch_npu {getattr(torch_npu, '__version__', '?')}, device {device_id}")
    print(software.torch_npu_line(software.torch_npu_software(torch, torch_npu, os.environ)), flush=True)
    if os.environ.get(DETERMINISTIC_ENV) == "1":
        torch.use_deterministic_algorithms(True)
        print("deterministic mode: torch.use_deterministic_algorithms(True)")
    dtypes = {name: str(entry["dtype"]) for name, entry in manifest.entries("inputs")}
    try:
        torch.npu.set_device(device_id)
        q, k, v = (to_tensor(torch, arrays[name], dtypes[name]).npu() for name in ("query", "key", "value"))
        mask = to_tensor(torch, np.ascontiguousarray(arrays["block_sparse_mask"]).view(np.int8), "int8").npu()
    except Exception as exc:
        raise DeviceFailure(f"cannot place the inputs on NPU {device_id}: {type(exc).__name__}: {exc}") from None
    print(f"op forward: {PACKAGE}.{ENTRY} (mask as int8, scale_value {keywords['scale_value']!r} given)")

    def call() -> Any:
        return entry(q, k, v, mask, block_shape, **keywords)

    result = torch_npu_ops._call(ENTRY, call, torch)
    if isinstance(result, torch_npu_ops.Refusal):
        return torch_npu_ops.refused(output_dir, result)
    out, lse = torch_npu_ops._tensors(result, 2, ENTRY)
    if not keywords["return_softmax_lse"]:
        # the entry returns an empty lse: nothing was written, as the operator leaves it with flag 0
        print("return_softmax_lse=False: the entry returns no lse; lse.bin holds NaN (judged by nobody)")
        entry_lse = manifest.entry("outputs", "lse")
        lse = torch.full([int(n) for n in entry_lse["shape"]], float("nan"), dtype=torch.float32)
    status = torch_npu_ops.written(torch, output_dir, manifest, {"out": out, "lse": lse})
    torch_npu_ops.time_calls(torch, "forward", call)  # --time: the entry's call, as the torch_npu device times
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the device on the case named on the command line; return the exit code."""
    return child_main(argv, MODULE, run_case)


@dataclass(frozen=True)
class CannOpsTransformerDevice(ChildDevice):
    """This module in a child process per run, for forward folders. Build one with `create`."""

    kind: ClassVar[DeviceKind] = "cann_ops_transformer"
    name = DEVICE_NAME
    binary_record = None

    @classmethod
    def create(cls) -> CannOpsTransformerDevice:
        """Return the device once this Python finds torch, torch_npu and the package (not importing them).

        Raises:
            RunConfigError: naming the module that is missing.
        """
        for module in ("torch", "torch_npu", PACKAGE):
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                raise RunConfigError(
                    f"--device {PACKAGE}: the module {module} is not installed for {sys.executable}; install torch, "
                    "the torch_npu release that matches it and ops-transformer's torch_extension (docs/run.md)"
                )
        return cls()

    @property
    def announcement(self) -> str:
        return f"device: {self.name}, through {MODULE} in {sys.executable}"

    def argv(self, case_dir: Path, output_dir: Path, device_id: int) -> list[str]:
        return [sys.executable, "-m", MODULE, str(case_dir / MANIFEST), str(output_dir)]

    def execute(self, attempt: Attempt, execution: Execution) -> None:
        spawn(attempt, execution)
        mark_cannot_run(attempt, execution)
        mark_device_lines(attempt, execution)  # its timed calls (--time)

    def software(self, stdout_log: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
        return software.from_torch_npu_log(stdout_log)

    def unsupported(self, manifest: Manifest) -> str | None:
        """Return why a folder is not this device's: every op but the forward (the entry has no backward and
        no autograd: run those with --device torch_npu)."""
        op = manifest.op
        if op.calls_forward and not op.calls_backward:
            return None
        return (
            f"{PACKAGE}.{ENTRY} is the forward alone (no backward, no autograd): run the {op} with --device torch_npu"
        )


if __name__ == "__main__":
    sys.exit(main())
