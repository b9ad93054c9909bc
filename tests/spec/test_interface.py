"""The interface rules of ops-transformer master: every status, the order of the checks, the warnings."""

from __future__ import annotations

import dataclasses
import math

import pytest

from bsa_cli.core.case import Case, TensorOverride
from bsa_cli.devices.reference import check_interface
from bsa_cli.ops import interface
from bsa_cli.specs import load_specs
from bsa_cli.store import manifest
from tests.helpers import REPO, case_factory

make_case = case_factory(
    name="t",
    source="test",
    batch=2,
    head_dim=64,
    q_seq_len=128,
    kv_seq_len=128,
    block_shape=(64, 64),
    scale=1 / math.sqrt(64),
    seed=0,
)


def tnd(**overrides) -> dict:
    return {
        "layout": "TND",
        "batch": 2,
        "actual_seq_lengths": (100, 28),
        "actual_seq_lengths_kv": (64, 64),
        **overrides,
    }


def null(*names: str) -> tuple[TensorOverride, ...]:
    return tuple(TensorOverride(n, null=True) for n in names)


def dtype(name: str, value: str) -> tuple[TensorOverride, ...]:
    return (TensorOverride(name, dtype=value),)


def shape(name: str, *dims: int) -> tuple[TensorOverride, ...]:
    return (TensorOverride(name, shape=dims),)


def status_of(case: Case) -> tuple[int, str]:
    return interface.check(manifest.params(case), case.tensor_descs())


VALID = [
    pytest.param({}, id="bnsd-mha"),
    pytest.param({"dtype": "bfloat16"}, id="bf16"),
    pytest.param({"num_heads": 8, "num_kv_heads": 2, "head_dim": 256}, id="gqa-d256"),
    pytest.param(tnd(), id="tnd"),
    pytest.param(tnd(actual_seq_lengths=(0, 28)), id="tnd-zero-length-first"),
    pytest.param({"block_shape": (16, 48)}, id="block-16x48"),
    pytest.param({"block_shape": (7, 1)}, id="block-7x1-no-alignment-rule"),
    pytest.param({"block_shape": (64, 64, 64)}, id="block-three-values"),
    pytest.param({"tensors": dtype("block_sparse_mask", "bool")}, id="bool-mask"),
    pytest.param({"tensors": shape("block_sparse_mask", 1, 1, 1, 1)}, id="mask-shape-unchecked"),
    pytest.param(
        {
            "tensors": shape("value", 2, 2, 128, 32)
            + shape("attention_out", 2, 2, 128, 32)
            + shape("dout", 2, 2, 128, 32)
            + shape("dv", 2, 2, 128, 32)
        },
        id="v-d-differs-from-q",
    ),
    pytest.param({"tensors": shape("key", 2, 2, 99, 64)}, id="kv-seq-unchecked"),
    pytest.param({**tnd(), "tensors": shape("key", 7, 2, 64)}, id="tnd-dim0-unchecked"),
    pytest.param({"tensors": shape("softmax_lse", 2, 1)}, id="lse-rest-unchecked"),
]

# (case fields, status, key of the deciding rule): one rule of master's ValidateParams or tiling each.
BROKEN = [
    # null mandatory tensors: 161001
    *[pytest.param({"tensors": null(n)}, 161001, n, id=f"null-{n}") for n in interface.MANDATORY],
    # dtypes: 161002
    pytest.param({"dtype": "float32"}, 161002, "query", id="query-float32"),
    pytest.param({"tensors": dtype("query", "bfloat16")}, 161002, "key", id="query-bf16-others-fp16"),
    *[
        pytest.param({"tensors": dtype(n, "bfloat16")}, 161002, n, id=f"{n}-dtype")
        for n in ("key", "value", "attention_out", "dout", "dq", "dk", "dv")
    ],
    pytest.param({"tensors": dtype("softmax_lse", "float16")}, 161002, "softmax_lse", id="lse-float16"),
    pytest.param({"tensors": dtype("block_sparse_mask", "int8")}, 161002, "block_sparse_mask", id="mask-int8"),
    pytest.param({"tensors": dtype("block_sparse_mask", "float32")}, 161002, "block_sparse_mask", id="mask-f32"),
    # shapes: 161002
    *[
        pytest.param({"tensors": shape(n, *((3,) + s))}, 161002, n, id=f"bnsd-dim0-{n}")
        for n, s in (
            ("key", (2, 128, 64)),
            ("value", (2, 128, 64)),
            ("attention_out", (2, 128, 64)),
            ("dout", (2, 128, 64)),
            ("softmax_lse", (2, 128, 1)),
            ("dq", (2, 128, 64)),
            ("dk", (2, 128, 64)),
            ("dv", (2, 128, 64)),
        )
    ],
    pytest.param({"tensors": shape("key", 2, 2, 128, 32)}, 161002, "key", id="bnsd-d-q-k"),
    pytest.param({"tensors": shape("attention_out", 2, 2, 128, 32)}, 161002, "attention_out", id="bnsd-d-v-out"),
    pytest.param({"tensors": shape("dout", 2, 2, 128, 32)}, 161002, "dout", id="bnsd-d-v-dout"),
    pytest.param({"tensors": shape("dq", 2, 2, 128, 32)}, 161002, "dq", id="bnsd-d-q-dq"),
    pytest.param({"tensors": shape("dk", 2, 2, 128, 32)}, 161002, "dk", id="bnsd-d-k-dk"),
    pytest.param({"tensors": shape("dv", 2, 2, 128, 32)}, 161002, "dv", id="bnsd-d-v-dv"),
    *[
        pytest.param(
            {**tnd(), "tensors": shape(n, *((128 if n in ("attention_out", "dout", "dq") else 128), 2, 32))},
            161002,
            n,
            id=f"tnd-dim2-{n}",
        )
        for n in interface.TND_DIM2_TENSORS
    ],
    # attributes: 161002
    pytest.param({"tensors": dtype("atten_mask", "bool")}, 161002, "atten_mask", id="atten-mask-given"),
    pytest.param({"mask_type": 1}, 161002, "mask_type", id="mask-type"),
    pytest.param({"pre_tokens": 65536}, 161002, "pre_tokens", id="pre-tokens"),
    pytest.param({"next_tokens": 0}, 161002, "next_tokens", id="next-tokens"),
    # layouts and lengths: 161002 (TND without lengths is 161002 in the code, 161001 in the doc)
    pytest.param(tnd(actual_seq_lengths=None), 161002, "actual_seq_lengths", id="tnd-no-q-lengths"),
    pytest.param(tnd(actual_seq_lengths_kv=None), 161002, "actual_seq_lengths_kv", id="tnd-no-kv-lengths"),
    pytest.param({"kv_layout": "TND", "actual_seq_lengths_kv": (128, 128)}, 161002, "kv_layout", id="bnsd-with-tnd-kv"),
    pytest.param({"kv_layout": "BSND"}, 161002, "kv_layout", id="bnsd-with-bsnd-kv"),
    # block shape: null 161001, else 161002
    pytest.param({"block_shape": ()}, 161001, "block_shape", id="block-shape-null"),
    pytest.param({"block_shape": (64,)}, 161002, "block_shape", id="block-shape-one-value"),
    pytest.param({"block_shape": (0, 64)}, 161002, "block_shape", id="block-shape-zero"),
    pytest.param({"block_shape": (64, -16)}, 161002, "block_shape", id="block-shape-negative"),
    # the A2/A3 tiling: 561002
    pytest.param({"layout": "BSND", "kv_layout": "BSND"}, 561002, "layout", id="layout-bsnd-both"),
    pytest.param({"layout": "bnsd", "kv_layout": "bnsd"}, 561002, "layout", id="layout-lowercase"),
    pytest.param({"num_heads": 3, "num_kv_heads": 2}, 561002, "num_kv_heads", id="gqa-not-divisible"),
    pytest.param({"num_heads": 2, "num_kv_heads": 4}, 561002, "num_kv_heads", id="kv-heads-above-heads"),
    pytest.param(tnd(actual_seq_lengths=(0, 0)), 561002, "actual_seq_lengths", id="tnd-no-query-token"),
]


@pytest.mark.parametrize("fields", VALID)
def test_calls_master_accepts_return_success(fields):
    assert status_of(make_case(**fields)) == (0, "")


@pytest.mark.parametrize(("fields", "status", "key"), BROKEN)
def test_each_rule_returns_masters_status(fields, status, key):
    case = make_case(**fields)
    found, message = status_of(case)
    assert (found, message.split(":")[0]) == (status, key)


@pytest.mark.parametrize(
    ("fields", "status", "key"),
    [
        # blockShape is parsed last: a null blockShape loses to every 161002 before it
        pytest.param({"block_shape": (), "mask_type": 1}, 161002, "mask_type", id="mask-type-before-null-block"),
        pytest.param(
            {**tnd(actual_seq_lengths=None), "block_shape": ()},
            161002,
            "actual_seq_lengths",
            id="tnd-lengths-before-null-block",
        ),
        # null tensors come first of all
        pytest.param(
            {"dtype": "float32", "tensors": null("softmax_lse")}, 161001, "softmax_lse", id="null-before-dtype"
        ),
        pytest.param(
            {"layout": "BSND", "kv_layout": "BSND", "tensors": null("block_sparse_mask")},
            161001,
            "block_sparse_mask",
            id="null-before-tiling",
        ),
        # dtypes before shapes before attributes before layouts
        pytest.param(
            {"tensors": dtype("softmax_lse", "float16") + shape("key", 3, 2, 128, 64)},
            161002,
            "softmax_lse",
            id="dtype-before-shape",
        ),
        pytest.param(
            {"mask_type": 1, "tensors": shape("dv", 2, 2, 128, 32)}, 161002, "dv", id="shape-before-mask-type"
        ),
        pytest.param({"kv_layout": "TND", "next_tokens": 0}, 161002, "next_tokens", id="tokens-before-layouts"),
        pytest.param(
            {"tensors": dtype("atten_mask", "bool"), "mask_type": 1},
            161002,
            "atten_mask",
            id="atten-mask-before-mask-type",
        ),
        # the tiling only runs after every aclnn check passed
        pytest.param(
            {"num_heads": 3, "num_kv_heads": 2, "block_shape": ()}, 161001, "block_shape", id="null-block-before-tiling"
        ),
        pytest.param(
            {"layout": "BSND", "kv_layout": "BSND", "pre_tokens": 1},
            161002,
            "pre_tokens",
            id="tokens-before-unknown-layout",
        ),
    ],
)
def test_the_first_broken_rule_in_masters_order_decides(fields, status, key):
    found, message = status_of(make_case(**fields))
    assert (found, message.split(":")[0]) == (status, key)


def test_the_reference_device_reads_the_same_rules_from_a_manifest():
    case = make_case(tensors=dtype("block_sparse_mask", "int8"))
    tensors = {name: {"dtype": d["dtype"], "shape": list(d["shape"])} for name, d in case.tensor_descs().items()}
    outputs = ("dq", "dk", "dv")
    document = {
        "params": manifest.params(case),
        "inputs": {k: v for k, v in tensors.items() if k not in outputs},
        "outputs": {k: tensors[k] for k in outputs},
    }
    assert check_interface(document["params"], manifest.call_tensors(document))[0] == 161002


def test_null_outputs_and_short_ranks_are_undefined_behaviour_not_statuses():
    params = manifest.params(make_case())
    descs = make_case().tensor_descs()
    descs.pop("dq")
    assert interface.undefined_behaviour(params, descs) == ["dq is null: master reads its dtype without a null check"]
    short = make_case(tensors=shape("key", 2, 2, 128)).tensor_descs()
    assert "key has rank 3" in interface.undefined_behaviour(params, short)[0]


def test_bnsd_without_lengths_passes_s_for_every_batch():
    params = manifest.params(make_case(batch=3, q_seq_len=200, kv_seq_len=72))
    assert params["actual_seq_lengths"] is None
    assert interface.call_lengths(params) == ([200, 200, 200], [72, 72, 72])
    given = manifest.params(make_case(actual_seq_lengths=(5, 6), actual_seq_lengths_kv=(7, 8)))
    assert interface.call_lengths(given) == ([5, 6], [7, 8])
    assert interface.call_lengths(manifest.params(make_case(**tnd()))) == ([100, 28], [64, 64])


@pytest.mark.parametrize("fields", VALID)
def test_shapes_the_kernel_accepts_get_no_warning(fields):
    case = make_case(**fields)
    assert interface.kernel_constraints(interface.case_params(case), case.bnsd_lengths) == []


def test_honoured_bnsd_lengths_warn_that_the_kernel_computes_over_all_s():
    case = make_case(actual_seq_lengths=(128, 65), actual_seq_lengths_kv=(128, 65))
    (note,) = interface.kernel_constraints(interface.case_params(case), case.bnsd_lengths)
    assert "ignores BNSD lengths" in note
    ignored = dataclasses.replace(case, bnsd_lengths="ignored")
    assert interface.kernel_constraints(interface.case_params(ignored), ignored.bnsd_lengths) == []


SUITES = sorted((REPO / "cases").glob("*.yaml"))


@pytest.mark.parametrize("suite", SUITES, ids=[s.stem for s in SUITES])
def test_a_cases_call_reads_as_its_manifest_records_it(suite):
    """The spec judges a case by `interface.case_params`; the reference device, by the manifest's `params`."""
    for case in load_specs([suite]):
        params = interface.case_params(case)
        recorded = manifest.params(case)
        assert params == {key: recorded[key] for key in params}, case.name


def test_cumulative_lengths_and_a_null_block_shape_read_as_the_manifest_records_them():
    cumulative = make_case(
        actual_seq_lengths=(3, 0, 5),
        actual_seq_lengths_kv=(2, 2, 2),
        batch=3,
        seq_lengths_encoding="cumulative",
        block_shape=(),
        null_layouts=("kv",),
    )
    assert interface.case_params(cumulative) == {
        key: manifest.params(cumulative)[key] for key in interface.case_params(cumulative)
    }


def test_the_manifest_records_the_rule_set_and_both_scales():
    case = make_case(scale=0.1)
    assert manifest.semantics(case)["interface"] == interface.RULES
    params = manifest.params(case)
    assert params["scale"] == 0.1
    assert params["kernel_scale"] == 0.10000000149011612 != 0.1
