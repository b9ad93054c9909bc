"""Tests of bsa_cli.compare: settings, metrics, standards, structural checks, verdicts, ERROR paths.

Case directories are built by tests/helpers.py's `build_case` (a `Case`, numpy inputs, `bsa_cli.golden`
for golden and benchmark, `store.CaseWriter` + `manifest.build_manifest`), and device outputs come from the
reference device `bsa_cli.devices.reference`, clean or with a planted fault (`write_outputs`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from bsa_cli import compare, report, store
from bsa_cli.compare import ERROR, FAIL, PASS, RunSettings
from bsa_cli.core.case import Case, Expect, numpy_dtype
from bsa_cli.core.layout import mask_view
from bsa_cli.devices import faults, reference
from tests.helpers import REPO, build_case, check, make_case, make_inputs, read_grad, rewrite_grad, write_outputs

# ---- fixtures -----------------------------------------------------------------------------------


def failing(result: compare.CaseResult) -> set[str]:
    return {t.name for t in result.tensors if not t.passed}


# ---- settings -----------------------------------------------------------------------------------


def test_validate_settings_accepts_each_standard_and_preset():
    for standard in ("double-benchmark", "double-benchmark:fa", "single", "allclose", "allclose:msopst", "fa-ratio"):
        compare.validate_settings({"standard": standard})
    compare.validate_settings({"standard": "single", "thresholds": {"mere": 1e-3, "zero_atol": 0}, "padding": "zero"})
    compare.validate_settings({"thresholds": {"rmse_ratio": 1.5, "tile_ratio": math.inf}})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"standrd": "single"},
            "unknown compare key 'standrd' (did you mean 'standard'?); allowed: standard, thresholds",
        ),
        ({"standard": "singel"}, "unknown standard 'singel' (did you mean 'single'?); allowed: double-benchmark, "),
        ({"standard": "double-benchmark:fast"}, "standard 'double-benchmark' has no preset 'fast'"),
        ({"standard": "single", "thresholds": {"rmse_ratio": 2}}, "threshold 'rmse_ratio' does not apply to standard"),
        ({"thresholds": {"mare_ration": 2}}, "(did you mean 'mare_ratio'?)"),
        ({"thresholds": {"rmse_ratio": -1}}, "threshold 'rmse_ratio' must be a number >= 0 (inf allowed), got -1"),
        ({"thresholds": {"rmse_ratio": True}}, "must be a number >= 0"),
        ({"thresholds": ["rmse_ratio"]}, "thresholds must be a mapping of key: number"),
        ({"standard": "allclose", "thresholds": {"mismatch": 0.1, "pct_thd": 0.1}}, "either mismatch"),
        ({"padding": "zeros"}, "padding 'zeros' is not one of ignore, zero"),
    ],
)
def test_validate_settings_names_the_problem_and_what_is_allowed(settings, message):
    with pytest.raises(ValueError) as info:
        compare.validate_settings(settings)
    assert message in str(info.value)


def test_precedence_cli_standard_over_case_over_default():
    case_settings = {"standard": "single", "thresholds": {"mere": 0.5, "zero_atol": 1e-3}}
    resolved = compare.resolve_settings("float16", case_settings, RunSettings())
    assert (resolved.standard, resolved.thresholds["mere"], resolved.thresholds["mare"]) == ("single", 0.5, 5.0)
    assert resolved.origin["standard"] == "case" and resolved.origin["mere"] == "case"
    # --standard names another standard: the case's own thresholds go, its general keys stay
    resolved = compare.resolve_settings("float16", case_settings, RunSettings(standard="double-benchmark:fa"))
    assert resolved.standard == "double-benchmark" and resolved.preset == "fa"
    assert resolved.thresholds["rmse_ratio"] == 1.2 and resolved.origin["rmse_ratio"] == "preset"
    assert "mere" not in resolved.thresholds and resolved.thresholds["zero_atol"] == 1e-3
    # --threshold beats the case
    resolved = compare.resolve_settings("float16", case_settings, RunSettings(thresholds={"mere": 0.25}))
    assert resolved.thresholds["mere"] == 0.25 and resolved.origin["mere"] == "cli"
    # defaults follow the dtype
    assert compare.resolve_settings("bfloat16", {}, RunSettings()).thresholds["err_thd"] == 2.0**-8
    assert compare.resolve_settings("float16", {}, RunSettings()).thresholds["err_thd"] == 2.0**-11


def test_run_threshold_unknown_to_the_case_standard_is_an_error():
    with pytest.raises(ValueError, match="--threshold rmse_ratio: does not apply to standard 'single'"):
        compare.resolve_settings("float16", {"standard": "single"}, RunSettings(thresholds={"rmse_ratio": 3}))
    with pytest.raises(ValueError, match="unknown threshold 'rmse'"):
        RunSettings(thresholds={"rmse": 3}).validate()


# ---- clean outputs pass -------------------------------------------------------------------------

EDGE_LIKE = {
    "bnsd-tails": dict(q_seq_len=100, kv_seq_len=75, block_shape=(32, 16)),
    "unequal-blocks": dict(q_seq_len=96, kv_seq_len=144, block_shape=(16, 48), head_dim=64),
    "gqa-4to1": dict(num_heads=4, num_kv_heads=1, q_seq_len=64, kv_seq_len=64, block_shape=(16, 16)),
    "tnd-zero-lengths": dict(
        layout="TND",
        batch=4,
        actual_seq_lengths=(0, 70, 33, 0),
        actual_seq_lengths_kv=(0, 48, 90, 0),
        q_seq_len=70,
        kv_seq_len=90,
        block_shape=(16, 32),
    ),
    "bnsd-honored-lengths": dict(
        batch=2, q_seq_len=96, kv_seq_len=80, actual_seq_lengths=(96, 41), actual_seq_lengths_kv=(80, 23)
    ),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", sorted(EDGE_LIKE))
def test_clean_kernel_faithful_outputs_pass_the_default_standard(tmp_path, shape, dtype):
    for seed in (1, 2):
        case = make_case(f"{shape}-{seed}", dtype=dtype, seed=seed, **EDGE_LIKE[shape])
        result = compare.compare_case(build_case(tmp_path, case))
        assert result.verdict == PASS, result.message
        assert result.standard == "double-benchmark"
        assert {c.name for c in result.all_checks} >= {"status", "nonfinite", "mare_ratio", "tile_ratio"}


def test_empty_rows_and_unselected_kv_are_checked_when_the_mask_has_them(tmp_path):
    case = make_case("holes", q_seq_len=64, kv_seq_len=64, block_shape=(16, 16))
    mask = np.ones(case.mask_shape, dtype=np.uint8)
    mask[:, :, 1, :] = 0  # query block 1 of every head is empty
    mask[:, :, :, 2] = 0  # kv block 2 is never selected
    result = compare.compare_case(build_case(tmp_path, case, mask=mask))
    assert result.verdict == PASS, result.message
    assert check(result, "empty_rows", "dq").passed
    assert check(result, "unselected_kv", "dk").detail == "dk never-selected kv rows: all 1024 elements 0"


def test_unusual_shapes_pass_when_clean(tmp_path):
    case = make_case("d40", head_dim=40)  # D not a multiple of 16: partial tile columns
    result = compare.compare_case(build_case(tmp_path, case))
    assert result.verdict == PASS, result.message


def test_a_case_folder_expecting_success_where_the_backward_refuses_is_malformed(tmp_path):
    # No query tokens at all: the backward's tiling refuses it, so a case.json that expects status 0 contradicts
    # the interface rules (as `bsa validate` says of the spec) and is not judged as if it were right.
    case = make_case(
        "no-queries",
        layout="TND",
        batch=2,
        actual_seq_lengths=(0, 0),
        actual_seq_lengths_kv=(0, 5),
        q_seq_len=0,
        kv_seq_len=5,
    )
    result = compare.compare_case(build_case(tmp_path, case))
    assert result.verdict == "ERROR"
    assert "no query tokens" in result.message


def test_float64_golden_is_judged_like_float32(tmp_path):
    from bsa_cli.gen.generate import generate_case
    from bsa_cli.gen.settings import GenSettings

    case = make_case("f64", dtype="bfloat16")
    case_dir = generate_case(case, tmp_path, GenSettings("float64"))
    reference.emulate_case_dir(case_dir, case_dir / "outputs")
    result = compare.compare_case(case_dir)
    assert result.verdict == PASS, result.message


def test_bfloat16_inf_is_a_structural_failure(tmp_path):
    case = make_case("bf-inf", dtype="bfloat16")
    case_dir = build_case(tmp_path, case)
    dk = read_grad(case_dir, "dk", case).copy()
    dk[0, 1, 5, 3] = np.inf
    rewrite_grad(case_dir, "dk", dk)
    result = compare.compare_case(case_dir)
    assert failing(result) == {"dk"}
    assert (
        result.message
        == "dk NaN/Inf where the golden is finite: 1 element (0 NaN, 1 Inf), rows b=0 n=1 s=5 (kv block 0)"
    )


# ---- planted faults fail, and the report points at the tensor and block --------------------------

FAULT_CASE = dict(
    num_heads=4, num_kv_heads=2, q_seq_len=100, kv_seq_len=75, block_shape=(32, 16), head_dim=32, scale=0.17
)
EXPECTED_TENSORS = {
    "dk-no-scale": {"dk"},
    "no-gqa-sum": {"dk", "dv"},
    "nan-row": {"dq"},
    "tile-noise": {"dq"},
    "stale-output": {"dq", "dk", "dv"},
}


@pytest.fixture(scope="module")
def fault_case(tmp_path_factory) -> tuple[Path, Case, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("faults")
    case = make_case("faulty", **FAULT_CASE)
    mask = (np.random.default_rng(5).random(case.mask_shape) < 0.5).astype(np.uint8)
    mask[0, :, -1, 0] = 1  # the tail query block and the tail kv block are selected somewhere
    mask[0, :, 0, -1] = 1
    case_dir = build_case(root, case, mask=mask, outputs=False)
    return case_dir, case, make_inputs(case, mask)


@pytest.mark.parametrize("fault", sorted(faults.FAULTS))
def test_each_planted_fault_fails_on_the_right_tensor(fault_case, tmp_path, fault):
    case_dir, case, tensors = fault_case
    assert faults.fault_applies(fault, case, tensors["block_sparse_mask"])
    write_outputs(tmp_path / "out", case, tensors, fault)
    result = compare.compare_case(case_dir, tmp_path / "out")
    assert result.verdict == FAIL
    if fault in EXPECTED_TENSORS:
        assert failing(result) == EXPECTED_TENSORS[fault], result.message
    # every failing tensor names its hot blocks, worst first
    for tensor in result.tensors:
        if not tensor.passed:
            assert tensor.hot_blocks and tensor.hot_blocks[0].score >= tensor.hot_blocks[-1].score


@pytest.mark.parametrize("fault", sorted(faults.FAULTS))
def test_each_fault_s_hottest_block_is_one_the_fault_changed(fault_case, tmp_path, fault):
    case_dir, case, tensors = fault_case
    faulty = write_outputs(tmp_path / "out", case, tensors, fault)
    clean = reference.emulate(case, tensors)
    result = compare.compare_case(case_dir, tmp_path / "out")
    for tensor in result.tensors:
        if tensor.passed:
            continue
        hot = tensor.hot_blocks[0]
        size = case.block_shape[0] if tensor.name == "dq" else case.block_shape[1]
        rows = slice(hot.block * size, (hot.block + 1) * size)
        before = clean[tensor.name][hot.batch, hot.head, rows]
        after = faulty[tensor.name][hot.batch, hot.head, rows]
        assert not np.array_equal(before, after, equal_nan=True), (tensor.name, hot)


def test_tile_noise_hot_block_is_the_tile_of_the_fault(fault_case, tmp_path):
    case_dir, case, tensors = fault_case
    write_outputs(tmp_path / "out", case, tensors, "tile-noise")
    result = compare.compare_case(case_dir, tmp_path / "out")
    site = faults.fault_site(case, tensors["block_sparse_mask"])
    dq = next(t for t in result.tensors if t.name == "dq")
    hot = dq.hot_blocks[0]
    assert (hot.batch, hot.head, hot.block) == (site.span.batch, site.head, site.q_block)
    assert hot.tile == (site.q_block * case.block_shape[0], (case.head_dim // 32) * 16)
    assert check(result, "tile_ratio", "dq").detail.startswith("dq worst 16x16 tile RMSE ratio ")
    assert 4 < hot.tile_ratio < 7  # errors 5x the natural ones
    assert dq.hot_blocks[1].score < 2


def test_drop_tail_block_points_at_the_tail_kv_block(fault_case, tmp_path):
    case_dir, case, tensors = fault_case
    write_outputs(tmp_path / "out", case, tensors, "drop-tail-block")
    result = compare.compare_case(case_dir, tmp_path / "out")
    tail = case.num_kv_blocks - 1
    for name in ("dk", "dv"):
        tensor = next(t for t in result.tensors if t.name == name)
        assert not tensor.passed
        assert {h.block for h in tensor.hot_blocks if h.score > 3} == {tail}


def test_nan_row_is_a_structural_failure_pointing_at_its_row(fault_case, tmp_path):
    case_dir, case, tensors = fault_case
    write_outputs(tmp_path / "out", case, tensors, "nan-row")
    result = compare.compare_case(case_dir, tmp_path / "out")
    site = faults.fault_site(case, tensors["block_sparse_mask"])
    nonfinite = check(result, "nonfinite", "dq")
    assert not nonfinite.passed and nonfinite.value == case.head_dim
    row = site.q_block * case.block_shape[0]
    assert f"rows b=0 n={site.head} s={row} (q block {site.q_block})" in nonfinite.detail
    assert result.deciding == nonfinite
    dq = next(t for t in result.tensors if t.name == "dq")
    assert (dq.hot_blocks[0].head, dq.hot_blocks[0].block, dq.hot_blocks[0].score) == (
        site.head,
        site.q_block,
        math.inf,
    )
    assert dq.device.nan_count == case.head_dim and math.isnan(dq.worst[0].device)
    # the NaN row is left out of the numeric metrics, which stay those of a clean run
    assert math.isfinite(dq.device.rmse) and dq.device.count == dq.benchmark.count - case.head_dim


# ---- structural checks on hand-planted outputs -------------------------------------------------


@pytest.fixture
def holes(tmp_path) -> tuple[Path, Case]:
    case = make_case("holes", q_seq_len=64, kv_seq_len=64, block_shape=(16, 16))
    mask = np.ones(case.mask_shape, dtype=np.uint8)
    mask[:, 1, 2, :] = 0  # head 1, query block 2: empty
    mask[:, :, :, 3] = 0  # kv block 3: never selected
    return build_case(tmp_path, case, mask=mask), case


def test_nonzero_dq_in_an_empty_query_row_fails(holes):
    case_dir, case = holes
    dq = read_grad(case_dir, "dq", case).copy()
    dq[0, 1, 40, 5] = 1e-3
    rewrite_grad(case_dir, "dq", dq)
    result = compare.compare_case(case_dir)
    empty = check(result, "empty_rows", "dq")
    assert not empty.passed
    assert empty.detail == (
        "dq empty query rows: 1 of 512 elements nonzero (largest |value| 0.001), first at b=0 n=1 s=40 (q block 2)"
    )
    assert failing(result) == {"dq"}


def test_nonzero_dk_on_a_never_selected_kv_position_fails_and_zero_atol_relaxes_it(holes):
    case_dir, case = holes
    dk = read_grad(case_dir, "dk", case).copy()
    dk[0, 0, 50, :] = 2e-6
    rewrite_grad(case_dir, "dk", dk)
    result = compare.compare_case(case_dir)
    assert not check(result, "unselected_kv", "dk").passed
    assert "first at b=0 n=0 s=50 (kv block 3)" in check(result, "unselected_kv", "dk").detail
    relaxed = compare.compare_case(case_dir, run=RunSettings(thresholds={"zero_atol": 1e-5}))
    assert check(relaxed, "unselected_kv", "dk").passed
    off = compare.compare_case(case_dir, run=RunSettings(thresholds={"zero_atol": math.inf}))
    assert not [c for c in off.all_checks if c.name == "unselected_kv"]


def test_bnsd_padding_is_ignored_by_default_or_required_zero(tmp_path):
    case = make_case("pad", batch=2, actual_seq_lengths=(96, 40), actual_seq_lengths_kv=(80, 30))
    case_dir = build_case(tmp_path, case)
    dq = read_grad(case_dir, "dq", case).copy()
    dq[1, :, 40:, :] = 7.0  # junk past the actual length of batch 1
    rewrite_grad(case_dir, "dq", dq)
    assert compare.compare_case(case_dir).verdict == PASS
    strict = compare.compare_case(case_dir, run=RunSettings(padding="zero"))
    padding = check(strict, "padding", "dq")
    assert not padding.passed and "first at b=1 n=0 s=40" in padding.detail
    assert strict.settings.origin["padding"] == "cli"
    # the case's spec may ask for it too
    case_dir = build_case(tmp_path / "spec", case, compare_settings={"padding": "zero"})
    rewrite_grad(case_dir, "dq", dq)
    assert compare.compare_case(case_dir).verdict == FAIL


# ---- metrics on synthetic arrays ----------------------------------------------------------------


def synthetic(
    case: Case, golden_values: dict[str, np.ndarray], device: dict[str, np.ndarray], standard: str = "single"
):
    mask = np.ones(case.mask_shape, dtype=np.uint8)
    settings = compare.resolve_settings(case.dtype, {"standard": standard}, RunSettings())
    bench = {k: v.astype(numpy_dtype(case.dtype)) for k, v in golden_values.items()}
    return {t.name: t for t in compare.judge_tensors(case, settings, device, golden_values, bench, mask)}


def test_metrics_of_a_known_error():
    case = make_case("m", num_heads=1, num_kv_heads=1, q_seq_len=16, kv_seq_len=16, head_dim=16, block_shape=(16, 16))
    rng = np.random.default_rng(0)
    gold = {n: (rng.random((1, 1, 16, 16)) + 0.5).astype(np.float32) for n in ("dq", "dk", "dv")}
    device = {n: g.astype(np.float16) for n, g in gold.items()}
    device["dq"] = device["dq"].copy()
    device["dq"][0, 0, 3, 7] = np.float16(gold["dq"][0, 0, 3, 7] + 0.25)
    tensors = synthetic(case, gold, device)
    dq, dk = tensors["dq"], tensors["dk"]
    assert dk.device.ulp_max <= 0.5 and dk.device.ulp_histogram == (256, 0, 0)  # correctly rounded
    assert dq.worst[0].coords == {"b": 0, "n": 0, "s": 3, "d": 7} and dq.worst[0].index == (0, 0, 3, 7)
    assert dq.device.max_abs_err == pytest.approx(0.25, abs=1e-3)
    assert dq.device.max_rel_err == pytest.approx(0.25 / gold["dq"][0, 0, 3, 7], rel=1e-2)
    assert dq.device.mismatch_count == 1 and dq.device.mismatch_ratio == 1 / 256
    assert dq.device.ulp_histogram[2] == 1 and dq.device.ulp_max > 100
    assert 0.99 < dq.device.cosine < 1
    assert dq.device.rmse == pytest.approx(math.sqrt(dq.device.max_abs_err**2 / 256), rel=0.05)
    assert not check_of(dq, "mare").passed and check_of(dk, "mare").passed


def check_of(tensor: compare.TensorResult, name: str) -> compare.Check:
    return next(c for c in tensor.checks if c.name == name)


def test_ulp_error_uses_the_golden_ulp_in_the_case_dtype():
    assert compare.ulp_error(1.0 + 2**-10, 1.0, "float16") == 1.0
    assert compare.ulp_error(0.5 + 2**-9, 0.5, "bfloat16") == 0.5
    assert compare.ulp_error(2.0**-20, 0.0, "float16") == 16.0  # subnormal spacing 2^-24
    assert compare.ulp_error(2.0**-20, 0.0, "float16", err_thd=2.0**-11) == 2.0  # in ULPs of err_thd: 2^-21


def test_ulp_figures_of_a_golden_that_cancelled_to_zero_stay_finite_sized_in_bf16():
    """A bf16 golden of 0 (a sum that cancelled) has an ULP of 2^-133: counted there, an ordinary 2^-22
    rounding error read 2.2e+33 ULP on a passing dq. Below err_thd the unit is the ULP of err_thd."""
    case = make_case(
        "u",
        dtype="bfloat16",
        num_heads=1,
        num_kv_heads=1,
        q_seq_len=16,
        kv_seq_len=16,
        head_dim=16,
        block_shape=(16, 16),
    )
    rng = np.random.default_rng(1)
    gold = {n: (rng.random((1, 1, 16, 16)) + 0.5).astype(np.float32) for n in ("dq", "dk", "dv")}
    gold["dq"][0, 0, 5, 5] = 0.0
    device = {n: g.astype(ml_dtypes.bfloat16) for n, g in gold.items()}
    device["dq"][0, 0, 5, 5] = 2.0**-22
    dq = synthetic(case, gold, device)["dq"]
    assert compare.ulp._ulp_floor("bfloat16", 2.0**-8) == 2.0**-8
    assert compare.ulp_error(2.0**-22, 0.0, "bfloat16", 2.0**-8) == 2.0**-7  # ULPs of err_thd (2^-15)
    assert dq.device.ulp_max <= 0.5 and dq.device.ulp_histogram[2] == 0  # was 2^111 ULP


@pytest.mark.parametrize(
    ("standard", "names"),
    [
        ("double-benchmark", {"mare_ratio", "mere_ratio", "rmse_ratio", "small_value_ratio", "tile_ratio", "bias"}),
        ("single", {"mere", "mare"}),
        ("allclose", {"mismatch"}),
        ("allclose:msopst", {"pct_thd", "max_diff"}),
        ("fa-ratio", {"max_abs_err"}),
    ],
)
def test_each_standard_decides_by_its_own_checks(tmp_path, standard, names):
    case_dir = build_case(tmp_path, make_case("std"))
    result = compare.compare_case(case_dir, run=RunSettings(standard=standard))
    own = {c.name for c in result.all_checks} - {"status", "nonfinite", "empty_rows", "unselected_kv"}
    assert own == names
    assert result.standard == standard


@pytest.mark.parametrize("standard", ["single", "allclose", "fa-ratio"])
def test_the_other_standards_run_the_bias_check_when_given_bias_z(tmp_path, standard):
    case_dir = build_case(tmp_path, make_case("std"))
    result = compare.compare_case(case_dir, run=RunSettings(standard=standard, thresholds={"bias_z": 5}))
    assert {c.tensor for c in result.all_checks if c.name == "bias"} == {"dq", "dk", "dv"}


def test_allclose_and_fa_ratio_limits():
    case = make_case("m", num_heads=1, num_kv_heads=1, q_seq_len=16, kv_seq_len=16, head_dim=16, block_shape=(16, 16))
    rng = np.random.default_rng(3)
    gold = {n: rng.standard_normal((1, 1, 16, 16)).astype(np.float32) for n in ("dq", "dk", "dv")}
    device = {n: g.astype(np.float16) for n, g in gold.items()}
    device["dv"] = (gold["dv"] + 0.05).astype(np.float16)
    tensors = synthetic(case, gold, device, "allclose")
    assert check_of(tensors["dq"], "mismatch").passed and not check_of(tensors["dv"], "mismatch").passed
    tensors = synthetic(case, gold, device, "fa-ratio")
    floor = tensors["dq"].extra["ulp_floor"]
    assert 0 < floor < 2 * 2**-8  # 2 x the fp16 ULP near the largest |g| (< 4)
    assert check_of(tensors["dq"], "max_abs_err").passed and not check_of(tensors["dv"], "max_abs_err").passed


# ---- ERROR paths --------------------------------------------------------------------------------


@pytest.fixture
def two_cases(tmp_path) -> tuple[Path, Path]:
    return build_case(tmp_path, make_case("a")), build_case(tmp_path, make_case("b", seed=2))


def test_missing_output_is_an_error_with_the_bytes_expected_and_others_are_judged(two_cases):
    a, b = two_cases
    (a / "outputs" / "dk.bin").unlink()
    suite = compare.compare_suite([a, b], workers=1)
    assert [c.verdict for c in suite.cases] == [ERROR, PASS]
    assert suite.cases[0].errors == (
        f"{a}/outputs/dk.bin: missing (expected 10240 bytes for shape [1, 2, 80, 32] float16)",
    )
    assert suite.return_code == 3


def marking_worker(case_dir: Path, *rest: Any) -> Any:
    """Stands in for `compare.suite._judge_in_worker`: leaves a mark that a worker process judged the case."""
    (case_dir / f"judged-by-{os.getpid()}").touch()
    return compare.suite._judge_in_worker(case_dir, *rest)


def dying_worker(*args: Any) -> None:
    """Stands in for `compare.suite._judge_in_worker` in a worker process: the process dies (as if killed)."""
    os._exit(9)


def failing_worker(*args: Any) -> None:
    raise RuntimeError("a bug in the judge")


def slow_here(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[str]:
    """Make this process judge slowly (so workers get cases); return the names of the cases judged here."""
    here: list[str] = []
    judge = compare.suite._compare_case

    def slow(case_dir: Path, *rest: Any) -> Any:
        here.append(case_dir.name)
        time.sleep(seconds)
        return judge(case_dir, *rest)

    monkeypatch.setattr(compare.suite, "_compare_case", slow)
    return here


@pytest.fixture
def three_cases(two_cases, tmp_path) -> list[Path]:
    a, b = two_cases
    (a / "outputs" / "dk.bin").unlink()  # an ERROR travels back from a worker like a verdict
    return [a, b, build_case(tmp_path, make_case("c", seed=3))]


def test_cases_judged_in_processes_match_one_process_in_order(three_cases, monkeypatch):
    serial = compare.compare_suite(three_cases, workers=1)
    monkeypatch.setattr(compare.suite, "_judge_in_worker", marking_worker)
    here = slow_here(monkeypatch, 1.0)
    seen: list[str] = []
    parallel = compare.compare_suite(three_cases, jobs=2, on_case=lambda r: seen.append(r.name))
    assert [r.name for r in parallel.cases] == ["a", "b", "c"] and sorted(seen) == ["a", "b", "c"]
    assert [r.verdict for r in parallel.cases] == [ERROR, PASS, PASS]
    in_worker = {d.name for d in three_cases if list(d.glob("judged-by-*"))}
    assert in_worker and in_worker.isdisjoint(here) and in_worker | set(here) == {"a", "b", "c"}
    for one, other in zip(serial.cases, parallel.cases, strict=True):
        documents = [report.case_document(dataclasses.replace(r, seconds=0.0)) for r in (one, other)]
        assert documents[0] == documents[1]  # every metric, check and block map


def test_cases_of_a_worker_that_dies_are_judged_here(three_cases, monkeypatch):
    monkeypatch.setattr(compare.suite, "_judge_in_worker", dying_worker)
    here = slow_here(monkeypatch, 0.5)
    suite = compare.compare_suite(three_cases, jobs=2)
    assert [r.name for r in suite.cases] == ["a", "b", "c"] and suite.count(PASS) == 2
    assert sorted(here) == ["a", "b", "c"]  # including the one first handed to the worker


def test_a_worker_that_raises_is_not_mistaken_for_one_that_died(three_cases, monkeypatch):
    monkeypatch.setattr(compare.suite, "_judge_in_worker", failing_worker)
    slow_here(monkeypatch, 0.5)
    with pytest.raises(RuntimeError, match="a bug in the judge"):
        compare.compare_suite(three_cases, jobs=2)


def test_suite_jobs_default_to_processes_only_for_large_suites(two_cases, monkeypatch):
    a, b = two_cases
    assert compare.suite_jobs([a, b], None, None) == 1  # a few kilobytes: not worth starting processes
    assert compare.suite_jobs([a, b], None, 8) == 2  # never more processes than cases
    assert compare.suite_jobs([a], None, None) == 1
    monkeypatch.setattr(compare.suite, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(compare.suite, "cpu_count", lambda: 4)
    assert compare.suite_jobs([a, b], None, None) == 2


@pytest.mark.parametrize(("size", "kind"), [(100, "truncated"), (10242, "oversized")])
def test_truncated_or_oversized_output_is_an_error(two_cases, size, kind):
    a, _ = two_cases
    path = a / "outputs" / "dv.bin"
    path.write_bytes(path.read_bytes()[:size].ljust(size, b"\0"))
    result = compare.compare_case(a)
    assert result.verdict == ERROR
    assert result.errors == (f"{path}: {kind}: {size} bytes, expected 10240 bytes for shape [1, 2, 80, 32] float16",)


STALE = [
    ("golden/dq.bin", "golden"),
    ("benchmark/dv.bin", "benchmark"),
    ("inputs/query.bin", "input"),
    ("inputs/block_sparse_mask.bin", "input"),
]


@pytest.mark.parametrize(("relative", "what"), STALE)
def test_stale_input_or_golden_is_an_error_naming_the_file(two_cases, relative, what):
    a, _ = two_cases
    path = a / relative
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    result = compare.compare_case(a)
    assert result.verdict == ERROR
    assert result.errors == (f"{path}: sha256 differs from the manifest: stale {what}; run `bsa gen` again",)


def write_run_record(case_dir: Path, **inputs: str) -> None:
    """Write the run.json `bsa run` leaves: the input digests it checked, the manifest's unless given."""
    manifest = json.loads((case_dir / "case.json").read_text())
    digests = {name: entry["sha256"] for name, entry in manifest["inputs"].items()} | inputs
    record = {"format": "bsa-run/1", "case": case_dir.name, "outcome": "ok", "inputs": digests}
    (case_dir / "outputs" / "run.json").write_text(json.dumps(record))


def test_inputs_checked_by_the_run_are_not_hashed_again(two_cases):
    a, _ = two_cases
    write_run_record(a)
    query = a / "inputs" / "query.bin"
    query.write_bytes(bytes(len(query.read_bytes())))  # changed after the device read it: the verdict stands
    assert compare.compare_case(a).verdict == PASS
    mask = a / "inputs" / "block_sparse_mask.bin"
    mask.write_bytes(bytes(len(mask.read_bytes())))  # the judge reads the mask itself: still hashed
    result = compare.compare_case(a)
    assert result.verdict == ERROR
    assert result.errors == (f"{mask}: sha256 differs from the manifest: stale input; run `bsa gen` again",)


@pytest.mark.parametrize("name", ["key", "block_sparse_mask"])
def test_inputs_run_that_are_not_the_manifests_make_the_case_an_error(two_cases, name):
    a, _ = two_cases
    write_run_record(a, **{name: "0" * 64})  # the case was generated again after the run
    result = compare.compare_case(a)
    assert result.verdict == ERROR
    assert result.errors == (
        f"{a / 'inputs' / name}.bin: the device ran on other contents (sha256 in {a / 'outputs' / 'run.json'}):"
        " the case was generated again since; run it again",
    )


def test_without_input_verification_only_the_mask_is_hashed(two_cases):
    a, _ = two_cases
    path = a / "inputs" / "query.bin"
    path.write_bytes(bytes(len(path.read_bytes())))
    assert compare.compare_case(a).verdict == ERROR
    assert compare.compare_case(a, verify_inputs=False).verdict == PASS


def test_missing_or_garbled_status_is_an_error(two_cases):
    a, _ = two_cases
    (a / "outputs" / "status.txt").write_text("ok\n")
    result = compare.compare_case(a)
    assert result.errors == (f"{a}/outputs/status.txt: first line 'ok' is not a decimal aclnn status",)
    (a / "outputs" / "status.txt").unlink()
    assert "status.txt: missing" in compare.compare_case(a).errors[0]


def test_run_record_of_a_crash_or_timeout_makes_the_case_an_error(two_cases):
    a, _ = two_cases
    record = {
        "format": "bsa-run/1",
        "case": "a",
        "outcome": "timeout",
        "problems": ["ran past --timeout 5 s"],
        "device": {"name": "./kernel"},
    }
    (a / "outputs" / "run.json").write_text(json.dumps(record))
    result = compare.compare_case(a)
    assert result.verdict == ERROR and result.device == "./kernel"
    assert result.errors == (f"the run timed out: ran past --timeout 5 s (see {a}/outputs/run.json)",)
    record.update(outcome="crashed", signal="SIGSEGV", problems=[])
    (a / "outputs" / "run.json").write_text(json.dumps(record))
    assert compare.compare_case(a).errors[0].startswith("the run crashed (SIGSEGV)")
    record.update(outcome="ok", case="someone-else")
    (a / "outputs" / "run.json").write_text(json.dumps(record))
    assert "a record of case 'someone-else'" in compare.compare_case(a).errors[0]


def test_nondeterministic_run_fails(two_cases):
    a, _ = two_cases
    record = {"case": "a", "outcome": "nondeterministic", "repeat": {"count": 3, "differences": [{"run": 2, "dq": 7}]}}
    (a / "outputs" / "run.json").write_text(json.dumps(record))
    result = compare.compare_case(a)
    assert result.verdict == FAIL and result.deciding.name == "deterministic"
    assert result.deciding.detail == "repeated runs differ (3 runs): run 2, dq 7"


def test_not_a_case_directory_is_an_error(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "case.json").write_text("{")
    result = compare.compare_case(tmp_path / "x")
    assert result.verdict == ERROR and "case.json: not valid JSON" in result.errors[0]


# ---- status of negative and valid cases ---------------------------------------------------------


@pytest.mark.parametrize(("status", "verdict"), [(161002, PASS), (0, FAIL), (161001, FAIL)])
def test_negative_case_passes_only_with_the_expected_status(tmp_path, status, verdict):
    case = make_case("neg", expect=Expect(161002, "ACLNN_ERR_PARAM_INVALID"))
    case_dir = build_case(tmp_path, case, outputs=False)
    (case_dir / "outputs" / "status.txt").write_text(f"{status}\nmessage from the op\n")
    result = compare.compare_case(case_dir)
    assert result.verdict == verdict
    if verdict == FAIL:
        assert (
            result.message.startswith(f"status {status}")
            and "expected 161002 (ACLNN_ERR_PARAM_INVALID)" in result.message
        )


def test_valid_case_with_a_nonzero_status_fails_with_it(two_cases):
    a, _ = two_cases
    (a / "outputs" / "status.txt").write_text("161002\nblockShape rejected\n")
    result = compare.compare_case(a)
    assert result.verdict == FAIL
    assert result.message == "status 161002 (ACLNN_ERR_PARAM_INVALID), expected 0 (ACLNN_SUCCESS): blockShape rejected"


def test_exit_code_policy():
    def suite(*verdicts: str) -> compare.SuiteResult:
        cases = tuple(
            compare.CaseResult(
                name=f"c{i}",
                case_dir="",
                output_dir="",
                verdict=v,
                spec=None,
                device=None,
                standard="-",
                settings=None,
                dtype=None,
                layout=None,
                expect_status=None,
                status=None,
                status_message=None,
                checks=(),
                tensors=(),
                errors=(),
                output_bytes=0,
                seconds=0.0,
            )
            for i, v in enumerate(verdicts)
        )
        return compare.SuiteResult(cases)

    assert suite(PASS, PASS).return_code == 0
    assert suite(PASS, FAIL).return_code == 1
    assert suite(FAIL, ERROR, PASS).return_code == 3
    assert suite().return_code == 0


def test_select_cases_filters_by_directory_name(two_cases, tmp_path):
    assert [p.name for p in store.select_cases([tmp_path], ["b*"])] == ["b"]
    with pytest.raises(Exception, match="--filter 'z' matches none of 2 cases"):
        store.select_cases([tmp_path], ["z"])


# ---- specificity over many seeds (edge suite through bsa gen) ------------------------------------


def _edge_sweep(tmp_path: Path, seeds: range) -> list[str]:
    from bsa_cli.gen.generate import generate_case
    from bsa_cli.specs import load_specs

    cases = load_specs([REPO / "cases" / "edge.yaml"])
    failures = []
    for seed in seeds:
        for case in cases:
            case = dataclasses.replace(case, seed=seed, name=f"{case.name}.s{seed}")
            case_dir = generate_case(case, tmp_path)
            # a run seed, as `bsa run` gives: dK/dV partials summed in another order every seed
            reference.emulate_case_dir(case_dir, case_dir / "outputs", order_seed=seed)
            result = compare.compare_case(case_dir)
            if result.verdict != PASS:
                failures.append(f"{result.name}: {result.message}")
    return failures


@pytest.mark.slow  # 30 s: the 50-seed sweep covers it; the fast loop keeps the per-fault tests
def test_edge_suite_clean_outputs_pass_one_seed(tmp_path):
    assert _edge_sweep(tmp_path, range(100, 101)) == []


@pytest.mark.slow
@pytest.mark.parametrize("first", range(0, 50, 10))  # fifty seeds, ten a test: xdist's workers share them
def test_edge_suite_clean_outputs_pass_fifty_seeds(tmp_path, first):
    assert _edge_sweep(tmp_path, range(first, first + 10)) == []


def test_mask_view_agrees_with_structural_rows(tmp_path):
    case = make_case(
        "tnd",
        layout="TND",
        batch=2,
        actual_seq_lengths=(20, 37),
        actual_seq_lengths_kv=(33, 9),
        q_seq_len=37,
        kv_seq_len=33,
        block_shape=(16, 16),
    )
    mask = (np.random.default_rng(2).random(case.mask_shape) < 0.4).astype(np.uint8)
    rows = compare.structural_rows(case, mask)
    zero_dq = rows["dq"][0].reshape(-1, case.num_heads)  # [T, N]
    for span in case.spans():
        view = mask_view(case, mask, span)
        for head in range(case.num_heads):
            for s in range(span.q_len):
                assert zero_dq[span.q_start + s, head] == (not view[head, s // 16].any())


@pytest.mark.slow
def test_edge_suite_every_applicable_fault_fails(generated_suite, tmp_path):
    from bsa_cli.specs import load_specs
    from bsa_cli.store import load_manifest, read_array

    missed = []
    for case in load_specs([REPO / "cases" / "edge.yaml"]):
        case_dir = generated_suite("edge") / case.name
        mask = read_array(case_dir, load_manifest(case_dir)["inputs"]["block_sparse_mask"])
        for fault in faults.applicable_faults(case, mask):
            output_dir = tmp_path / "faults" / case.name / fault
            reference.emulate_case_dir(case_dir, output_dir, fault=fault)
            result = compare.compare_case(case_dir, output_dir)
            if result.verdict != FAIL:
                missed.append(f"{case.name} {fault}: {result.verdict} {result.message}")
    assert missed == []


# ---- the benchmark summary written at gen -------------------------------------------------------

EDGE = REPO / "cases" / "edge.yaml"


def measured_benchmark(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Spy on `compare.metrics._measure` where judging and summarizing call it: one entry per call, True when
    it measured a benchmark array."""
    calls: list[bool] = []
    measure = compare.metrics._measure

    def spy(device: Any, bench: Any, *rest: Any) -> Any:
        calls.append(bench is not None)
        return measure(device, bench, *rest)

    monkeypatch.setattr(compare.judge, "_measure", spy)
    monkeypatch.setattr(compare.summary, "_measure", spy)
    return calls


@pytest.mark.parametrize(
    ("case_name", "fault", "compare_settings", "precision"),
    [
        ("edge-varlen-tnd", None, {}, "float32"),
        ("edge-gqa-8to2-bf16", "tile-noise", {}, "float32"),
        ("edge-varlen-bnsd", "dk-no-scale", {"thresholds": {"err_thd": 0.01, "small_value_thd": 0.001}}, "float32"),
        ("edge-empty-rows", None, {"standard": "fa-ratio"}, "float32"),
        ("edge-tail", "tile-noise", {"standard": "fa-ratio"}, "float64"),
        ("edge-gqa", None, {"standard": "single"}, "float64"),
    ],
)
def test_the_benchmark_summary_judges_exactly_as_measuring_the_benchmark(
    tmp_path, monkeypatch, case_name, fault, compare_settings, precision
):
    from bsa_cli.gen.generate import generate_case
    from bsa_cli.gen.settings import GenSettings
    from bsa_cli.specs import load_specs

    case = next(c for c in load_specs([EDGE]) if c.name.startswith(case_name))
    case = dataclasses.replace(case, compare=compare_settings)
    case_dir = generate_case(case, tmp_path, GenSettings(precision))
    reference.emulate_case_dir(case_dir, case_dir / "outputs", fault=fault)
    manifest = json.loads((case_dir / "case.json").read_text())
    assert set(manifest["benchmark_summary"]["tiles"]) == {"dq", "dk", "dv"}
    calls = measured_benchmark(monkeypatch)
    with_summary = compare.compare_case(case_dir)
    assert calls == [False] * 3  # the summary stood for the benchmark
    del manifest["benchmark_summary"]
    (case_dir / "case.json").write_text(json.dumps(manifest))
    measured = compare.compare_case(case_dir)
    assert calls[3:] == [True] * 3  # without it the benchmark is measured (reported under every standard)
    if fault is not None and "standard" not in compare_settings:
        assert with_summary.verdict == FAIL  # the default standard catches both planted faults
    documents = [report.case_document(dataclasses.replace(r, seconds=0.0)) for r in (with_summary, measured)]
    assert documents[0] == documents[1]


@pytest.fixture
def generated(emulated_cases, tmp_path) -> Path:
    """A private copy of a case generated once with the reference device's outputs (the tests change it)."""
    return Path(shutil.copytree(emulated_cases([make_case("g")]) / "g", tmp_path / "g"))


def test_settings_that_change_the_summary_key_measure_the_benchmark_again(generated, monkeypatch):
    calls = measured_benchmark(monkeypatch)
    assert compare.compare_case(generated).verdict == PASS
    assert compare.compare_case(generated, run=RunSettings(thresholds={"err_thd": 0.5})).verdict == PASS
    assert calls == [False] * 3 + [True] * 3


def test_benchmark_files_are_still_checked_when_the_summary_stands_for_them(generated):
    bench = generated / "benchmark" / "dq.bin"
    data = bytearray(bench.read_bytes())
    data[0] ^= 1
    bench.write_bytes(bytes(data))
    result = compare.compare_case(generated)
    assert result.verdict == ERROR
    assert result.errors == (f"{bench}: sha256 differs from the manifest: stale benchmark; run `bsa gen` again",)
    bench.unlink()
    assert compare.compare_case(generated).errors[0].startswith(f"{bench}: missing")


def test_a_changed_summary_tiles_file_is_stale(generated):
    tiles = generated / "benchmark" / "dv.tiles.bin"
    tiles.write_bytes(bytes(len(tiles.read_bytes())))
    result = compare.compare_case(generated)
    assert result.verdict == ERROR
    stale = "sha256 differs from the manifest: stale benchmark summary; run `bsa gen` again"
    assert result.errors == (f"{tiles}: {stale}",)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["benchmark_summary"]["stats"]["dq"].update(rmse=None), "rmse: None is not float"),
        (lambda m: m["benchmark_summary"]["stats"]["dk"].update(count=True), "count: True is not int"),
        (lambda m: m["benchmark_summary"]["stats"]["dv"].pop("rmse"), "fields ['rmse'] missing or unknown"),
        (lambda m: m["benchmark_summary"]["stats"]["dk"].update(bias="nan"), "dk: bias nan ± "),
        (lambda m: m["benchmark_summary"].pop("tiles"), "benchmark_summary: 'tiles'"),
        (
            lambda m: m["benchmark_summary"]["tiles"]["dq"].update(shape=[96, 4]),  # same bytes as [192, 2]
            "dq: benchmark summary tiles are float32 [96, 4], expected float32 [192, 2]",
        ),
        (lambda m: m["benchmark_summary"]["tiles"]["dq"].update(shape=[192, 1]), "oversized"),
    ],
)
def test_a_malformed_summary_makes_the_case_an_error_not_a_crash(generated, edit, message):
    manifest = json.loads((generated / "case.json").read_text())
    edit(manifest)
    (generated / "case.json").write_text(json.dumps(manifest))
    result = compare.compare_case(generated)
    assert result.verdict == ERROR
    assert any(message in e for e in result.errors), result.errors
