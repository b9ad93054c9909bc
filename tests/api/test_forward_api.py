"""The Python API on op folders: `bsa.judge(case, out=, lse=)` for the forward, all five outputs for the
pair, the same verdict as `bsa compare` for the same outputs, errors naming what is missing or extra."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bsa_cli as bsa
from bsa_cli import compare
from bsa_cli.core.case import numpy_dtype
from tests.helpers import build_judged_op_folder, case_factory

make = case_factory(head_dim=64, q_seq_len=96, kv_seq_len=80, block_shape=(32, 16), scale=None)


def mask_with_empty_rows(case) -> np.ndarray:
    mask = (np.random.default_rng(5).random(case.mask_shape) < 0.6).astype(np.uint8)
    mask[:, 0, 1, :] = 0
    return mask


def device_outputs(case_dir: Path) -> dict[str, np.ndarray]:
    manifest = bsa.load_case(case_dir).manifest
    return {
        name: np.fromfile(case_dir / "outputs" / e["file"], dtype=numpy_dtype(e["dtype"])).reshape(e["shape"])
        for name, e in manifest.entries("outputs")
    }


def same_judgement(a: compare.CaseResult, b: compare.CaseResult) -> None:
    assert (a.verdict, a.op, a.name) == (b.verdict, b.op, b.name)
    assert [(c.name, c.tensor, c.value, c.passed, c.detail) for c in a.all_checks] == [
        (c.name, c.tensor, c.value, c.passed, c.detail) for c in b.all_checks
    ]


def test_a_forward_folder_loads_with_its_op_inputs_and_golden(tmp_path: Path) -> None:
    case = bsa.load_case(build_judged_op_folder(tmp_path, make("c"), "forward", mask_with_empty_rows(make("c"))))
    assert (case.op, case.outputs, case.skip) == ("forward", ("out", "lse"), None)
    assert sorted(case.inputs) == ["block_sparse_mask", "key", "query", "value"]
    assert case.inputs["block_sparse_mask"].dtype == np.int8
    assert sorted(case.golden) == sorted(case.benchmark) == ["lse", "out"]
    assert case.params["inner_precise"] == 0 and case.params["softmax_lse_flag"] == 1


@pytest.mark.parametrize("op", ["forward", "chain"])
def test_judge_gives_compare_s_verdict_for_the_same_outputs(tmp_path: Path, op: str) -> None:
    case_dir = build_judged_op_folder(tmp_path, make("c"), op, mask_with_empty_rows(make("c")))
    from_files = compare.compare_case(case_dir, workers=1)
    outputs = device_outputs(case_dir)
    in_memory = bsa.judge(bsa.load_case(case_dir), **outputs, prefilled=True)
    assert in_memory.verdict == "PASS", in_memory.message
    same_judgement(in_memory, from_files)


def test_judge_without_prefill_leaves_rows_the_forward_skips_unchecked(tmp_path: Path) -> None:
    case_dir = build_judged_op_folder(tmp_path, make("c"), "forward", mask_with_empty_rows(make("c")))
    case, outputs = bsa.load_case(case_dir), device_outputs(case_dir)
    out = outputs["out"].copy()
    out[0, 0, 32:64] = 0  # block row 1 of head 0 selects nothing: the forward must leave it alone
    assert bsa.judge(case, out=out, lse=outputs["lse"]).verdict == "PASS"
    result = bsa.judge(case, out=out, lse=outputs["lse"], prefilled=True)
    assert result.verdict == "FAIL"
    assert result.deciding is not None and result.deciding.name == "rows-written"
    with pytest.raises(AssertionError, match="rows-written: 32 of 32 rows the forward must leave alone were written"):
        bsa.assert_passed(result)


def test_judge_names_outputs_missing_or_extra_for_the_op(tmp_path: Path) -> None:
    case_dir = build_judged_op_folder(tmp_path, make("c"), "forward")
    case, outputs = bsa.load_case(case_dir), device_outputs(case_dir)
    with pytest.raises(ValueError, match=r"^c@forward: lse missing: the forward's outputs are out, lse \(bsa.judge"):
        bsa.judge(case, out=outputs["out"])
    with pytest.raises(ValueError, match=r"^c@forward: dq given, but the forward has no dq: "):
        bsa.judge(case, outputs["out"], out=outputs["out"], lse=outputs["lse"])
    with pytest.raises(ValueError, match=r"^lse: expected float32 \[1, 2, 96, 1\], got float16 \[1, 2, 96, 1\]$"):
        bsa.judge(case, out=outputs["out"], lse=outputs["lse"].astype(np.float16))
    chain = bsa.load_case(build_judged_op_folder(tmp_path, make("p"), "chain"))
    with pytest.raises(ValueError, match=r"^p@chain: dq, dk, dv missing: the chain's outputs are out, lse, dq, dk, dv"):
        bsa.judge(chain, out=outputs["out"], lse=outputs["lse"])


def test_a_folder_gen_skipped_loads_and_judges_as_skip(tmp_path: Path) -> None:
    reason = "the A2/A3 forward refuses block_shape [32, 16]: Y % 128 != 0 (tiling, 561002); the backward accepts it"
    case = bsa.load_case(build_judged_op_folder(tmp_path, make("c"), "forward", skip=reason))
    assert (case.op, case.skip, dict(case.inputs)) == ("forward", reason, {})
    result = bsa.judge(case)
    assert (result.verdict, result.message) == ("SKIP", reason)


def test_a_pair_that_must_fail_passes_through_the_api_too(tmp_path: Path) -> None:
    expect = {"verdict": "FAIL", "cause": "lse-unwritten"}
    case_dir = build_judged_op_folder(
        tmp_path, make("p", softmax_lse_flag=0), "chain", mask_with_empty_rows(make("p")), expect=expect
    )
    result = bsa.judge(bsa.load_case(case_dir), **device_outputs(case_dir), prefilled=True)
    assert result.verdict == "PASS" and result.message.startswith("fails as it must: lse-unwritten")
    assert json.loads((case_dir / "case.json").read_text())["expect"]["cause"] == "lse-unwritten"
