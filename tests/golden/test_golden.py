"""Tests of bsa_cli.golden against the independent references in tests/oracle.py."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from bsa_cli import golden
from bsa_cli.core import blas
from bsa_cli.core.case import Case
from bsa_cli.core.rounding import round_float32
from bsa_cli.golden import compute, numerics, paths, walk
from tests import helpers, oracle

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)


def make_case(
    layout: str = "BNSD",
    dtype: str = "float16",
    batch: int = 1,
    heads: int = 2,
    kv_heads: int = 2,
    dim: int = 32,
    q_len: int = 64,
    kv_len: int = 64,
    lengths: tuple[int, ...] | None = None,
    kv_lengths: tuple[int, ...] | None = None,
    block_shape: tuple[int, int] = (16, 16),
    scale: float | None = None,
    **fields,
) -> Case:
    """Return helpers.make_case's Case in this file's short names; for TND the S dimensions are the largest lengths."""
    if layout == "TND":
        assert lengths is not None and kv_lengths is not None
        q_len, kv_len = max(lengths), max(kv_lengths)
    return helpers.make_case(
        "t",
        source="test",
        layout=layout,
        dtype=dtype,
        batch=batch,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=dim,
        q_seq_len=q_len,
        kv_seq_len=kv_len,
        actual_seq_lengths=lengths,
        actual_seq_lengths_kv=kv_lengths,
        block_shape=block_shape,
        scale=scale,
        seed=0,
        **fields,
    )


def make_inputs(case: Case, seed: int = 0, density: float = 0.5, mask: np.ndarray | None = None) -> dict:
    """Random query/key/value/dout in the case dtype and a random uint8 block mask (values 0..3)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(BF16 if case.dtype == "bfloat16" else FP16)
    tensors = {
        name: rng.standard_normal(shape).astype(dtype)
        for name, shape in (
            ("query", case.q_shape),
            ("key", case.kv_shape),
            ("value", case.kv_shape),
            ("dout", case.q_shape),
        )
    }
    if mask is None:
        selected = rng.random(case.mask_shape) < density
        mask = (selected * rng.integers(1, 4, case.mask_shape)).astype(np.uint8)
    tensors["block_mask"] = np.broadcast_to(mask, case.mask_shape).astype(np.uint8)
    return tensors


def forward_of(case: Case, t: dict) -> tuple[np.ndarray, np.ndarray]:
    return golden.forward(case, t["query"], t["key"], t["value"], t["block_mask"])


def golden_grads(case: Case, t: dict, out, lse, precision=np.float64):
    return golden.backward(
        case, t["dout"], t["query"], t["key"], t["value"], out, lse, t["block_mask"], precision=precision
    )


def kernel_grads(case: Case, t: dict, out, lse):
    return golden.backward_kernel(case, t["dout"], t["query"], t["key"], t["value"], out, lse, t["block_mask"])


def rel_err(actual: np.ndarray, expected: np.ndarray) -> float:
    """Normwise relative error ||a - e|| / ||e||."""
    actual, expected = oracle.f64(actual), oracle.f64(expected)
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-300))


def check_against_oracles(case: Case, t: dict) -> None:
    """Golden forward and float64 backward equal the dense formula and PyTorch autograd."""
    out, lse = forward_of(case, t)
    ref_out, ref_lse = oracle.dense_forward(case, t["query"], t["key"], t["value"], t["block_mask"])
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)

    grads = golden_grads(case, t, out, lse)
    dense = oracle.dense_backward(case, t["dout"], t["query"], t["key"], t["value"], out, lse, t["block_mask"])
    torch_out, *torch_grads = oracle.torch_backward(case, t["dout"], t["query"], t["key"], t["value"], t["block_mask"])
    np.testing.assert_allclose(out, torch_out, rtol=1e-10, atol=1e-12)
    for name, g, d, p in zip(("dq", "dk", "dv"), grads, dense, torch_grads, strict=True):
        assert g.dtype == np.float64
        np.testing.assert_allclose(g, d, rtol=1e-10, atol=1e-11, err_msg=f"{name} vs dense")
        np.testing.assert_allclose(g, p, rtol=1e-9, atol=1e-10, err_msg=f"{name} vs torch")


# ---- agreement with the oracles over geometries -------------------------------------------------


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1), (8, 2)], ids=["mha", "gqa2", "gqa4-n2=1", "gqa4"])
def test_gqa_ratios_match_oracles_with_own_mask_per_head(heads, kv_heads):
    case = make_case(heads=heads, kv_heads=kv_heads, q_len=96, kv_len=112, block_shape=(16, 16))
    t = make_inputs(case, seed=heads + kv_heads, density=0.4)
    assert not all(np.array_equal(t["block_mask"][0, 0], t["block_mask"][0, n]) for n in range(heads))
    check_against_oracles(case, t)


def test_gqa_equals_mha_on_repeated_kv_heads_summed_over_group():
    gqa = make_case(heads=4, kv_heads=1, q_len=48, kv_len=80, block_shape=(16, 16))
    mha = make_case(heads=4, kv_heads=4, q_len=48, kv_len=80, block_shape=(16, 16))
    t = make_inputs(gqa, seed=3)
    t_mha = dict(t, key=np.repeat(t["key"], 4, axis=1), value=np.repeat(t["value"], 4, axis=1))
    out, lse = forward_of(gqa, t)
    np.testing.assert_array_equal(out, forward_of(mha, t_mha)[0])
    dq, dk, dv = golden_grads(gqa, t, out, lse)
    dq_m, dk_m, dv_m = golden_grads(mha, t_mha, out, lse)
    np.testing.assert_array_equal(dq, dq_m)
    np.testing.assert_allclose(dk, dk_m.sum(axis=1, keepdims=True), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(dv, dv_m.sum(axis=1, keepdims=True), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize(
    "q_len, kv_len, block_shape, dim",
    [
        (257, 256, (16, 16), 16),
        (256, 333, (16, 16), 16),
        (257, 333, (16, 48), 16),
        (1023, 1023, (80, 32), 16),
        (333, 257, (80, 32), 32),
        (100, 90, (64, 128), 64),
    ],
)
def test_partial_tail_blocks_match_oracles(q_len, kv_len, block_shape, dim):
    case = make_case(heads=2, kv_heads=1, dim=dim, q_len=q_len, kv_len=kv_len, block_shape=block_shape)
    t = make_inputs(case, seed=q_len + kv_len, density=0.6)
    t["block_mask"][..., -1, -1] = 1  # both partial tail blocks take part
    check_against_oracles(case, t)


@pytest.mark.parametrize("path", ["float32", "kernel"])
def test_padding_columns_of_a_partial_tail_block_stay_out_even_when_lse_is_very_negative(path):
    # every real score is -100, so exp(0 - lse) would overflow float32 on a padding column
    case = make_case(heads=1, kv_heads=1, dim=16, q_len=20, kv_len=20, block_shape=(16, 16), scale=0.25)
    t = make_inputs(case, seed=1, mask=np.ones(1, np.uint8))
    t["query"][...] = 5
    t["key"][...] = -5
    out, lse = forward_of(case, t)
    np.testing.assert_allclose(lse, -100 + np.log(20))
    if path == "kernel":
        grads = kernel_grads(case, t, out.astype(FP16), lse.astype(np.float32))
    else:
        grads = golden_grads(case, t, out.astype(FP16), lse.astype(np.float32), np.float32)
    reference = golden_grads(case, t, out.astype(FP16), lse.astype(np.float32), np.float64)
    for got, want in zip(grads, reference, strict=True):
        np.testing.assert_allclose(oracle.f64(got), want, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tnd_zero_length_sequences_first_middle_and_last(dtype):
    case = make_case(
        layout="TND",
        dtype=dtype,
        batch=5,
        heads=4,
        kv_heads=2,
        dim=16,
        lengths=(0, 37, 20, 0, 50),
        kv_lengths=(0, 45, 0, 29, 0),
        block_shape=(16, 48),
    )
    t = make_inputs(case, seed=7, density=0.7)
    check_against_oracles(case, t)
    out, lse = forward_of(case, t)
    assert lse.shape == case.q_shape[:-1]
    # entries 2 and 4 have queries but no keys: every row is empty
    rows = np.r_[37:57, 57:107]
    assert np.all(out[rows] == 0) and np.all(lse[rows] == np.inf)
    dq, dk, dv = golden_grads(case, t, out, lse, np.float32)
    assert np.all(dq[rows] == 0)
    assert np.all(dk[45:] == 0) and np.all(dv[45:] == 0)  # entry 3 has keys but no queries


def test_bnsd_lengths_honored_skips_padding_and_equals_the_cropped_case():
    kw = dict(batch=2, heads=2, kv_heads=1, dim=16, q_len=80, kv_len=96, block_shape=(16, 32))
    case = make_case(lengths=(50, 80), kv_lengths=(70, 33), bnsd_lengths="honored", empty_row_lse=-math.inf, **kw)
    t = make_inputs(case, seed=11, density=0.8)
    check_against_oracles(case, t)
    out, lse = forward_of(case, t)
    dq, dk, dv = golden_grads(case, t, out, lse)
    assert np.all(out[0, :, 50:] == 0) and np.all(lse[0, :, 50:] == -np.inf) and np.all(dq[0, :, 50:] == 0)
    assert np.all(dk[0, :, 70:] == 0) and np.all(dv[1, :, 33:] == 0)
    for b, (q_len, kv_len) in enumerate([(50, 70), (80, 33)]):
        single = make_case(**dict(kw, batch=1, q_len=q_len, kv_len=kv_len))
        nq, nkv = -(-q_len // 16), -(-kv_len // 32)
        part = {
            "query": t["query"][b : b + 1, :, :q_len],
            "dout": t["dout"][b : b + 1, :, :q_len],
            "key": t["key"][b : b + 1, :, :kv_len],
            "value": t["value"][b : b + 1, :, :kv_len],
            "block_mask": t["block_mask"][b : b + 1, :, :nq, :nkv],
        }
        out_b, lse_b = forward_of(single, part)
        np.testing.assert_array_equal(out[b : b + 1, :, :q_len], out_b)
        grads_b = golden_grads(single, part, out_b, lse_b)
        np.testing.assert_array_equal(dq[b : b + 1, :, :q_len], grads_b[0])
        np.testing.assert_array_equal(dk[b : b + 1, :, :kv_len], grads_b[1])


def test_bnsd_lengths_ignored_computes_the_full_sequence():
    kw = dict(batch=2, heads=2, kv_heads=2, dim=16, q_len=80, kv_len=96, block_shape=(16, 32))
    ignored = make_case(lengths=(50, 80), kv_lengths=(70, 33), bnsd_lengths="ignored", **kw)
    no_lengths = make_case(**kw)
    t = make_inputs(ignored, seed=12, density=0.8)
    check_against_oracles(ignored, t)
    out, lse = forward_of(ignored, t)
    out_full, lse_full = forward_of(no_lengths, t)
    np.testing.assert_array_equal(out, out_full)
    assert np.any(out[0, :, 50:] != 0)
    for a, b in zip(golden_grads(ignored, t, out, lse), golden_grads(no_lengths, t, out, lse), strict=True):
        np.testing.assert_array_equal(a, b)


# ---- masks with a known dense meaning -----------------------------------------------------------


@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 1)])
def test_all_ones_mask_equals_dense_sdpa(heads, kv_heads):
    case = make_case(heads=heads, kv_heads=kv_heads, q_len=100, kv_len=77, block_shape=(16, 48))
    t = make_inputs(case, seed=5, mask=np.ones(1, np.uint8))
    out, lse = forward_of(case, t)
    dq, dk, dv = golden_grads(case, t, out, lse)
    ref = oracle.sdpa_sequence(t["dout"][0], t["query"][0], t["key"][0], t["value"][0], case.kernel_scale)
    for got, want in zip((out, dq, dk, dv), ref, strict=True):
        np.testing.assert_allclose(got[0], want, rtol=1e-10, atol=1e-12)


def test_causal_block_mask_with_unit_blocks_equals_sdpa_causal():
    case = make_case(heads=2, kv_heads=1, dim=8, q_len=40, kv_len=40, block_shape=(1, 1))
    causal = np.tril(np.ones((40, 40), np.uint8))
    t = make_inputs(case, seed=6, mask=causal)
    out, lse = forward_of(case, t)
    dq, dk, dv = golden_grads(case, t, out, lse)
    t0 = [t[name][0] for name in ("dout", "query", "key", "value")]
    ref = oracle.sdpa_sequence(*t0, case.kernel_scale, is_causal=True)
    for got, want in zip((out, dq, dk, dv), ref, strict=True):
        np.testing.assert_allclose(got[0], want, rtol=1e-10, atol=1e-12)


def test_causal_block_mask_equals_sdpa_with_block_causal_element_mask():
    case = make_case(heads=2, kv_heads=2, dim=16, q_len=130, kv_len=130, block_shape=(32, 32))
    n = case.num_q_blocks
    t = make_inputs(case, seed=8, mask=np.tril(np.ones((n, n), np.uint8)))
    out, lse = forward_of(case, t)
    dq, dk, dv = golden_grads(case, t, out, lse)
    rows, cols = np.arange(130)[:, None] // 32, np.arange(130)[None, :] // 32
    ref = oracle.sdpa_sequence(
        t["dout"][0], t["query"][0], t["key"][0], t["value"][0], case.kernel_scale, attn_mask=cols <= rows
    )
    for got, want in zip((out, dq, dk, dv), ref, strict=True):
        np.testing.assert_allclose(got[0], want, rtol=1e-10, atol=1e-12)


# ---- empty rows and never-selected keys ---------------------------------------------------------


@pytest.mark.parametrize("empty_row_lse", [math.inf, -math.inf, 0.0, math.nan, 1e300])
@pytest.mark.parametrize("path", ["float32", "float64", "kernel"])
def test_empty_rows_and_unselected_keys_give_exact_zeros_and_no_nan(empty_row_lse, path):
    case = make_case(
        heads=4, kv_heads=2, dim=16, q_len=75, kv_len=70, block_shape=(16, 16), empty_row_lse=empty_row_lse
    )
    t = make_inputs(case, seed=9, density=0.7)
    mask = t["block_mask"]
    mask[0, 1, [0, 4]] = 0  # head 1: first and partial last query block rows empty
    mask[0, 1, 1:4, 0] = 1  # ... and the others not
    mask[0, 2] = 0  # head 2: everything empty
    mask[0, 0:2, :, 2] = 0  # kv block 2 unselected by both heads of kv group 0
    mask[0, 2:4, :, 4] = 0  # partial last kv block unselected in group 1
    with np.errstate(all="raise"):
        out, lse = forward_of(case, t)
    assert np.all(out[0, 1, :16] == 0) and np.all(out[0, 1, 64:] == 0) and np.all(out[0, 2] == 0)
    np.testing.assert_array_equal(lse[0, 2], np.full(75, empty_row_lse))
    with np.errstate(over="ignore"):  # the 1e300 sentinel becomes inf in float32, as in a .bin file
        out16, lse32 = out.astype(FP16), lse.astype(np.float32)
    if path == "kernel":
        grads = kernel_grads(case, t, out16, lse32[..., None])
    else:
        grads = golden_grads(case, t, out16, lse32[..., None], precision=np.dtype(path))
    dq, dk, dv = (oracle.f64(g) for g in grads)
    assert all(np.isfinite(g).all() for g in (dq, dk, dv))
    assert np.all(dq[0, 1, :16] == 0) and np.all(dq[0, 1, 64:] == 0) and np.all(dq[0, 2] == 0)
    assert np.all(dq[0, 1, 16:64] != 0)
    assert np.all(dk[0, 0, 32:48] == 0) and np.all(dv[0, 0, 32:48] == 0)
    assert np.all(dk[0, 1, 64:] == 0) and np.all(dv[0, 1, 64:] == 0)
    assert np.all(dk[0, 0, 48:] != 0) and np.all(dv[0, 1, :64] != 0)


def test_sequence_level_accepts_any_lse_on_empty_rows():
    rng = np.random.default_rng(1)
    query, dout = rng.standard_normal((2, 2, 20, 8))
    key, value = rng.standard_normal((2, 1, 30, 8))
    mask = np.array([[[1, 0], [0, 0]], [[0, 1], [1, 1]]], dtype=bool)
    out, lse, empty = golden.forward_sequence(query, key, value, mask, (16, 16), 0.3)
    np.testing.assert_array_equal(empty[0], np.arange(20) >= 16)
    assert not empty[1].any()
    assert np.all(lse[empty] == -np.inf)
    results = []
    for junk in (np.nan, np.inf, -np.inf, 7.0):
        lse_junk = np.where(empty, junk, lse)
        grads = golden.backward_sequence(dout, query, key, value, out, lse_junk, mask, (16, 16), 0.3, np.float64)
        results.append(grads)
        assert all(np.isfinite(g).all() for g in grads)
    for grads in results[1:]:
        for a, b in zip(grads, results[0], strict=True):
            np.testing.assert_array_equal(a, b)


# ---- dtypes, block shapes, precision ------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("block_shape", [(16, 48), (80, 32)])
def test_dtypes_and_block_shapes_match_oracles(dtype, block_shape):
    case = make_case(dtype=dtype, heads=4, kv_heads=2, dim=32, q_len=200, kv_len=170, block_shape=block_shape)
    check_against_oracles(case, make_inputs(case, seed=13, density=0.5))


def test_uint8_mask_values_other_than_one_count_as_selected():
    case = make_case(q_len=48, kv_len=48)
    t = make_inputs(case, seed=2)
    t255 = dict(t, block_mask=t["block_mask"] * np.uint8(255))
    np.testing.assert_array_equal(forward_of(case, t)[0], forward_of(case, t255)[0])


def test_lse_with_or_without_trailing_axis_gives_the_same_gradients():
    case = make_case(layout="TND", heads=2, kv_heads=1, dim=16, lengths=(30, 17), kv_lengths=(20, 40), batch=2)
    t = make_inputs(case, seed=4)
    out, lse = forward_of(case, t)
    for a, b in zip(golden_grads(case, t, out, lse), golden_grads(case, t, out, lse[..., None]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float32_golden_is_close_to_float64_golden(dtype):
    case = make_case(dtype=dtype, heads=4, kv_heads=1, dim=64, q_len=300, kv_len=260, block_shape=(64, 64))
    t = make_inputs(case, seed=14, density=0.5)
    out, lse = forward_of(case, t)
    out_io = out.astype(FP16 if dtype == "float16" else BF16)
    lse32 = lse.astype(np.float32)
    g64 = golden_grads(case, t, out_io, lse32, np.float64)
    g32 = golden_grads(case, t, out_io, lse32, np.float32)
    for a, b in zip(g32, g64, strict=True):
        assert a.dtype == np.float32
        assert rel_err(a, b) < 2e-6


# ---- forward and backward in one pass (what `bsa gen` runs) -------------------------------------

FUSED_GEOMETRIES = {
    "gqa-tails": dict(heads=4, kv_heads=2, dim=32, q_len=200, kv_len=170, block_shape=(16, 48)),
    "gqa4-bf16": dict(dtype="bfloat16", heads=4, kv_heads=1, dim=64, q_len=300, kv_len=260, block_shape=(64, 64)),
    "tnd-zero-lengths": dict(
        layout="TND",
        batch=4,
        heads=4,
        kv_heads=2,
        dim=16,
        lengths=(0, 37, 20, 50),
        kv_lengths=(45, 0, 29, 61),
        block_shape=(16, 48),
    ),
    "bnsd-honored": dict(
        batch=2,
        heads=2,
        kv_heads=1,
        dim=16,
        q_len=80,
        kv_len=96,
        lengths=(50, 80),
        kv_lengths=(70, 33),
        block_shape=(16, 32),
        bnsd_lengths="honored",
        empty_row_lse=-math.inf,
    ),
}


def fused(case: Case, t: dict, precision=np.float32):
    return golden.forward_backward(
        case, t["dout"], t["query"], t["key"], t["value"], t["block_mask"], precision=precision
    )


@pytest.mark.parametrize("geometry", FUSED_GEOMETRIES)
def test_forward_backward_writes_the_rounded_forward_bit_for_bit(geometry):
    case = make_case(**FUSED_GEOMETRIES[geometry])
    t = make_inputs(case, seed=17, density=0.6)
    io = np.dtype(BF16 if case.dtype == "bfloat16" else FP16)
    out, lse = forward_of(case, t)
    for precision in (np.float32, np.float64):
        out_io, lse32, *_ = fused(case, t, precision)
        assert out_io.dtype == io and lse32.dtype == np.float32 and lse32.shape == lse.shape
        np.testing.assert_array_equal(out_io.view(np.uint16), out.astype(io).view(np.uint16))
        np.testing.assert_array_equal(lse32.view(np.uint32), lse.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("geometry", FUSED_GEOMETRIES)
def test_forward_backward_gradients_are_the_golden_backward_of_the_rounded_forward(geometry):
    case = make_case(**FUSED_GEOMETRIES[geometry])
    t = make_inputs(case, seed=18, density=0.6)
    out_io, lse32, *grads32 = fused(case, t, np.float32)
    grads64 = fused(case, t, np.float64)[2:]
    reference = golden_grads(case, t, out_io, lse32, np.float64)  # docs/operator.md section 1 on the GIVEN out and lse
    standalone32 = golden_grads(case, t, out_io, lse32, np.float32)
    for name, g32, g64, ref, s32 in zip(("dq", "dk", "dv"), grads32, grads64, reference, standalone32, strict=True):
        assert g32.dtype == np.float32 and g64.dtype == np.float64
        np.testing.assert_allclose(g64, ref, rtol=1e-10, atol=1e-12, err_msg=name)
        # float32 from the float64 scores: no less accurate than recomputing them in float32
        assert rel_err(g32, ref) < max(2e-6, 1.5 * rel_err(s32, ref)), name


def test_forward_backward_on_empty_rows_writes_the_sentinel_and_exact_zeros():
    case = make_case(heads=4, kv_heads=2, dim=16, q_len=75, kv_len=70, block_shape=(16, 16), empty_row_lse=1e300)
    t = make_inputs(case, seed=9, density=0.7)
    t["block_mask"][0, 1, [0, 4]] = 0
    t["block_mask"][0, 1, 1:4, 0] = 1
    t["block_mask"][0, 2] = 0
    t["block_mask"][0, 0:2, :, 2] = 0
    with np.errstate(all="raise"):
        out_io, lse32, dq, dk, dv = fused(case, t)
    assert np.all(lse32[0, 2] == np.inf) and np.all(lse32[0, 1, :16] == np.inf)  # 1e300 as a float32 file holds it
    assert np.all(out_io[0, 2] == 0) and np.all(dq[0, 2] == 0) and np.all(dq[0, 1, 64:] == 0)
    assert np.all(dk[0, 0, 32:48] == 0) and np.all(dv[0, 0, 32:48] == 0)
    assert all(np.isfinite(g).all() for g in (dq, dk, dv))


def test_forward_backward_leaves_float_inputs_of_its_own_precision_untouched():
    rng = np.random.default_rng(2)
    query, dout = rng.standard_normal((2, 2, 40, 8))
    key, value = rng.standard_normal((2, 1, 50, 8))
    mask = rng.random((2, 3, 4)) < 0.7
    inputs64 = (dout, query, key, value)
    inputs32 = tuple(a.astype(np.float32) for a in inputs64)
    before = [a.copy() for a in inputs64 + inputs32]
    for precision in (np.float32, np.float64):
        for inputs in (inputs64, inputs32):
            golden.forward_backward_sequence(*inputs, mask, (16, 16), 0.3, FP16, precision)
    for a, b in zip(inputs64 + inputs32, before, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", ["fused", "float32", "kernel"])
def test_wide_block_rows_cut_into_row_tiles_give_the_same_results(path, monkeypatch):
    case = make_case(heads=2, kv_heads=1, dim=16, q_len=130, kv_len=333, block_shape=(48, 16))
    t = make_inputs(case, seed=19, density=0.8)
    t["block_mask"][..., -1, -1] = 1

    def run():
        if path == "fused":
            return fused(case, t)
        out, lse = forward_of(case, t)
        out_io, lse32 = out.astype(FP16), lse.astype(np.float32)
        if path == "kernel":
            return (out_io, lse32, *kernel_grads(case, t, out_io, lse32))
        return (out_io, lse32, *golden_grads(case, t, out_io, lse32, np.float32))

    whole = run()
    monkeypatch.setattr(walk, "_TILE_ELEMENTS", 16 * 48)  # tiles of 16 rows: 48 -> 16 + 16 + 16, 34 -> 17 + 17
    monkeypatch.setattr(numerics, "_PRODUCT_ELEMENTS", 3 * 16 * 16)  # dK/dV shares three blocks at a time
    assert walk._row_tiles(96, 130, 300) == [slice(96, 113), slice(113, 130)]
    tiled = run()
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), tiled, whole, strict=True):
        if path == "kernel" and name in ("dq", "dk", "dv"):  # fp32 sums in another order, then a cast
            np.testing.assert_allclose(oracle.f64(a), oracle.f64(b), rtol=2e-3, atol=2e-3, err_msg=name)
        elif path == "float32" and name in ("dq", "dk", "dv"):  # float32 sums in another grouping: a few ULP
            scale = float(np.abs(oracle.f64(b)).max())  # of the largest partial sum, not of a small result
            atol = 8 * float(np.finfo(np.float32).eps) * scale
            np.testing.assert_allclose(oracle.f64(a), oracle.f64(b), rtol=2e-6, atol=atol, err_msg=name)
        else:
            np.testing.assert_allclose(oracle.f64(a), oracle.f64(b), rtol=2e-6, atol=1e-7, err_msg=name)


def test_backward_matches_finite_differences_of_the_forward():
    rng = np.random.default_rng(21)
    heads, kv_heads, q_len, kv_len, dim, scale = 2, 1, 7, 8, 3, 0.7
    block_shape = (3, 3)
    query = rng.standard_normal((heads, q_len, dim))
    key, value = rng.standard_normal((2, kv_heads, kv_len, dim))
    dout = rng.standard_normal((heads, q_len, dim))
    mask = np.array([[[1, 0, 1], [0, 0, 0], [0, 1, 1]], [[0, 1, 0], [1, 1, 1], [1, 0, 0]]], dtype=bool)

    def loss(q, k, v):
        return float((golden.forward_sequence(q, k, v, mask, block_shape, scale)[0] * dout).sum())

    out, lse, _ = golden.forward_sequence(query, key, value, mask, block_shape, scale)
    grads = golden.backward_sequence(dout, query, key, value, out, lse, mask, block_shape, scale, np.float64)
    eps = 1e-6
    tensors = [query, key, value]
    for which, grad in enumerate(grads):
        numeric = np.zeros_like(grad)
        for index in np.ndindex(grad.shape):
            plus = [x.copy() for x in tensors]
            minus = [x.copy() for x in tensors]
            plus[which][index] += eps
            minus[which][index] -= eps
            numeric[index] = (loss(*plus) - loss(*minus)) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    assert np.all(grads[0][1, 3:6] != 0) and np.all(grads[0][0, 3:6] == 0)


# ---- kernel-faithful path -----------------------------------------------------------------------

EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["BNSD", "TND"])
def test_kernel_path_is_close_to_float64_golden_and_reproducible(dtype, layout):
    if layout == "TND":
        case = make_case(
            layout,
            dtype,
            batch=3,
            heads=4,
            kv_heads=2,
            dim=64,
            lengths=(130, 0, 200),
            kv_lengths=(150, 60, 190),
            block_shape=(64, 64),
        )
    else:
        case = make_case(layout, dtype, heads=4, kv_heads=1, dim=64, q_len=260, kv_len=300, block_shape=(64, 64))
    t = make_inputs(case, seed=15, density=0.5)
    out, lse = forward_of(case, t)
    io = np.dtype(FP16 if dtype == "float16" else BF16)
    out_io, lse32 = out.astype(io), lse.astype(np.float32)
    kernel = kernel_grads(case, t, out_io, lse32)
    again = kernel_grads(case, t, out_io, lse32)
    reference = golden_grads(case, t, out_io, lse32, np.float64)
    for name, k, a, g in zip(("dq", "dk", "dv"), kernel, again, reference, strict=True):
        assert k.dtype == io and k.shape == g.shape
        np.testing.assert_array_equal(k.view(np.uint16), a.view(np.uint16))
        error, rounding = rel_err(k, g), rel_err(g.astype(io), g)
        assert error < 2 * EPS[dtype], f"{name}: normwise relative error {error:.2e}"
        # more than rounding the golden to the dtype: P and dS are rounded on the way (about 0.6 vs 0.4 eps)
        assert error > 1.2 * rounding, f"{name}: {error:.2e} vs {rounding:.2e}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kernel_path_matches_dense_emulation_of_section_2(dtype):
    case = make_case(dtype=dtype, heads=4, kv_heads=2, dim=32, q_len=100, kv_len=90, block_shape=(16, 48))
    t = make_inputs(case, seed=16, density=0.5)
    out, lse = forward_of(case, t)
    io = np.dtype(FP16 if dtype == "float16" else BF16)
    out_io, lse32 = out.astype(io), lse.astype(np.float32)
    kernel = kernel_grads(case, t, out_io, lse32)
    mask = oracle.element_mask(t["block_mask"][0], 100, 90, (16, 48))
    emulated = oracle.kernel_emulation_sequence(
        t["dout"][0], t["query"][0], t["key"][0], t["value"][0], out_io[0], lse32[0], mask, case.kernel_scale, io
    )
    for k, e in zip(kernel, emulated, strict=True):
        k, e = oracle.f64(k[0]), oracle.f64(e)
        # same roundings, different fp32 summation order: at most one io-dtype ulp apart, mostly equal
        ulp = np.abs(np.spacing(e.astype(io)).astype(np.float64))
        assert np.all(np.abs(k - e) <= ulp + 1e-30)
        assert np.mean(k == e) > 0.9


# ---- bad input and degenerate shapes ------------------------------------------------------------


def test_sequence_functions_handle_zero_lengths():
    query = np.zeros((2, 0, 8), FP16)
    key = np.ones((1, 5, 8), FP16)
    out, lse, empty = golden.forward_sequence(query, key, key, np.zeros((2, 0, 2), bool), (4, 4), 1.0)
    assert out.shape == (2, 0, 8) and lse.shape == (2, 0) and empty.shape == (2, 0)
    query = np.ones((2, 6, 8), FP16)
    none = np.zeros((1, 0, 8), FP16)
    out, lse, empty = golden.forward_sequence(query, none, none, np.zeros((2, 2, 0), bool), (4, 4), 1.0)
    assert np.all(out == 0) and empty.all()
    dq, dk, dv = golden.backward_sequence_kernel(
        query, query, none, none, out, lse, np.zeros((2, 2, 0)), (4, 4), 1.0, FP16
    )
    assert dq.dtype == FP16 and np.all(dq == 0) and dk.shape == (1, 0, 8)


def test_mask_of_the_wrong_shape_is_rejected():
    query = np.ones((2, 10, 8))
    with pytest.raises(ValueError, match=r"block_mask has shape \(2, 2, 2\), expected \(2, 3, 2\)"):
        golden.forward_sequence(query, query[:1], query[:1], np.ones((2, 2, 2)), (4, 8), 1.0)


def test_fast_float16_rounding_equals_numpy_cast_bit_for_bit():
    rng = np.random.default_rng(0)
    edges = np.array([0x38800000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x33000000, 0x33000001, 0x7F800000, 0x7F800001])
    around = (edges[:, None] + np.arange(-2048, 2049)).ravel() & 0x7FFFFFFF
    bits = np.concatenate([rng.integers(0, 2**32, 2**20), around, around | 0x80000000]).astype(np.uint32)
    values = bits.view(np.float32)
    with np.errstate(all="ignore"):
        expected = values.astype(np.float16).astype(np.float32)
    got = round_float32(values, np.dtype(np.float16))
    same = (got.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(got) & np.isnan(expected))
    assert same.all(), bits[~same][:5]
    nan = np.isnan(values)
    assert np.array_equal(got.view(np.uint32)[nan], bits[nan])  # NaN as it came, payload and sign
    in_place = values.copy()
    assert round_float32(in_place, np.dtype(np.float16), out=in_place) is in_place
    assert np.array_equal(in_place.view(np.uint32), got.view(np.uint32))


# ---- walks in threads ---------------------------------------------------------------------------


def test_a_failing_walk_in_a_thread_raises_its_own_error_and_nothing_waits_for_it(monkeypatch):
    monkeypatch.setattr(compute, "_THREADS_MIN_ROW_FLOPS", 0)
    case = make_case(heads=4, kv_heads=4, dim=16, q_len=256, kv_len=256, block_shape=(16, 16))
    t = make_inputs(case, seed=5, density=0.5)
    tiles: list[int] = []
    original = paths._ForwardGolden.tile

    def failing(self, head, *args):
        tiles.append(head)
        if head == 2 and tiles.count(2) == 3:
            raise FloatingPointError("planted")
        return original(self, head, *args)

    monkeypatch.setattr(paths._ForwardGolden, "tile", failing)
    with pytest.raises(FloatingPointError, match="planted"):  # not the benchmark walk that waited in vain
        golden.golden_and_benchmark(case, t["dout"], t["query"], t["key"], t["value"], t["block_mask"], jobs=2)


def test_walks_in_threads_give_blas_one_thread_each_and_restore_it(monkeypatch):
    if not blas.thread_counts():
        pytest.skip("NumPy's BLAS here is not an OpenBLAS whose threads can be set")
    monkeypatch.setattr(compute, "_THREADS_MIN_ROW_FLOPS", 0)
    before = blas.thread_counts()
    seen: list[list[int]] = []
    case = make_case(heads=2, kv_heads=2, dim=16, q_len=64, kv_len=64)
    t = make_inputs(case, seed=6)
    with golden.reporting(lambda pairs: seen.append(blas.thread_counts())):
        golden.golden_and_benchmark(case, t["dout"], t["query"], t["key"], t["value"], t["block_mask"], jobs=2)
    assert seen and all(counts == [1] * len(before) for counts in seen)
    assert blas.thread_counts() == before


def test_walks_in_threads_handle_floating_point_errors_as_the_caller_does(monkeypatch):
    monkeypatch.setattr(compute, "_THREADS_MIN_ROW_FLOPS", 0)
    case = make_case(heads=2, kv_heads=2, dim=16, q_len=64, kv_len=64, block_shape=(16, 16))
    t = make_inputs(case, seed=8)
    t["query"][0, 1, 5] = np.inf  # inf scores: inf - inf in the forward
    inputs = (t["dout"], t["query"], t["key"], t["value"], t["block_mask"])
    for jobs in (1, 2):
        with np.errstate(invalid="raise"), pytest.raises(FloatingPointError):
            golden.golden_and_benchmark(case, *inputs, jobs=jobs)


def test_walks_take_threads_only_for_rows_with_arithmetic_to_share():
    small = make_case(heads=4, kv_heads=4, dim=16, q_len=64, kv_len=64, block_shape=(16, 16))
    large = make_case(heads=2, kv_heads=2, dim=128, q_len=256, kv_len=256, block_shape=(128, 128))
    for case, lanes in ((small, 1), (large, 3)):  # 14 * 16**3 = 57 kFLOP per block pair; 14 * 128**3 = 29 MFLOP
        assert compute._lanes(case, make_inputs(case, seed=3)["block_mask"], jobs=3) == lanes
    assert compute._lanes(large, np.zeros(large.mask_shape, np.uint8), jobs=3) == 1  # nothing selected
