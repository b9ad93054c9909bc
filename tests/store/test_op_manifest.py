"""store.check_manifest and load_manifest on op folders: op, skip and the forward's parameters."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bsa_cli import store
from bsa_cli.core.errors import DataError
from bsa_cli.store.manifest import build_manifest, flat_params, output_entries
from tests.helpers import make_case


def op_manifest(op: str = "forward", **extra: Any) -> dict[str, Any]:
    case = make_case("c", ops=("forward", "backward", "chain"))
    document = build_manifest(case, {}, {}, {}, {}, op)  # type: ignore[arg-type]
    document.update(extra)
    return document


@pytest.mark.parametrize("op", ["forward", "chain", "autograd"])
def test_op_folders_are_accepted(op: str) -> None:
    store.check_manifest(op_manifest(op), "case.json")


def test_a_skipped_op_folder_is_accepted() -> None:
    document = op_manifest("forward", skip="the forward refuses it", outputs={})
    store.check_manifest(document, "case.json")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"op": "sideways"}, "op: 'sideways' is not one of forward, backward, chain, autograd"),
        ({"op": 3}, "op: 3 is not one of"),
        ({"op": "chain"}, "name 'c@forward' is the folder of the forward, but the manifest has op 'chain'"),
        ({"name": "c"}, "name 'c' is the folder of the backward, but the manifest has op 'forward'"),
        ({"skip": ""}, "skip: '' is not a non-empty string"),
        ({"skip": ["why"]}, "skip: ['why'] is not a non-empty string"),
        ({"skip": "why"}, "skip: a skipped op has no files, but outputs list some"),
    ],
)
def test_malformed_op_fields_are_refused(change: dict[str, Any], message: str) -> None:
    document = op_manifest()
    document.update(change)
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")):
        store.check_manifest(document, "case.json")


def test_a_backward_folder_named_as_an_op_folder_is_refused() -> None:
    document = op_manifest("backward")
    document["name"] = "c@chain"
    with pytest.raises(DataError, match="is the folder of the chain, but the manifest has no op"):
        store.check_manifest(document, "case.json")


@pytest.mark.parametrize("value", ["1", True, 1.0, 2**63])
def test_forward_parameters_must_be_integers(value: Any) -> None:
    document = copy.deepcopy(op_manifest())
    document["params"]["inner_precise"] = value
    with pytest.raises(DataError, match="params.inner_precise: .* is not a 64-bit integer"):
        store.check_manifest(document, "case.json")


def test_op_outputs_entries_follow_the_call_s_overrides() -> None:
    from bsa_cli.core.case import TensorOverride

    case = make_case("c", tensors=(TensorOverride("attention_out", null=True),))
    assert list(output_entries(case, "forward")) == ["lse"]
    assert list(output_entries(case, "chain")) == ["lse", "dq", "dk", "dv"]
    assert list(output_entries(case)) == ["dq", "dk", "dv"]


def test_case_txt_names_the_op_of_an_op_folder_only() -> None:
    assert flat_params(op_manifest("chain")).splitlines()[2] == "op chain"
    assert flat_params(op_manifest("backward")).splitlines()[2].startswith("layout ")
