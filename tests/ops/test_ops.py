"""The ops as objects: one `Op` per operator call, its name everywhere a string goes, its attributes
everything that differs between ops."""

from __future__ import annotations

import json
import pickle

import pytest

from bsa_cli import ops
from bsa_cli.ops import base


@pytest.mark.parametrize("op", ops.OPS, ids=str)
def test_an_op_is_its_name_in_json_folders_and_pickles(op: ops.Op) -> None:
    assert ops.get(str(op)) is op and ops.get(op) is op
    assert json.loads(json.dumps({"op": op})) == {"op": str(op)}
    assert pickle.loads(pickle.dumps(op)) is op  # worker processes get the one op of that name
    assert ops.split_folder_name(op.folder("case-1")) == ("case-1", op)
    with pytest.raises(AttributeError):
        op.outputs = ()  # type: ignore[misc]


def test_what_each_op_writes_and_calls() -> None:
    assert [(str(op), op.outputs) for op in ops.OPS] == [
        ("forward", ("out", "lse")),
        ("backward", ("dq", "dk", "dv")),
        ("chain", ("out", "lse", "dq", "dk", "dv")),
        ("autograd", ("out", "lse", "dq", "dk", "dv")),
    ]
    assert [op for op in ops.OPS if op.pair] == [ops.get("chain"), ops.get("autograd")]
    assert all(op.pair == (op.calls_forward and op.calls_backward) for op in ops.OPS)
    assert [op.folder("x") for op in ops.OPS] == ["x@forward", "x", "x@chain", "x@autograd"]
    assert ops.DEFAULT_OPS == (ops.get("backward"),)


def test_folder_names_and_the_ops_option() -> None:
    assert ops.split_folder_name("a@b@forward") == ("a@b", ops.get("forward"))
    assert ops.split_folder_name("a@backward") == ("a@backward", ops.get("backward"))  # no such folder
    assert ops.split_folder_name("@chain") == ("@chain", ops.get("backward"))
    assert ops.parse_ops(" chain, forward ,chain") == (ops.get("forward"), ops.get("chain"))
    with pytest.raises(ValueError, match="sideways: ops are forward, backward, chain, autograd"):
        ops.parse_ops("forward,sideways")
    with pytest.raises(ValueError, match="ops are"):
        ops.get("sideways")


def test_a_new_op_is_one_object_the_folders_know() -> None:
    """Adding an op is a module defining one `Op`: its folder name is read back with no other change."""
    sidecar = ops.Op(
        "sidecar", inputs=("query",), outputs=("out",), calls_forward=True, calls_backward=False, summary="a planted op"
    )
    try:
        assert ops.get("sidecar") is sidecar
        assert ops.split_folder_name(sidecar.folder("c")) == ("c", sidecar)
    finally:
        del base._BY_NAME["sidecar"]
