"""The Python API (bsa_cli.api): load_case, judge and judge_status give what `bsa compare` gives.

A tiny suite is generated once (`bsa gen`); device outputs come from the reference device
(`bsa_cli.devices.reference`), clean or with a planted fault, written to files for `compare.compare_case` and
held in memory (NumPy arrays or torch tensors) for `bsa.judge`.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

import bsa_cli as bsa
from bsa_cli import compare, report, store
from bsa_cli.compare import ERROR, FAIL, PASS
from bsa_cli.core.case import numpy_dtype
from bsa_cli.devices import reference
from bsa_cli.store.manifest import GRAD_NAMES, INPUT_NAMES

SPEC = {
    "defaults": {"head_dim": 16, "block_shape": [16, 16], "num_heads": 2, "seed": 5, "dtype": "fp16"},
    "cases": [
        {"name": "a-bnsd-tail", "batch": 2, "q_seq_len": 40, "kv_seq_len": 24, "sparsity": {"pattern": "causal"}},
        {
            "name": "b-tnd-gqa-bf16",
            "layout": "TND",
            "dtype": "bf16",
            "actual_seq_lengths": [16, 0, 24],
            "num_kv_heads": 1,
            "sparsity": {"pattern": "random", "density": 0.6},
        },
        {"name": "n-dtype", "dtype": "float32", "q_seq_len": 16, "expect": "ACLNN_ERR_PARAM_INVALID"},
    ],
}
VALID = ("a-bnsd-tail", "b-tnd-gqa-bf16")


@pytest.fixture(scope="module")
def generated(generated_spec: Callable[..., Path]) -> Path:
    """The tiny suite, shared (read-only: `out` is a private copy)."""
    return generated_spec(SPEC)


@pytest.fixture
def out(generated: Path, tmp_path: Path) -> Path:
    """A private copy of the generated cases (tests write outputs into them or change them)."""
    return Path(shutil.copytree(generated, tmp_path / "out"))


def manifest_of(case_dir: Path) -> dict[str, Any]:
    return json.loads((case_dir / "case.json").read_text())


def checks_of(result: compare.CaseResult) -> list[str]:
    """Everything a verdict says, as text (NaN-safe): checks, and per tensor its worst elements and hot blocks."""
    parts = [result.verdict, result.message, repr(result.checks), repr(result.deciding)]
    parts += [repr((t.name, t.checks, t.worst, t.hot_blocks)) for t in result.tensors]
    return parts


def written_outputs(case_dir: Path, fault: str | None = None) -> tuple[Path, dict[str, np.ndarray]]:
    """Run the reference device on a case's files; return its output directory and dq, dk, dv read back."""
    output_dir = case_dir / "outputs"
    assert reference.emulate_case_dir(case_dir, output_dir, fault) == 0
    entries = manifest_of(case_dir)["outputs"]
    return output_dir, {name: store.read_array(output_dir, entries[name]) for name in GRAD_NAMES}


# ---- load_case ----------------------------------------------------------------------------------


def test_load_case_gives_checked_inputs_params_and_the_arguments_of_the_call(generated: Path) -> None:
    case = bsa.load_case(generated / "a-bnsd-tail")
    manifest = manifest_of(generated / "a-bnsd-tail")
    assert (case.name, case.dir, case.expect, case.expect_name) == (
        "a-bnsd-tail",
        generated / "a-bnsd-tail",
        0,
        "ACLNN_SUCCESS",
    )
    assert set(case.inputs) == set(INPUT_NAMES)
    for name, entry in manifest["inputs"].items():
        assert (
            case.inputs[name].dtype == numpy_dtype(entry["dtype"]) and list(case.inputs[name].shape) == entry["shape"]
        )
    assert case.params == manifest["params"]
    assert case.op_args == {
        "block_shape": [16, 16],
        "actual_seq_lengths": [40, 40],  # BNSD without lengths passes [S] * B
        "actual_seq_lengths_kv": [24, 24],
        "q_input_layout": "BNSD",
        "kv_input_layout": "BNSD",
        "num_key_value_heads": 2,
        "scale_value": manifest["params"]["scale"],
    }
    assert list(case.op_args) == [
        "block_shape",
        "actual_seq_lengths",
        "actual_seq_lengths_kv",
        "q_input_layout",
        "kv_input_layout",
        "num_key_value_heads",
        "scale_value",
    ]
    case.params["layout"] = "TND"  # a copy: the case is not changed through it
    assert case.params["layout"] == "BNSD"


def test_load_case_reads_bfloat16_inputs_and_the_golden_on_demand(generated: Path) -> None:
    case = bsa.load_case(generated / "b-tnd-gqa-bf16")
    assert case.inputs["query"].dtype == numpy_dtype("bfloat16")
    assert case.op_args["actual_seq_lengths"] == [16, 0, 24] and case.op_args["q_input_layout"] == "TND"
    assert "golden" not in vars(case)  # read on first use
    assert {n: a.dtype for n, a in case.golden.items()} == dict.fromkeys(GRAD_NAMES, np.dtype(np.float32))
    assert {n: a.shape for n, a in case.benchmark.items()} == {n: a.shape for n, a in case.golden.items()}


def test_a_negative_case_loads_with_its_expected_status(generated: Path) -> None:
    case = bsa.load_case(generated / "n-dtype")
    assert (case.expect, case.expect_name) == (161002, "ACLNN_ERR_PARAM_INVALID")
    assert case.golden == {} and case.benchmark == {}


def test_a_negative_case_without_an_input_entry_loads_without_it(out: Path) -> None:
    manifest = manifest_of(out / "n-dtype")
    manifest["inputs"]["softmax_lse"] = None  # a null tensor
    del manifest["inputs"]["block_sparse_mask"]
    (out / "n-dtype" / "case.json").write_text(json.dumps(manifest))
    case = bsa.load_case(out / "n-dtype")
    assert set(case.inputs) == set(INPUT_NAMES) - {"softmax_lse", "block_sparse_mask"}


def test_a_valid_case_without_an_input_entry_is_a_data_error(out: Path) -> None:
    manifest = manifest_of(out / "a-bnsd-tail")
    del manifest["inputs"]["softmax_lse"]
    (out / "a-bnsd-tail" / "case.json").write_text(json.dumps(manifest))
    with pytest.raises(bsa.DataError, match="no inputs entry for softmax_lse"):
        bsa.load_case(out / "a-bnsd-tail")


def test_bad_folders_are_data_errors_that_say_what_is_wrong(out: Path, tmp_path: Path) -> None:
    with pytest.raises(bsa.DataError, match="no such directory"):
        bsa.load_case(tmp_path / "nowhere")
    with pytest.raises(bsa.DataError, match=r"holds 3 cases \(a-bnsd-tail, b-tnd-gqa-bf16, n-dtype\); load one"):
        bsa.load_case(out)
    (tmp_path / "empty").mkdir()
    with pytest.raises(bsa.DataError, match="no manifest: not a case directory written by `bsa gen`"):
        bsa.load_case(tmp_path / "empty")
    query = out / "a-bnsd-tail" / "inputs" / "query.bin"
    data = bytearray(query.read_bytes())
    data[0] ^= 1
    query.write_bytes(bytes(data))
    with pytest.raises(bsa.DataError, match=r"query.bin: sha256 differs from the manifest"):
        bsa.load_case(out / "a-bnsd-tail")
    query.write_bytes(bytes(data[:-2]))
    with pytest.raises(bsa.DataError, match=r"query.bin: truncated"):
        bsa.load_case(out / "a-bnsd-tail")
    manifest = manifest_of(out / "b-tnd-gqa-bf16")
    del manifest["params"]["layout"]
    (out / "b-tnd-gqa-bf16" / "case.json").write_text(json.dumps(manifest))
    with pytest.raises(bsa.DataError, match=r"case.json: malformed manifest \(KeyError: 'layout'\)"):
        bsa.load_case(out / "b-tnd-gqa-bf16")


def test_case_dirs_selects_like_bsa_filter(generated: Path) -> None:
    assert [p.name for p in bsa.case_dirs(generated, patterns=["*-tnd-*", "n-*"])] == ["b-tnd-gqa-bf16", "n-dtype"]
    with pytest.raises(bsa.DataError, match="--filter 'x' matches none of 3 cases"):
        bsa.case_dirs(generated, patterns=["x"])


# ---- judge: the verdict of bsa compare ----------------------------------------------------------


@pytest.mark.parametrize("name", VALID)
@pytest.mark.parametrize("fault", [None, "tile-noise"])
def test_judge_gives_the_verdict_and_checks_of_compare_for_the_same_outputs(out: Path, name: str, fault: str | None):
    output_dir, grads = written_outputs(out / name, fault)
    from_files = compare.compare_case(out / name, output_dir)
    result = bsa.judge(bsa.load_case(out / name), *grads.values())
    assert result.verdict == (PASS if fault is None else FAIL)
    assert checks_of(result) == checks_of(from_files)
    assert (result.standard, result.status, result.output_bytes) == (from_files.standard, 0, from_files.output_bytes)
    assert result.output_dir == "(in memory)" and result.case_dir == str(out / name)


def test_a_planted_fault_fails_with_the_deciding_check_in_the_assertion(generated: Path) -> None:
    case = bsa.load_case(generated / "a-bnsd-tail")
    grads = reference.emulate(case.geometry, case.inputs, fault="dk-no-scale")
    result = bsa.judge(case, grads["dq"], grads["dk"], grads["dv"])
    assert not result.passed and result.verdict == FAIL
    deciding = result.deciding
    assert deciding is not None and deciding.tensor == "dk" and not deciding.passed
    with pytest.raises(AssertionError) as raised:
        bsa.assert_passed(result)
    lines = str(raised.value).splitlines()
    assert lines[0] == f"a-bnsd-tail: FAIL (double-benchmark): {deciding.detail}"
    assert any(line.startswith("  dk worst at ") for line in lines[1:])
    bsa.assert_passed(bsa.judge(case, *reference.emulate(case.geometry, case.inputs).values()))  # clean: no raise


def test_torch_tensors_give_the_numpy_verdict_bf16_bit_for_bit(generated: Path) -> None:
    torch = pytest.importorskip("torch")
    case = bsa.load_case(generated / "b-tnd-gqa-bf16")
    grads = reference.emulate(case.geometry, case.inputs, fault="tile-noise")
    tensors = {name: bsa.to_torch(array) for name, array in grads.items()}
    assert tensors["dq"].dtype == torch.bfloat16
    assert np.array_equal(bsa.to_numpy(tensors["dq"]).view(np.uint16), grads["dq"].view(np.uint16))
    # a tensor that needs grad, and a non-contiguous view of the right shape, are taken as they are
    tensors["dk"] = tensors["dk"].clone().requires_grad_(True)
    tensors["dv"] = tensors["dv"].transpose(0, 2).contiguous().transpose(0, 2)
    assert not tensors["dv"].is_contiguous()
    from_torch = bsa.judge(case, tensors["dq"], tensors["dk"], tensors["dv"])
    assert from_torch.verdict == FAIL
    assert checks_of(from_torch) == checks_of(bsa.judge(case, *grads.values()))


def test_to_torch_keeps_every_input_dtype_and_value(generated: Path) -> None:
    pytest.importorskip("torch")
    for name in VALID:
        for array in bsa.load_case(generated / name).inputs.values():
            back = bsa.to_numpy(bsa.to_torch(array))
            assert back.dtype == array.dtype and back.tobytes() == array.tobytes()


def test_wrong_gradients_are_errors_naming_the_tensor_expected_and_given(generated: Path) -> None:
    case = bsa.load_case(generated / "a-bnsd-tail")
    grads = reference.emulate(case.geometry, case.inputs)
    dq, dk, dv = grads["dq"], grads["dk"], grads["dv"]
    with pytest.raises(ValueError, match=r"^dk: expected float16 \[2, 2, 24, 16\], got float16 \[2, 2, 16, 24\]$"):
        bsa.judge(case, dq, dk.reshape(2, 2, 16, 24), dv)
    with pytest.raises(ValueError, match=r"^dq: expected float16 \[2, 2, 40, 16\], got float32 \[2, 2, 40, 16\]$"):
        bsa.judge(case, dq.astype(np.float32), dk, dv)
    with pytest.raises(TypeError, match=r"^dv: a list; expected a NumPy array or a torch tensor$"):
        bsa.judge(case, dq, dk, dv.tolist())
    with pytest.raises(TypeError, match="expected what bsa.load_case returns"):
        bsa.judge(str(generated / "a-bnsd-tail"), dq, dk, dv)  # type: ignore[arg-type]


def test_judge_takes_run_settings_as_compare_does(out: Path) -> None:
    output_dir, grads = written_outputs(out / "a-bnsd-tail")
    settings = bsa.RunSettings(standard="single")
    result = bsa.judge(bsa.load_case(out / "a-bnsd-tail"), *grads.values(), settings=settings)
    assert result.standard == "single"
    assert checks_of(result) == checks_of(compare.compare_case(out / "a-bnsd-tail", output_dir, run=settings))


def test_stale_golden_is_an_error_verdict_naming_the_file(out: Path) -> None:
    case = bsa.load_case(out / "a-bnsd-tail")
    grads = reference.emulate(case.geometry, case.inputs)
    golden = out / "a-bnsd-tail" / "golden" / "dq.bin"
    data = bytearray(golden.read_bytes())
    data[3] ^= 1
    golden.write_bytes(bytes(data))
    result = bsa.judge(case, *grads.values())
    assert result.verdict == ERROR and result.errors[0].startswith(f"{golden}: sha256 differs from the manifest")
    with pytest.raises(AssertionError, match=r"^a-bnsd-tail: could not be judged: .*dq.bin: sha256 differs"):
        bsa.assert_passed(result)


def test_reports_render_an_api_result_like_a_compare_result(generated: Path) -> None:
    case = bsa.load_case(generated / "a-bnsd-tail")
    grads = reference.emulate(case.geometry, case.inputs, fault="nan-row")
    suite = bsa.SuiteResult((bsa.judge(case, *grads.values(), device="my-npu"),))
    console = Console(file=io.StringIO(), width=100, color_system=None)
    report.render_terminal(suite, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "a-bnsd-tail" in text and "FAIL" in text and "dq NaN/Inf where the golden is finite" in text
    assert "dq NaN/Inf where the golden is finite" in report.junit_xml(suite)
    assert report.to_document(suite)["cases"][0]["device"] == "my-npu"


# ---- judge_status: calls that return no gradients -----------------------------------------------


def test_judge_status_passes_a_negative_case_on_its_expected_status(generated: Path) -> None:
    case = bsa.load_case(generated / "n-dtype")
    assert bsa.judge_status(case, 161002).verdict == PASS
    wrong = bsa.judge_status(case, 161001, "blockShape is null")
    assert wrong.verdict == FAIL
    assert wrong.message == (
        "status 161001 (ACLNN_ERR_PARAM_NULLPTR) != expected 161002 (ACLNN_ERR_PARAM_INVALID): blockShape is null"
    )


def test_judge_status_reads_the_status_an_exception_carries(generated: Path) -> None:
    case = bsa.load_case(generated / "n-dtype")
    raised = RuntimeError("call aclnnBlockSparseAttentionGradGetWorkspaceSize failed, error code 161002.")
    result = bsa.judge_status(case, raised)
    assert result.verdict == PASS and result.status == 161002 and result.status_message == str(raised)
    silent = bsa.judge_status(case, RuntimeError("head_dim must be <= 128"))
    assert silent.verdict == ERROR
    assert silent.errors == (
        "the call raised RuntimeError without an aclnn status in its message: 'head_dim must be <= 128'",
    )


def test_a_negative_case_that_returns_gradients_fails_on_status(generated: Path) -> None:
    case = bsa.load_case(generated / "n-dtype")
    wrong_shapes = [np.zeros(1, np.float16)] * 3  # not looked at: the call should not have succeeded
    result = bsa.judge(case, *wrong_shapes)
    assert result.verdict == FAIL
    assert result.message == "status 0 (ACLNN_SUCCESS) != expected 161002 (ACLNN_ERR_PARAM_INVALID)"


def test_a_valid_case_fails_on_a_nonzero_status(generated: Path) -> None:
    case = bsa.load_case(generated / "a-bnsd-tail")
    result = bsa.judge_status(case, RuntimeError("EZ1001: [PID: 161234] rejected: ACLNN_ERR_PARAM_INVALID"))
    assert result.verdict == FAIL and result.status == 161002
    assert result.message.startswith("status 161002 (ACLNN_ERR_PARAM_INVALID), expected 0 (ACLNN_SUCCESS): EZ1001")
    with pytest.raises(TypeError, match="expected an aclnn status"):
        bsa.judge_status(case, "161002")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, status",
    [
        ("call aclnnX failed, detail: error code is 161001", 161001),
        ("aclnn status 561002: tiling failed", 561002),
        ("[PID: 161002] 2026-07-03-10:12:161002 rejected", None),  # a process id and a time are not statuses
        ("ret=161002.", 161002),
        ("ACLNN_ERR_PARAM_NULLPTR: softmaxLse is null", 161001),
        ("1610021 or 0.161002", None),
        ("nothing here", None),
    ],
)
def test_aclnn_status_finds_the_status_in_a_message(text: str, status: int | None) -> None:
    assert bsa.aclnn_status(text) == status


def test_every_public_name_resolves_and_unknown_names_are_attribute_errors() -> None:
    for name in bsa.__all__:
        assert getattr(bsa, name) is not None, name
    assert bsa.judge is bsa.api.judge and bsa.CaseResult is compare.CaseResult
    with pytest.raises(AttributeError, match="module 'bsa_cli' has no attribute 'jugde'"):
        bsa.jugde  # noqa: B018
