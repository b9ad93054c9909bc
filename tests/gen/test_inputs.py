"""Input tensors and block masks: deterministic per case, patterns as documented."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from bsa_cli import inputs
from bsa_cli.core.case import Distribution, Init, Sparsity
from bsa_cli.inputs import make_mask, make_tensors, mask_stats
from tests.helpers import case_factory
from tests.helpers.cli import invoke

make_case = case_factory(
    name="c",
    source="t",
    batch=2,
    num_heads=4,
    head_dim=16,
    q_seq_len=256,
    kv_seq_len=256,
    block_shape=(32, 32),
    scale=0.25,
    seed=3,
)


def test_tensors_depend_only_on_the_case_and_are_rounded_to_its_dtype() -> None:
    first, again = make_tensors(make_case()), make_tensors(make_case(name="other-name", source="elsewhere"))
    for name in first:
        assert first[name].dtype == np.float16
        assert first[name].tobytes() == again[name].tobytes()
    assert make_tensors(make_case(seed=4))["query"].tobytes() != first["query"].tobytes()
    assert make_tensors(make_case(dtype="bfloat16"))["key"].dtype == ml_dtypes.bfloat16


def test_streams_are_independent_of_other_tensors_init() -> None:
    wide = make_case(init=Init(dout=Distribution(std=5.0)))
    assert make_tensors(wide)["query"].tobytes() == make_tensors(make_case())["query"].tobytes()


def test_uniform_values_stay_within_bounds() -> None:
    case = make_case(init=Init(query=Distribution(kind="uniform", low=0.5, high=0.75)))
    query = make_tensors(case)["query"].astype(np.float32)
    assert query.min() >= 0.5 and query.max() <= 0.75


def test_causal_sliding_strided_patterns() -> None:
    causal = make_mask(make_case(sparsity=Sparsity(pattern="causal")))[0, 0]
    assert np.array_equal(causal, np.tril(np.ones((8, 8), dtype=np.uint8)))
    window = make_mask(make_case(sparsity=Sparsity(pattern="sliding_window", window=2)))[0, 0]
    assert window[5].tolist() == [0, 0, 0, 0, 1, 1, 0, 0]
    strided = make_mask(make_case(sparsity=Sparsity(pattern="strided", window=1, stride=3)))[0, 0]
    assert strided[7].tolist() == [0, 0, 1, 0, 0, 1, 0, 1]


def test_random_masks_differ_between_heads_of_one_gqa_group() -> None:
    mask = make_mask(make_case(sparsity=Sparsity(pattern="random", density=0.5)))
    assert mask.shape == (2, 4, 8, 8) and mask.dtype == np.uint8
    assert not np.array_equal(mask[0, 0], mask[0, 1])  # heads 0 and 1 share kv head 0
    assert 0.3 < mask.mean() < 0.7
    shared = make_mask(make_case(sparsity=Sparsity(pattern="random", density=0.5, per_head=False)))
    assert np.array_equal(shared[0, 0], shared[0, 3])


def test_empty_rows_by_index_and_by_fraction() -> None:
    mask = make_mask(make_case(sparsity=Sparsity(pattern="dense", empty_rows=(1, 6, 99))))
    assert not mask[:, :, [1, 6]].any() and mask[:, :, [0, 2, 3, 4, 5, 7]].all()
    mask = make_mask(make_case(sparsity=Sparsity(pattern="dense", empty_rows=0.25)))
    assert ((mask.sum(axis=3) == 0).sum(axis=2) == 2).all()


def test_explicit_mask_broadcasts_over_batch_and_heads() -> None:
    grid = np.eye(8, dtype=bool)
    mask = make_mask(make_case(sparsity=Sparsity(pattern="explicit", explicit=grid)))
    assert all(np.array_equal(mask[b, n], grid) for b in range(2) for n in range(4))


def test_stats_count_only_real_rows_and_columns() -> None:
    case = make_case(batch=1, num_heads=1, num_kv_heads=1, q_seq_len=40, kv_seq_len=70, head_dim=8)
    stats = mask_stats(case, make_mask(case))  # blocks of 32: rows 32+8, cols 32+32+6
    assert stats["selected_blocks"] == 6 and stats["density"] == 1.0
    assert stats["flops_backward"] == 10 * 40 * 70 * 8 and stats["flops_forward"] == 4 * 40 * 70 * 8


def test_stats_skip_blocks_past_actual_lengths() -> None:
    case = dataclasses.replace(
        make_case(batch=2, num_heads=1, num_kv_heads=1),
        layout="TND",
        actual_seq_lengths=(0, 40),
        actual_seq_lengths_kv=(10, 64),
        q_seq_len=40,
        kv_seq_len=64,
    )
    stats = mask_stats(case, make_mask(case))
    assert stats["selected_blocks"] == 4 and stats["total_blocks"] == 4


@pytest.mark.parametrize("layout", ["BNSD", "TND"])
def test_shapes_follow_layout(layout: str) -> None:
    lengths = (100, 0, 28) if layout == "TND" else None
    case = make_case(
        layout=layout,
        batch=3,
        actual_seq_lengths=lengths,
        actual_seq_lengths_kv=lengths,
        q_seq_len=100 if lengths else 256,
        kv_seq_len=100 if lengths else 256,
    )
    tensors = make_tensors(case)
    expected = (128, 4, 16) if layout == "TND" else (3, 4, 256, 16)
    assert tensors["query"].shape == expected and tensors["dout"].shape == expected


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensors_drawn_in_chunks_and_threads_are_the_stream_drawn_in_one_go(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    init = Init(key=Distribution("uniform", low=-2.0, high=3.0), dout=Distribution(std=0.5))
    case = make_case(dtype=dtype, init=init)
    monkeypatch.setattr(inputs, "_DRAW_CHUNK", 1000)  # 32768 values per tensor: 33 chunks, the last one short
    tensors = make_tensors(case, jobs=3)
    for name, dist in (("query", case.init.query), ("key", case.init.key), ("dout", case.init.dout)):
        generator = inputs.rng(case, name)
        shape = case.kv_shape if name == "key" else case.q_shape
        if dist.kind == "uniform":
            whole = generator.uniform(dist.low, dist.high, size=shape)
        else:
            whole = generator.standard_normal(size=shape) * dist.std + dist.mean
        assert tensors[name].tobytes() == whole.astype(tensors[name].dtype).tobytes(), name


def test_exact_values_are_integers_and_halves_that_both_dtypes_hold_exactly() -> None:
    exact = Distribution(kind="exact", low=-3.0, high=2.5)
    for dtype in ("float16", "bfloat16"):
        tensors = make_tensors(make_case(dtype=dtype, init=Init(query=exact, key=exact, value=exact, dout=exact)))
        query = tensors["query"].astype(np.float64)
        assert set(np.unique(query * 2)) == set(range(-6, 6))  # every half in [low, high], none outside
        key = tensors["key"].astype(np.float64)
        # The forward's products are exact: scores summed in float32 equal those summed in float64.
        scores32 = tensors["query"][0, 0].astype(np.float32) @ tensors["key"][0, 0].astype(np.float32).T
        assert np.array_equal(scores32.astype(np.float64), query[0, 0] @ key[0, 0].T)
    # The default distribution is drawn as before: a spec without `exact` keeps its bytes.
    assert make_tensors(make_case())["query"].tobytes() == make_tensors(make_case(init=Init()))["query"].tobytes()


EXACT_SPEC = """
cases:
  - name: exact
    layout: BNSD
    dtype: fp16
    batch: 1
    num_heads: 2
    q_seq_len: 64
    head_dim: 32
    block_shape: [32, 32]
    scale: 0.125
    init: {distribution: exact, low: -2, high: 2}
"""


def test_exact_inputs_pass_clean_and_show_a_tile_of_kernel_error(tmp_path) -> None:
    spec = tmp_path / "exact.yaml"
    spec.write_text(EXACT_SPEC)
    assert invoke("check", spec, "-o", tmp_path / "out").exit_code == 0
    planted = invoke("check", spec, "-o", tmp_path / "out", "--fault", "tile-noise")
    assert planted.exit_code == 1 and "dq worst 16x16 tile RMSE ratio" in planted.output


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ("{distribution: exact, low: -2.25}", "key 'init.low': -2.25 is not a half-integer within +-64"),
        ("{distribution: exact, high: 65}", "key 'init.high': 65 is not a half-integer within +-64"),
        ("{distribution: exact, row_scale: {low: 1, high: 2}}", "exact values stay exact only without outliers"),
    ],
)
def test_exact_values_refuse_bounds_and_shapes_that_are_not_exact(tmp_path, init: str, message: str) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(EXACT_SPEC.replace("{distribution: exact, low: -2, high: 2}", init))
    result = invoke("validate", spec)
    assert result.exit_code == 2 and message in result.output, result.output
