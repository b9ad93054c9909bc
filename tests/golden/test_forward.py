"""Tests of bsa_cli.golden.forward_op: the forward's written rows, its kernel-faithful benchmark and the chain's golden.

The dense oracle here is written fresh from the forward's formula (a full masked score matrix per batch
entry, softmax, natural-log lse), with batch entries located by this file's own arithmetic; the chain's
golden is checked against PyTorch float64 autograd of the same dense masked attention.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from bsa_cli import golden
from bsa_cli.core.case import Case, numpy_dtype
from bsa_cli.golden.forward_op import _Fp16Softmax
from tests import helpers

BF16 = np.dtype(ml_dtypes.bfloat16)

make_case = helpers.case_factory(tnd_sizes_from_lengths=True, name="fwd", source="test")


def draw(case: Case, seed: int = 0, density: float = 0.6, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Random query/key/value/dout of the case dtype and a random int8 block mask (values 0..3)."""
    return helpers.draw_forward(case, seed, density, mask, mask_dtype="int8", most_selecting_byte=3)


# ---- the dense oracle -------------------------------------------------------------------------------


def entries(case: Case) -> list[tuple[int, int, int, int, int]]:
    """(batch, q_start, q_len, kv_start, kv_len): BNSD lengths honoured, TND starts the running sums."""
    q_lengths = list(case.actual_seq_lengths or [case.q_seq_len] * case.batch)
    kv_lengths = list(case.actual_seq_lengths_kv or [case.kv_seq_len] * case.batch)
    if case.layout != "TND":
        return [(b, 0, q_lengths[b], 0, kv_lengths[b]) for b in range(case.batch)]
    q_starts = [sum(q_lengths[:b]) for b in range(case.batch)]
    kv_starts = [sum(kv_lengths[:b]) for b in range(case.batch)]
    return [(b, q_starts[b], q_lengths[b], kv_starts[b], kv_lengths[b]) for b in range(case.batch)]


def heads_major(case: Case, tensor: np.ndarray, batch: int, start: int, length: int) -> np.ndarray:
    if case.layout == "TND":
        return np.moveaxis(tensor[start : start + length], 1, 0)
    return tensor[batch, :, start : start + length]


def dense_forward(case: Case, t: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return float64 out, lse (nan where not written) and written rows of the whole case, densely."""
    x, y = case.block_shape
    out = np.zeros(case.q_shape)
    lse = np.full(case.q_shape[:-1], np.nan)
    written = np.zeros(case.q_shape[:-1], dtype=bool)
    group = case.num_heads // case.num_kv_heads
    for b, q0, q_len, kv0, kv_len in entries(case):
        if q_len == 0 or kv_len == 0:
            continue
        q = heads_major(case, t["query"], b, q0, q_len).astype(np.float64)
        k = np.repeat(heads_major(case, t["key"], b, kv0, kv_len).astype(np.float64), group, axis=0)
        v = np.repeat(heads_major(case, t["value"], b, kv0, kv_len).astype(np.float64), group, axis=0)
        blocks = t["block_sparse_mask"][b] != 0
        mask = blocks[:, np.arange(q_len)[:, None] // x, np.arange(kv_len)[None, :] // y]  # [N1, q_len, kv_len]
        scores = np.where(mask, case.kernel_scale * np.einsum("nqd,nkd->nqk", q, k), -np.inf)
        rows = mask.any(axis=-1)
        top = np.where(rows, scores.max(axis=-1), 0.0)
        weights = np.exp(scores - top[..., None])
        total = np.where(rows, weights.sum(axis=-1), 1.0)
        heads_major(case, out, b, q0, q_len)[...] = np.einsum("nqk,nkd->nqd", weights / total[..., None], v)
        entry_lse = heads_major(case, lse[..., None], b, q0, q_len)[..., 0]
        entry_lse[...] = np.where(rows, top + np.log(total), np.nan)
        heads_major(case, written[..., None], b, q0, q_len)[..., 0][...] = rows
    return out, lse, written


def relative_errors(actual: np.ndarray, expected: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """|a - e| / max(|e|, 1e-7) over the written rows."""
    a, e = np.asarray(actual, dtype=np.float64)[rows], np.asarray(expected, dtype=np.float64)[rows]
    return np.abs(a - e) / np.maximum(np.abs(e), 1e-7)


GEOMETRIES = {
    "bnsd-tails": dict(q_seq_len=96, kv_seq_len=80, block_shape=(32, 16)),
    "gqa": dict(num_heads=4, num_kv_heads=2, q_seq_len=64, kv_seq_len=100, block_shape=(16, 32)),
    "bnsd-lengths": dict(
        batch=2, q_seq_len=64, kv_seq_len=64, actual_seq_lengths=(40, 64), actual_seq_lengths_kv=(64, 20)
    ),
    "tnd": dict(layout="TND", actual_seq_lengths=(30, 0, 50), actual_seq_lengths_kv=(40, 17, 0), block_shape=(16, 16)),
    "bf16": dict(dtype="bfloat16", q_seq_len=64, kv_seq_len=48, block_shape=(16, 16)),
}


# ---- golden and kernel against the oracle --------------------------------------------------------------


@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_golden_forward_equals_the_dense_oracle_and_compute_forward(geometry: str) -> None:
    case = make_case(**GEOMETRIES[geometry])
    t = draw(case)
    ref_out, ref_lse, ref_written = dense_forward(case, t)
    written = golden.written_rows(case, t["block_sparse_mask"])
    np.testing.assert_array_equal(written, ref_written)
    args = (t["query"], t["key"], t["value"], t["block_sparse_mask"])
    gold_out, gold_lse, _, _ = golden.forward_golden_and_benchmark(case, *args, precision=np.float64, jobs=2)
    np.testing.assert_allclose(gold_out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gold_lse[written], ref_lse[written], rtol=1e-12, atol=1e-12)
    assert np.all(gold_out[~written] == 0) and np.all(gold_lse[~written] == case.empty_row_lse)
    plain_out, plain_lse = golden.forward(case, *args)  # the existing float64 forward, bit for bit
    np.testing.assert_array_equal(gold_out, plain_out)
    np.testing.assert_array_equal(gold_lse, plain_lse)
    out32, lse32, _, _ = golden.forward_golden_and_benchmark(case, *args)
    assert out32.dtype == lse32.dtype == np.float32
    np.testing.assert_array_equal(out32, plain_out.astype(np.float32))


@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_forward_kernel_is_the_oracle_to_the_rounding_of_its_dtype(geometry: str) -> None:
    case = make_case(**GEOMETRIES[geometry])
    t = draw(case, seed=1)
    ref_out, ref_lse, written = dense_forward(case, t)
    out, lse = golden.forward_kernel(case, t["query"], t["key"], t["value"], t["block_sparse_mask"])
    assert out.dtype == numpy_dtype(case.dtype) and lse.dtype == np.float32
    assert out.shape == case.q_shape and lse.shape == case.q_shape[:-1]
    eps = 2.0**-8 if case.dtype == "bfloat16" else 2.0**-11
    # a few roundings of P and one of out: a few units of the dtype's epsilon, relative to the output's scale
    assert np.abs(out[written].astype(np.float64) - ref_out[written]).max() <= 4 * eps * np.abs(ref_out).max()
    np.testing.assert_allclose(lse[written], ref_lse[written], rtol=1e-5, atol=1e-5)
    assert np.all(out[~written] == 0) and np.all(lse[~written] == np.float32(case.empty_row_lse))


def long_row_case(**fields) -> Case:
    """One head, 64 query rows, 2048 kv columns all selected: rows of four 512-column stacks."""
    base = dict(num_heads=1, num_kv_heads=1, head_dim=64, q_seq_len=64, kv_seq_len=2048, block_shape=(64, 128))
    return make_case(**{**base, **fields, "scale": 0.125})


def test_benchmark_error_on_long_rows_is_small_and_of_the_dtypes_size() -> None:
    case = long_row_case()
    t = draw(case, seed=3, mask=np.ones(long_row_case().mask_shape))
    args = (t["query"], t["key"], t["value"], t["block_sparse_mask"])
    gold_out, gold_lse, bench_out, bench_lse = golden.forward_golden_and_benchmark(case, *args)
    rows = golden.written_rows(case, t["block_sparse_mask"])
    assert rows.all()
    # the size to expect: a dense float64 forward whose P alone is rounded to fp16 (relative to the row max)
    q, k, v = (t[name][0, 0].astype(np.float64) for name in ("query", "key", "value"))
    scores = case.kernel_scale * q @ k.T
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    naive = (probs.astype(np.float16).astype(np.float64) @ v / probs.sum(axis=1, keepdims=True))[None, None]
    bench_abs = np.abs(bench_out.astype(np.float64) - gold_out).mean()
    naive_abs = np.abs(naive.astype(np.float16).astype(np.float64) - gold_out).mean()
    assert 0.5 * naive_abs < bench_abs < 2 * naive_abs  # measured: 8.1e-6 and 8.0e-6
    errors = relative_errors(bench_out, gold_out, rows)
    assert errors.mean() < 3 * relative_errors(naive, gold_out, rows).mean()  # measured: 2.4e-3, 1.7e-3
    rounding = relative_errors(gold_out.astype(np.float16), gold_out, rows)  # out's own rounding to fp16
    assert errors.mean() > 4 * rounding.mean()  # P's rounding dominates on long rows (measured: 1.8e-4)
    assert errors.mean() < 2.0**-8
    assert np.abs(bench_lse.astype(np.float64) - gold_lse).max() < 1e-5  # fp32 lse


def test_a_single_stack_implementation_differs_in_bits_on_long_rows() -> None:
    case = long_row_case()
    t = draw(case, seed=4, mask=np.ones(case.mask_shape))
    args = (t["query"], t["key"], t["value"], t["block_sparse_mask"])
    stacked_out, stacked_lse = golden.forward_kernel(case, *args)
    single_out, single_lse = golden.forward_kernel(case, *args, stack=1 << 30)
    assert not np.array_equal(stacked_out.view(np.uint16), single_out.view(np.uint16))
    assert not np.array_equal(stacked_lse, single_lse)
    np.testing.assert_allclose(single_out.astype(np.float32), stacked_out.astype(np.float32), atol=2e-3)
    # on a row of one stack (512 columns) the stack size makes no difference at all
    short = long_row_case(kv_seq_len=512)
    ts = draw(short, seed=4, mask=np.ones(short.mask_shape))
    short_args = (ts["query"], ts["key"], ts["value"], ts["block_sparse_mask"])
    a, b = golden.forward_kernel(short, *short_args), golden.forward_kernel(short, *short_args, stack=1 << 30)
    np.testing.assert_array_equal(a[0].view(np.uint16), b[0].view(np.uint16))
    np.testing.assert_array_equal(a[1], b[1])


def test_inner_precise_1_gives_an_lse_of_fp16_precision() -> None:
    base = long_row_case(kv_seq_len=1024)
    t = draw(base, seed=5, mask=np.ones(base.mask_shape))
    args = (t["query"], t["key"], t["value"], t["block_sparse_mask"])
    gold_out, gold_lse, _, lse0 = golden.forward_golden_and_benchmark(base, *args)
    out1, lse1 = golden.forward_kernel(dataclasses.replace(base, inner_precise=1), *args)
    err0 = np.abs(lse0.astype(np.float64) - gold_lse)
    err1 = np.abs(lse1.astype(np.float64) - gold_lse)
    ulp16 = np.spacing(np.abs(gold_lse).astype(np.float16)).astype(np.float64)
    assert err0.max() < 1e-5
    assert err1.max() <= 4 * ulp16.max()  # a few fp16 roundings (ln, + m, the sum held in fp16)
    assert err1.mean() > 30 * err0.mean()  # and clearly not fp32's
    assert np.array_equal(lse1, lse1.astype(np.float16).astype(np.float32))  # fp16 values, cast to fp32
    out_err = relative_errors(out1, gold_out, np.ones(base.q_shape[:-1], dtype=bool))
    assert out_err.mean() < 2.0**-8  # out stays close: only the softmax runs in fp16


def test_inner_precise_1_holds_the_scale_in_fp16() -> None:
    softmax = _Fp16Softmax(0.17)  # innerPrecise 1
    assert softmax.scale == np.float32(np.float16(0.17)) != np.float32(0.17)


# ---- written rows ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bnsd_lengths", ["honored", "ignored"])
def test_bnsd_rows_past_the_actual_lengths_are_not_written(bnsd_lengths: str) -> None:
    case = make_case(
        batch=2,
        q_seq_len=64,
        kv_seq_len=64,
        actual_seq_lengths=(40, 64),
        actual_seq_lengths_kv=(64, 20),
        block_shape=(16, 16),
        bnsd_lengths=bnsd_lengths,
    )
    mask = np.ones(case.mask_shape, dtype=np.int8)
    rows = golden.written_rows(case, mask)
    assert rows[0, :, :40].all() and not rows[0, :, 40:].any()
    assert rows[1].all()
    t = draw(case, mask=mask)
    out, lse = golden.forward_kernel(case, t["query"], t["key"], t["value"], mask)
    assert np.all(out[0, :, 40:] == 0) and np.all(lse[0, :, 40:] == np.inf)
    ref_out, _, _ = dense_forward(case, t)  # batch 1 sees only its 20 kv positions
    np.testing.assert_allclose(out[1].astype(np.float64), ref_out[1], atol=2e-3)


def test_rows_of_a_block_row_without_selected_kv_blocks_are_not_written() -> None:
    case = make_case(q_seq_len=64, kv_seq_len=64, block_shape=(16, 16))
    mask = np.ones(case.mask_shape, dtype=np.int8)
    mask[0, 0, 1] = 0  # head 0, rows 16..31: nothing selected
    mask[0, 1, 3, :3] = 0  # head 1, rows 48..63: only kv block 3
    rows = golden.written_rows(case, mask)
    assert not rows[0, 0, 16:32].any() and rows[0, 0, :16].all() and rows[0, 0, 32:].all()
    assert rows[0, 1].all()
    # a selection past the kv length does not count: kv_len 40 has blocks 0..2 only
    short = make_case(
        q_seq_len=64, kv_seq_len=64, block_shape=(16, 16), actual_seq_lengths=(64,), actual_seq_lengths_kv=(40,)
    )
    only_past = np.zeros(short.mask_shape, dtype=np.int8)
    only_past[0, :, :, 3] = 1
    assert not golden.written_rows(short, only_past).any()


def test_tnd_with_a_zero_length_sequence_writes_the_others_rows() -> None:
    case = make_case(
        layout="TND", actual_seq_lengths=(20, 0, 30, 10), actual_seq_lengths_kv=(16, 40, 0, 24), block_shape=(16, 16)
    )
    mask = np.ones(case.mask_shape, dtype=np.int8)
    rows = golden.written_rows(case, mask)
    assert rows.shape == (60, 2)
    assert rows[:20].all()  # entry 0
    assert not rows[20:50].any()  # entry 2: 30 query tokens but no kv token; entry 1 has no query token
    assert rows[50:].all()  # entry 3
    t = draw(case, mask=mask)
    ref_out, ref_lse, ref_written = dense_forward(case, t)
    np.testing.assert_array_equal(rows, ref_written)
    out, lse = golden.forward_kernel(case, t["query"], t["key"], t["value"], mask)
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=2e-3)
    np.testing.assert_allclose(lse[rows], ref_lse[rows], rtol=1e-5)


def test_forward_kernel_gives_the_same_bits_in_threads() -> None:
    case = make_case(num_heads=4, num_kv_heads=2, q_seq_len=256, kv_seq_len=1024, block_shape=(128, 128), head_dim=64)
    t = draw(case, seed=6, density=0.8)
    args = (t["query"], t["key"], t["value"], t["block_sparse_mask"])
    one, four = golden.forward_kernel(case, *args), golden.forward_kernel(case, *args, jobs=4)
    np.testing.assert_array_equal(one[0].view(np.uint16), four[0].view(np.uint16))
    np.testing.assert_array_equal(one[1], four[1])


# ---- the chain ----------------------------------------------------------------------------------------


def torch_chain(case: Case, t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Dense masked attention in torch float64 per batch entry, then autograd's backward of out with dout."""
    torch = pytest.importorskip("torch")
    x, y = case.block_shape
    result = {
        name: np.zeros(case.q_shape if name in ("out", "dq") else case.kv_shape) for name in ("out", "dq", "dk", "dv")
    }
    group = case.num_heads // case.num_kv_heads
    for b, q0, q_len, kv0, kv_len in entries(case):
        if q_len == 0 or kv_len == 0:
            continue
        leaf = {
            name: torch.tensor(heads_major(case, t[name], b, start, length).astype(np.float64), requires_grad=True)
            for name, start, length in (("query", q0, q_len), ("key", kv0, kv_len), ("value", kv0, kv_len))
        }
        dout = torch.tensor(heads_major(case, t["dout"], b, q0, q_len).astype(np.float64))
        blocks = t["block_sparse_mask"][b] != 0
        mask = torch.tensor(blocks[:, np.arange(q_len)[:, None] // x, np.arange(kv_len)[None, :] // y])
        keys = leaf["key"].repeat_interleave(group, dim=0)
        values = leaf["value"].repeat_interleave(group, dim=0)
        scores = (case.kernel_scale * leaf["query"] @ keys.transpose(1, 2)).masked_fill(~mask, -torch.inf)
        top = scores.amax(dim=-1, keepdim=True).detach()
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weights = torch.exp(scores - top)
        total = weights.sum(dim=-1, keepdim=True)
        out = (weights / torch.where(total == 0, torch.ones_like(total), total)) @ values
        out.backward(dout)
        for name, tensor, start, length in (
            ("out", out.detach(), q0, q_len),
            ("dq", leaf["query"].grad, q0, q_len),
            ("dk", leaf["key"].grad, kv0, kv_len),
            ("dv", leaf["value"].grad, kv0, kv_len),
        ):
            heads_major(case, result[name], b, start, length)[...] = tensor.numpy()
    return result


CHAIN_GEOMETRIES = {
    "bnsd-gqa": dict(num_heads=4, num_kv_heads=2, q_seq_len=64, kv_seq_len=80, block_shape=(16, 32)),
    "bnsd-lengths-ignored": dict(
        batch=2,
        q_seq_len=64,
        kv_seq_len=64,
        actual_seq_lengths=(40, 64),
        actual_seq_lengths_kv=(64, 20),
        block_shape=(16, 16),
        bnsd_lengths="ignored",
    ),
    "tnd-empty-entry": dict(
        layout="TND", actual_seq_lengths=(30, 0, 50), actual_seq_lengths_kv=(40, 17, 0), block_shape=(16, 16)
    ),
}


@pytest.mark.parametrize("geometry", sorted(CHAIN_GEOMETRIES))
def test_chain_golden_is_torch_autograd_of_the_dense_forward(geometry: str) -> None:
    case = make_case(**CHAIN_GEOMETRIES[geometry])
    t = draw(case, seed=7, density=0.7)
    args = (t["dout"], t["query"], t["key"], t["value"], t["block_sparse_mask"])
    gold, bench = golden.chain_golden_and_benchmark(case, *args, precision=np.float64, jobs=2)
    reference = torch_chain(case, t)
    for name in ("out", "dq", "dk", "dv"):
        assert gold[name].dtype == np.float64
        np.testing.assert_allclose(gold[name], reference[name], rtol=1e-9, atol=1e-10, err_msg=name)
    _, ref_lse, written = dense_forward(case, t)
    np.testing.assert_allclose(gold["lse"][written], ref_lse[written], rtol=1e-12)
    # the benchmark: kernel forward, then kernel backward on its out and lse, in the case dtype
    assert {bench[name].dtype for name in ("out", "dq", "dk", "dv")} == {numpy_dtype(case.dtype)}
    assert bench["lse"].dtype == np.float32
    for name in ("dq", "dk", "dv"):
        scale = np.abs(reference[name]).max()
        assert np.abs(bench[name].astype(np.float64) - reference[name]).max() <= 2.0**-7 * scale, name
    out, lse = golden.forward_kernel(case, t["query"], t["key"], t["value"], t["block_sparse_mask"])
    np.testing.assert_array_equal(bench["out"].view(np.uint16), out.view(np.uint16))
    np.testing.assert_array_equal(bench["lse"], lse)
    dq, dk, dv = golden.backward_kernel(golden.forward_case(case), *args[:4], out, lse, t["block_sparse_mask"])
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        np.testing.assert_array_equal(bench[name].view(np.uint16), grad.view(np.uint16))


def test_golden_forward_is_still_the_float64_forward_function() -> None:
    """The module golden/forward.py must not shadow compute's `forward` on the package (callers use both)."""
    from bsa_cli.golden import compute

    assert golden.forward is compute.forward
    assert golden.forward_kernel.__module__ == "bsa_cli.golden.forward_op"
