"""Headlines say what happened: an output never written, a fault that does not apply, a floored ratio, a
failed run's log; and what a failing case keeps for its pictures (block mask, tiles, ULP chart)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bsa_cli import compare, devices
from bsa_cli.compare import ERROR, FAIL, PASS, metrics
from bsa_cli.devices import faults
from tests.helpers import build_case, check, make_case, make_inputs, write_outputs
from tests.helpers.cli import invoke


def record_fault(output_dir: Path, fault: str | None, kind: str = "reference", **device: object) -> None:
    """Write the part of run.json compare reads about the device (a record of an older bsa: without
    `fault_not_applied`, unless given)."""
    name = "reference (bsa emulate)" + (f" with fault '{fault}'" if fault else "")
    record = {
        "case": None,
        "outcome": "ok",
        "device": {"name": name, "kind": kind, "fault": fault, **device},
        "binary": None,
    }
    (output_dir / "run.json").write_text(json.dumps(record))


def test_an_all_zero_output_is_named_as_never_written_not_by_its_ratio(tmp_path):
    case = make_case("zero")
    case_dir = build_case(tmp_path, case, fault="stale-output")
    result = compare.compare_case(case_dir, workers=1)

    assert result.verdict == FAIL
    assert result.deciding is not None and result.deciding.name == "all_zero"
    assert result.headline.startswith("dq is all zero, as if never written, where the golden is not")
    assert {c.tensor for c in result.all_checks if c.name == "all_zero" and not c.passed} == {"dq", "dk", "dv"}


def test_a_nonzero_output_has_no_all_zero_check(tmp_path):
    result = compare.compare_case(build_case(tmp_path, make_case("clean")), workers=1)
    assert result.verdict == PASS
    assert not any(c.name == "all_zero" for c in result.all_checks)


def test_a_ratio_whose_benchmark_error_is_below_err_thd_says_it_was_floored(tmp_path):
    result = compare.compare_case(build_case(tmp_path, make_case("floor")), workers=1)
    dq = result.tensors[0]
    assert dq.benchmark is not None and result.settings is not None
    err_thd = result.settings.thresholds["err_thd"]
    assert dq.benchmark.rmse < err_thd < dq.benchmark.max_rel_err  # one of each kind
    assert "benchmark" in check(result, "rmse_ratio", "dq").detail
    assert "floored at err_thd" in check(result, "rmse_ratio", "dq").detail
    assert "floored" not in check(result, "mare_ratio", "dq").detail


def test_a_fault_that_does_not_apply_is_said_in_the_headline(tmp_path):
    case = make_case("mha", num_heads=2, num_kv_heads=2)  # no-gqa-sum needs N1 > N2
    case_dir = build_case(tmp_path, case, fault="no-gqa-sum")
    record_fault(case_dir / "outputs", "no-gqa-sum", fault_not_applied=NO_GQA_SUM_NOTE)
    result = compare.compare_case(case_dir, workers=1)

    assert result.verdict == PASS and result.fault == "no-gqa-sum" and result.device_kind == "reference"
    assert result.notes == (
        "fault 'no-gqa-sum' does not apply to this case (applies only with N1 > N2 and a selection in a "
        "non-first head of a group): the reference device computed it without the fault",
    )
    assert result.headline.startswith("fault 'no-gqa-sum' does not apply to this case")


NO_GQA_SUM_NOTE = (
    "fault 'no-gqa-sum' does not apply to this case (applies only with N1 > N2 and a selection in a "
    "non-first head of a group): the reference device computed it without the fault"
)


def test_the_reference_device_records_whether_its_fault_applied_and_compare_reads_it(tmp_path):
    case_dir = build_case(tmp_path, make_case("mha", num_heads=2, num_kv_heads=2))
    options = devices.RunOptions(device=devices.create(fault="no-gqa-sum"))
    result = devices.run_case(case_dir, options)
    assert result.outcome == "ok", result.problems
    assert result.record["device"]["fault_not_applied"] == NO_GQA_SUM_NOTE
    judged = compare.compare_case(case_dir, workers=1)
    assert judged.verdict == PASS and judged.notes == (NO_GQA_SUM_NOTE,)

    applied = build_case(tmp_path / "tile", make_case("tile"))
    result = devices.run_case(applied, devices.RunOptions(device=devices.create(fault="tile-noise")))
    assert result.record["device"]["fault_not_applied"] is None
    assert compare.compare_case(applied, workers=1).notes == ()


def test_compare_takes_the_recorded_answer_and_never_asks_the_device(tmp_path):
    case_dir = build_case(tmp_path, make_case("mha", num_heads=2, num_kv_heads=2), fault="no-gqa-sum")
    record_fault(case_dir / "outputs", "no-gqa-sum", fault_not_applied="as the device said it")
    assert compare.compare_case(case_dir, workers=1).notes == ("as the device said it",)
    record_fault(case_dir / "outputs", "no-gqa-sum", fault_not_applied=None)  # the device said: it applied
    assert compare.compare_case(case_dir, workers=1).notes == ()
    record_fault(case_dir / "outputs", "no-gqa-sum")  # an older record says nothing: no note
    assert compare.compare_case(case_dir, workers=1).notes == ()


def test_a_fault_that_applies_adds_no_note(tmp_path):
    case_dir = build_case(tmp_path, make_case("tile"), fault="tile-noise")
    record_fault(case_dir / "outputs", "tile-noise")
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == FAIL and result.notes == () and result.fault == "tile-noise"


def test_fault_not_applied_explains_each_fault_in_words():
    case = make_case("c")
    for name in faults.FAULTS:
        assert faults.fault_condition(name).startswith("applies ")
    assert faults.fault_not_applied("dk-no-scale", make_case("c", scale=1.0)) is not None
    assert faults.fault_not_applied("tile-noise", case) is None
    with pytest.raises(ValueError, match="unknown fault"):
        faults.fault_not_applied("nope", case)


def test_a_failed_run_names_its_log(tmp_path):
    case_dir = build_case(tmp_path, make_case("crash"), outputs=False)
    output_dir = case_dir / "outputs"
    output_dir.mkdir(exist_ok=True)
    record = {
        "case": "crash",
        "outcome": "error",
        "exit_code": 1,
        "problems": ["exited with code 1 (see stderr.log)"],
        "stderr_log": "stderr.log",
        "device": {"name": "b", "kind": "binary", "fault": None},
    }
    (output_dir / "run.json").write_text(json.dumps(record))
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == ERROR
    assert f"log {output_dir / 'stderr.log'}" in result.errors[0]


def test_a_failing_case_keeps_its_block_mask_tiles_and_ulp_chart(tmp_path):
    case = make_case("pict", batch=2, actual_seq_lengths=(96, 40), actual_seq_lengths_kv=(80, 20))
    tensors = make_inputs(case)
    case_dir = build_case(tmp_path, case, fault="tile-noise")
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == FAIL

    selection = result.selection
    assert selection is not None and selection.shape == case.mask_shape
    mask = tensors["block_sparse_mask"]
    first = selection.grid(0, 1)
    assert first == ["".join("1" if v else "0" for v in row) for row in mask[0, 1]]
    second = selection.grid(1, 0)  # 40 query rows of 32: 2 blocks; 20 kv columns of 16: 2 blocks
    assert all(row[2:] == "-" * (len(row) - 2) for row in second[:2]) and second[2] == "-" * len(second[2])

    dq = result.tensors[0]
    assert not dq.passed and dq.ulp_chart is not None
    assert len(dq.ulp_chart.device) == len(compare.ULP_CHART_EDGES) + 1
    assert sum(dq.ulp_chart.device) == dq.device.count and sum(dq.ulp_chart.benchmark or ()) == dq.device.count
    assert dq.hot_blocks[0].tiles is not None and dq.hot_blocks[0].tiles.max() == dq.hot_blocks[0].tile_ratio
    assert all(h.tiles is None for h in dq.hot_blocks[1:])
    passing = [t for t in result.tensors if t.passed]
    assert passing and all(t.ulp_chart is None and t.hot_blocks[0].tiles is None for t in passing)


def test_a_passing_case_keeps_no_pictures(tmp_path):
    result = compare.compare_case(build_case(tmp_path, make_case("ok")), workers=1)
    assert result.verdict == PASS and result.selection is None


def test_write_outputs_helper_is_the_reference_device(tmp_path):
    case = make_case("w")
    grads = write_outputs(tmp_path / "o", case, make_inputs(case), "stale-output")
    assert not any(np.any(g) for g in grads.values())


ONE_KEY_SPEC = """
cases:
  - name: one-key
    layout: BNSD
    dtype: fp16
    batch: 1
    num_heads: 1
    q_seq_len: 1
    head_dim: 128
    block_shape: [128, 128]
    sparsity: {pattern: dense}
    matrix: {seed: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]}
"""


def test_rows_that_see_one_key_pass_where_the_true_gradient_is_exactly_zero(tmp_path):
    # Sq = Skv = 1: P = 1, out = v, so dS = P (dP - Dsum) = 0 and dq = dk = 0 exactly; every side (golden,
    # benchmark, device) carries float32 rounding noise of about 1e-7 there. Before the noise floor 7 of these
    # 20 correct outputs failed (all zero "as if never written", or a noise-over-noise tile ratio).
    spec = tmp_path / "one.yaml"
    spec.write_text(ONE_KEY_SPEC)
    report = tmp_path / "report.json"
    result = invoke("check", spec, "-o", tmp_path / "out", "-j", "1", "--json", report)
    verdicts = {case["name"]: case["verdict"] for case in json.loads(report.read_text())["cases"]}
    assert len(verdicts) == 20 and set(verdicts.values()) == {"PASS"}, (result.output, verdicts)
    assert result.exit_code == 0


#: The fuzzer's clean false alarms (seed 3): one key, many query rows, so dk = sum over the rows of dS q = 0 exactly
#: and every side's dk is float32 cancellation noise summed over 432 (and 92 x 8 GQA) rows, past small_value_thd.
MANY_ROWS_ONE_KEY_SPEC = """
cases:
  - {name: causal-d256, layout: BNSD, dtype: float16, num_heads: 1, head_dim: 256, block_shape: [64, 128],
     seed: 1814392655, batch: 1, q_seq_len: 432, kv_seq_len: 1, sparsity: {pattern: causal}}
  - {name: gqa8-d128, layout: BNSD, dtype: float16, num_heads: 8, num_kv_heads: 1, head_dim: 128,
     block_shape: [32, 64], seed: 0, batch: 1, q_seq_len: 92, kv_seq_len: 1, sparsity: {pattern: dense}}
"""


def test_many_rows_on_one_key_pass_where_dk_is_noise_summed_over_the_rows(tmp_path):
    # Before the bound grew with the accumulation length both failed dk's small_value_ratio (4 > 2, 3 > 2).
    spec = tmp_path / "many.yaml"
    spec.write_text(MANY_ROWS_ONE_KEY_SPEC)
    report = tmp_path / "report.json"
    result = invoke("check", spec, "-o", tmp_path / "out", "-j", "1", "--json", report)
    verdicts = {case["name"]: case["verdict"] for case in json.loads(report.read_text())["cases"]}
    assert verdicts == {"causal-d256": "PASS", "gqa8-d128": "PASS"}, result.output
    assert result.exit_code == 0


#: A clean 10-minute fuzz (seed 7): one varlen entry of 239 rows on one key (its dk is noise) beside an entry of
#: real values, so the tensor as a whole is not noise-level: dk's small-value ratio read 17 > 2.
ONE_KEY_ENTRY_SPEC = """
cases:
  - {name: one-key-entry, layout: TND, dtype: float16, num_heads: 1, num_kv_heads: 1, head_dim: 256,
     block_shape: [128, 128], seed: 1432625415, actual_seq_lengths: [239, 1], actual_seq_lengths_kv: [1, 239],
     sparsity: {pattern: causal}}
"""


def test_an_entry_of_many_rows_on_one_key_passes_beside_entries_of_real_values(tmp_path):
    spec = tmp_path / "entry.yaml"
    spec.write_text(ONE_KEY_ENTRY_SPEC)
    report = tmp_path / "report.json"
    result = invoke("check", spec, "-o", tmp_path / "out", "-j", "1", "--json", report)
    assert [case["verdict"] for case in json.loads(report.read_text())["cases"]] == ["PASS"], result.output
    faulty = invoke("check", spec, "-o", tmp_path / "faulty", "-j", "1", "--fault", "no-dsum")
    assert faulty.exit_code == 1, faulty.output  # a real dk where the entry's true dk is 0 still fails


def test_the_small_value_bound_grows_per_entry_only_where_that_entry_is_noise_level():
    case = make_case(
        "varlen",
        layout="TND",
        batch=2,
        actual_seq_lengths=(100, 3),
        actual_seq_lengths_kv=(1, 5),
        q_seq_len=100,
        kv_seq_len=5,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    params = metrics._params(case, compare.resolve_settings(case.dtype, None, compare.RunSettings()))
    golden = np.full(case.kv_shape, params.err_thd / 2, dtype=np.float32)
    golden[1:] = params.err_thd * 2  # the second entry (kv rows 1..5) holds real values
    grown = metrics.noise_params(params, case, "dk", golden)
    assert grown.small_thd == params.small_thd and grown.small_thd_rows is not None
    assert grown.small_thd_rows[0] == pytest.approx(params.small_thd * np.sqrt(100 * 2))  # rows x group size
    assert np.all(grown.small_thd_rows[1:] == np.float32(params.small_thd))


def test_many_rows_on_one_key_still_fail_a_real_dk_fault(tmp_path):
    # no-dsum (dS = P dP) gives dk a real value where the true dk is 0: the noise-level bound must not hide it.
    case = make_case("one-key", q_seq_len=96, kv_seq_len=1, block_shape=(32, 32), head_dim=64)
    result = compare.compare_case(build_case(tmp_path, case, fault="no-dsum"), workers=1)
    assert result.verdict == FAIL
    assert any(c.tensor == "dk" and not c.passed for c in result.all_checks)


def test_the_small_value_bound_grows_only_where_the_golden_is_noise_level_everywhere():
    case = make_case("one-key", num_heads=8, num_kv_heads=2, q_seq_len=100, kv_seq_len=1, head_dim=64)
    params = metrics._params(case, compare.resolve_settings(case.dtype, None, compare.RunSettings()))
    noise = np.full((1, 2, 1, 64), params.err_thd / 2, dtype=np.float32)
    signal = noise.copy()
    signal[0, 0, 0, 0] = params.err_thd * 2  # one real value: the standard's bound stands
    grown = metrics.noise_params(params, case, "dk", noise)
    assert grown.small_thd == pytest.approx(params.small_thd * np.sqrt(100 * 4))  # rows x group size
    assert metrics.noise_params(params, case, "dq", noise).small_thd == pytest.approx(params.small_thd)
    assert metrics.noise_params(params, case, "dk", signal) == params


def test_rows_that_see_one_key_still_fail_a_gradient_that_is_not_noise(tmp_path):
    # The floor is the standard's small_value_thd: an error above it in one tile (tile-noise: 5x the kernel's)
    # on a case whose gradients are not zero still fails its tile ratio.
    case = make_case("one-row", q_seq_len=16, kv_seq_len=16, block_shape=(16, 16), head_dim=32)
    result = compare.compare_case(build_case(tmp_path, case, fault="tile-noise"), workers=1)
    assert result.verdict == FAIL
    assert not check(result, "tile_ratio", "dq").passed
