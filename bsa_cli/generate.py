"""Generate one case directory: inputs, golden forward, golden and kernel-faithful backward, manifest."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, golden
from .case import Case, numpy_dtype
from .inputs import draw, make_mask, make_tensors, mask_stats
from .manifest import GRAD_NAMES, build_manifest, flat_params
from .store import MANIFEST, CaseWriter, load_manifest, verify_inputs
from .errors import DataError

PRECISIONS = ("float32", "float64")


def fingerprint(case: Case, precision: str) -> str:
    """Return a digest of everything that determines a case's files (spec values, precision, bsa version)."""
    fields = asdict(case)
    fields.pop("source", None)
    fields.pop("warnings", None)
    explicit = case.sparsity.explicit
    fields["sparsity"]["explicit"] = None if explicit is None else np.packbits(explicit).tobytes().hex()
    text = json.dumps([fields, precision, __version__], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def is_current(case: Case, case_dir: Path, precision: str) -> bool:
    """Return whether `case_dir` already holds this case, generated the same way, with intact inputs."""
    if not (case_dir / MANIFEST).is_file():
        return False
    try:
        manifest = load_manifest(case_dir)
        if manifest.get("generator", {}).get("fingerprint") != fingerprint(case, precision):
            return False
        verify_inputs(case_dir, manifest)
    except DataError:
        return False
    return True


def compute_case(case: Case, precision: str = "float32") -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Return (inputs, golden, benchmark) arrays of a case; negative cases get no golden or benchmark."""
    dtype = numpy_dtype(case.dtype)
    tensors = make_tensors(case)
    mask = make_mask(case)
    if not case.expect.ok:
        # The op rejects the call before reading data: any out and lse of the right shapes will do.
        tensors["attention_out"] = draw(case, "attention_out", case.q_shape, case.init.dout, dtype)
        tensors["softmax_lse"] = np.zeros(case.lse_shape_dims, dtype=np.float32)
        tensors["block_sparse_mask"] = mask
        return tensors, {}, {}
    out, lse = golden.forward(case, tensors["query"], tensors["key"], tensors["value"], mask)
    tensors["attention_out"] = out.astype(dtype)
    tensors["softmax_lse"] = lse.astype(np.float32).reshape(case.lse_shape_dims)
    tensors["block_sparse_mask"] = mask
    args = (case, tensors["dout"], tensors["query"], tensors["key"], tensors["value"],
            tensors["attention_out"], tensors["softmax_lse"], mask)  # fmt: skip
    gold = golden.backward(*args, precision=np.dtype(precision))
    bench = golden.backward_kernel(*args)
    return tensors, dict(zip(GRAD_NAMES, gold, strict=True)), dict(zip(GRAD_NAMES, bench, strict=True))


def generate_case(case: Case, out_root: Path, precision: str = "float32") -> Path:
    """Write case directory `out_root/<case.name>` atomically and return it."""
    tensors, gold, bench = compute_case(case, precision)
    with CaseWriter(Path(out_root) / case.name) as writer:
        inputs = {name: writer.array(f"inputs/{name}.bin", array, _dtype_name(array)) for name, array in tensors.items()}
        golden_entries = {name: writer.array(f"golden/{name}.bin", array, precision) for name, array in gold.items()}
        bench_entries = {name: writer.array(f"benchmark/{name}.bin", array, case.dtype) for name, array in bench.items()}
        manifest = build_manifest(case, inputs, golden_entries, bench_entries, mask_stats(case, tensors["block_sparse_mask"]))
        manifest["generator"]["fingerprint"] = fingerprint(case, precision)
        manifest["generator"]["golden_precision"] = precision
        if case.sparsity.explicit_source:
            manifest["generator"]["explicit_mask"] = case.sparsity.explicit_source
        return writer.commit(manifest, flat_params(manifest))


def _dtype_name(array: np.ndarray) -> str:
    name = "bfloat16" if array.dtype == numpy_dtype("bfloat16") else array.dtype.name
    return name


def case_summary(case: Case) -> dict[str, Any]:
    """Return the figures `bsa list` shows: shapes, density, FLOPs and bytes of a case."""
    mask = make_mask(case)
    stats = mask_stats(case, mask)
    itemsize = numpy_dtype(case.dtype).itemsize
    q_elems = int(np.prod(case.q_shape))
    kv_elems = int(np.prod(case.kv_shape))
    input_bytes = (3 * q_elems + 2 * kv_elems) * itemsize + q_elems // max(case.head_dim, 1) * 4 + mask.size
    return {**stats, "input_bytes": input_bytes, "output_bytes": (q_elems + 2 * kv_elems) * itemsize}
