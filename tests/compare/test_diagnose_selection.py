"""The contributions fit (compare/diagnose/contributions.py): a selection read wrongly in ways no recomputed
hypothesis supposes (a shift by two blocks, a selected block dropped, the diagonal added or skipped, a query
head left out of its group's dK/dV) is named by its kind, with the pairs it adds or leaves out."""

from __future__ import annotations

import numpy as np
import pytest

from bsa_cli import api, compare
from bsa_cli.compare.diagnose import contributions
from bsa_cli.compare.diagnose.hypotheses import Context, Target
from bsa_cli.compare.diagnose.scoring import gather_blocks
from bsa_cli.devices import reference
from bsa_cli.gen.generate import generate_case
from bsa_cli.specs import load_specs

SPECS = """
defaults: {dtype: fp16, head_dim: 64, seed: 5, num_heads: 1}
cases:
  - {name: heads, batch: 2, num_heads: 3, q_seq_len: 256, block_shape: [64, 64],
     sparsity: {pattern: random, density: 0.5}}
  - {name: gqa, num_heads: 4, num_kv_heads: 1, q_seq_len: 512, block_shape: [64, 64],
     sparsity: {pattern: random, density: 0.4}}
  - {name: gqa-bf16, dtype: bf16, num_heads: 6, num_kv_heads: 2, q_seq_len: 384, block_shape: [64, 64],
     sparsity: {pattern: random, density: 0.5}}
  - {name: tnd, layout: TND, dtype: bf16, num_heads: 2, actual_seq_lengths: [130, 64, 200], block_shape: [64, 64],
     sparsity: {pattern: random, density: 0.6}}
  - {name: causal, num_heads: 2, q_seq_len: 512, block_shape: [64, 64], sparsity: {pattern: causal}}
"""


def _shifted_by_two(mask: np.ndarray) -> np.ndarray:
    out = np.zeros_like(mask)
    out[..., 2:] = mask[..., :-2]
    return out


def _first_selected_dropped(mask: np.ndarray) -> np.ndarray:
    out = mask.copy()
    selected = out != 0
    first = np.argmax(selected, axis=-1)
    b, n, i = np.indices(first.shape)
    has = selected.any(axis=-1)
    out[b[has], n[has], i[has], first[has]] = 0
    return out


def _diagonal(mask: np.ndarray, value: int) -> np.ndarray:
    out = mask.copy()
    k = np.arange(min(out.shape[2], out.shape[3]))
    out[:, :, k, k] = value
    return out


MISREAD = {
    "kv-shift-2": _shifted_by_two,
    "first-selected-dropped": _first_selected_dropped,
    "diagonal-skipped": lambda m: _diagonal(m, 0),
    "diagonal-added": lambda m: _diagonal(m, 1),
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("selection")
    spec = root / "spec.yaml"
    spec.write_text(SPECS)
    out = {}
    for case in load_specs([spec]):
        loaded = api.load_case(generate_case(case, root / "cases"))
        out[case.name] = (case, loaded, reference.emulate(case, loaded.inputs, order_seed=7))
    return out


def _misread(case, loaded, how: str) -> dict[str, np.ndarray]:
    """The reference device's outputs had it read the mask `how`: its P from the given lse, as a kernel's."""
    mask = MISREAD[how](np.asarray(loaded.inputs["block_sparse_mask"]))
    return reference.emulate(case, {**loaded.inputs, "block_sparse_mask": mask}, order_seed=7)


@pytest.mark.parametrize(
    ("name", "how"),
    [
        ("heads", "kv-shift-2"),
        ("heads", "diagonal-skipped"),
        ("heads", "diagonal-added"),
        ("gqa", "kv-shift-2"),
        ("gqa", "first-selected-dropped"),
        ("gqa", "diagonal-added"),
        ("gqa-bf16", "first-selected-dropped"),
        ("gqa-bf16", "diagonal-skipped"),
        ("tnd", "kv-shift-2"),
        ("tnd", "diagonal-added"),
        ("causal", "first-selected-dropped"),
    ],
)
def test_a_selection_read_wrongly_is_named_block_selection(cases, name, how):
    case, loaded, _ = cases[name]
    grads = _misread(case, loaded, how)
    result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert result.verdict == compare.FAIL
    top = result.diagnosis[0]
    assert top.kind == "block-selection", [(c.kind, c.score, c.evidence) for c in result.diagnosis]
    assert "(head " in top.evidence and "kv block" in top.evidence  # it names the pairs
    if how == "kv-shift-2":
        assert "kv block j reads the selection of block j - 2" in top.evidence


@pytest.mark.parametrize(("name", "head"), [("gqa", 1), ("gqa", 2), ("gqa-bf16", 1), ("gqa-bf16", 4)])
def test_a_query_head_left_out_of_its_groups_sum_is_named_gqa_group_sum(cases, name, head):
    case, loaded, clean = cases[name]
    mask = np.asarray(loaded.inputs["block_sparse_mask"]).copy()
    mask[:, head] = 0  # dK/dV without that head's pairs; dq as it is
    without = reference.emulate(case, {**loaded.inputs, "block_sparse_mask": mask}, order_seed=7)
    result = api.judge(loaded, clean["dq"], without["dk"], without["dv"])
    assert result.verdict == compare.FAIL
    top = result.diagnosis[0]
    assert top.kind == "gqa-group-sum", [(c.kind, c.score, c.evidence) for c in result.diagnosis]
    assert f"query heads {head} out" in top.evidence or "last query head" in top.evidence


def _blocks(case, loaded, grads):
    result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    spans = {s.batch: s for s in case.spans() if s.q_len and s.kv_len}
    ctx = Context(case, loaded.inputs, spans)
    golden = {n: loaded.golden[n] for n in ("dq", "dk", "dv")}
    bench = {n: loaded.benchmark[n] for n in ("dq", "dk", "dv")} if loaded.benchmark else None
    return ctx, gather_blocks(case, ctx, result.tensors, grads, golden, bench)


def test_the_fit_of_a_clean_block_adds_and_leaves_out_nothing(cases):
    case, loaded, clean = cases["heads"]
    grads = dict(clean)
    grads["dq"] = clean["dq"].copy()
    grads["dq"][0, 0, :64] *= 2  # a failing tensor, so that the diagnosis's blocks are gathered
    ctx, blocks = _blocks(case, loaded, grads)
    for target in blocks.targets:
        if target.tensor == "dq" and target.block == 0 and target.head == 0:
            continue
        fit = contributions.fit_block(ctx, blocks, target)
        assert not isinstance(fit, str), fit
        assert fit.added == () and fit.left_out == (), target


def test_the_fit_names_the_one_pair_left_out_of_a_dq_block(cases):
    case, loaded, clean = cases["heads"]
    mask = np.asarray(loaded.inputs["block_sparse_mask"])
    h, i = 1, 2
    j = int(np.flatnonzero(mask[0, h, i])[0])
    pair = contributions.Pair(0, h, i, j)
    spans = {s.batch: s for s in case.spans() if s.q_len and s.kv_len}
    part = contributions.partial(Context(case, loaded.inputs, spans), pair, "dq")
    grads = dict(clean)
    grads["dq"] = clean["dq"].copy()
    rows = grads["dq"][0, h, i * 64 : (i + 1) * 64]
    rows[:] = (rows.astype(np.float64) - part).astype(rows.dtype)
    ctx, blocks = _blocks(case, loaded, grads)
    target = Target("dq", 0, h, i)
    assert target in blocks.targets
    fit = contributions.fit_block(ctx, blocks, target)
    assert not isinstance(fit, str), fit
    assert fit.left_out == (pair,) and fit.added == ()


def test_a_gradient_off_by_scale_is_not_read_as_pairs_left_out(cases):
    case, loaded, clean = cases["heads"]
    grads = dict(clean)
    grads["dq"] = (clean["dq"].astype(np.float64) * case.kernel_scale).astype(clean["dq"].dtype)
    result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert result.diagnosis[0].kind == "scale", [(c.kind, c.score) for c in result.diagnosis]
    assert not any(c.kind == "block-selection" for c in result.diagnosis)


# ---- the fitted softmax variants (hypotheses.fitted_variants): a softmax term wrong by any factor ---------


def _with_inputs(case, loaded, name: str, change) -> dict[str, np.ndarray]:
    """The reference device's outputs given a changed input: out times k changes only Dsum (= rowsum(dO out)),
    a changed softmax_lse only the P the backward recomputes from it."""
    return reference.emulate(case, {**loaded.inputs, name: change(np.asarray(loaded.inputs[name]))}, order_seed=7)


def _out_times(k: float):
    return lambda a: (a.astype(np.float32) * k).astype(a.dtype)


@pytest.mark.parametrize(
    ("name", "change", "kind", "words"),
    [
        ("heads", ("attention_out", _out_times(2.0)), "softmax-grad", "Dsum taken 2 times"),
        ("gqa", ("attention_out", _out_times(0.5)), "softmax-grad", "Dsum taken 0.5 times"),
        ("tnd", ("attention_out", _out_times(3.0)), "softmax-grad", "Dsum taken 3 times"),
        ("heads", ("softmax_lse", lambda a: a * 0.5), "softmax-lse", "0.5 lse: lse read halved"),
        ("gqa", ("softmax_lse", lambda a: a * 0.8), "softmax-lse", "0.8 lse: lse read scaled"),
        ("gqa-bf16", ("softmax_lse", lambda a: a * np.log10(np.e)), "softmax-lse", "as a base-10 log"),
        ("causal", ("softmax_lse", lambda a: a + 1.0), "softmax-lse", "lse off by a constant"),
        ("tnd", ("softmax_lse", lambda a: a - 0.5), "softmax-lse", "lse off by a constant"),
    ],
)
def test_a_softmax_term_wrong_by_a_factor_is_fitted_and_named(cases, name, change, kind, words):
    case, loaded, _ = cases[name]
    grads = _with_inputs(case, loaded, *change)
    result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert result.verdict == compare.FAIL
    top = result.diagnosis[0]
    assert top.kind == kind and words in top.evidence, [(c.kind, c.score, c.evidence) for c in result.diagnosis]
    assert top.score >= 0.98


# ---- the fitted head map (hypotheses.fitted_head_map): query heads reading any other kv head -------------

HEAD_SPECS = """
defaults: {dtype: fp16, head_dim: 64, seed: 5, q_seq_len: 256, block_shape: [64, 64]}
cases:
  - {name: gqa3, num_heads: 6, num_kv_heads: 3, sparsity: {pattern: random, density: 0.5}}
  - {name: mha4, dtype: bf16, num_heads: 4, num_kv_heads: 4, sparsity: {pattern: random, density: 0.5}}
"""


def _kv_heads_read(case, loaded, order: list[int], into_first: bool = False) -> dict[str, np.ndarray]:
    """Outputs of a kernel whose query heads read kv head order[n // G]: the reference device given key and
    value in that order (dq then right for that reading), its dK/dV put back in place (or all added into kv
    head 0, `into_first`, as a kernel reading kv head 0 for every query head would)."""
    inputs = dict(loaded.inputs)
    inputs["key"] = np.asarray(inputs["key"])[:, order].copy()
    inputs["value"] = np.asarray(inputs["value"])[:, order].copy()
    grads = reference.emulate(case, inputs, order_seed=7)
    if into_first:
        out = {"dq": grads["dq"]}
        for name in ("dk", "dv"):
            summed = np.zeros_like(grads[name])
            summed[:, 0] = grads[name].astype(np.float32).sum(axis=1).astype(summed.dtype)
            out[name] = summed
        return out
    back = np.argsort(order)
    return {"dq": grads["dq"], "dk": grads["dk"][:, back], "dv": grads["dv"][:, back]}


@pytest.mark.parametrize(("name", "into_first"), [("gqa3", False), ("gqa3", True), ("mha4", False), ("mha4", True)])
def test_query_heads_reading_other_kv_heads_are_named_with_their_mapping(tmp_path, name, into_first):
    spec = tmp_path / "spec.yaml"
    spec.write_text(HEAD_SPECS)
    (case,) = [c for c in load_specs([spec]) if c.name == name]
    loaded = api.load_case(generate_case(case, tmp_path / "cases"))
    n2 = case.num_kv_heads
    order = [0] * n2 if into_first else list(range(n2))[::-1]
    grads = _kv_heads_read(case, loaded, order, into_first)
    result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert result.verdict == compare.FAIL
    top = result.diagnosis[0]
    assert top.kind == "gqa-head-mapping" and top.score >= 0.98, [(c.kind, c.evidence) for c in result.diagnosis]
    wrong = [h for h in range(case.num_heads) if order[h // case.group_size] != h // case.group_size]
    assert f"{wrong[-1]} -> {order[wrong[-1] // case.group_size]}" in top.evidence


# ---- hostile outputs: no fit claims them, and nothing leaks ---------------------------------------------


def test_a_gradient_left_nearly_empty_is_not_read_as_every_pair_left_out(cases):
    case, loaded, clean = cases["gqa"]
    grads = {n: (a.astype(np.float32) * 1e-6).astype(a.dtype) if n == "dq" else a for n, a in clean.items()}
    result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert result.verdict == compare.FAIL
    assert not any(c.kind == "block-selection" for c in result.diagnosis), [
        (c.kind, c.evidence) for c in result.diagnosis
    ]


@pytest.mark.parametrize("name", ["gqa", "tnd"])
def test_random_bits_and_float32_range_values_are_diagnosed_without_warnings(cases, name):
    import warnings

    case, loaded, clean = cases[name]
    rng = np.random.default_rng(3)
    bits = {n: np.frombuffer(rng.bytes(a.nbytes), dtype=a.dtype).reshape(a.shape).copy() for n, a in clean.items()}
    huge = {
        n: np.full(a.shape, 3e38 if case.dtype == "bfloat16" else 6e4, np.float32).astype(a.dtype)
        for n, a in clean.items()
    }
    for grads in (bits, huge, {**clean, "dq": bits["dq"]}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a NumPy warning from judging or diagnosing would reach the terminal
            result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
        assert result.verdict == compare.FAIL
        assert not any(h.outcome.startswith("failed") for h in result.hypotheses)
