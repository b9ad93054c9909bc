"""The reference device's ops other than the backward: the forward, and the chain (forward, then backward on
the forward's own out and lse), as the binary contract asks of an op folder (`Manifest.op`).

* forward: the forward's interface check (`forward_interface.check`: its statuses in docs/interface.md's
  order), then the reference forward (`forward.run_forward`: its own tiling, the kernel's precision path,
  output buffers pre-filled with NaN so the rows it must leave alone stay NaN), writing out.bin and lse.bin.
* chain: the forward on the mask bytes as int8 (the forward's registered dtype), then the backward's
  interface check on the tensors the backward receives (the forward's out and lse, the mask in the
  manifest's dtype) and the backward (`backward`, the reference device's `emulate`) on them, writing out,
  lse, dq, dk, dv; the status is the first nonzero one (the forward's, then the backward's). A backward
  that refuses leaves the forward's out and lse written (as a device would) and no gradients.
* autograd: not here (torch_npu's autograd link): `Unsupported`, and `ReferenceDevice.unsupported` says so
  before anything runs.

A forward fault plants itself in the forward step, a backward fault in the backward step of a chain.
`emulate_op_into` does for an op folder what `reference.emulate_into` does for a backward one (which calls
it): old outputs removed first, every file written atomically, status.txt last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core import blas
from ..core.case import Case, numpy_dtype
from ..core.errors import BsaError, DataError
from ..core.untrusted import inside_parent
from ..ops import forward_interface, interface
from ..store import MANIFEST, array_bytes, check_output_dir, read_array
from ..store.manifest import Manifest
from .base import STATUS_FILE, write_atomic
from .faults import FORWARD_FAULTS, fault_not_applied
from .forward import OUTPUT_NAMES, backward_tensors, forward_mask, run_forward

AUTOGRAD_REASON = "the reference device has no autograd: run it with --device torch_npu"
"""Why the reference device does not run an autograd folder (run.json `skipped`)."""

PREFILL = "nan"
"""What the reference device pre-fills the forward's output buffers with (run.json `device.prefilled_outputs`)."""

CHAIN_OUTPUTS = (*OUTPUT_NAMES, "dq", "dk", "dv")
OP_INPUTS: Mapping[str, tuple[str, ...]] = {
    "forward": ("query", "key", "value", "block_sparse_mask"),
    "chain": ("query", "key", "value", "dout", "block_sparse_mask"),
}
"""The inputs and outputs of an op folder, as the manifest's sections name them."""

Backward = Callable[[Case, Mapping[str, np.ndarray], "str | None", "int | None"], dict[str, np.ndarray]]
"""The backward step: `reference.emulate(case, tensors, fault, order_seed)` -> {"dq", "dk", "dv"}."""


class Unsupported(BsaError):
    """The reference device does not run this case folder: an autograd folder, or one gen skipped."""


@dataclass(frozen=True)
class Emulated:
    """What one reference run did: the aclnn status it wrote, why its planted fault left the case clean
    (`faults.fault_not_applied`; None without a fault, when it applied, or when the call was refused), and
    what it pre-filled the forward's outputs with (`PREFILL`; None: no forward ran)."""

    status: int
    fault_not_applied: str | None = None
    prefilled_outputs: str | None = None


def unsupported(manifest: Manifest) -> str | None:
    """Return why the reference device cannot run the op of a case folder, or None."""
    return AUTOGRAD_REASON if manifest.op == "autograd" else None


def _op_case(case_dir: Path, manifest: Manifest) -> Case:
    """Rebuild the case of an op folder (its forward parameters too) and check its entries' shapes.

    Raises:
        DataError: the params cannot describe a case, or an input or output is missing or of another shape.
    """
    where = str(Path(case_dir) / MANIFEST)
    try:
        forward = manifest.forward_params
        case = dataclasses.replace(
            manifest.case, inner_precise=forward["inner_precise"], softmax_lse_flag=forward["softmax_lse_flag"]
        )
        lse_shapes = (tuple(case.lse_shape_dims), tuple(case.q_shape[:-1]))
        shapes: dict[str, tuple[tuple[int, ...], ...]] = {
            "query": (tuple(case.q_shape),),
            "dout": (tuple(case.q_shape),),
            "out": (tuple(case.q_shape),),
            "dq": (tuple(case.q_shape),),
            "key": (tuple(case.kv_shape),),
            "value": (tuple(case.kv_shape),),
            "dk": (tuple(case.kv_shape),),
            "dv": (tuple(case.kv_shape),),
            "block_sparse_mask": (tuple(case.mask_shape),),
            "lse": lse_shapes,
        }
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise DataError(where, f"params do not describe a case ({type(exc).__name__}: {exc})") from None
    outputs = OUTPUT_NAMES if manifest.op == "forward" else CHAIN_OUTPUTS
    for section, names in (("inputs", OP_INPUTS[manifest.op]), ("outputs", outputs)):
        entries = manifest.section(section)
        for name in names:
            if entries.get(name) is None:
                raise DataError(where, f"{section}: no entry for {name} (a {manifest.op} folder has one)")
            shape = tuple(manifest.entry(section, name)["shape"])
            if shape not in shapes[name]:
                raise DataError(
                    where, f"{section}.{name}.shape {list(shape)} differs from the case's {list(shapes[name][0])}"
                )
    return case


def forward_call(manifest: Manifest) -> dict[str, dict[str, Any]]:
    """Return the tensors the device passes the forward (`forward_interface.manifest_tensors`: out and lse
    as attention_out and softmax_lse), the mask as int8 (its registered dtype; a chain's manifest holds the
    backward's)."""
    entries = {**manifest.inputs, **manifest.outputs}
    call = forward_interface.manifest_tensors({name: entry for name, entry in entries.items() if entry is not None})
    if "block_sparse_mask" in call:
        call["block_sparse_mask"] = {**call["block_sparse_mask"], "dtype": forward_interface.FORWARD_MASK_DTYPE}
    return call


def backward_call(manifest: Manifest) -> dict[str, dict[str, Any]]:
    """Return the tensors a chain's backward receives: its inputs (the mask in the manifest's dtype), the
    forward's out and lse as attention_out and softmax_lse, and dq, dk, dv."""
    table = manifest.call_tensors()
    aliases = {"out": "attention_out", "lse": "softmax_lse"}
    return {aliases.get(name, name): desc for name, desc in table.items()}


def _write(output_dir: Path, paths: Mapping[str, Path], manifest: Manifest, arrays: Mapping[str, np.ndarray]) -> None:
    """Write each array where its output entry says, after checking its dtype and shape against the entry."""
    for name, array in arrays.items():
        entry = manifest.entry("outputs", name)
        expected = numpy_dtype(entry["dtype"])
        value = np.asarray(array)
        if value.size == int(np.prod(entry["shape"])) and name == "lse":
            value = value.reshape(entry["shape"])  # the forward returns lse with or without the trailing 1
        if value.dtype != expected or list(value.shape) != list(entry["shape"]):
            raise DataError(
                str(output_dir),
                f"outputs.{name}: the reference device gives {value.dtype} {list(value.shape)}, "
                f"the entry says {expected} {entry['shape']}",
            )
        path = paths[name]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, array_bytes(value))


def emulate_op_into(
    manifest: Manifest,
    case_dir: Path,
    output_dir: Path,
    backward: Backward,
    fault: str | None = None,
    order_seed: int | None = None,
) -> Emulated:
    """Act as the device binary on a forward or chain folder; return what was done.

    Raises:
        Unsupported: an autograd folder (or another op this device does not run), or one gen skipped.
        DataError: the manifest or an input file is missing, malformed or stale.
    """
    op = manifest.op
    if manifest.skip is not None:
        raise Unsupported(f"{case_dir}: gen skipped this op, no device runs it: {manifest.skip}")
    reason = unsupported(manifest)
    if reason is not None or op not in OP_INPUTS:
        raise Unsupported(reason or f"op {op!r}: the reference device runs forward and chain folders here")
    check_output_dir(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    outputs = dict(manifest.entries("outputs"))
    paths = {name: inside_parent(output_dir, entry["file"]) for name, entry in outputs.items()}
    for path in [output_dir / STATUS_FILE, *paths.values()]:
        if path.is_symlink() or path.is_file():
            path.unlink()
    step = "forward: " if op == "chain" else ""  # a chain's message says which step refused, as chain_check's
    params = forward_interface.params_forward(manifest.params)
    status, message = forward_interface.check(params, forward_call(manifest), manifest.release)
    if status != 0:
        write_atomic(output_dir / STATUS_FILE, f"{status}\n{step}{message}\n".encode())
        return Emulated(status)
    case = _op_case(case_dir, manifest)
    tensors = {name: read_array(case_dir, manifest.entry("inputs", name)) for name in OP_INPUTS[op]}
    mask = np.asarray(tensors["block_sparse_mask"])
    not_applied = None if fault is None else fault_not_applied(fault, case, mask, op)
    with blas.one_thread_each():  # a forward fault plants itself here, a backward one is ignored
        produced = run_forward(case, {**tensors, "block_sparse_mask": forward_mask(mask)}, fault)
    _write(output_dir, paths, manifest, produced)
    if op == "chain":
        status, message = interface.check(params, backward_call(manifest), manifest.release)
        if status != 0:
            write_atomic(output_dir / STATUS_FILE, f"{status}\nbackward: {message}\n".encode())
            return Emulated(status, None, PREFILL)
        backward_fault = None if fault in FORWARD_FAULTS else fault  # a backward fault plants itself here
        with blas.one_thread_each():
            grads = backward(case, backward_tensors(tensors, produced), backward_fault, order_seed)
        _write(output_dir, paths, manifest, grads)
    write_atomic(output_dir / STATUS_FILE, b"0\n")
    return Emulated(0, not_applied, PREFILL)
