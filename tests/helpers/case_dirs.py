"""Case folders and the tensors in them: `write_case_dir` (random values, for the runner), `build_case` (a
complete one: inputs, golden, benchmark and the reference device's outputs), the outputs read and replaced,
`draw_forward` (the forward's tensors), and `digest` (a folder tree's fingerprint)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bsa_cli import golden
from bsa_cli.core.case import Case, Expect, numpy_dtype
from bsa_cli.devices import reference
from bsa_cli.store import CaseWriter, array_bytes
from bsa_cli.store.manifest import build_manifest, flat_params


def write_case_dir(root: Path, name: str, *, expect: int = 0, seed: int = 0) -> Path:
    """Write a tiny BNSD float16 case directory (no golden math: the runner never looks at values)."""
    case = Case(
        name=name,
        source="tests",
        layout="BNSD",
        dtype="float16",
        batch=1,
        num_heads=2,
        num_kv_heads=2,
        head_dim=16,
        q_seq_len=32,
        kv_seq_len=32,
        actual_seq_lengths=None,
        actual_seq_lengths_kv=None,
        block_shape=(16, 16),
        scale=0.25,
        seed=seed,
        expect=Expect(status=expect, name="ACLNN_SUCCESS" if expect == 0 else "ACLNN_ERR_PARAM_INVALID"),
    )
    rng = np.random.default_rng(seed)
    f16 = numpy_dtype("float16")
    with CaseWriter(root / name) as writer:
        inputs = {
            n: writer.array(f"inputs/{n}.bin", rng.standard_normal(shape).astype(f16), "float16")
            for n, shape in (
                ("query", case.q_shape),
                ("key", case.kv_shape),
                ("value", case.kv_shape),
                ("dout", case.q_shape),
                ("attention_out", case.q_shape),
            )
        }
        lse = rng.standard_normal(case.lse_shape_dims).astype(np.float32)
        inputs["softmax_lse"] = writer.array("inputs/softmax_lse.bin", lse, "float32")
        mask = np.ones(case.mask_shape, dtype=np.uint8)
        inputs["block_sparse_mask"] = writer.array("inputs/block_sparse_mask.bin", mask, "uint8")
        golden, benchmark = {}, {}
        if expect == 0:
            for grad, shape in (("dq", case.q_shape), ("dk", case.kv_shape), ("dv", case.kv_shape)):
                values = rng.standard_normal(shape)
                golden[grad] = writer.array(f"golden/{grad}.bin", values.astype(np.float32), "float32")
                benchmark[grad] = writer.array(f"benchmark/{grad}.bin", values.astype(f16), "float16")
        manifest = build_manifest(case, inputs, golden, benchmark, {})
        return writer.commit(manifest, flat_params(manifest))


def make_inputs(case: Case, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Draw inputs, a random block mask (unless given) and the forward's out and lse."""
    rng = np.random.default_rng(case.seed)
    dtype = numpy_dtype(case.dtype)
    tensors = {
        name: rng.standard_normal(case.kv_shape if name in ("key", "value") else case.q_shape).astype(dtype)
        for name in ("query", "key", "value", "dout")
    }
    if mask is None:
        mask = (rng.random(case.mask_shape) < 0.6).astype(np.uint8)
    out, lse = golden.forward(case, tensors["query"], tensors["key"], tensors["value"], mask)
    tensors["attention_out"] = out.astype(dtype)
    tensors["softmax_lse"] = lse.astype(np.float32).reshape(case.lse_shape_dims)
    tensors["block_sparse_mask"] = np.asarray(mask, dtype=np.uint8)
    return tensors


def build_case(
    root: Path,
    case: Case,
    mask: np.ndarray | None = None,
    fault: str | None = None,
    outputs: bool = True,
    compare_settings: Mapping[str, Any] | None = None,
) -> Path:
    """Write a complete case directory under `root`, with device outputs (reference device) unless told not."""
    if compare_settings is not None:
        case = dataclasses.replace(case, compare=dict(compare_settings))
    tensors = make_inputs(case, mask)
    with CaseWriter(Path(root) / case.name) as writer:
        inputs = {}
        for name, array in tensors.items():
            dtype = "bfloat16" if array.dtype == numpy_dtype("bfloat16") else array.dtype.name
            inputs[name] = writer.array(f"inputs/{name}.bin", array, dtype)
        gold: dict[str, Any] = {}
        bench: dict[str, Any] = {}
        if case.expect.ok:
            args = [tensors[n] for n in ("dout", "query", "key", "value", "attention_out", "softmax_lse")]
            grads = golden.backward(case, *args, tensors["block_sparse_mask"])
            kernel = golden.backward_kernel(case, *args, tensors["block_sparse_mask"])
            for name, g, b in zip(("dq", "dk", "dv"), grads, kernel, strict=True):
                gold[name] = writer.array(f"golden/{name}.bin", g, "float32")
                bench[name] = writer.array(f"benchmark/{name}.bin", b, case.dtype)
        manifest = build_manifest(case, inputs, gold, bench, {})
        case_dir = writer.commit(manifest, flat_params(manifest))
    if outputs:
        write_outputs(case_dir / "outputs", case, tensors, fault)
    return case_dir


def write_outputs(
    output_dir: Path, case: Case, tensors: Mapping[str, np.ndarray], fault: str | None = None, status: int = 0
) -> dict[str, np.ndarray]:
    """Write the reference device's dq, dk, dv (with `fault`) and status.txt into `output_dir`."""
    output_dir.mkdir(parents=True, exist_ok=True)
    if status != 0 or not case.expect.ok:
        (output_dir / "status.txt").write_text(f"{status}\n")
        return {}
    grads = reference.emulate(case, tensors, fault)
    for name, grad in grads.items():
        (output_dir / f"{name}.bin").write_bytes(array_bytes(grad))
    (output_dir / "status.txt").write_text("0\n")
    return grads


def read_grad(case_dir: Path, name: str, case: Case) -> np.ndarray:
    """Return the device's `name` (dq, dk or dv) from `case_dir`/outputs in the case's shape and dtype."""
    shape = case.q_shape if name == "dq" else case.kv_shape
    return np.fromfile(case_dir / "outputs" / f"{name}.bin", dtype=numpy_dtype(case.dtype)).reshape(shape)


def rewrite_grad(case_dir: Path, name: str, array: np.ndarray) -> None:
    """Replace the device's `name` in `case_dir`/outputs with `array` (a planted change)."""
    (case_dir / "outputs" / f"{name}.bin").write_bytes(array_bytes(array))


def digest(folder: Path) -> str:
    """Return a digest of a folder tree: every path, its kind, its bytes or link target."""
    hasher = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = Path(dirpath) / name
            hasher.update(str(path.relative_to(folder)).encode())
            if path.is_symlink():
                hasher.update(b"link:" + os.readlink(path).encode())
            elif path.is_file():
                hasher.update(b"file:" + path.read_bytes())
            else:
                hasher.update(b"dir")
    return hasher.hexdigest()


def draw_forward(
    case: Case,
    seed: int = 0,
    density: float = 0.6,
    mask: np.ndarray | None = None,
    *,
    mask_dtype: str = "uint8",
    most_selecting_byte: int = 1,
) -> dict[str, np.ndarray]:
    """Random query/key/value/dout of the case dtype and a random block mask of `mask_dtype`.

    A selected block gets a byte from 1 to `most_selecting_byte` (any nonzero byte selects); `mask`, if
    given, is taken as it is.
    """
    rng = np.random.default_rng(seed)
    dtype = numpy_dtype(case.dtype)
    tensors = {
        name: rng.standard_normal(case.kv_shape if name in ("key", "value") else case.q_shape).astype(dtype)
        for name in ("query", "key", "value", "dout")
    }
    if mask is None:
        selected = rng.random(case.mask_shape) < density
        if most_selecting_byte > 1:
            mask = selected * rng.integers(1, most_selecting_byte + 1, case.mask_shape)
        else:
            mask = selected
    tensors["block_sparse_mask"] = np.asarray(mask).astype(mask_dtype)
    return tensors
