"""The forward's interface rules (ops-transformer master 5778144), their order, the chain's status, and the
spec keys that choose ops (`ops`, `inner_precise`, `softmax_lse_flag`, `expect: {verdict, cause}`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from bsa_cli import ops
from bsa_cli.core.case import Case, Expect
from bsa_cli.core.errors import SpecError
from bsa_cli.ops import DEFAULT_OPS, OPS, forward_interface, interface
from bsa_cli.specs import load_specs
from bsa_cli.store import manifest
from tests.helpers import REPO

BASE: dict[str, Any] = {"name": "c", "num_heads": 2, "q_seq_len": 256, "head_dim": 128}
"""A valid case: BNSD fp16, B 1, N 2, S 256, D 128, blocks [128, 128]."""


def load(tmp_path: Path, cases: list[dict], override: tuple | None = None, **document: Any) -> list[Case]:
    """Load a spec of `cases` (and `defaults:`/`matrix:` from `document`), `override` as `--ops`."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**document, "cases": cases}, sort_keys=False))
    return load_specs([path], ops=override)


def one(tmp_path: Path, override: tuple | None = None, **fields: Any) -> Case:
    return load(tmp_path, [{**BASE, **fields}], override)[0]


def error(tmp_path: Path, override: tuple | None = None, **fields: Any) -> SpecError:
    with pytest.raises(SpecError) as caught:
        one(tmp_path, override, **fields)
    return caught.value


def forward_status(case: Case) -> tuple[int, str]:
    return forward_interface.check(forward_interface.case_params_forward(case), forward_interface.forward_tensors(case))


# ---- the negative suite: one rule per case, the status the rules give ---------------------------------------


NEGATIVE = load_specs([REPO / "cases" / "negative-forward.yaml"])


@pytest.mark.parametrize("case", NEGATIVE, ids=[c.name for c in NEGATIVE])
def test_every_negative_forward_case_gets_the_status_it_expects(case: Case) -> None:
    status, message = forward_status(case)
    assert case.ops == ("forward",)
    assert status == case.expect.status != 0, message
    assert case.op_expect == () and case.skipped_ops == ()


@pytest.mark.parametrize("case", NEGATIVE, ids=[c.name for c in NEGATIVE])
def test_the_case_name_says_which_part_of_the_forward_refuses_it(case: Case) -> None:
    stage = forward_interface.STAGES[case.expect.status]
    assert case.name.startswith({"aclnn": "fwd-", "infershape": "fwd-infer-", "tiling": "fwd-tiling-"}[stage])
    if stage == "aclnn":
        assert not case.name.startswith(("fwd-infer-", "fwd-tiling-"))


def test_each_negative_forward_case_breaks_its_own_rule() -> None:
    messages = [forward_status(case)[1] for case in NEGATIVE]
    assert len(set(messages)) == len(messages)


def test_manifest_params_give_the_forward_the_same_status() -> None:
    for case in NEGATIVE:
        params = {
            **manifest.params(case),
            "inner_precise": case.inner_precise,
            "softmax_lse_flag": case.softmax_lse_flag,
        }
        tensors = forward_interface.forward_tensors(case)
        assert forward_interface.check(params, tensors) == forward_status(case), case.name


def test_a_valid_forward_call_breaks_no_rule(tmp_path: Path) -> None:
    for fields in (
        {},
        {"dtype": "bf16"},
        {"inner_precise": 1},
        {"softmax_lse_flag": 0},
        {"head_dim": 64},
        {"num_heads": 4, "num_kv_heads": 2},
        {"block_shape": [64, 256]},
        {"layout": "TND", "q_seq_len": None, "batch": 2, "actual_seq_lengths": [100, 28]},
        {"actual_seq_lengths": [200], "actual_seq_lengths_kv": [256]},
        {"kv_seq_len": 384},
    ):
        case = one(tmp_path, override=("forward",), **fields)
        assert forward_status(case) == (0, ""), fields


# ---- the order: a call breaking two rules gets the first one's status ---------------------------------------

ORDER = [
    pytest.param(
        {"tensors": {"query": None}, "inner_precise": 2}, 161001, "query", id="null-query-before-inner-precise"
    ),
    pytest.param({"dtype": "float32", "null_layouts": ["q"]}, 161002, "query", id="dtype-before-null-layout"),
    pytest.param(
        {"null_layouts": ["q"], "block_shape": [128, 0]}, 161001, "layout", id="null-layout-before-block-shape"
    ),
    pytest.param(
        {"block_shape": [128, 0], "inner_precise": 2}, 161002, "block_shape", id="block-shape-before-inner-precise"
    ),
    pytest.param(
        {"inner_precise": 2, "tensors": {"attention_out": None}}, 161002, "inner_precise", id="inner-precise-before-out"
    ),
    pytest.param(
        {"tensors": {"attention_out": None, "block_sparse_mask": {"shape": [1, 2, 2]}}},
        161001,
        "attention_out",
        id="out-before-mask-rank",
    ),
    pytest.param(
        {"tensors": {"block_sparse_mask": {"shape": [1, 2, 2]}, "query": {"shape": [1, 2, 256]}}},
        161002,
        "block_sparse_mask",
        id="mask-rank-before-infershape",
    ),
    pytest.param(
        {"tensors": {"value": {"shape": [1, 2, 256, 64]}}, "inner_precise": 4},
        561103,
        "value",
        id="infershape-before-tiling",
    ),
    pytest.param({"inner_precise": 4, "head_dim": 32}, 561002, "inner_precise", id="attrs-before-head-dim"),
    pytest.param({"head_dim": 32, "block_shape": [128, 64]}, 561002, "head_dim", id="head-dim-before-block-y"),
    pytest.param(
        {"actual_seq_lengths": [100], "actual_seq_lengths_kv": None, "block_shape": [128, 64]},
        561002,
        "actual_seq_lengths",
        id="lengths-before-block-y",
    ),
    pytest.param(
        {"block_shape": [128, 64], "tensors": {"block_sparse_mask": {"shape": [1, 2, 2, 9]}}},
        561002,
        "block_shape",
        id="block-y-before-mask-shape",
    ),
    pytest.param(
        {"tensors": {"block_sparse_mask": {"shape": [1, 2, 2, 9]}, "atten_mask": {"dtype": "bool"}}},
        561002,
        "block_sparse_mask",
        id="mask-shape-before-atten-mask",
    ),
]


@pytest.mark.parametrize(("fields", "status", "key"), ORDER)
def test_the_first_broken_rule_decides(tmp_path: Path, fields: dict, status: int, key: str) -> None:
    case = one(tmp_path, override=("forward",), expect=status, **fields)
    found = forward_interface.violations(
        forward_interface.case_params_forward(case), forward_interface.forward_tensors(case)
    )
    assert (found[0].status, found[0].key) == (status, key)


def test_a_negative_case_breaking_two_rules_expects_the_first(tmp_path: Path) -> None:
    fields = {"ops": ["forward"], "head_dim": 32, "block_shape": [128, 64]}
    assert one(tmp_path, expect=561002, **fields).expect.status == 561002
    caught = error(tmp_path, expect=161002, **fields)
    assert "makes the operator return 561002" in caught.message and "head_dim" in caught.message


# ---- where the code differs from the earlier notes / the backward ----------------------------------------------------


def test_the_forward_differs_from_the_backward_where_its_code_does(tmp_path: Path) -> None:
    valid = one(tmp_path, override=("forward", "backward"), num_heads=1, kv_seq_len=1)

    def statuses(**fields: Any) -> tuple[int, int]:
        case = dataclasses.replace(valid, **fields)
        return ops.get("forward").status(case)[0], ops.get("backward").status(case)[0]

    assert statuses() == (0, 0)
    assert statuses(pre_tokens=1024) == (561002, 161002)  # the forward's tiling, the backward's aclnn
    assert statuses(mask_type=1) == (0, 161002)  # the forward never reads maskType
    assert statuses(layout="BSND", kv_layout="BSND") == (561002, 561002)  # aclnn passes BSND, A2/A3 refuses it
    tnd = {"layout": "TND", "actual_seq_lengths": (256,), "actual_seq_lengths_kv": None}
    assert statuses(**tnd) == (561002, 161002)  # TND without kv lengths: the forward's tiling, the backward's aclnn


def test_a_null_block_shape_passes_the_forward_as_128_by_128(tmp_path: Path) -> None:
    case = one(tmp_path, override=("forward", "backward"), block_shape=None, expect=161001)
    assert ops.get("forward").status(case) == (0, "")
    assert case.op_expect == (("forward", Expect()),)


def test_the_forward_gets_the_mask_as_int8_and_the_lengths_as_given(tmp_path: Path) -> None:
    case = one(tmp_path, override=("chain",), tensors={"block_sparse_mask": {"dtype": "bool"}})
    assert forward_interface.forward_tensors(case)["block_sparse_mask"]["dtype"] == "int8"
    assert case.tensor_descs()["block_sparse_mask"]["dtype"] == "bool"
    params = forward_interface.case_params_forward(case)
    assert forward_interface.call_lengths(params) == (None, None)
    assert interface.call_lengths({**params, "batch": 1}) == ([256], [256])


def test_manifest_tensors_name_the_forward_outputs() -> None:
    entries = {
        "query": {"dtype": "float16", "shape": [1, 2, 256, 128]},
        "out": {"dtype": "float16", "shape": [1, 2, 256, 128]},
        "lse": {"dtype": "float32", "shape": [1, 2, 256, 1]},
        "dq": {"dtype": "float16", "shape": [1, 2, 256, 128]},
    }
    assert forward_interface.manifest_tensors(entries) == {
        "query": {"dtype": "float16", "shape": (1, 2, 256, 128)},
        "attention_out": {"dtype": "float16", "shape": (1, 2, 256, 128)},
        "softmax_lse": {"dtype": "float32", "shape": (1, 2, 256, 1)},
    }


# ---- the chain: the forward's status, then the backward's ----------------------------------------------------


def test_the_chain_status_names_the_step_that_refuses(tmp_path: Path) -> None:
    case = one(tmp_path, override=("chain",), tensors={"block_sparse_mask": {"dtype": "int8"}}, expect=161002)
    status, message = ops.get("chain").status(case)
    assert status == 161002 and message.startswith("backward: block_sparse_mask")
    y64 = dataclasses.replace(case, block_shape=(128, 64))
    status, message = ops.get("chain").status(y64)
    assert status == 561002 and message.startswith("forward: block_shape")


def test_an_op_the_operator_refuses_is_skipped_with_why(tmp_path: Path) -> None:
    case = one(tmp_path, **{"ops": ["chain", "backward", "forward"], "block_shape": [128, 64]})
    assert case.ops == ("forward", "backward", "chain")
    assert case.skip_reason("backward") is None
    assert case.skip_reason("forward") == (
        "the A2/A3 forward refuses block_shape [128, 64]: Y % 128 != 0 (tiling, 561002); the backward accepts it"
    )
    assert "the chain's forward step refuses block_shape [128, 64]" in (case.skip_reason("chain") or "")
    assert case.expect_of("forward") == Expect()


def test_a_case_every_listed_op_refuses_is_an_error(tmp_path: Path) -> None:
    caught = error(tmp_path, **{"ops": ["forward", "chain"], "head_dim": 32})
    assert caught.key == "expect"
    assert "every listed op refuses the case; the forward returns 561002 (head_dim: D = 32" in caught.message
    assert "set 'expect: 561002'" in caught.message


def test_a_negative_case_judges_the_ops_that_accept_it(tmp_path: Path) -> None:
    case = one(
        tmp_path,
        **{
            "ops": ["forward", "backward", "chain"],
            "tensors": {"block_sparse_mask": {"dtype": "int8"}},
            "expect": 161002,
        },
    )
    assert case.op_expect == (("forward", Expect()),)
    assert case.expect_of("backward").status == case.expect_of("chain").status == 161002
    caught = error(
        tmp_path,
        **{"ops": ["forward", "backward"], "tensors": {"query": None}, "null_layouts": ["q"], "expect": 161002},
    )
    assert "for op forward 'query: query is null' makes the operator return 161001" in caught.message


def test_a_pair_verdict_leaves_the_single_ops_a_plain_expectation(tmp_path: Path) -> None:
    expect = {"verdict": "FAIL", "cause": "lse-unwritten"}
    case = one(tmp_path, **{"ops": ["forward", "backward", "chain"], "softmax_lse_flag": 0, "expect": expect})
    assert case.expect == Expect(verdict="FAIL", cause="lse-unwritten")
    assert case.expect_of("chain") == case.expect
    assert case.expect_of("forward") == case.expect_of("backward") == Expect()


# ---- spec keys ---------------------------------------------------------------------------------------------


def test_ops_are_stored_in_ops_order_from_a_case_defaults_or_a_matrix(tmp_path: Path) -> None:
    assert one(tmp_path, **{"ops": ["chain", "forward"]}).ops == ("forward", "chain")
    cases = load(tmp_path, [BASE], defaults={"ops": ["autograd", "backward"]})
    assert cases[0].ops == ("backward", "autograd")
    cases = load(tmp_path, [BASE], matrix={"ops": [["forward"], ["backward", "chain"]]})
    assert [(c.name, c.ops) for c in cases] == [
        ("c.forward", ("forward",)),
        ("c.backwardxchain", ("backward", "chain")),
    ]


@pytest.mark.parametrize(
    ("fields", "key", "text"),
    [
        ({"ops": "forward"}, "ops", "'forward' is not a list: write 'ops: [forward]'"),
        ({"ops": []}, "ops", "is not a non-empty list of ops; allowed: forward, backward, chain, autograd"),
        ({"ops": ["froward"]}, "ops", "'froward' is not an op (did you mean 'forward'?)"),
        ({"ops": ["chain", "chain"]}, "ops", "'chain' is listed twice"),
        ({"ops": ["forward"], "inner_precise": 3}, "inner_precise", "3 is not allowed; allowed: 0 (fp32 softmax"),
        ({"ops": ["forward"], "inner_precise": True}, "inner_precise", "True is not an integer"),
        ({"ops": ["forward"], "softmax_lse_flag": 2}, "softmax_lse_flag", "2 is not allowed; allowed: 1 (lse written"),
        ({"inner_precise": 1}, "inner_precise", "is the forward's parameter, but the case's ops are backward"),
        ({"softmax_lse_flag": 0}, "softmax_lse_flag", "is the forward's parameter, but the case's ops are backward"),
        ({"expect": {"verdict": "FAIL", "cause": "lse-unwritten"}}, "expect", "verdict and cause judge the pair"),
        ({"ops": ["chain"], "expect": {"verdict": "FAIL"}}, "expect.cause", "verdict FAIL needs the cause"),
        ({"ops": ["chain"], "expect": {"cause": "lse-unwritten"}}, "expect.cause", "is for 'verdict: FAIL' only"),
        ({"ops": ["chain"], "expect": {"verdict": "FAL", "cause": "x"}}, "expect.verdict", "(did you mean 'FAIL'?)"),
        ({"ops": ["chain"], "expect": {"verdict": "FAIL", "cause": "Lse Unwritten"}}, "expect.cause", "is not a cause"),
        ({"ops": ["chain"], "expect": {"verdit": "FAIL"}}, "expect.verdit", "unknown key (did you mean 'verdict'?)"),
        (
            {"ops": ["chain"], "expect": {"status": 161002, "verdict": "FAIL", "cause": "x"}},
            "expect.verdict",
            "FAIL with status 161002",
        ),
        ({"ops": ["chain"], "expect": {"status": "bad"}}, "expect.expect", "'bad' is not allowed"),
    ],
)
def test_spec_errors_name_the_key_the_value_and_what_is_allowed(
    tmp_path: Path, fields: dict, key: str, text: str
) -> None:
    caught = error(tmp_path, **fields)
    assert caught.key == key and text in caught.message, (caught.key, caught.message)


def test_a_negative_case_may_pass_other_forward_values(tmp_path: Path) -> None:
    case = one(tmp_path, **{"ops": ["forward"], "inner_precise": 7, "expect": 161002})
    assert case.inner_precise == 7
    case = one(tmp_path, **{"ops": ["forward"], "softmax_lse_flag": -1, "expect": 561002})
    assert case.softmax_lse_flag == -1


def test_the_expect_mapping_takes_a_status(tmp_path: Path) -> None:
    case = one(tmp_path, **{"ops": ["chain"], "head_dim": 32, "expect": {"status": "ACLNN_ERR_INNER_TILING_ERROR"}})
    assert case.expect == Expect(status=561002, name="ACLNN_ERR_INNER_TILING_ERROR")


def test_the_ops_override_replaces_the_spec_and_forgives_keys_it_leaves(tmp_path: Path) -> None:
    fields = {"ops": ["chain"], "inner_precise": 1, "expect": {"verdict": "FAIL", "cause": "lse-unwritten"}}
    case = one(tmp_path, override=("backward",), **fields)
    assert case.ops == ("backward",) and case.inner_precise == 0
    assert case.expect_of("backward") == Expect()
    case = one(tmp_path, override=("forward", "chain"), **fields)
    assert case.ops == ("forward", "chain") and case.inner_precise == 1
    assert case.expect_of("forward") == Expect() and case.expect_of("chain").cause == "lse-unwritten"


def test_backward_only_cases_build_exactly_as_before() -> None:
    """Every shipped case file builds the same Cases with no ops, with `--ops backward`, and with the
    fields new to issue 21 at their defaults (so every existing case folder keeps its bytes)."""
    for path in sorted((REPO / "cases").glob("*.yaml")):
        if path.name in ("chain.yaml", "negative-forward.yaml", "forward-edge.yaml"):  # their cases list ops
            continue
        cases = load_specs([path])
        assert cases == load_specs([path], ops=("backward",)), path.name
        for case in cases:
            assert case.ops == DEFAULT_OPS and case.op_expect == () and case.skipped_ops == ()
            assert (case.inner_precise, case.softmax_lse_flag) == (0, 1)
            assert case.expect.verdict == "PASS" and case.expect.cause is None


# ---- cases/chain.yaml: the pitfalls as named cases ---------------------------------------------------------


CHAIN = {case.name: case for case in load_specs([REPO / "cases" / "chain.yaml"])}


def test_chain_yaml_names_each_pitfall_with_its_verdict() -> None:
    assert CHAIN["chain-lse-flag-0"].expect == Expect(verdict="FAIL", cause="lse-unwritten")
    assert CHAIN["chain-lse-flag-0"].softmax_lse_flag == 0
    assert CHAIN["chain-bnsd-padding-rows-read"].expect == Expect(verdict="FAIL", cause="padding-rows-read")
    assert CHAIN["chain-bnsd-padding-rows-read"].bnsd_lengths == "ignored"
    assert CHAIN["chain-mask-int8-into-backward"].expect.status == 161002
    assert ops.get("chain").status(CHAIN["chain-mask-int8-into-backward"])[1].startswith("backward: ")
    assert CHAIN["chain-rows-without-blocks"].expect == Expect()
    assert CHAIN["chain-inner-precise-1-fp16"].inner_precise == 1
    assert CHAIN["chain-inner-precise-1-fp16"].expect == Expect()
    y64 = CHAIN["chain-y64-backward-only"]
    assert y64.ops == ("forward", "backward", "chain")
    assert [op for op, _ in y64.skipped_ops] == ["forward", "chain"]
    assert CHAIN["chain-plain"].ops == ("chain",) and CHAIN["chain-plain"].expect == Expect()


def test_chain_yaml_builds_with_every_op() -> None:
    cases = load_specs([REPO / "cases" / "chain.yaml"], ops=OPS)
    by_name = {case.name: case for case in cases}
    assert by_name["chain-lse-flag-0"].expect_of("forward") == Expect()
    assert by_name["chain-lse-flag-0"].expect_of("autograd").cause == "lse-unwritten"
    assert by_name["chain-scale-forward-default"].expect_of("chain").cause == "scale-mismatch"
    assert by_name["chain-scale-forward-default"].expect_of("autograd") == Expect()  # one scale for both steps
    alone = load_specs([REPO / "cases" / "chain.yaml"], ops=(ops.get("autograd"),))  # `--ops autograd`
    assert next(c for c in alone if c.name == "chain-scale-forward-default").expect_of("autograd") == Expect()
    assert [op for op, _ in by_name["chain-y64-backward-only"].skipped_ops] == ["forward", "chain", "autograd"]
    assert by_name["chain-y64-backward-only"].skip_reason("autograd").startswith("autograd's forward step refuses")


def test_warnings_belong_to_the_ops_whose_kernel_parts_ways_with_the_golden(tmp_path: Path) -> None:
    lengths = {"actual_seq_lengths": [200], "actual_seq_lengths_kv": [200]}
    forward_only = one(tmp_path, **{"ops": ["forward"], **lengths})
    assert forward_only.warnings == ()  # the forward honours the lengths, as the golden does
    pair = one(tmp_path, **{"ops": ["forward", "backward"], **lengths})
    assert ["the A2/A3 kernel ignores BNSD lengths" in w for w in pair.warnings] == [True]
    ignored = one(tmp_path, **{"ops": ["forward"], "bnsd_lengths": "ignored", **lengths})
    assert [w.split(":")[0] for w in ignored.warnings] == ["forward"]
    assert "attends only to each entry's first keys" in ignored.warnings[0]


def test_a_backward_refusal_names_the_backward_and_the_op_that_accepts(tmp_path: Path) -> None:
    case = one(tmp_path, **{"ops": ["forward", "backward"], "mask_type": 1})
    assert case.skipped_ops == (
        ("backward", "the backward refuses mask_type 1: only 0 is supported (aclnn, 161002); the forward accepts it"),
    )
    assert ops.get("forward").refusal(case) is None
