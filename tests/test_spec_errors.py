"""Spec reading: dtype names in every spelling, and errors of several cases reported together."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bsa_cli.errors import SpecError
from bsa_cli.spec import dtype_name, load_specs

BASE = {"name": "c", "num_heads": 2, "q_seq_len": 256, "head_dim": 128}


def load(tmp_path: Path, cases: list[dict], name: str = "spec.yaml") -> list:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"cases": cases}, sort_keys=False))
    return load_specs([path])


@pytest.mark.parametrize(
    ("spelling", "dtype"),
    [
        ("FP16", "float16"), ("half", "float16"), ("Half", "float16"), ("Float16", "float16"),
        ("fp16", "float16"), ("float16", "float16"), ("torch.float16", "float16"), (" FLOAT16 ", "float16"),
        ("BF16", "bfloat16"), ("bfloat16", "bfloat16"), ("bf16", "bfloat16"), ("BFloat16", "bfloat16"),
        ("torch.bfloat16", "bfloat16"), ("Float32", "float32"), ("FP32", "float32"), ("float", "float32"),
        ("double", "float64"), ("INT8", "int8"), ("Bool", "bool"), ("np.int64", "int64"),
    ],
)  # fmt: skip
def test_dtype_names_are_read_case_insensitively(spelling: str, dtype: str) -> None:
    assert dtype_name(spelling) == dtype


@pytest.mark.parametrize("value", ["fp8", "float17", "", 16, None, True, ["fp16"]])
def test_values_that_name_no_dtype(value: object) -> None:
    assert dtype_name(value) is None


def test_case_dtype_and_tensor_override_accept_any_spelling(tmp_path: Path) -> None:
    case = load(tmp_path, [{**BASE, "dtype": "BF16"}])[0]
    assert case.dtype == "bfloat16"
    case = load(tmp_path, [{**BASE, "dtype": "Half"}])[0]
    assert case.dtype == "float16"
    case = load(tmp_path, [{**BASE, "tensors": {"block_sparse_mask": {"dtype": "BOOL"}}}])[0]
    assert case.tensor_descs()["block_sparse_mask"]["dtype"] == "bool"
    case = load(tmp_path, [{**BASE, "tensors": {"key": {"dtype": "Float32"}}, "expect": 161002}])[0]
    assert case.tensor_descs()["key"]["dtype"] == "float32"


@pytest.mark.parametrize(
    ("fields", "key", "hint"),
    [
        ({"dtype": "FLAOT16"}, "key 'dtype'", "did you mean 'float16'?"),
        ({"dtype": "bfloat61"}, "key 'dtype'", "did you mean 'bfloat16'?"),
        ({"tensors": {"key": {"dtype": "Flaot32"}}}, "tensors.key.dtype", "did you mean 'float32'?"),
    ],
)
def test_a_misspelt_dtype_gets_a_suggestion(tmp_path: Path, fields: dict, key: str, hint: str) -> None:
    with pytest.raises(SpecError) as info:
        load(tmp_path, [{**BASE, **fields}])
    assert key in str(info.value) and hint in str(info.value)
