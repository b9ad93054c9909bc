"""The golden of every case of cases/edge.yaml against independent oracles.

Two peers, written differently from bsa_cli/golden/: the dense float64 formula of docs/operator.md section 1
(tests/oracle.py, full element masks, from the rounded out and lse that `bsa gen` writes), and PyTorch
float64 autograd of masked attention (which knows nothing of block masks, out or lse: it differentiates
the forward itself, so the golden is fed the unrounded float64 forward for that comparison).
"""

from __future__ import annotations

import numpy as np
import pytest

from bsa_cli import golden
from bsa_cli.gen.generate import compute_case
from bsa_cli.gen.settings import GenSettings
from bsa_cli.inputs import make_mask, make_tensors
from bsa_cli.specs import load_specs
from tests import oracle
from tests.helpers import REPO

EDGE = load_specs([REPO / "cases" / "edge.yaml"])


def assert_close(actual: np.ndarray, expected: np.ndarray, rel: float, what: str) -> None:
    """Max-norm relative agreement: |a - e| <= rel * max|e| everywhere (and exact zeros where e is 0)."""
    scale = float(np.abs(expected).max()) or 1.0
    error = float(np.abs(actual.astype(np.float64) - expected).max()) if expected.size else 0.0
    assert error <= rel * scale, f"{what}: max abs error {error:.3g} > {rel:g} x {scale:.3g}"


@pytest.mark.parametrize("case", EDGE, ids=lambda c: c.name)
def test_gen_golden_matches_the_dense_float64_formula(case) -> None:
    tensors, gold, bench = compute_case(case, GenSettings("float64"))
    args = [tensors[n] for n in ("dout", "query", "key", "value", "attention_out", "softmax_lse", "block_sparse_mask")]
    expected = oracle.dense_backward(case, *args)
    out, lse = oracle.dense_forward(
        case, tensors["query"], tensors["key"], tensors["value"], tensors["block_sparse_mask"]
    )
    # Structural zeros: query rows that attend to nothing (out and dq rows 0), kv rows nobody selects
    # (dv rows 0), padding. Other exact zeros of the oracle (one selected key: dP == Dsum) are rounding luck.
    no_query = (expected[2] == 0).all(axis=-1)
    structural = {"dq": (out == 0).all(axis=-1), "dk": no_query, "dv": no_query}
    for name, want in zip(("dq", "dk", "dv"), expected, strict=True):
        assert_close(gold[name], want, 1e-10, f"{case.name} {name}")
        assert (gold[name][structural[name]] == 0).all(), f"{case.name} {name}: rows that take no part are not 0"
        assert np.isfinite(bench[name].astype(np.float32)).all(), f"{case.name} benchmark {name}"
    rounding = 2.0**-8 if case.dtype == "bfloat16" else 2.0**-11  # half an ulp, relative
    error = np.abs(tensors["attention_out"].astype(np.float64) - out)
    assert (error <= rounding * np.abs(out) + 2.0**-24).all(), f"{case.name}: attention_out is not out rounded"
    finite = np.isfinite(lse)
    got_lse = tensors["softmax_lse"].reshape(lse.shape)
    assert np.array_equal(got_lse[~finite], lse[~finite].astype(np.float32))
    np.testing.assert_allclose(got_lse[finite], lse[finite], rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # 40 s over the suite; the fast loop keeps the dense float64 oracle above
@pytest.mark.parametrize("case", EDGE, ids=lambda c: c.name)
def test_golden_matches_torch_autograd(case) -> None:
    tensors = make_tensors(case)
    mask = make_mask(case)
    out, lse = golden.forward(case, tensors["query"], tensors["key"], tensors["value"], mask)
    grads = golden.backward(
        case, tensors["dout"], tensors["query"], tensors["key"], tensors["value"], out, lse, mask, precision=np.float64
    )
    torch_out, *torch_grads = oracle.torch_backward(
        case, tensors["dout"], tensors["query"], tensors["key"], tensors["value"], mask
    )
    assert_close(out, torch_out, 1e-10, f"{case.name} out")
    for name, got, want in zip(("dq", "dk", "dv"), grads, torch_grads, strict=True):
        assert_close(got, want, 1e-9, f"{case.name} {name}")
