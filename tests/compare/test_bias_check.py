"""The bias check inside `bsa compare`: planted systematic errors in each gradient fail, clean runs pass.

Cases come from `bsa gen` (the same code path as users'); outputs from the reference device with a run
seed, then one gradient replaced by a biased one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from bsa_cli import compare, store
from bsa_cli.compare import FAIL, PASS, RunSettings
from bsa_cli.core.case import Sparsity, numpy_dtype
from bsa_cli.devices import reference
from tests.helpers import case_factory

GRADS = ("dq", "dk", "dv")


_case = case_factory(
    source="tests",
    head_dim=128,
    q_seq_len=128,
    kv_seq_len=128,
    block_shape=(64, 64),
    scale=1 / 128**0.5,
    seed=5,
    sparsity=Sparsity(pattern="random", density=0.6),
)


SHAPES = {
    "fp16-mha": _case("fp16-mha"),
    "bf16-gqa": _case("bf16-gqa", dtype="bfloat16", num_heads=4, q_seq_len=256, kv_seq_len=128, num_kv_heads=2),
    "bf16-tnd": _case(
        "bf16-tnd",
        dtype="bfloat16",
        layout="TND",
        batch=2,
        q_seq_len=200,
        kv_seq_len=160,
        actual_seq_lengths=(200, 72),
        actual_seq_lengths_kv=(160, 96),
    ),
    "fp16-tnd-gqa": _case(
        "fp16-tnd-gqa",
        layout="TND",
        batch=2,
        num_heads=4,
        num_kv_heads=1,
        q_seq_len=130,
        kv_seq_len=190,
        actual_seq_lengths=(130, 100),
        actual_seq_lengths_kv=(190, 80),
    ),
}


@pytest.fixture(scope="module")
def generated(emulated_cases) -> dict[str, Path]:
    root = emulated_cases(list(SHAPES.values()), order_seed=3)
    return {name: root / name for name in SHAPES}


def _plant(case_dir: Path, output_dir: Path, tensor: str, factor: float) -> None:
    """Copy the device outputs to `output_dir` with `tensor` replaced by the golden times `factor`, rounded
    to the case dtype: a device that computes exactly and rounds once, with a systematic error."""
    manifest = store.load_manifest(case_dir)
    output_dir.mkdir(parents=True)
    for name in GRADS:
        entry = manifest["outputs"][name]
        source = case_dir / "outputs" / entry["file"]
        if name == tensor:
            golden = store.read_array(case_dir, manifest["golden"][name]).astype(np.float64)
            array = (golden * factor).astype(numpy_dtype(manifest["params"]["dtype"]))
            (output_dir / entry["file"]).write_bytes(array.tobytes())
        else:
            (output_dir / entry["file"]).write_bytes(source.read_bytes())
    (output_dir / "status.txt").write_text("0\n")


def _elements(case_dir: Path, tensor: str) -> int:
    return int(np.prod(store.load_manifest(case_dir)["outputs"][tensor]["shape"]))


def test_clean_reference_device_outputs_pass_with_the_bias_check_on(generated):
    for case_dir in generated.values():
        result = compare.compare_case(case_dir)
        assert result.verdict == PASS, result.message
        assert sum(c.name == "bias" for c in result.all_checks) == 3


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("tensor", GRADS)
@pytest.mark.parametrize("factor", [1 + 1e-4, 1 - 1e-4])
def test_a_relative_bias_of_1e_4_in_any_gradient_fails(generated, tmp_path, shape, tensor, factor):
    case_dir = generated[shape]
    assert _elements(case_dir, tensor) >= 32768
    _plant(case_dir, tmp_path / "out", tensor, factor)
    result = compare.compare_case(case_dir, tmp_path / "out")
    assert result.verdict == FAIL, result.message
    failed = [c for c in result.all_checks if not c.passed]
    assert [(c.name, c.tensor) for c in failed] == [("bias", tensor)], [c.detail for c in failed]
    estimate = next(t.bias for t in result.tensors if t.name == tensor)
    assert estimate.device == pytest.approx(factor - 1, abs=5 * estimate.device_se)
    assert "relative" in failed[0].detail and "ULP" in failed[0].detail


@pytest.mark.parametrize("shape", ["bf16-gqa", "bf16-tnd"])
@pytest.mark.parametrize("tensor", GRADS)
def test_a_bf16_bias_of_one_256th_fails(generated, tmp_path, shape, tensor):
    _plant(generated[shape], tmp_path / "out", tensor, 1 + 2.0**-8)
    result = compare.compare_case(generated[shape], tmp_path / "out")
    assert result.verdict == FAIL
    assert ("bias", tensor) in {(c.name, c.tensor) for c in result.all_checks if not c.passed}


def test_the_scale_rounded_fault_fails_by_the_bias_check_alone(generated, tmp_path):
    case_dir = generated["fp16-mha"]
    reference.emulate_case_dir(case_dir, tmp_path / "out", fault="scale-rounded", order_seed=4)
    result = compare.compare_case(case_dir, tmp_path / "out")
    assert result.verdict == FAIL
    assert {c.name for c in result.all_checks if not c.passed} == {"bias"}
    assert result.deciding.name == "bias"


def test_bias_z_inf_turns_the_check_off_and_other_standards_can_turn_it_on(generated, tmp_path):
    case_dir = generated["fp16-mha"]
    _plant(case_dir, tmp_path / "out", "dq", 1 + 1e-4)
    off = compare.compare_case(case_dir, tmp_path / "out", run=RunSettings(thresholds={"bias_z": float("inf")}))
    assert off.verdict == PASS and not any(c.name == "bias" for c in off.all_checks)
    single = compare.compare_case(case_dir, tmp_path / "out", run=RunSettings(standard="fa-ratio"))
    assert not any(c.name == "bias" for c in single.all_checks)
    fa_ratio_with_bias = RunSettings(standard="fa-ratio", thresholds={"bias_z": 5})
    on = compare.compare_case(case_dir, tmp_path / "out", run=fa_ratio_with_bias)
    assert on.verdict == FAIL and on.deciding.name == "bias"


def test_a_bias_under_the_floor_passes(generated, tmp_path):
    case_dir = generated["fp16-mha"]
    _plant(case_dir, tmp_path / "out", "dk", 1 + 1e-4)
    result = compare.compare_case(case_dir, tmp_path / "out", run=RunSettings(thresholds={"bias_floor": 2e-4}))
    assert result.verdict == PASS


def test_the_json_report_keeps_the_estimate(generated, tmp_path):
    from bsa_cli import report

    case_dir = generated["bf16-gqa"]
    _plant(case_dir, tmp_path / "out", "dv", 1 - 1e-4)
    result = compare.compare_case(case_dir, tmp_path / "out")
    document = report.to_document(compare.SuiteResult((result,)))
    dv = next(t for t in document["cases"][0]["tensors"] if t["name"] == "dv")
    assert dv["bias"]["device"] == pytest.approx(-1e-4, abs=3e-5) and dv["bias"]["device_se"] > 0
    back = report.from_document(document)
    assert dataclasses.asdict(back.cases[0].tensors[2].bias) == dataclasses.asdict(result.tensors[2].bias)


def test_the_html_report_draws_the_bias_first_when_it_decides(generated, tmp_path):
    from bsa_cli import report

    case_dir = generated["fp16-mha"]
    _plant(case_dir, tmp_path / "out", "dk", 1 - 1e-4)
    result = compare.compare_case(case_dir, tmp_path / "out")
    page = report.html_report(compare.SuiteResult((result,)))
    section = page[page.index("<h3>dk ") :]
    chart = section[: section.index("</svg>")]
    assert "dk: systematic relative error against the golden" in chart
    assert chart.count("<circle") == 2 and "within the floor" in chart  # device, benchmark; the floor band
    assert section.index("systematic relative error") < section.index("error ratio per")  # before the heat map
    assert "dq: systematic" not in page  # passing tensors get no chart
