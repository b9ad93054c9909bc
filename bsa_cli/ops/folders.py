"""What each op's case folder holds: its inputs, its outputs, the mask dtype its call passes.

A case that lists several ops (`bsa_cli/ops/`) is one case folder per op, every folder drawn from the
same inputs: the backward's folder is exactly the case of old (`base.BACKWARD_INPUTS`, golden and outputs
`GRAD_NAMES`); each op says what its folder holds (`Op.inputs`, `Op.outputs`, `Op.mask_dtype`: the forward
passes the mask as int8, the same bytes). Pure: a `Case` seen as one op's call; the manifest is built
in `manifest.py`, and `op_problem` is what `store.check_manifest` asks of a folder's op fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..core.case import Case, TensorOverride
from . import OPS, find, get, split_folder_name

#: The manifest's sections of array entries {name: {file, dtype, shape, sha256}} (a null tensor: None).
SECTIONS = ("inputs", "golden", "benchmark", "outputs")
#: The forward's outputs by the names of the backward's inputs they are (`Case.tensor_descs`, overrides).
CALL_NAMES = {"out": "attention_out", "lse": "softmax_lse"}


def op_case(case: Case, op: str) -> Case:
    """Return the case as one op's call sees its tensors (`tensor_descs`, `inputs.call_inputs`): a forward
    folder's mask is int8 (`Op.mask_dtype`, the same bytes) whatever dtype the case gives the backward's; a
    null mask or a shape override applies, as `forward_interface.forward_tensors` has it."""
    mask, dtype = case.override("block_sparse_mask"), get(op).mask_dtype
    if dtype is None or (mask is not None and mask.null):
        return case
    return replace(case, tensors=(*case.tensors, TensorOverride("block_sparse_mask", dtype=dtype)))


def op_problem(document: Mapping[str, Any]) -> str | None:
    """Return what is wrong with a manifest's op fields (`op`, `skip`, the forward's parameters), or None.

    `op` one of `OPS` and the op its folder's name says (`NAME@op`; a plain name is the backward's); `skip` a
    non-empty string, and then no files in any section; `params.inner_precise` and `softmax_lse_flag`
    integers where given.
    """
    op = document.get("op", "backward")
    if not isinstance(op, str) or find(op) is None:
        return f"op: {op!r:.60} is not one of {', '.join(OPS)}"
    name = str(document.get("name"))
    named = split_folder_name(name)[1]
    if named != op:
        said = f"op {op!r}" if "op" in document else "no op (the backward)"
        return f"name {name!r:.80} is the folder of the {named}, but the manifest has {said}"
    skip = document.get("skip")
    if skip is not None:
        if not isinstance(skip, str) or not skip:
            return f"skip: {skip!r:.60} is not a non-empty string (why the op is skipped)"
        filled = [section for section in SECTIONS if document.get(section)]
        if filled:
            return f"skip: a skipped op has no files, but {', '.join(filled)} list some"
    given = document.get("params")
    for key in ("inner_precise", "softmax_lse_flag"):
        value = given.get(key) if isinstance(given, Mapping) else None
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or abs(value) >= 2**63):
            return f"params.{key}: {value!r:.60} is not a 64-bit integer"
    return None
