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
