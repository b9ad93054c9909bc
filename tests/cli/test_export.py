"""`bsa export --format msopst|atk`: case files parse back, point at the right .bin files, say what to expect."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from bsa_cli.cli import main
from bsa_cli.store import load_manifest, read_array
from tests.helpers import SPEC

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "uint8": 1, "int8": 1, "bool": 1}


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    spec = root / "tiny.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    result = CliRunner().invoke(main, ["gen", str(spec), "-o", str(root / "out")])
    assert result.exit_code == 0, result.output
    return root / "out"


def export(out: Path, fmt: str, target: Path) -> dict[str, object]:
    result = CliRunner().invoke(main, ["export", str(out), "--format", fmt, "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"exported 4 cases as {fmt} into {target}")
    return {p.name.split(f".{fmt}.json")[0]: json.loads(p.read_text()) for p in target.glob(f"*.{fmt}.json")}


def test_msopst_cases_point_at_the_inputs_and_expect_the_golden(out, tmp_path):
    cases = export(out, "msopst", tmp_path / "st")
    assert set(cases) == {"t-bnsd-tail", "t-tnd-gqa", "t-neg-dtype", "t-neg-tnd"}
    (case,) = cases["t-bnsd-tail"]
    manifest = load_manifest(out / "t-bnsd-tail")
    assert case["case_name"] == "t_bnsd_tail" and case["op"] == "BlockSparseAttentionGrad"
    assert [d["name"] for d in case["input_desc"]] == [
        "dout",
        "query",
        "key",
        "value",
        "attentionOut",
        "softmaxLse",
        "blockSparseMask",
    ]
    for desc in case["input_desc"]:
        path = Path(desc["value"])
        assert path.is_absolute() and path.is_file()
        assert path.stat().st_size == int(np.prod(desc["shape"])) * ITEMSIZE[desc["type"][0]]
    assert [d["name"] for d in case["output_desc"]] == ["dq", "dk", "dv"]
    attrs = {a["name"]: a["value"] for a in case["attr"]}
    params = manifest["params"]
    assert attrs["blockShape"] == [16, 16] and attrs["qInputLayout"] == "BNSD"
    assert attrs["actualSeqLengths"] == [params["q_seq_len"]] * params["batch"]  # BNSD passes [S] * B
    assert attrs["scaleValue"] == params["scale"] and attrs["numKeyValueHeads"] == 2
    assert case["expect"] == "success" and case["error_threshold"] == [0.01, 0.05]

    module_path, function = case["calc_expect_func_file"].rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("bsa_expect_test", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dq, dk, dv = getattr(module, function)()
    golden = read_array(out / "t-bnsd-tail", manifest["golden"]["dq"])
    assert dq.dtype == np.float16 and np.array_equal(dq, golden.astype(np.float16))
    assert dk.shape == tuple(manifest["outputs"]["dk"]["shape"]) and dv.dtype == np.float16

    (negative,) = cases["t-neg-dtype"]
    assert negative["expect"] == "failed" and "calc_expect_func_file" not in negative
    assert negative["input_desc"][1]["type"] == ["float32"]  # what the refused call passes


def test_atk_cases_name_their_bin_files_standard_and_seed(out, tmp_path):
    cases = export(out, "atk", tmp_path / "atk")
    case = cases["t-tnd-gqa"]
    manifest = load_manifest(out / "t-tnd-gqa")
    assert case["name"] == "t-tnd-gqa" and case["aclnn_name"] == "aclnnBlockSparseAttentionGrad"
    assert case["api_type"] == "aclnn" and case["default_seed"] == manifest["generator"]["seed"]
    limits = {"max_re_ratio": 10.0, "avg_re_ratio": 2.0, "root_mean_squared_ratio": 2.0}
    assert case["standard"] == {"acc": {"cv_fused_double_benchmark": limits}}
    tensors = [i for i in case["inputs"] if i["type"] == "tensor"]
    attrs = {i["name"]: i for i in case["inputs"] if i["type"] == "attr"}
    assert [t["name"] for t in tensors][:2] == ["dout", "query"]
    for item in tensors:
        names = {"attentionOut": "attention_out", "softmaxLse": "softmax_lse", "blockSparseMask": "block_sparse_mask"}
        entry = manifest["inputs"][names.get(item["name"], item["name"])]
        values = read_array(out / "t-tnd-gqa", entry).astype(np.float64)
        assert item["dtype"] == entry["dtype"] and item["shape"] == entry["shape"]
        assert Path(item["bin_file"]) == (out / "t-tnd-gqa" / entry["file"]).resolve()
        finite = values[np.isfinite(values)]
        assert item["range_values"][0] <= finite.min() + 1e-6 and finite.max() - 1e-6 <= item["range_values"][1]
    assert attrs["qInputLayout"]["value"] == "TND" and attrs["actualSeqLengths"]["value"] == [16, 0, 24]
    assert attrs["actualSeqLengths"]["dtype"] == "list_int" and attrs["scaleValue"]["dtype"] == "double"
    dq = case["outputs"][0]
    assert dq["name"] == "dq" and dq["dtype"] == "bfloat16" and Path(dq["golden_file"]).is_file()
    assert dq["golden_dtype"] == "float32"
    ids = sorted(c["id"] for c in cases.values())
    assert ids == [1, 2, 3, 4]
    assert cases["t-neg-tnd"]["expect"] == {"status": 161002, "name": "ACLNN_ERR_PARAM_INVALID"}


def test_export_refuses_a_folder_without_cases(tmp_path):
    result = CliRunner().invoke(main, ["export", str(tmp_path), "--format", "atk", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "no case directories" in result.stderr


def load_expect(case: dict) -> object:
    module_path, function = case["calc_expect_func_file"].rsplit(":", 1)
    spec = importlib.util.spec_from_file_location(f"bsa_expect_{function}", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def test_a_second_msopst_export_into_the_same_folder_keeps_the_first_working(out, tmp_path):
    """An earlier export's cases keep their expected outputs in the rewritten expect module (issue 16, item 10)."""
    target = tmp_path / "st"
    command = ["export", str(out), "--format", "msopst", "-o", str(target), "--filter"]
    first = CliRunner().invoke(main, [*command, "t-bnsd-*"])
    assert first.exit_code == 0 and first.stderr == ""
    second = CliRunner().invoke(main, [*command, "t-tnd-*"])
    assert second.exit_code == 0
    assert second.stderr == (
        f"kept 1 case of an earlier export in {target} working (t-bnsd-tail): "
        "bsa_msopst_expect.py holds their expected outputs too\n"
    )
    for name in ("t-bnsd-tail", "t-tnd-gqa"):
        (case,) = json.loads((target / f"{name}.msopst.json").read_text())
        dq, _, _ = load_expect(case)()
        manifest = load_manifest(out / name)
        assert np.array_equal(
            dq.view(np.uint16), read_array(out / name, manifest["golden"]["dq"]).astype(dq.dtype).view(np.uint16)
        )


def test_an_earlier_msopst_case_whose_folder_is_gone_is_named(out, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    target = tmp_path / "st"
    assert (
        CliRunner()
        .invoke(main, ["export", str(copy), "--format", "msopst", "-o", str(target), "--filter", "t-bnsd-*"])
        .exit_code
        == 0
    )
    shutil.rmtree(copy / "t-bnsd-tail")
    result = CliRunner().invoke(
        main, ["export", str(out), "--format", "msopst", "-o", str(target), "--filter", "t-tnd-*"]
    )
    assert result.exit_code == 0
    assert result.stderr.startswith(f"Warning: {target / 't-bnsd-tail.msopst.json'}: its case cannot be read (")
    assert "its expected outputs are left out of bsa_msopst_expect.py: export that case again" in result.stderr
