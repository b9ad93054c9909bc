"""Spec reading: dtype names in every spelling, and errors of several cases reported together."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bsa_cli.core.errors import SpecError
from bsa_cli.specs import dtype_name, load_specs

BASE = {"name": "c", "num_heads": 2, "q_seq_len": 256, "head_dim": 128}


def load(tmp_path: Path, cases: list[dict], name: str = "spec.yaml") -> list:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"cases": cases}, sort_keys=False))
    return load_specs([path])


@pytest.mark.parametrize(
    ("spelling", "dtype"),
    [
        ("FP16", "float16"),
        ("half", "float16"),
        ("Half", "float16"),
        ("Float16", "float16"),
        ("fp16", "float16"),
        ("float16", "float16"),
        ("torch.float16", "float16"),
        (" FLOAT16 ", "float16"),
        ("BF16", "bfloat16"),
        ("bfloat16", "bfloat16"),
        ("bf16", "bfloat16"),
        ("BFloat16", "bfloat16"),
        ("torch.bfloat16", "bfloat16"),
        ("Float32", "float32"),
        ("FP32", "float32"),
        ("float", "float32"),
        ("double", "float64"),
        ("INT8", "int8"),
        ("Bool", "bool"),
        ("np.int64", "int64"),
    ],
)
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


def test_one_bad_case_gives_its_error_alone(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load(tmp_path, [{**BASE, "name": "a"}, {**BASE, "name": "b", "head_dim": "x"}])
    assert type(info.value) is SpecError
    assert str(info.value) == f"{tmp_path / 'spec.yaml'}: case 'b': key 'head_dim': 'x' is not an integer"


def test_every_bad_case_of_a_file_is_reported_in_order(tmp_path: Path) -> None:
    cases = [
        {**BASE, "name": "a", "dtype": "fp8"},
        {**BASE, "name": "ok"},
        {**BASE, "name": "b", "head_dim": "x", "num_heads": -1},
    ]
    with pytest.raises(SpecError) as info:
        load(tmp_path, cases)
    lines = str(info.value).splitlines()
    file = str(tmp_path / "spec.yaml")
    assert len(lines) == 2
    assert lines[0].startswith(f"{file}: case 'a': key 'dtype': 'fp8' is not allowed")
    assert lines[1].startswith(f"{file}: case 'b': key ")  # its first error only
    assert [e.case for e in info.value.errors] == ["a", "b"]  # type: ignore[attr-defined]


def test_bad_cases_of_two_files_are_reported_together(tmp_path: Path) -> None:
    first = tmp_path / "a.yaml"
    first.write_text(yaml.safe_dump({"cases": [{**BASE, "name": "x", "head_dim": "x"}]}))
    second = tmp_path / "b.yaml"
    second.write_text("cases: [unclosed\n")  # a file-level error: that file stops, the others are still read
    third = tmp_path / "c.yaml"
    third.write_text(yaml.safe_dump({"cases": [{**BASE, "name": "y", "dtype": "fp8"}, {**BASE, "name": "x"}]}))
    with pytest.raises(SpecError) as info:
        load_specs([tmp_path])
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"{first}: case 'x': key 'head_dim'")
    assert lines[1].startswith(f"{second}: not valid YAML")
    assert lines[2].startswith(f"{third}: case 'y': key 'dtype'")


def test_cli_validate_prints_every_bad_case_and_exits_2(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from bsa_cli.cli import main

    path = tmp_path / "spec.yaml"
    cases = [{**BASE, "name": "a", "dtype": "fp8"}, {**BASE, "name": "b", "head_dim": "x"}]
    path.write_text(yaml.safe_dump({"cases": cases}))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert "case 'a': key 'dtype'" in result.output and "case 'b': key 'head_dim'" in result.output
    lines = result.output.splitlines()
    assert len(lines) == 2 and all(line.startswith("Error: ") for line in lines)
    assert "Traceback" not in result.output


# ---- hints that point to the fix (issue 16, items 7 and 8) ----------------------------------------------


def validate(tmp_path: Path, case: dict) -> object:
    from click.testing import CliRunner

    from bsa_cli.cli import main

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"cases": [{**BASE, **case}]}, sort_keys=False))
    return CliRunner().invoke(main, ["validate", str(path)])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"layout": "bnsd"},
            "key 'layout': 'bnsd' is not a layout the operator knows (did you mean 'BNSD'? layout "
            "strings are upper case); for a negative case that tests this instead, set 'expect: 561002' (the operator "
            "returns 561002)",
        ),
        (
            {"layout": "TND"},
            "key 'actual_seq_lengths': is null, but a TND query needs it: add "
            "'actual_seq_lengths: [...]' to the case, one query length per batch entry (for example "
            "'actual_seq_lengths: [1000, 333]'); for a negative case that tests this instead, set 'expect: 161002' "
            "(the operator returns 161002)",
        ),
        ({"dtype": "float8"}, "key 'dtype': 'float8' is not allowed; allowed: float16 (fp16), bfloat16 (bf16)"),
        (
            {"dtype": "flaot16"},
            "key 'dtype': 'flaot16' is not allowed (did you mean 'float16'?); allowed: float16 (fp16), bfloat16 (bf16)",
        ),
        (
            {"sparsity": {"pattern": "causal", "density": 0.5}},
            "key 'sparsity.density': pattern 'causal' does not "
            "use it (density is for pattern random); remove it, or set pattern: random",
        ),
        (
            {"sparsity": {"pattern": "random", "window": 2}},
            "key 'sparsity.window': pattern 'random' does not use it "
            "(window is for pattern sliding_window or strided); remove it, or set pattern: sliding_window",
        ),
        (
            {"sparsity": {"pattern": "sliding_window", "stride": 3}},
            "key 'sparsity.stride': pattern "
            "'sliding_window' does not use it (stride is for pattern strided); remove it, or set pattern: strided",
        ),
        (
            {"sparsity": {"pattern": "random", "causal_alignment": "bottom_right"}},
            "key 'sparsity.causal_alignment': "
            "pattern 'random' does not use it (causal_alignment is for pattern causal or sliding_window or strided); "
            "remove it, or set pattern: causal",
        ),
        (
            {"sparsity": {"density": 0.3}},
            "key 'sparsity.density': pattern 'dense' does not use it (density is for "
            "pattern random); remove it, or set pattern: random",
        ),
        (
            {"sparsity": {"pattern": "causal", "per_head": False}},
            "key 'sparsity.per_head': pattern 'causal' does "
            "not use it (per_head is for pattern random); remove it, or set pattern: random",
        ),
        (
            {"sparsity": {"pattern": "random", "mask": [[1]]}},
            "key 'sparsity.mask': pattern 'random' does not use "
            "it (mask is for pattern explicit); remove it, or set pattern: explicit",
        ),
    ],
)
def test_a_hint_points_to_the_fix(tmp_path: Path, fields: dict, message: str) -> None:
    result = validate(tmp_path, fields)
    assert result.exit_code == 2
    assert result.stderr == f"Error: {tmp_path / 'spec.yaml'}: case 'c': {message}\n"


def test_keys_every_pattern_uses_and_a_negative_case_with_a_lower_case_layout_stay_valid(tmp_path: Path) -> None:
    assert (
        validate(
            tmp_path,
            {
                "sparsity": {
                    "pattern": "strided",
                    "window": 2,
                    "stride": 3,
                    "causal_alignment": "bottom_right",
                    "empty_rows": [0],
                }
            },
        ).exit_code
        == 0
    )
    assert validate(tmp_path, {"sparsity": {"pattern": "random", "density": 0.4, "per_head": False}}).exit_code == 0
    assert validate(tmp_path, {"layout": "bnsd", "expect": 561002}).exit_code == 0


def test_a_cases_compare_settings_are_checked_by_the_comparators_rules(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"key 'compare': unknown standard 'singel' \(did you mean 'single'\?\)"):
        load(tmp_path, [{**BASE, "compare": {"standard": "singel"}}])
    assert load(tmp_path, [{**BASE, "compare": {"standard": "single"}}])[0].compare == {"standard": "single"}
