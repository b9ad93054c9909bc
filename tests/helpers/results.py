"""Hand-built results for the reports' tests: `stats`, `tensor`, `case`, `sample_suite` (four cases, one of
each verdict), and a suite with ops side by side (`op_tensor`, `op_result`, `skipped_result`, `ops_suite`);
`check` finds a check of a result."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from bsa_cli import compare
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


def check(result: compare.CaseResult, name: str, tensor: str | None = None) -> compare.Check:
    """Return the first check of `result` called `name` (of `tensor`, when given)."""
    return next(c for c in result.all_checks if c.name == name and (tensor is None or c.tensor == tensor))


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
