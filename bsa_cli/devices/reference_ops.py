"""The reference device's ops other than the backward: the forward, and the chain (forward, then backward on
the forward's own out and lse), as the binary contract asks of an op folder (`Manifest.op`).

* forward: the forward's interface check (`forward_interface.check`: its statuses in docs/interface.md's
  order), then the reference forward (`forward.run_forward`: its own tiling, the kernel's precision path,
  output buffers pre-filled with NaN so the rows it must leave alone stay NaN), writing out.bin and lse.bin.
* chain: the forward on the mask bytes as int8 (the forward's registered dtype), then the backward's
  interface check on the tensors the backward receives (the forward's out and lse, the mask in the
  manifest's dtype) and the backward (`backward`, the reference device's `emulate`) on them, writing out,
  lse, dq, dk, dv, each step at the scale it is called with (`Manifest.step_scales`); the status is the
  first nonzero one (the forward's, then the backward's). A backward that refuses leaves the forward's out
  and lse written (as a device would) and no gradients.
* autograd: not here (torch_npu's autograd link): `Unsupported`, and `ReferenceDevice.unsupported` says so
  before anything runs.

A forward fault plants itself in the forward step, a backward fault in the backward step of a chain.
`emulate_op` does for an op folder what `reference.emulate_into` does for a backward one (which calls it,
once the old outputs are removed): every file written atomically, status.txt last. `case_of` and
`write_outputs` serve both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.case import Case, numpy_dtype
from ..core.errors import BsaError, DataError
from ..ops import forward_interface, interface
from ..store import MANIFEST, array_bytes, read_array
from ..store.manifest import Manifest
from .base import write_atomic, write_status
from .faults import FORWARD_FAULTS, fault_not_applied, guard_writes
from .forward import backward_tensors, forward_mask, run_forward

#: Why the reference device does not run an autograd folder (run.json `skipped`).
AUTOGRAD_REASON = "the reference device has no autograd: run it with --device torch_npu"

#: What the reference device pre-fills the forward's output buffers with (run.json `device.prefilled_outputs`).
PREFILL = "nan"

#: The backward step: `reference.emulate(case, tensors, fault, order_seed)` -> {"dq", "dk", "dv"}.
Backward = Callable[[Case, Mapping[str, np.ndarray], "str | None", "int | None"], dict[str, np.ndarray]]


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
    #: run.json's `guards` (`faults.guard_writes`): the zones around the outputs written; None: not kept.
    guards: dict[str, Any] | None = None


def unsupported(manifest: Manifest) -> str | None:
    """Return why the reference device cannot run the op of a case folder, or None."""
    return AUTOGRAD_REASON if manifest.op.autograd_only else None


def case_of(case_dir: Path, manifest: Manifest) -> Case:
    """Rebuild the case of a folder (an op's forward parameters too) and check that its op's inputs and
    outputs have the case's shapes.

    Raises:
        DataError: the params cannot describe a case, or an input or output is missing or of another shape.
    """
    where = str(Path(case_dir) / MANIFEST)
    op = manifest.op
    try:
        case = manifest.case
        if op.calls_forward:
            forward = manifest.forward_params
            case = dataclasses.replace(
                case, inner_precise=forward["inner_precise"], softmax_lse_flag=forward["softmax_lse_flag"]
            )
        q_shape, kv_shape, lse_shapes = tuple(case.q_shape), tuple(case.kv_shape), tuple(case.lse_shape_dims)
        shapes: dict[str, tuple[tuple[int, ...], ...]] = {
            **dict.fromkeys(("query", "dout", "attention_out", "out", "dq"), (q_shape,)),
            **dict.fromkeys(("key", "value", "dk", "dv"), (kv_shape,)),
            **dict.fromkeys(("softmax_lse", "lse"), (lse_shapes, q_shape[:-1])),
            "block_sparse_mask": (tuple(case.mask_shape),),
        }
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise DataError(where, f"params do not describe a case ({type(exc).__name__}: {exc})") from None
    for section, names in (("inputs", op.inputs), ("outputs", op.outputs)):
        entries = manifest.section(section)
        for name in names:
            if (entries.get(name) is None) if op.calls_forward else (name not in entries):
                has_one = f" (a {op} folder has one)" if op.calls_forward else ""
                raise DataError(where, f"{section}: no entry for {name}{has_one}")
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


def write_outputs(
    paths: Mapping[str, Path], manifest: Manifest, arrays: Mapping[str, np.ndarray], where: str, who: str
) -> None:
    """Write each array where its output entry says, after checking its dtype and shape against the entry
    (`who` gives them, `where` the error names)."""
    for name, array in arrays.items():
        entry = manifest.entry("outputs", name)
        expected = numpy_dtype(entry["dtype"])
        value = np.asarray(array)
        if value.size == int(np.prod(entry["shape"])) and name == "lse":
            value = value.reshape(entry["shape"])  # the forward returns lse with or without the trailing 1
        if value.dtype != expected or list(value.shape) != list(entry["shape"]):
            given = f"{value.dtype} {list(value.shape)}"
            raise DataError(where, f"outputs.{name}: {who} gives {given}, the entry says {expected} {entry['shape']}")
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        write_atomic(paths[name], array_bytes(value))


def emulate_op(
    manifest: Manifest,
    case_dir: Path,
    output_dir: Path,
    paths: Mapping[str, Path],
    backward: Backward,
    fault: str | None = None,
    order_seed: int | None = None,
) -> Emulated:
    """Act as the device binary on a forward or chain folder whose old outputs are gone (`paths`: where
    each output goes); return what was done.

    Raises:
        DataError: the manifest or an input file is missing, malformed or stale.
    """
    op = manifest.op
    step = "forward: " if op.calls_backward else ""  # a chain's message says which step refused, as Op.status's
    params = forward_interface.params_forward(manifest.params)
    status, message = forward_interface.check(params, forward_call(manifest), manifest.release)
    if status != 0:
        return Emulated(write_status(output_dir, status, f"{step}{message}"))
    case = case_of(case_dir, manifest)
    tensors = {name: read_array(case_dir, manifest.entry("inputs", name)) for name in op.inputs}
    mask = np.asarray(tensors["block_sparse_mask"])
    not_applied = None if fault is None else fault_not_applied(fault, case, mask, op)
    # each step at the scaleValue it is called with: a chain's `params.<step>_scale`, else the case's
    scaled = {step: dataclasses.replace(case, scale=scale) for step, scale in manifest.step_scales.items()}
    # A forward fault plants itself here, a backward one is ignored (both steps run BLAS on one thread).
    produced = run_forward(scaled["forward"], {**tensors, "block_sparse_mask": forward_mask(mask)}, fault)
    write_outputs(paths, manifest, produced, str(output_dir), "the reference device")
    written = dict(produced)  # every output written gets guard zones, as the harness gives them on the device
    if op.calls_backward:
        status, message = interface.check(params, backward_call(manifest), manifest.release)
        if status != 0:
            status = write_status(output_dir, status, f"backward: {message}")
            return Emulated(status, None, PREFILL, guard_writes(fault, written))
        backward_fault = None if fault in FORWARD_FAULTS else fault  # a backward fault plants itself here
        grads = backward(scaled["backward"], backward_tensors(tensors, produced), backward_fault, order_seed)
        write_outputs(paths, manifest, grads, str(output_dir), "the reference device")
        written.update(grads)
    return Emulated(write_status(output_dir, 0), not_applied, PREFILL, guard_writes(fault, written))
