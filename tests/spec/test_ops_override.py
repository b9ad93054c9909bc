"""`--ops` on a suite written for other ops: each case is judged for the ops that accept it, and the ops
that refuse it (or that have no status to expect) are skipped with why, never a spec error."""

from __future__ import annotations

import pytest

from bsa_cli.specs import load_specs
from tests.helpers import CASES


def test_every_asked_op_refusing_a_valid_case_is_skipped_with_why() -> None:
    cases = {c.name: c for c in load_specs([CASES / "chain.yaml"], ops=("autograd",))}
    y64 = cases["chain-y64-backward-only"]
    assert y64.ops == ("autograd",)
    (op, why), *rest = y64.skipped_ops
    assert op == "autograd" and not rest
    assert "Y % 128" in why and "561002" in why and "--ops" in why
    assert not cases["chain-plain"].skipped_ops  # a case autograd accepts is judged


def test_without_the_override_the_same_refusal_is_a_spec_error(tmp_path) -> None:
    spec = tmp_path / "y64.yaml"
    spec.write_text(
        "cases:\n  - name: y64\n    ops: [forward]\n    block_shape: [128, 64]\n"
        "    batch: 1\n    num_heads: 1\n    head_dim: 128\n    dtype: fp16\n    q_seq_len: 256\n"
    )
    with pytest.raises(Exception, match="refuses|561002"):
        load_specs([spec])


@pytest.mark.parametrize("ops", [("backward",), ("forward",), ("forward", "backward", "chain", "autograd")])
def test_negative_suites_load_under_any_ops(ops) -> None:
    for name in ("negative.yaml", "negative-forward.yaml", "negative-9.0.yaml"):
        cases = load_specs([CASES / name], ops=ops)
        for case in cases:
            for op in case.ops:
                expected = case.expect_of(op)
                reason = case.skip_reason(op)
                assert reason is not None or expected.status == case.expect.status or expected.ok, (case.name, op)


def test_backward_override_keeps_backward_suites_exactly() -> None:
    for name in ("smoke.yaml", "edge.yaml", "negative.yaml"):
        assert load_specs([CASES / name], ops=("backward",)) == load_specs([CASES / name])
