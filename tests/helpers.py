"""What the tests share: one factory for each thing many tests build, and one way to call the CLI.

- `make_case` / `case_factory`: a frozen `Case` from the house defaults (a small BNSD float16 case) or a
  file's own defaults; `scale=None` means 1/sqrt(head_dim).
- `write_case_dir`: a tiny generated case directory with random values (for the runner: it never looks at
  values); `build_case`: a complete one (inputs, golden, benchmark) with the reference device's outputs.
- `fake_device`: tests/bin/fake_device.py copied as an executable device binary.
- `invoke`: `bsa ARGS` in process through click's CliRunner.
- `assert_snapshot`: a text compared with tests/snapshots/NAME (conftest.py's `snapshot` fixture decides
  whether a missing or changed snapshot is written).
- `REPO`, `CASES`, `TESTS`: the repository, its cases/ and tests/, whatever folder a test file is in.

Test files import from here (`from tests.helpers import ...`), never from one another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from bsa_cli import compare, devices, golden
from bsa_cli.cli import main
from bsa_cli.compare import (
    ERROR,
    FAIL,
    PASS,
    BlockMap,
    CaseResult,
    Check,
    ErrorStats,
    HotBlock,
    RunSettings,
    SuiteResult,
    TensorResult,
    WorstElement,
)
from bsa_cli.core.case import Case, Expect, numpy_dtype
from bsa_cli.devices import record, reference
from bsa_cli.store import CaseWriter, array_bytes
from bsa_cli.store.manifest import build_manifest, flat_params

TESTS = Path(__file__).resolve().parent
"""tests/: helpers, oracles and data folders; the test files are one folder down, by what they test."""
REPO = TESTS.parent
"""The repository root: test files name `REPO / "scripts"`, `CASES / "edge.yaml"`, never `__file__`'s parents."""
CASES = REPO / "cases"
FAKE_DEVICE = TESTS / "bin" / "fake_device.py"
SNAPSHOTS = TESTS / "snapshots"
STANDIN = TESTS / "torch_npu_standin"
STANDIN_FAULT = "BSA_TORCH_NPU_STANDIN_FAULT"


# ---- cases --------------------------------------------------------------------------------------

CASE_DEFAULTS: dict[str, Any] = dict(
    source="cases/test.yaml",
    layout="BNSD",
    dtype="float16",
    batch=1,
    num_heads=2,
    num_kv_heads=2,
    head_dim=32,
    q_seq_len=96,
    kv_seq_len=80,
    actual_seq_lengths=None,
    actual_seq_lengths_kv=None,
    block_shape=(32, 16),
    scale=0.17,
    seed=1,
)
"""The house case: small, BNSD, float16, a partial last block on both axes."""


def make_case(name: str = "c", **fields: Any) -> Case:
    """Return a `Case`: CASE_DEFAULTS, then `fields`; `scale=None` stands for 1/sqrt(head_dim)."""
    values = {**CASE_DEFAULTS, "name": name, **fields}
    if values["scale"] is None:
        values["scale"] = 1 / math.sqrt(values["head_dim"])
    return Case(**values)


def case_factory(*, tnd_sizes_from_lengths: bool = False, **defaults: Any) -> Callable[..., Case]:
    """Return a `make_case` with a file's own defaults over CASE_DEFAULTS; a call's fields override both.

    With `tnd_sizes_from_lengths`, a TND case the call does not size itself gets batch = the number of
    entries, and q_seq_len, kv_seq_len = the largest lengths.
    """

    def make(name: str | None = None, **fields: Any) -> Case:
        values = {**defaults, **fields}
        if name is not None:
            values["name"] = name
        if tnd_sizes_from_lengths and values.get("layout") == "TND":
            sizes = dict(
                batch=len(values["actual_seq_lengths"]),
                q_seq_len=max(values["actual_seq_lengths"]),
                kv_seq_len=max(values["actual_seq_lengths_kv"]),
            )
            values.update({key: value for key, value in sizes.items() if key not in fields})
        return make_case(**values)

    return make


# ---- case directories ---------------------------------------------------------------------------


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


def check(result: compare.CaseResult, name: str, tensor: str | None = None) -> compare.Check:
    """Return the first check of `result` called `name` (of `tensor`, when given)."""
    return next(c for c in result.all_checks if c.name == name and (tensor is None or c.tensor == tensor))


# ---- device binaries and runs -------------------------------------------------------------------


def fake_device(tmp_path: Path) -> Path:
    """Copy the fake device binary into tmp_path and make it executable."""
    binary = tmp_path / "fake_device.py"
    shutil.copy(FAKE_DEVICE, binary)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return binary


def read_record(result: devices.RunResult) -> dict:
    """Return the run record the runner wrote for `result`."""
    return json.loads((result.output_dir / record.RUN_RECORD).read_text())


def run_options(binary: Path | None = None, **kwargs) -> devices.RunOptions:
    """Return RunOptions for `binary` (or `cmd=`; neither: the reference device) and any other option."""
    cmd = kwargs.pop("cmd", None)
    return devices.RunOptions(device=devices.create(binary=binary, cmd=cmd), **kwargs)


def run_record(case_dir: Path) -> dict:
    """Return the run.json a run wrote into `case_dir`/outputs."""
    return json.loads((case_dir / "outputs" / "run.json").read_text())


def standin_env(patch: pytest.MonkeyPatch) -> None:
    """Make torch_npu importable here (bsa's check) and in the device's child processes."""
    patch.syspath_prepend(str(STANDIN))
    patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(STANDIN), os.environ.get("PYTHONPATH")])))
    patch.delenv(STANDIN_FAULT, raising=False)


# ---- the CLI ------------------------------------------------------------------------------------


def invoke(*args: object, catch_exceptions: bool = True, **kwargs: Any) -> Result:
    """Run `bsa ARGS` in process (each argument through str) and return click's result, stdout and stderr apart."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=catch_exceptions, **kwargs)


SPEC = {
    "defaults": {"head_dim": 16, "block_shape": [16, 16], "num_heads": 2, "seed": 5, "dtype": "fp16"},
    "cases": [
        {"name": "t-bnsd-tail", "q_seq_len": 40, "kv_seq_len": 24, "sparsity": {"pattern": "causal"}},
        {
            "name": "t-tnd-gqa",
            "layout": "TND",
            "dtype": "bf16",
            "actual_seq_lengths": [16, 0, 24],
            "num_kv_heads": 1,
            "sparsity": {"pattern": "random", "density": 0.6},
        },
        {"name": "t-neg-dtype", "dtype": "float32", "q_seq_len": 16, "expect": "ACLNN_ERR_PARAM_INVALID"},
        {"name": "t-neg-tnd", "layout": "TND", "q_seq_len": 16, "expect": "ACLNN_ERR_PARAM_INVALID"},
    ],
}
"""A small spec of run's tests: a tail, TND GQA with an empty entry, and two negative cases."""

BASE = {"name": "c", "num_heads": 1, "head_dim": 16, "q_seq_len": 32, "block_shape": [16, 16], "dtype": "fp16"}
"""One tiny valid case as a spec writes it (the hostile and untrusted tests change one key of it)."""


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


# ---- reports ------------------------------------------------------------------------------------


def assert_snapshot(name: str, text: str, update: bool = False) -> None:
    """Compare `text` with tests/snapshots/`name`; write it instead when `update`.

    A missing snapshot fails: a new one is written on purpose (conftest.py: --update-snapshots or
    BSA_UPDATE_SNAPSHOTS=1), never by a run that happens not to find it.
    """
    path = SNAPSHOTS / name
    how = "rerun with --update-snapshots (or BSA_UPDATE_SNAPSHOTS=1)"
    if update:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    elif not path.exists():
        pytest.fail(f"snapshot {path.relative_to(TESTS.parent)} is missing; {how} to create it", pytrace=False)
    assert text == path.read_text(), f"{name} changed; {how} if that is intended"


def stats(rmse: float, full: bool = True, **fields) -> ErrorStats:
    base = dict(
        count=1024,
        max_abs_err=rmse * 8,
        mean_abs_err=rmse * 0.8,
        rmse=rmse,
        max_rel_err=0.125,
        mean_rel_err=0.001,
        large_count=1000,
        small_value_count=24,
        small_value_err_count=2,
        nan_count=0,
        inf_count=0,
        nonfinite_mismatch=0,
    )
    if full:
        base.update(
            mare=0.25,
            mere=0.002,
            cosine=0.99999,
            mismatch_count=3,
            mismatch_ratio=3 / 1024,
            ulp_max=6.5,
            ulp_mean=0.375,
            ulp_histogram=(700, 300, 24),
        )
    base.update(fields)
    return ErrorStats(**base)


def tensor(name: str, failed: bool) -> TensorResult:
    axis = "q" if name == "dq" else "kv"
    score = np.array([[[1.0, 1.0, 5.0 if failed else 1.5, math.nan]]])
    block_map = BlockMap(axis, 32, score * 1e-4, np.full_like(score, 1e-4), score * 1e-3, score)
    checks = [
        Check("nonfinite", name, 0.0, 0.0, True, f"{name} no NaN/Inf where the golden is finite"),
        Check("rmse_ratio", name, 1.0, 2.0, True, f"{name} RMSE ratio 1 <= 2", 0.5),
        Check(
            "tile_ratio",
            name,
            5.0 if failed else 1.5,
            3.0,
            not failed,
            f"{name} worst 16x16 tile RMSE ratio {5 if failed else 1.5} {'>' if failed else '<='} 3",
            5 / 3 if failed else 0.5,
        ),
    ]
    worst = (
        WorstElement((0, 1, 70, 33), {"b": 0, "n": 1, "s": 70, "d": 33}, 2, 0.5, 0.499, 0.4995, 0.001, 2.0),
        WorstElement((0, 0, 3, 1), {"b": 0, "n": 0, "s": 3, "d": 1}, 0, -1.25, -1.2495, -1.25, 0.0005, 0.5),
    )
    hot = (HotBlock(0, 1, 2, (64, 96), 5.0, 5e-4, 1e-4, 5e-3, (64, 32), 5.0),) if failed else ()
    return TensorResult(
        name,
        (1, 2, 100, 64),
        "float16",
        ("b", "n", "s", "d"),
        stats(1e-4),
        stats(1e-4, full=False),
        tuple(checks),
        worst,
        hot,
        block_map,
    )


def case(name: str, verdict: str, **fields) -> CaseResult:
    settings = compare.resolve_settings("float16", {}, RunSettings())
    base = dict(
        name=name,
        case_dir=f"out/{name}",
        output_dir=f"out/{name}/outputs",
        verdict=verdict,
        spec="cases/edge.yaml",
        device="reference (bsa emulate)",
        standard="double-benchmark",
        settings=settings,
        dtype="float16",
        layout="BNSD",
        expect_status=0,
        status=0,
        status_message=None,
        checks=(Check("status", None, 0.0, 0.0, True, "status 0 (ACLNN_SUCCESS)"),),
        tensors=(),
        errors=(),
        output_bytes=1000,
        seconds=0.5,
    )
    base.update(fields)
    return CaseResult(**base)


def sample_suite() -> SuiteResult:
    passing = case("edge-tail", PASS, tensors=(tensor("dq", False), tensor("dk", False), tensor("dv", False)))
    failing = case("edge-tile", FAIL, tensors=(tensor("dq", True), tensor("dk", False), tensor("dv", False)))
    unjudged = case(
        "edge-missing",
        ERROR,
        settings=None,
        standard="-",
        checks=(),
        output_bytes=0,
        errors=("out/edge-missing/outputs/dk.bin: missing (expected 25600 bytes for shape [1, 2, 100, 64] float16)",),
    )
    negative = case(
        "neg-dtype",
        PASS,
        expect_status=161002,
        status=161002,
        status_message="dtype float32 is not supported",
        checks=(
            Check(
                "status",
                None,
                161002.0,
                161002.0,
                True,
                "status 161002 (ACLNN_ERR_PARAM_INVALID) == expected 161002 (ACLNN_ERR_PARAM_INVALID)",
            ),
        ),
    )
    return SuiteResult((passing, failing, unjudged, negative), seconds=1.5)


class Page(HTMLParser):
    """Collect elements as (tag, attributes, text inside) and the text of <title> elements."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self.stack: list[tuple[str, dict[str, str], list[str]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = (tag, {k: v or "" for k, v in attrs}, [])
        self.elements.append(element)
        if tag not in ("input", "meta", "br", "line", "rect", "polygon", "col"):
            self.stack.append(element)
        elif tag in ("rect", "polygon"):
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self.stack:
            element[2].append(data)

    def find(self, tag: str, **attrs: str) -> list[tuple[str, dict[str, str], list[str]]]:
        return [e for e in self.elements if e[0] == tag and all(e[1].get(k) == v for k, v in attrs.items())]

    @staticmethod
    def text(element: tuple[str, dict[str, str], list[str]]) -> str:
        return "".join(element[2])


# ---- op folders (forward, chain, autograd) --------------------------------------------------------


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


# ---- op folders with golden and device outputs (issue 21: compare's forward and pair) ----------------


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


# ---- reports of a suite with ops (issue 21) ---------------------------------------------------------


def op_tensor(name: str, failed: bool) -> TensorResult:
    """A judged tensor of any op: dq/dk/dv as `tensor`, or the forward's out ([B, N, S, D]) and lse ([B, N, S],
    per query block i)."""
    base = tensor("dq" if name in ("out", "lse") else name, failed)
    if name not in ("out", "lse"):
        return base
    checks = tuple(dataclasses.replace(c, tensor=name, detail=c.detail.replace("dq", name, 1)) for c in base.checks)
    if name == "out":
        return dataclasses.replace(base, name=name, checks=checks)
    worst = tuple(
        dataclasses.replace(w, index=w.index[:3], coords={k: v for k, v in w.coords.items() if k != "d"})
        for w in base.worst
    )
    hot = tuple(dataclasses.replace(h, tile=None, tile_ratio=None) for h in base.hot_blocks)
    return dataclasses.replace(
        base,
        name=name,
        shape=(1, 2, 100),
        dtype="float32",
        axes=("b", "n", "s"),
        checks=checks,
        worst=worst,
        hot_blocks=hot,
    )


def op_result(case_name: str, op: str, verdict: str, **fields: Any) -> CaseResult:
    """One op's result of a case (`case`, named after its folder: `NAME` for the backward, `NAME@op`)."""
    name = case_name if op == "backward" else f"{case_name}@{op}"
    fields.setdefault("case_dir", f"out/{name}")
    fields.setdefault("output_dir", f"out/{name}/outputs")
    return dataclasses.replace(case(name, verdict, **fields), op=op)


def skipped_result(case_name: str, op: str, why: str) -> CaseResult:
    """An op a case lists that is not judged (SKIP), with why."""
    return op_result(case_name, op, compare.SKIP, checks=(), tensors=(), errors=(why,), output_bytes=0, status=None)


def ops_suite() -> SuiteResult:
    """Results of three cases with ops side by side, as `bsa check --ops forward,backward,chain,autograd` on the
    reference device gives them: PASS, FAIL (a chain whose backward read the lse the forward never wrote) and
    SKIP (autograd on the reference device, the A2/A3 forward refusing Y = 64), in folder-name order (the
    reports put each case's ops side by side)."""
    grads = ("dq", "dk", "dv")
    fwd_ok = tuple(op_tensor(n, False) for n in ("out", "lse"))
    chain_fail = case(
        "x", FAIL, tensors=(*fwd_ok, op_tensor("dq", True), op_tensor("dk", False), op_tensor("dv", False))
    )
    unwritten = Check(
        "pair_cause",
        None,
        1.0,
        None,
        False,
        "lse-unwritten: softmax_lse_flag 0: the backward read the lse the forward never wrote",
        math.inf,
    )
    autograd = "autograd: the reference device cannot run it (only torch_npu 2.6 or later runs autograd)"
    y64 = "the A2/A3 forward refuses block_shape [128, 64]: Y % 128 != 0 (tiling, 561002); the backward accepts it"
    results = [
        op_result("smoke-bnsd", "backward", PASS, tensors=tuple(op_tensor(n, False) for n in grads)),
        op_result("smoke-bnsd", "autograd", compare.SKIP, checks=(), errors=(autograd,), status=None, output_bytes=0),
        op_result("smoke-bnsd", "chain", FAIL, tensors=chain_fail.tensors, checks=(*chain_fail.checks, unwritten)),
        op_result("smoke-bnsd", "forward", PASS, tensors=fwd_ok),
        op_result("smoke-y64", "backward", PASS, tensors=tuple(op_tensor(n, False) for n in grads)),
        skipped_result("smoke-y64", "chain", y64),
        skipped_result("smoke-y64", "forward", y64),
        op_result(
            "neg-fwd-d96",
            "forward",
            PASS,
            expect_status=561002,
            status=561002,
            checks=(Check("status", None, 561002.0, 561002.0, True, "status 561002 == expected 561002"),),
        ),
    ]
    return SuiteResult(tuple(results), seconds=2.0)


# ---- forward tensors (tests of the forward's golden and of the reference device's forward) -------


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
