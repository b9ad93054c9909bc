"""Op folders (`NAME@forward`, `@chain`, `@autograd`) as gen writes them: `build_op_folder` (inputs, no
golden) and `build_judged_op_folder` (golden, benchmark and device outputs: compare's forward and pair)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bsa_cli import golden
from bsa_cli.core.case import Case, numpy_dtype
from bsa_cli.devices import reference
from bsa_cli.store import CaseWriter, array_bytes
from bsa_cli.store.manifest import build_manifest, flat_params
from tests.helpers.case_dirs import make_inputs

OP_INPUT_NAMES = {
    "forward": ("query", "key", "value", "block_sparse_mask"),
    "chain": ("query", "key", "value", "dout", "block_sparse_mask"),
    "autograd": ("query", "key", "value", "dout", "block_sparse_mask"),
}
"""The inputs of an op folder other than the backward's (the contract of issue 21)."""


def op_outputs(case: Case, op: str) -> dict[str, dict[str, Any]]:
    """Return the `outputs` section of an op folder: out and lse (forward), and dq, dk, dv (chain, autograd)."""
    outputs: dict[str, dict[str, Any]] = {
        "out": {"file": "out.bin", "dtype": case.dtype, "shape": list(case.q_shape)},
        "lse": {"file": "lse.bin", "dtype": "float32", "shape": list(case.lse_shape_dims)},
    }
    if op != "forward":
        outputs.update(
            {
                name: {"file": f"{name}.bin", "dtype": case.dtype, "shape": list(shape)}
                for name, shape in (("dq", case.q_shape), ("dk", case.kv_shape), ("dv", case.kv_shape))
            }
        )
    return outputs


def build_op_folder(
    root: Path,
    case: Case,
    op: str,
    mask: np.ndarray | None = None,
    *,
    skip: str | None = None,
    mask_dtype: str = "uint8",
) -> Path:
    """Write the case folder `NAME@op` of `case` as gen writes it (inputs, outputs, no golden), and return it.

    The inputs are `make_inputs`'s (the same bytes as `build_case`'s backward folder); the mask is int8 in
    a forward folder and `mask_dtype` in a chain or autograd one. With `skip`, the folder gen writes for an
    op it skipped: every section empty and `skip` the reason.
    """
    from bsa_cli.ops import folder_name

    name = folder_name(case.name, op)  # type: ignore[arg-type]
    tensors = make_inputs(case, mask)
    with CaseWriter(Path(root) / name) as writer:
        inputs: dict[str, Any] = {}
        for tensor in OP_INPUT_NAMES[op] if skip is None else ():
            array = tensors[tensor]
            dtype = "bfloat16" if array.dtype == numpy_dtype("bfloat16") else array.dtype.name
            if tensor == "block_sparse_mask":
                dtype = "int8" if op == "forward" else mask_dtype
                array = np.asarray(array).astype(numpy_dtype(dtype))
            inputs[tensor] = writer.array(f"inputs/{tensor}.bin", array, dtype)
        manifest = build_manifest(dataclasses.replace(case, name=name), inputs, {}, {}, {})
        manifest["op"] = op
        manifest["params"].update(inner_precise=case.inner_precise, softmax_lse_flag=case.softmax_lse_flag)
        manifest["outputs"] = op_outputs(case, op) if skip is None else {}
        if skip is not None:
            manifest["skip"] = skip
        return writer.commit(manifest, flat_params(manifest))


def read_output(output_dir: Path, name: str, case: Case) -> np.ndarray:
    """Return output `name` of an op folder (out, lse, dq, dk, dv) from `output_dir`, in its entry's shape."""
    entry = op_outputs(case, "chain")[name]
    return np.fromfile(output_dir / entry["file"], dtype=numpy_dtype(entry["dtype"])).reshape(entry["shape"])


def build_judged_op_folder(
    root: Path,
    case: Case,
    op: str,
    mask: np.ndarray | None = None,
    *,
    device: str = "reference",
    fault: str | None = None,
    prefilled: bool = True,
    expect: Mapping[str, Any] | None = None,
    skip: str | None = None,
) -> Path:
    """Write the case folder `NAME@op` (forward, chain) of `case` with golden, benchmark and device outputs.

    Golden and benchmark come from `golden.forward_golden_and_benchmark` / `chain_golden_and_benchmark` (float32
    golden); lse entries have `case.lse_shape_dims`. The device is the reference device (`device="reference"`:
    its forward into NaN-prefilled buffers, then for a chain its backward on the forward's own out and lse) or
    the benchmark itself (`device="benchmark"`: rows the forward leaves alone hold the NaN prefill when
    `prefilled`). run.json records `device.prefilled_outputs: "nan"` when `prefilled`. `expect` replaces the
    manifest's expect (e.g. {"verdict": "FAIL", "cause": "lse-unwritten"}); `skip` writes a skipped folder.
    """
    from bsa_cli.devices import forward as device_forward
    from bsa_cli.ops import folder_name

    name = folder_name(case.name, op)  # type: ignore[arg-type]
    tensors = make_inputs(case, mask)
    block_mask = tensors["block_sparse_mask"]
    query, key, value, dout = (tensors[n] for n in ("query", "key", "value", "dout"))
    if op == "forward":
        g_out, g_lse, b_out, b_lse = golden.forward_golden_and_benchmark(case, query, key, value, block_mask)
        gold, bench = {"out": g_out, "lse": g_lse}, {"out": b_out, "lse": b_lse}
        input_names: tuple[str, ...] = ("query", "key", "value", "block_sparse_mask")
    else:
        gold, bench = golden.chain_golden_and_benchmark(case, dout, query, key, value, block_mask)
        input_names = ("query", "key", "value", "dout", "block_sparse_mask")
    with CaseWriter(Path(root) / name) as writer:
        inputs: dict[str, Any] = {}
        golden_entries: dict[str, Any] = {}
        bench_entries: dict[str, Any] = {}
        for tensor in input_names if skip is None else ():
            array = tensors[tensor]
            dtype = "bfloat16" if array.dtype == numpy_dtype("bfloat16") else array.dtype.name
            if tensor == "block_sparse_mask" and op == "forward":
                dtype, array = "int8", np.asarray(array).astype(np.int8)
            inputs[tensor] = writer.array(f"inputs/{tensor}.bin", array, dtype)
        for tensor in gold if skip is None else ():
            g, b = gold[tensor], bench[tensor]
            if tensor == "lse":
                g, b = g.reshape(case.lse_shape_dims), b.reshape(case.lse_shape_dims)
            golden_entries[tensor] = writer.array(f"golden/{tensor}.bin", g, g.dtype.name)
            bench_dtype = "float32" if tensor == "lse" else case.dtype
            bench_entries[tensor] = writer.array(f"benchmark/{tensor}.bin", b, bench_dtype)
        manifest = build_manifest(dataclasses.replace(case, name=name), inputs, golden_entries, bench_entries, {})
        manifest["op"] = op
        manifest["params"].update(inner_precise=case.inner_precise, softmax_lse_flag=case.softmax_lse_flag)
        outputs = {
            "out": {"file": "out.bin", "dtype": case.dtype, "shape": list(case.q_shape)},
            "lse": {"file": "lse.bin", "dtype": "float32", "shape": list(case.lse_shape_dims)},
        }
        if op != "forward":
            outputs.update(manifest["outputs"])
        manifest["outputs"] = outputs if skip is None else {}
        if expect is not None:
            manifest["expect"] = {**manifest["expect"], **expect}
        if skip is not None:
            manifest["skip"] = skip
        case_dir = writer.commit(manifest, flat_params(manifest))
    if skip is not None:
        return case_dir
    if device == "reference":
        forward_tensors = {**tensors, "block_sparse_mask": np.asarray(block_mask).astype(np.int8)}
        produced = device_forward.run_forward(case, forward_tensors, fault)
        if op != "forward":
            produced.update(reference.emulate(case, device_forward.backward_tensors(tensors, produced), fault))
    else:
        produced = {n: np.array(bench[n]) for n in bench}
        produced["lse"] = produced["lse"].reshape(case.lse_shape_dims)
        if prefilled:
            written = golden.written_rows(case, block_mask)
            produced["out"][~written] = device_forward.prefilled((1,), case.dtype)[0]
            lse_rows = produced["lse"].reshape(case.q_shape[:-1])
            lse_rows[~written if case.softmax_lse_flag else np.ones_like(written)] = np.float32(np.nan)
    output_dir = case_dir / "outputs"
    output_dir.mkdir(parents=True, exist_ok=True)
    for tensor, array in produced.items():
        (output_dir / f"{tensor}.bin").write_bytes(array_bytes(array))
    (output_dir / "status.txt").write_text("0\n")
    record_device: dict[str, Any] = {"name": f"test ({device})", "kind": "reference"}
    if prefilled:
        record_device["prefilled_outputs"] = "nan"
    run = {"case": name, "outcome": "ok", "device": record_device}
    (output_dir / "run.json").write_text(json.dumps(run))
    return case_dir
