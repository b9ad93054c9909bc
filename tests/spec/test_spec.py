"""Case specs: defaults, matrix expansion, validation messages, interface rules and kernel warnings."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from bsa_cli.core.errors import SpecError
from bsa_cli.specs import load_specs
from tests.helpers import REPO


def write_spec(tmp_path: Path, document: object, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


BASE = {"name": "c", "num_heads": 2, "q_seq_len": 256, "head_dim": 128}


def load_one(tmp_path: Path, **fields: object):
    cases = load_specs([write_spec(tmp_path, {"cases": [{**BASE, **fields}]})])
    assert len(cases) == 1
    return cases[0]


def spec_error(tmp_path: Path, document: object) -> str:
    with pytest.raises(SpecError) as info:
        load_specs([write_spec(tmp_path, document)])
    return str(info.value)


def test_defaults_fill_a_minimal_case(tmp_path: Path) -> None:
    case = load_one(tmp_path)
    assert case.layout == "BNSD" and case.dtype == "float16"
    assert case.num_kv_heads == 2 and case.kv_seq_len == 256 and case.block_shape == (128, 128)
    assert case.scale == pytest.approx(1 / math.sqrt(128))
    assert case.q_shape == (1, 2, 256, 128) and case.mask_shape == (1, 2, 2, 2)
    assert case.expect.ok and case.warnings == ()


def test_dtype_aliases(tmp_path: Path) -> None:
    assert load_one(tmp_path, dtype="bf16").dtype == "bfloat16"
    assert load_one(tmp_path, dtype="fp16").dtype == "float16"


def test_file_defaults_merge_into_nested_mappings(tmp_path: Path) -> None:
    doc = {
        "defaults": {"dtype": "bf16", "sparsity": {"pattern": "random", "density": 0.3}},
        "cases": [{**BASE, "sparsity": {"density": 0.9}}],
    }
    (case,) = load_specs([write_spec(tmp_path, doc)])
    assert case.dtype == "bfloat16"
    assert case.sparsity.pattern == "random" and case.sparsity.density == 0.9


def test_matrix_expands_cartesian_product_with_readable_unique_names(tmp_path: Path) -> None:
    doc = {
        "cases": [
            {
                **BASE,
                "matrix": {"dtype": ["fp16", "bf16"], "block_shape": [[16, 48], [80, 32]], "sparsity.density": [0.25]},
                "sparsity": {"pattern": "random"},
            }
        ]
    }
    cases = load_specs([write_spec(tmp_path, doc)])
    assert [c.name for c in cases] == [
        "c.fp16.16x48.0p25",
        "c.fp16.80x32.0p25",
        "c.bf16.16x48.0p25",
        "c.bf16.80x32.0p25",
    ]
    assert cases[1].block_shape == (80, 32) and cases[2].dtype == "bfloat16"
    assert all(c.sparsity.density == 0.25 for c in cases)


def test_top_level_matrix_applies_to_every_case(tmp_path: Path) -> None:
    doc = {"matrix": {"dtype": ["fp16", "bf16"]}, "cases": [BASE, {**BASE, "name": "d"}]}
    assert [c.name for c in load_specs([write_spec(tmp_path, doc)])] == ["c.fp16", "c.bf16", "d.fp16", "d.bf16"]


def test_misspelt_key_names_file_case_key_and_suggestion(tmp_path: Path) -> None:
    message = spec_error(tmp_path, {"cases": [{**BASE, "num_head": 4}]})
    assert message.startswith(
        f"{tmp_path / 'spec.yaml'}: case 'c': key 'num_head': unknown key (did you mean 'num_heads'?)"
    )


def test_misspelt_nested_key_is_named_with_its_path(tmp_path: Path) -> None:
    message = spec_error(tmp_path, {"cases": [{**BASE, "sparsity": {"pattern": "random", "densty": 0.2}}]})
    assert "key 'sparsity.densty'" in message and "did you mean 'density'" in message


def test_bad_pattern_lists_allowed_values(tmp_path: Path) -> None:
    message = spec_error(tmp_path, {"cases": [{**BASE, "sparsity": {"pattern": "casual"}}]})
    assert "key 'sparsity.pattern': 'casual' is not allowed (did you mean 'causal'?)" in message
    assert "sliding_window" in message


def test_bad_dtype_without_expect_is_an_error_naming_the_status(tmp_path: Path) -> None:
    message = spec_error(tmp_path, {"cases": [{**BASE, "dtype": "float32"}]})
    assert "key 'dtype'" in message and "161002" in message and "expect" in message


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"layout": "BSND"}, "layout"),
        ({"kv_layout": "TND"}, "actual_seq_lengths_kv"),  # master checks kv TND lengths before the layout mix
        ({"kv_layout": "BSND"}, "kv_layout"),
        ({"tensors": {"block_sparse_mask": {"dtype": "int8"}}}, "tensors.block_sparse_mask"),
        ({"tensors": {"softmax_lse": None}}, "tensors.softmax_lse"),
        ({"mask_type": 1}, "mask_type"),
        ({"pre_tokens": 10}, "pre_tokens"),
        ({"next_tokens": 0}, "next_tokens"),
    ],
)
def test_interface_violation_without_expect_is_refused(tmp_path: Path, fields: dict, key: str) -> None:
    assert f"key '{key}'" in spec_error(tmp_path, {"cases": [{**BASE, **fields}]})


def test_negative_case_with_matching_expect_is_accepted(tmp_path: Path) -> None:
    case = load_one(tmp_path, num_kv_heads=3, expect="ACLNN_ERR_INNER_TILING_ERROR")
    assert case.expect.status == 561002 and not case.expect.ok
    case = load_one(tmp_path, layout="TND", expect=161002)
    assert case.expect.name == "ACLNN_ERR_PARAM_INVALID"
    case = load_one(tmp_path, tensors={"softmax_lse": None}, expect=161001)
    assert case.expect.name == "ACLNN_ERR_PARAM_NULLPTR" and case.tensor_descs().get("softmax_lse") is None


def test_tensors_key_expresses_null_dtype_and_shape_overrides(tmp_path: Path) -> None:
    case = load_one(tmp_path, tensors={"block_sparse_mask": {"dtype": "bool"}})  # valid: aclnn takes bool
    assert case.expect.ok and case.tensor_descs()["block_sparse_mask"]["dtype"] == "bool"
    case = load_one(tmp_path, tensors={"key": {"shape": [2, 2, 256, 128]}}, expect=161002)
    assert case.tensor_descs()["key"]["shape"] == (2, 2, 256, 128)
    case = load_one(tmp_path, tensors={"atten_mask": {"dtype": "bool"}}, expect=161002)
    assert "atten_mask" in case.tensor_descs()


@pytest.mark.parametrize(
    ("tensors", "fragment"),
    [
        ({"keys": None}, "unknown tensor"),
        ({"key": {"dtype": "fp8"}}, "'fp8' is not allowed"),
        ({"key": {"shape": [1, -2]}}, "is not a list of non-negative integers"),
        ({"key": {"shape": [1 << 20, 1 << 20]}}, "holds over"),
        ({"key": {"size": 3}}, "unknown key"),
        ({"dq": None}, "undefined behaviour"),
        ({"key": {"shape": [1, 2, 256]}}, "undefined behaviour"),
        ({"atten_mask": None}, "null already"),
    ],
)
def test_bad_tensor_overrides_are_refused(tmp_path: Path, tensors: dict, fragment: str) -> None:
    assert fragment in spec_error(tmp_path, {"cases": [{**BASE, "tensors": tensors, "expect": 161002}]})


def test_expect_that_no_rule_explains_is_refused(tmp_path: Path) -> None:
    assert "breaks no interface rule" in spec_error(tmp_path, {"cases": [{**BASE, "expect": 161002}]})


def test_expect_with_the_wrong_code_is_refused(tmp_path: Path) -> None:
    message = spec_error(tmp_path, {"cases": [{**BASE, "layout": "TND", "expect": 161001}]})
    assert "makes the operator return 161002" in message


def test_shapes_the_current_kernel_accepts_get_no_warning(tmp_path: Path) -> None:
    case = load_one(tmp_path, head_dim=64, num_kv_heads=1, block_shape=[80, 40])
    assert case.warnings == ()
    fields = {k: v for k, v in BASE.items() if k != "q_seq_len"}
    (tnd,) = load_specs([write_spec(tmp_path, {"cases": [{**fields, "layout": "TND", "actual_seq_lengths": [7, 9]}]})])
    assert tnd.warnings == ()


def test_honoured_bnsd_lengths_shorter_than_s_warn(tmp_path: Path) -> None:
    case = load_one(tmp_path, batch=2, actual_seq_lengths=[256, 100])
    assert "ignores BNSD lengths" in " ".join(case.warnings)


def test_tnd_takes_batch_and_max_lengths_from_actual_lengths(tmp_path: Path) -> None:
    fields = {k: v for k, v in BASE.items() if k != "q_seq_len"}
    (case,) = load_specs(
        [write_spec(tmp_path, {"cases": [{**fields, "layout": "TND", "actual_seq_lengths": [0, 100, 37, 0]}]})]
    )
    assert case.batch == 4 and case.q_seq_len == 100 and case.actual_seq_lengths_kv == (0, 100, 37, 0)
    assert case.q_shape == (137, 2, 128) and case.lse_shape_dims == (137, 2, 1)


def test_tnd_refuses_q_seq_len(tmp_path: Path) -> None:
    message = spec_error(tmp_path, {"cases": [{**BASE, "layout": "TND", "actual_seq_lengths": [4]}]})
    assert "key 'q_seq_len': applies to BNSD only" in message


def test_lengths_must_match_batch_and_fit_the_sequence(tmp_path: Path) -> None:
    assert "has 1 entries, but batch is 2" in spec_error(
        tmp_path, {"cases": [{**BASE, "batch": 2, "actual_seq_lengths": [3]}]}
    )
    assert "exceeds the sequence dimension 256" in spec_error(
        tmp_path, {"cases": [{**BASE, "actual_seq_lengths": [300]}]}
    )


def test_duplicate_names_across_files_are_refused(tmp_path: Path) -> None:
    a = write_spec(tmp_path, {"cases": [BASE]}, "a.yaml")
    b = write_spec(tmp_path, {"cases": [BASE]}, "b.yaml")
    with pytest.raises(SpecError, match="duplicate case name"):
        load_specs([a, b])


def test_folder_loads_every_yaml_sorted(tmp_path: Path) -> None:
    write_spec(tmp_path, {"cases": [{**BASE, "name": "b"}]}, "2.yaml")
    write_spec(tmp_path, {"cases": [{**BASE, "name": "a"}]}, "1.yml")
    assert [c.name for c in load_specs([tmp_path])] == ["a", "b"]


def test_missing_file_and_bad_yaml_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such spec file"):
        load_specs([tmp_path / "nope.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases: [\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_specs([bad])


def test_explicit_mask_inline_and_npy(tmp_path: Path) -> None:
    case = load_one(tmp_path, sparsity={"pattern": "explicit", "mask": [[1, 0], [1, 1]]})
    assert case.sparsity.explicit.tolist() == [[True, False], [True, True]]
    np.save(tmp_path / "m.npy", np.ones((2, 2, 2), dtype=np.uint8))
    case = load_one(tmp_path, sparsity={"pattern": "explicit", "mask": "m.npy"})
    assert case.sparsity.explicit.shape == (2, 2, 2) and case.sparsity.explicit_source == "m.npy"


def test_explicit_mask_of_wrong_shape_is_refused(tmp_path: Path) -> None:
    message = spec_error(tmp_path, {"cases": [{**BASE, "sparsity": {"pattern": "explicit", "mask": [[1, 0, 1]]}}]})
    assert "key 'sparsity.mask'" in message and "[1, 2, 2, 2]" in message


def test_init_overrides_per_tensor(tmp_path: Path) -> None:
    case = load_one(
        tmp_path, init={"distribution": "uniform", "low": -2, "high": 2, "dout": {"distribution": "normal", "std": 0.1}}
    )
    assert case.init.query.kind == "uniform" and case.init.query.low == -2
    assert case.init.dout.kind == "normal" and case.init.dout.std == 0.1


def test_empty_row_lse_accepts_inf_strings(tmp_path: Path) -> None:
    assert load_one(tmp_path, empty_row_lse="-inf").empty_row_lse == -math.inf
    assert load_one(tmp_path, empty_row_lse=0).empty_row_lse == 0.0


@pytest.mark.parametrize("suite", sorted((REPO / "cases").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_suites_are_valid(suite: Path) -> None:
    cases = load_specs([suite])
    assert cases
    if suite.name.startswith("negative"):
        assert all(not c.expect.ok for c in cases)
    elif suite.name == "chain.yaml":  # a pitfall of the pair is a status: the backward refuses an int8 mask
        assert [c.name for c in cases if not c.expect.ok] == ["chain-mask-int8-into-backward"]
    else:
        assert all(c.expect.ok for c in cases)


def test_only_the_doc_semantics_suite_holds_cases_the_a2_a3_target_fails_by_design() -> None:
    """A case whose golden follows the documentation where the A2/A3 code does otherwise (BNSD lengths
    honoured) warns; every such shipped case is in cases/doc-semantics.yaml, and every case there is one."""
    by_design = "the A2/A3 kernel ignores BNSD lengths"
    for suite in sorted((REPO / "cases").glob("*.yaml")):
        cases = load_specs([suite])
        failing = [c.name for c in cases if any(by_design in w for w in c.warnings)]
        if suite.name == "doc-semantics.yaml":
            assert failing == [c.name for c in cases]
        else:
            assert failing == [], suite.name


def test_the_readme_s_complete_spec_is_valid(tmp_path: Path) -> None:
    """README's first spec example is a whole spec `bsa validate` accepts as it stands (the reference after it
    lists every key and is not one spec)."""
    readme = (REPO / "README.md").read_text()
    intro = "A complete spec (`bsa validate` accepts it as it stands"
    assert intro in readme
    example = readme.split(intro, 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my.yaml").write_text(example)
    cases = load_specs([tmp_path / "my.yaml"])
    assert [c.name for c in cases] == ["my-case", "my-varlen"] and not [w for c in cases for w in c.warnings]
