"""What makes the diagnosis cheap must not change what it computes: the inputs converted block by block
(compare/diagnose/views.py), the products and blocks kept and shared (read-only), and the score of a
hypothesis estimated on sampled rows (scoring.Blocks.weights_of)."""

from __future__ import annotations

import numpy as np
import pytest

from bsa_cli import api, compare
from bsa_cli.compare.diagnose.hypotheses import NULL, VARIANTS, Context, Target, recompute
from bsa_cli.compare.diagnose.scoring import gather_blocks
from bsa_cli.compare.diagnose.views import InputRows
from bsa_cli.core.layout import kv_view, lse_view, q_view
from bsa_cli.devices import reference
from bsa_cli.gen.generate import generate_case
from bsa_cli.specs import load_specs

SPECS = """
defaults: {head_dim: 64, seed: 11, block_shape: [128, 128]}
cases:
  - {name: gqa, dtype: fp16, num_heads: 4, num_kv_heads: 2, q_seq_len: 512, sparsity: {pattern: random, density: 0.6}}
  - {name: tnd, layout: TND, dtype: bf16, num_heads: 2, actual_seq_lengths: [300, 200],
     sparsity: {pattern: random, density: 0.7}}
"""


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("views")
    spec = root / "spec.yaml"
    spec.write_text(SPECS)
    out = {}
    for case in load_specs([spec]):
        out[case.name] = (case, api.load_case(generate_case(case, root / "cases")))
    return out


@pytest.mark.parametrize("name", ["gqa", "tnd"])
def test_rows_converted_by_block_equal_the_whole_heads_conversion(cases, name):
    case, loaded = cases[name]
    inputs = loaded.inputs
    spans = {s.batch: s for s in case.spans() if s.q_len and s.kv_len}
    rows = InputRows(case, inputs, spans)
    x, y = case.block_shape
    for batch, span in spans.items():
        for head in range(case.num_heads):
            query = np.asarray(q_view(case, inputs["query"], span)[head], dtype=np.float64)
            out = np.asarray(q_view(case, inputs["attention_out"], span)[head], dtype=np.float64)
            dout = np.asarray(q_view(case, inputs["dout"], span)[head], dtype=np.float64)
            lse = np.asarray(lse_view(case, np.asarray(inputs["softmax_lse"]), span)[head], dtype=np.float64)
            last = (span.q_len - 1) // x  # a partial last block where the length is not a multiple of X
            np.testing.assert_array_equal(rows.block("query", batch, head, last), query[last * x :])
            np.testing.assert_array_equal(rows.block("dsum", batch, head, 0), (out * dout).sum(axis=1)[:x])
            picked = np.array([span.q_len - 1, 0, x + 3])
            np.testing.assert_array_equal(rows("lse", batch, head, picked), lse[picked])
            np.testing.assert_array_equal(rows("query", batch, head, np.arange(span.q_len)), query)
        for head in range(case.num_kv_heads):
            key = np.asarray(kv_view(case, inputs["key"], span)[head], dtype=np.float64)
            for block in range(-(-span.kv_len // y)):
                np.testing.assert_array_equal(rows.block("key", batch, head, block), key[block * y : (block + 1) * y])
    with pytest.raises(ValueError):  # a view of the kept rows: read-only
        rows.block("query", 0, 0, 0)[0, 0] = 1.0


@pytest.mark.parametrize("name", ["gqa", "tnd"])
def test_kept_blocks_equal_a_fresh_recomputation_and_are_read_only(cases, name):
    case, loaded = cases[name]
    spans = {s.batch: s for s in case.spans() if s.q_len and s.kv_len}
    shared = Context(case, loaded.inputs, spans)
    targets = [Target("dq", 0, 1, 1), Target("dk", 0, 1, 0), Target("dv", 0, 1, 0)]
    for v in (NULL, *VARIANTS):  # every variant through one context: products and blocks shared
        for target in targets:
            kept = recompute(shared, v, target)
            fresh = recompute(Context(case, loaded.inputs, spans), v, target)
            np.testing.assert_array_equal(kept, fresh)
            assert not kept.flags.writeable
    golden = {n: np.asarray(loaded.golden[n], dtype=np.float64) for n in ("dq", "dk", "dv")}
    x = case.block_shape[0]
    null = recompute(shared, NULL, targets[0])
    span = spans[0]
    expected = q_view(case, golden["dq"], span)[1][x : 2 * x]
    np.testing.assert_allclose(null, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


@pytest.mark.parametrize(("name", "fault"), [("gqa", "no-dsum"), ("gqa", "dk-no-scale"), ("tnd", "no-dsum")])
def test_a_score_on_sampled_rows_estimates_the_score_on_whole_blocks(cases, name, fault):
    case, loaded = cases[name]
    grads = reference.emulate(case, loaded.inputs, fault=fault, order_seed=3)
    result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert result.verdict == compare.FAIL
    spans = {s.batch: s for s in case.spans() if s.q_len and s.kv_len}
    ctx = Context(case, loaded.inputs, spans)
    golden = {n: loaded.golden[n] for n in ("dq", "dk", "dv")}
    bench = {n: loaded.benchmark[n] for n in ("dq", "dk", "dv")} if loaded.benchmark else None
    blocks = gather_blocks(case, ctx, result.tensors, grads, golden, bench)
    some = blocks.sampled_rows(blocks.targets, whole=blocks.screen[:1])
    assert some, "blocks of 128 rows are sampled"
    for target, rows in some.items():  # a stratified sample: its weights stand for every row of the block
        assert blocks.weights_of(target).sum() == pytest.approx(blocks.data[target][0].shape[0])
        assert rows.size < blocks.data[target][0].shape[0]
    for v in VARIANTS:
        whole = blocks.explained([recompute(ctx, v, t) for t in blocks.targets])[0]
        estimated = blocks.explained([recompute(ctx, v, t, some.get(t)) for t in blocks.targets], rows=some)[0]
        assert estimated == pytest.approx(whole, abs=0.05), v.supposes
    # the null hypothesis explains nothing either way, whatever rows it is scored on
    assert blocks.explained(blocks.null_of(blocks.targets, some), rows=some)[0] == 0.0


def test_the_placement_checks_float32_rows_leave_their_inputs_as_they_are(cases):
    from bsa_cli.compare.diagnose import placement

    case, loaded = cases["tnd"]  # TND: a float32 tensor's global rows are a view of it, not a copy
    golden = {n: np.asarray(loaded.golden[n], dtype=np.float32).copy() for n in ("dq", "dk", "dv")}
    bench = {n: v + np.float32(1e-3) for n, v in golden.items()}
    device = {n: v * np.float32(2.0) for n, v in golden.items()}
    kept = {n: v.copy() for n, v in bench.items()}
    rows = placement._rows(case, "dq", device, golden, bench)
    for name in bench:
        np.testing.assert_array_equal(bench[name], kept[name])
    assert rows.device.dtype == np.float32 and rows.excess.dtype == np.float64
    assert float(rows.excess.sum()) > 0
